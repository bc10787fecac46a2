package analyze

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/geo"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/nmea"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// traceCapture turns a real trace of testdata/traces into the plain NDJSON
// capture the README's "Sizing from your own traffic" runs analyze on.
func traceCapture(t *testing.T, trace, asset string) ([]nmea.Fix, string) {
	t.Helper()
	fixes, err := nmea.ReadRMC(trace)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, f := range fixes {
		fmt.Fprintf(&b, `{"asset_id":%q,"occurred_at":%q,"lat":%.8f,"lon":%.8f}`+"\n", asset, f.Time.Format(time.RFC3339Nano), f.Lat, f.Lon)
	}
	return fixes, b.String()
}

// A capture whose lines are not in device-time order: exported from a
// backend's table or a log viewer newest first (ORDER BY time DESC, Loki's
// and Kibana's default), or logrotate's files concatenated as a glob
// orders them (zcat access.log.*.gz: .1, the newest, first). analyze
// measures the same jitter (it sorts by device time to measure), but
// replays the lines as written. On the stationary Amsterdam receiver (in
// order: radius 28 m, 1.00 admissions a window):
//   - newest first: every one of the 1,201 fixes is admitted in sliding
//     (each is older than the last accepted), and the report says "parked
//     assets' fixes are admitted 60.00 times a window" with the note "the
//     stationary runs cost 60.00 admissions a window at radius 28 m, and
//     no radius up to 42 m lowers that", blaming the receiver and the
//     radius;
//   - four rotated files, newest first: the recommendation widens to 37 m
//     (lag bound 55.5 m instead of 42 m) with no word on why.
//
// Nothing told the user that the capture ran backward, or to sort it. A
// note now does. (Helper 2's review, stop 65.)
func TestACaptureOutOfTimeOrderIsNamedNotSizedFrom(t *testing.T) {
	_, capture := traceCapture(t, nmea.ParkedTrace, "ams")
	lines := strings.Split(strings.TrimSpace(capture), "\n")
	inOrder, err := Analyze(strings.NewReader(capture), Options{})
	if err != nil {
		t.Fatal(err)
	}
	reversed := slices.Clone(lines)
	slices.Reverse(reversed)
	q := len(lines) / 4
	rotated := slices.Concat(lines[3*q:], lines[2*q:3*q], lines[q:2*q], lines[:q])
	for _, tc := range []struct {
		name  string
		lines []string
	}{{"newest first", reversed}, {"four rotated files, newest first", rotated}} {
		rep, err := Analyze(strings.NewReader(strings.Join(tc.lines, "\n")+"\n"), Options{})
		if err != nil {
			t.Fatal(err)
		}
		rec := rep.Recommended
		if rec.RadiusM == inOrder.Recommended.RadiusM && rec.ParkedAdmissionsPerWindow <= maxParkedPerWindow {
			continue
		}
		named := slices.ContainsFunc(rep.Notes, func(n string) bool {
			n = strings.ToLower(n)
			return strings.Contains(n, "order") || strings.Contains(n, "sort") || strings.Contains(n, "backward") || strings.Contains(n, "newest")
		})
		if !named {
			t.Errorf("%s: recommended radius %g m at %.2f parked admissions a window (in order: %g m at %.2f), "+
				"and no note says the capture is out of device-time order; notes: %q", tc.name, rec.RadiusM, rec.ParkedAdmissionsPerWindow,
				inOrder.Recommended.RadiusM, inOrder.Recommended.ParkedAdmissionsPerWindow, rep.Notes)
		}
	}
}

