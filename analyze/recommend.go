package analyze

import (
	"fmt"
	"slices"
	"time"

	"github.com/uber/h3-go/v4"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
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
	ttl, from, err := a.opts.ttl(rep.Recommended.Window)
	rep.Recommended.TTL, rep.Recommended.TTLFrom = ttl, from
	return err
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
