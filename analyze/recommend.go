package analyze

import (
	"fmt"
	"slices"
	"time"

	"github.com/uber/h3-go/v4"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// finish turns the pooled measurements into the report's statistics and
// recommendations.
func (a *analyzer) finish(assets []*assetFixes) error {
	rep := a.report
	slices.Sort(a.gaps)
	rep.MedianInterval = nearestRank(a.gaps, 50)

	slices.Sort(a.samples)
	rep.Jitter.Samples = len(a.samples)
	rep.Jitter.P50M = nearestRank(a.samples, 50)
	rep.Jitter.P95M = nearestRank(a.samples, 95)
	rep.Jitter.P99M = nearestRank(a.samples, 99)

	a.countMoves()
	for i := range rep.Candidates {
		c := &rep.Candidates[i]
		c.SuppressionRatio = ratio(c.Pings-c.Admitted, c.Pings)
	}
	a.recommendResolution()
	a.recommendWindow()
	a.noteMixedCadences()
	if err := a.recommendRadius(assets); err != nil {
		return err
	}
	a.noteWideAccuracies(assets)
	a.noteBackwardCapture(assets)
	ttl, from, err := a.opts.ttl(rep.Recommended.Window)
	rep.Recommended.TTL, rep.Recommended.TTLFrom = ttl, from
	return err
}

// noteWideAccuracies notes the fixes whose reported accuracy lets a
// suppressed one lie farther from the last accepted one than the
// recommendation's lag bound: the stay holds a fix by its own accuracy, and
// one reporting a speed under 0.5 m/s (OwnTracks Android and Traccar
// Client send 0 when they have no reading) by twice it, up to 50 m more,
// and √2 times that beside a last accepted fix as uncertain (dedup's
// uncertainty and lag2). Noted only past the bound, a walking phone
// reporting 16 m and a speed of 0 lay 44 m from a printed 18. Parked
// fixes are left out: the bound is the lag of an asset under way, and
// every parked phone reporting a speed of 0 would be noted.
func (a *analyzer) noteWideAccuracies(assets []*assetFixes) {
	lag := dedup.LagFactor * a.report.Recommended.RadiusM
	wide, widest := 0, 0.0
	for _, as := range assets {
		for i, f := range as.fixes {
			if b := lagOf(f); b > lag && !as.parked[i] {
				wide, widest = wide+1, max(widest, b)
			}
		}
	}
	if wide > 0 {
		a.note("%d of the capture's fixes report an accuracy that lets a suppressed fix lie farther than the %g m lag bound "+
			"from the last accepted one, up to %.0f m: the stay holds a fix by its accuracy, and one that reports standing still "+
			"by about 2.8 times it", wide, lag, widest)
	}
}

// lagOf is how far from the last accepted fix f may lie, suppressed, by its
// accuracy alone (0 when it reports none the handler trusts).
func lagOf(f fixPoint) float64 {
	return dedup.AccuracyLagM(ping.Ping{Lat: f.lat, Lon: f.lon, Accuracy: f.accuracy, Speed: f.speed, HasSpeed: f.hasSpeed})
}

// noteBackwardCapture notes a capture in which most fixes come after a
// later fix of their asset: exported newest first (a backend's table
// sorted descending, a log viewer's default) or rotated logs joined newest
// first (zcat access.log.*.gz reads .1 first). The replay takes the lines
// as written, as the handler would have met them, and judges such fixes
// late: sized from such a capture, the stationary receiver of the README's
// own traces cost 60 admissions a window, or was recommended 37 m for 28.
// A live sender's offline backlogs make some fixes late, not most; a
// resent batch (Overland's, until it is answered) repeats fixes already
// seen, which are counted neither late nor at all: counted in the whole,
// batches resent five times hid a capture exported newest first.
func (a *analyzer) noteBackwardCapture(assets []*assetFixes) {
	late, fixes := 0, 0
	for _, as := range assets {
		var latest time.Time
		seen := make(map[int64]bool, len(as.fixes)) // by instant: one time written in two offsets is one
		for i, f := range as.fixes {
			if seen[f.t.UnixNano()] {
				continue
			}
			seen[f.t.UnixNano()] = true
			fixes++
			if i > 0 && f.t.Before(latest) {
				late++
			}
			if i == 0 || f.t.After(latest) {
				latest = f.t
			}
		}
	}
	if late > 0 && float64(late) > lateShare*float64(fixes) {
		a.note("%d of the capture's %d fixes come after a later fix of their asset: if the capture was exported newest first, "+
			"or rotated logs were joined newest first (zcat access.log.*.gz), put it in the order the handler received it "+
			"(tac, or the files oldest first) and run again; the replay takes the lines as written", late, fixes)
	}
}

func (a *analyzer) recommendResolution() {
	rec := &a.report.Recommended
	rec.Resolution = dedup.DefaultResolution
	if a.report.Jitter.Samples == 0 {
		a.note("%s; resolution is the default %d", a.noJitter(), dedup.DefaultResolution)
	} else {
		rec.Resolution = min(finestResolutionOver(a.report.Jitter.P95M), finestResolution)
	}
	rec.EdgeM = h3.HexagonEdgeLengthAvgM(rec.Resolution)
	if !slices.Contains(a.opts.Resolutions, rec.Resolution) {
		a.note("recommended resolution %d is not among the candidates; add it to see its replay", rec.Resolution)
	}
}

// noJitter says why there is no jitter to size from: no stationary run, or
// runs whose every fix was left out of the jitter (maxJitterM).
func (a *analyzer) noJitter() string {
	if a.report.Jitter.Runs > 0 {
		return fmt.Sprintf("no jitter to measure: every fix of the %d stationary runs reports an accuracy worse than %g m "+
			"(a cell or Wi-Fi fix) or lies over %g m (or eight times its accuracy) from its run", a.report.Jitter.Runs, maxJitterAccuracyM, 4*stationaryRadiusM)
	}
	return fmt.Sprintf("no stationary run (%s of fixes within %g m of the first, or within their reported accuracies added) to measure jitter on; "+
		"a receiver that scatters wider shows none unless its pings' accuracy is read (the preset's, or --accuracy)", stationaryMinDuration, stationaryRadiusM)
}

// finestResolution is the finest resolution recommended (1.3 m edges), a
// survey-grade receiver's, and the finest of DefaultResolutions: a tracker
// that repeats one position while parked measures no jitter at all, and
// was recommended 15, half-metre cells that no candidate replayed.
const finestResolution = 14

// finestResolutionOver returns the finest H3 resolution whose average edge
// is at least m metres, so that jitter of that size stays in one cell.
func finestResolutionOver(m float64) int {
	res := 0
	for r := 1; r <= 15 && h3.HexagonEdgeLengthAvgM(r) >= m; r++ {
		res = r
	}
	return res
}

// mixedCadences is how many times slower than the tenth fastest asset the
// tenth slowest may report before the fleet is called mixed.
const mixedCadences = 5

// noteMixedCadences warns of a fleet whose assets report at very different
// cadences: the interval and the jitter are pooled over fixes, so the fast
// senders' fixes decide them. Sized so, 1 s trackers beside 30 s phones got
// a 1 min window and a 16 m radius, and the phones kept 89% of their
// parked pings.
func (a *analyzer) noteMixedCadences() {
	if len(a.intervals) < 2 {
		return
	}
	slices.Sort(a.intervals)
	fast, slow := nearestRank(a.intervals, 10), nearestRank(a.intervals, 90)
	if slow < mixedCadences*fast {
		return
	}
	a.note("the assets report at very different cadences (a tenth of them every %s or faster, a tenth every %s or slower): "+
		"the window and the jitter follow the pooled fixes, most of them the fast senders'; "+
		"analyze a capture of each kind apart, and give each its own telemetry_dedup if they need other settings", fast, slow)
}

func (a *analyzer) recommendWindow() {
	rec, ws := &a.report.Recommended, a.opts.Windows
	interval := a.report.MedianInterval
	if interval == 0 {
		rec.Window = dedup.DefaultWindow
		a.note("no asset reported twice at different times; window is the default %s", dedup.DefaultWindow)
		return
	}
	i := slices.IndexFunc(ws, func(w time.Duration) bool { return w >= windowIntervals*interval })
	if i < 0 {
		i = len(ws) - 1
		a.note("no candidate window spans %d median report intervals (%s); window is the largest candidate", windowIntervals, windowIntervals*interval)
	}
	rec.Window = ws[i]
}