// analyze prints, with the radius it recommends, "a suppressed ping then
// lies at most <1.5 radii> m from the last accepted one" (table.go). A
// capture that reports accuracy is replayed, and decided by the handler,
// with a lag of max(1.5 radii, the fix's accuracy), and a fix reporting a
// speed under 0.5 m/s (OwnTracks Android and Traccar Client send 0 when
// they have no reading) has its accuracy doubled and √2 of that besides
// (dedup/track.go uncertainty, lag2). A phone parked outdoors for 2 h
// (σ 3 m, reporting 8 m) walks off at 1.2 m/s: reporting 40 m, analyze
// recommended 12 m, printed "at most 18 m", and the replay suppressed the
// walk's fixes up to 37.7 m from the last accepted one, with no word of it
// (helper 2's review, stop 65); reporting 16 m and a speed of 0, 44 m,
// still with none once the note counted only accuracies past the bound
// (helper 4's review). A note now says how far such fixes may lie.
func TestAWalkPastThePrintedLagBoundIsNoted(t *testing.T) {
	for _, tc := range []struct {
		name     string
		accuracy float64
		speed    bool
	}{{"reporting 40 m", 40, false}, {"reporting 16 m and a speed of 0", 16, true}} {
		t.Run(tc.name, func(t *testing.T) {
			capture, fixes, walking := parkedThenWalking(tc.accuracy, tc.speed)
			p := ping.NewParser()
			p.AccuracyPath = "accuracy"
			if tc.speed {
				p.SpeedPath = "speed"
			}
			rep, err := Analyze(strings.NewReader(capture), Options{Parser: p})
			if err != nil {
				t.Fatal(err)
			}
			rec := rep.Recommended
			printed, farthest := dedup.LagFactor*rec.RadiusM, farthestSuppressed(t, rec, fixes, walking)
			t.Logf("radius %g m, printed bound %g m, farthest suppressed walking fix %.1f m; notes %q", rec.RadiusM, printed, farthest, rep.Notes)
			noted := slices.ContainsFunc(rep.Notes, func(n string) bool { return strings.Contains(n, "farther than the") })
			if farthest > printed+0.5 && !noted {
				t.Errorf("analyze prints a lag bound of %g m (radius %g m), but in sliding at that radius a walking fix is suppressed "+
					"%.1f m from the last accepted one, and no note says so: %q", printed, rec.RadiusM, farthest, rep.Notes)
			}
		})
	}
}

// parkedThenWalking is a phone's capture at a 5 s cadence: 2 h parked
// (σ 3 m, reporting 8 m), then 5 min walking east at 1.2 m/s reporting
// walkAccuracy, every fix with a speed of 0 if zeroSpeed; its fixes, and
// the index of the walk's first.
func parkedThenWalking(walkAccuracy float64, zeroSpeed bool) (capture string, fixes []fixPoint, walking int) {
	rng := rand.New(rand.NewPCG(1, 2))
	start := time.Date(2026, 8, 8, 12, 0, 0, 0, time.UTC)
	const lat0, lon0 = 52.52, 13.40
	mPerDegLat, mPerDegLon := 111320.0, 111320.0*math.Cos(lat0*math.Pi/180)
	var b strings.Builder
	add := func(i int, east, north, acc float64) {
		f := fixPoint{t: start.Add(time.Duration(i) * 5 * time.Second), lat: lat0 + north/mPerDegLat, lon: lon0 + east/mPerDegLon,
			accuracy: acc, hasSpeed: zeroSpeed}
		fixes = append(fixes, f)
		speed := ""
		if zeroSpeed {
			speed = `,"speed":0`
		}
		fmt.Fprintf(&b, `{"asset_id":"phone-1","occurred_at":%q,"lat":%.8f,"lon":%.8f,"accuracy":%g%s}`+"\n",
			f.t.Format(time.RFC3339), f.lat, f.lon, acc, speed)
	}
	for i := range 1440 {
		add(i, 3*rng.NormFloat64(), 3*rng.NormFloat64(), 8)
	}
	walking = len(fixes)
	for i := range 60 {
		add(1440+i, 6*float64(i+1)+3*rng.NormFloat64(), 3*rng.NormFloat64(), walkAccuracy)
	}
	return b.String(), fixes, walking
}

// farthestSuppressed replays fixes in sliding at the recommendation and
// returns how far from the last accepted fix the farthest suppressed fix
// from index walking on lies.
func farthestSuppressed(t *testing.T, rec Recommendation, fixes []fixPoint, walking int) float64 {
	t.Helper()
	pol := Options{Radius: rec.RadiusM}.withDefaults().policy(rec.Window)
	pol.Shape = dedup.Sliding
	as := &assetFixes{name: "phone-1", fixes: fixes, parked: make([]bool, len(fixes))}
	var last fixPoint
	farthest := 0.0
	err := replayAsset(dedup.Keyer{Window: rec.Window, Prefix: analyzePrefix}, pol, as,
		func(d *dedup.Deduper, _ int, p ping.Ping) dedup.Observation { return d.Observe(p) },
		func(i int, v dedup.Verdict) {
			if v.Decision == dedup.Accepted {
				last = fixes[i]
				return
			}
			if d := geo.DistanceM(last.lat, last.lon, fixes[i].lat, fixes[i].lon); i >= walking {
				farthest = max(farthest, d)
			}
		})
	if err != nil {
		t.Fatal(err)
	}
	return farthest
}

// README, Sizing from your own traffic, under the output on the two real
// traces: "an RTK-grade fleet alone would get 14 (the finest it
// recommends ...) and the 10 m floor". The RTK-grade fleet in those traces
// is the u-blox F9K car (SOURCES.md: parked for its first 122 s, every fix
// within 0.27 m of the centroid; every later stop within 0.9 m). Analysed
// alone it got resolution 13 and a 24 m radius (lag bound 36 m instead of
// 15 m): its one stationary run was taken as every fix within 25 m of the
// first, so the first seconds of the departure (the car accelerating away,
// 1-25 m from where it stood) were measured as parked jitter (p95 1.8 m,
// p99 18.7 m). (Helper 2's review, stop 65.)
func TestAnRTKCarAloneGetsTheFinestResolutionAndTheRadiusFloor(t *testing.T) {
	fixes, capture := traceCapture(t, nmea.CarTrace, "car")
	rep, err := Analyze(strings.NewReader(capture), Options{})
	if err != nil {
		t.Fatal(err)
	}
	// What was measured as jitter: the run's fixes farther than 1 m from
	// where the car stood, and the speed each reports.
	var departing []string
	for _, f := range fixes[:135] {
		if d := geo.DistanceM(fixes[0].Lat, fixes[0].Lon, f.Lat, f.Lon); d > 1 && d <= 25 {
			departing = append(departing, fmt.Sprintf("%s %.1f m at %.1f m/s", f.Time.Format("15:04:05"), d, f.SpeedMS))
		}
	}
	t.Logf("jitter p50 %.1f p95 %.1f p99 %.1f m over %d fixes in %d runs; fixes of the departure within 25 m: %v",
		rep.Jitter.P50M, rep.Jitter.P95M, rep.Jitter.P99M, rep.Jitter.Samples, rep.Jitter.Runs, departing)
	if rec := rep.Recommended; rec.Resolution != 14 || rec.RadiusM != 10 {
		t.Errorf("an RTK car (parked jitter under 0.3 m) alone is recommended resolution %d and radius %g m (lag bound %g m); "+
			"README: \"an RTK-grade fleet alone would get 14 ... and the 10 m floor\"", rec.Resolution, rec.RadiusM, 1.5*rec.RadiusM)
	}
}

// README, Sizing from your own traffic: analyze "notes a capture most of
// whose fixes come after a later fix of their asset (exported newest first,
// or rotated logs joined newest first ...)". noteBackwardCapture noted it
// only when more than half the fixes were late (lateShare 0.5). Two
// rotated logs of about the same size joined newest first (zcat
// access.log.*.gz with two files; zcat -f access.log access.log.1) make
// half the fixes or fewer late (the older file's): on the stationary Amsterdam trace the
// recommendation widens from 28 m to 37 m (lag bound 55.5 m for 42) and
// no note said why. (Helper 4's review, stop 65.)
func TestTwoRotatedLogsJoinedNewestFirstAreNoted(t *testing.T) {
	_, capture := traceCapture(t, nmea.ParkedTrace, "ams")
	lines := strings.Split(strings.TrimSpace(capture), "\n")
	inOrder, err := Analyze(strings.NewReader(capture), Options{})
	if err != nil {
		t.Fatal(err)
	}
	older := len(lines) * 45 / 100                        // the older file a little smaller than the newer
	joined := slices.Concat(lines[older:], lines[:older]) // access.log.1 (newest) first, then access.log.2
	rep, err := Analyze(strings.NewReader(strings.Join(joined, "\n")+"\n"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Recommended.RadiusM == inOrder.Recommended.RadiusM {
		t.Skipf("the join changed nothing (radius %g m)", rep.Recommended.RadiusM)
	}
	named := slices.ContainsFunc(rep.Notes, func(n string) bool {
		n = strings.ToLower(n)
		return strings.Contains(n, "order") || strings.Contains(n, "newest")
	})
	if !named {
		t.Errorf("two rotated logs joined newest first: recommended radius %g m (in order: %g m), and no note says the capture is out of order; notes: %q",
			rep.Recommended.RadiusM, inOrder.Recommended.RadiusM, rep.Notes)
	}
}

// Overland resends a batch whole unless it is answered {"result":"ok"}
// (SENDERS.md; README, Senders): on a flaky link, where the answer to a
// batch is lost, the same batch arrives twice, in the order the app sent
// it. A capture of such traffic, the very traffic the handler is for, is in
// the order received, and the README says analyze notes a capture "most of
// whose fixes come after a later fix of their asset (exported newest
// first, or rotated logs joined newest first ...; a fifth of its fixes late
// is enough)". With lateShare 0.2 every resent batch's fixes but its last
// count as "late" (they come after the batch's own last fix, sent the
// first time), so a capture where a third of the batches were sent twice
// was told it was exported newest first or joined from rotated logs in the
// wrong order, and to reverse it (tac): reversed, it would be wrong. A
// repeat of a fix already seen is no late fix. (Helper 5's review, stop
// 65.)
func TestResentOverlandBatchesAreNotTakenForABackwardCapture(t *testing.T) {
	lines := overlandBatches(t, 5, func(b int) int {
		if b%3 == 0 {
			return 2 // a lost answer: the app sends the batch again
		}
		return 1
	})
	rep, err := Analyze(strings.NewReader(strings.Join(lines, "\n")+"\n"), presetOptions(t, "overland"))
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(rep.Notes, func(n string) bool { return strings.Contains(n, "come after a later fix") }); i >= 0 {
		t.Errorf("a capture in the order received, 12 Overland batches of which 4 were resent whole (a lost answer), is noted as out of order: %q", rep.Notes[i])
	}
}

// README (analyze): "It notes a capture in which more than a fifth of the
// fixes come after a later fix of their asset (exported newest first ...;
// a fix sent again, as Overland resends a batch, is not counted)". A
// capture exported newest first, of Overland traffic in which the answers
// were lost for a while (each batch sent 5 times, as the app resends a
// batch until it is answered {"result":"ok"}): of the fixes not sent
// again, 11 batches in 12 come after a later fix. The resent copies are
// left out of the late count but kept in the count of fixes, so the share
// was 11/60 and nothing was noted: the capture was replayed backwards.
// (Helper 6's review, stop 65.)
func TestABackwardCaptureWithResentBatchesIsStillNoted(t *testing.T) {
	lines := overlandBatches(t, 6, func(int) int { return 5 }) // answers lost: each batch sent again at each interval
	slices.Reverse(lines)                                      // exported newest first
	rep, err := Analyze(strings.NewReader(strings.Join(lines, "\n")+"\n"), presetOptions(t, "overland"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(rep.Notes, func(n string) bool { return strings.Contains(n, "come after a later fix") }) {
		t.Errorf("a capture exported newest first (11 of its 12 batches' fixes come after a later fix, each batch sent 5 times) is not noted: %q", rep.Notes)
	}
}

// overlandBatches is an iPhone's Overland traffic as received: 12 batches
// of 50 fixes 10 s apart, parked for six and under way for six, each batch
// sent sends(b) times in a row (the app resends a batch until it is
// answered).
func overlandBatches(t *testing.T, seed uint64, sends func(b int) int) []string {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed))
	start := time.Date(2026, 8, 8, 12, 0, 0, 0, time.UTC)
	const lat0, lon0 = 52.52, 13.40
	mPerDegLat, mPerDegLon := 111320.0, 111320.0*math.Cos(lat0*math.Pi/180)
	var lines []string
	i := 0
	for b := range 12 {
		var feats []any
		for range 50 {
			east := 3 * rng.NormFloat64()
			if b >= 6 {
				east += 8 * float64(i-300)
			}
			feats = append(feats, map[string]any{
				"type":     "Feature",
				"geometry": map[string]any{"type": "Point", "coordinates": []float64{lon0 + east/mPerDegLon, lat0 + 3*rng.NormFloat64()/mPerDegLat}},
				"properties": map[string]any{"timestamp": start.Add(time.Duration(i) * 10 * time.Second).Format(time.RFC3339),
					"device_id": "iphone-1", "horizontal_accuracy": 5, "speed": 0},
			})
			i++
		}
		body, err := json.Marshal(map[string]any{"locations": feats})
		if err != nil {
			t.Fatal(err)
		}
		for range sends(b) {
			lines = append(lines, string(body))
		}
	}
	return lines
}
