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
// lies at most <1.5 radii> m from the last accepted one" (table.go; README,
// Sizing from your own traffic: "The price is the wider lag bound it
// prints"). A capture that reports accuracy (every Overland and OwnTracks
// capture, any --accuracy) is replayed, and decided by the handler, with a
// lag of max(1.5 radii, the fix's accuracy) (dedup/track.go lag2, and the
// stay's radius widened to the fix's accuracy, radius2). A phone parked
// outdoors for 2 h (sigma 3 m, reporting 8 m) that then walks off at
// 1.2 m/s in a street where it reports 40 m: analyze recommends 12 m and
// prints "at most 18 m", and the production Deduper at that radius (as
// analyze replays it) suppresses the walk's fixes up to 37.7 m from the
// last accepted one. The user sized the lag the backend tolerates from a
// figure the recommendation did not keep; a note now says how far such a
// fix may lie. (Helper 2's review, stop 65.)
func TestAFixWiderThanThePrintedLagBoundIsNoted(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	start := time.Date(2026, 8, 8, 12, 0, 0, 0, time.UTC)
	const lat0, lon0 = 52.52, 13.40
	mPerDegLat, mPerDegLon := 111320.0, 111320.0*math.Cos(lat0*math.Pi/180)
	var capture strings.Builder
	var fixes []fixPoint
	add := func(i int, east, north, acc float64) {
		f := fixPoint{t: start.Add(time.Duration(i) * 5 * time.Second), lat: lat0 + north/mPerDegLat, lon: lon0 + east/mPerDegLon, accuracy: acc}
		fixes = append(fixes, f)
		fmt.Fprintf(&capture, `{"asset_id":"phone-1","occurred_at":%q,"lat":%.8f,"lon":%.8f,"accuracy":%g}`+"\n",
			f.t.Format(time.RFC3339), f.lat, f.lon, acc)
	}
	for i := range 1440 { // 2 h parked, 5 s cadence
		add(i, 3*rng.NormFloat64(), 3*rng.NormFloat64(), 8)
	}
	walking := len(fixes)
	for i := range 60 { // 5 min walking east at 1.2 m/s
		add(1440+i, 6*float64(i+1)+3*rng.NormFloat64(), 3*rng.NormFloat64(), 40)
	}
	p := ping.NewParser()
	p.AccuracyPath = "accuracy"
	rep, err := Analyze(strings.NewReader(capture.String()), Options{Parser: p})
	if err != nil {
		t.Fatal(err)
	}
	rec := rep.Recommended
	printed := dedup.LagFactor * rec.RadiusM
	pol := Options{Radius: rec.RadiusM}.withDefaults().policy(rec.Window)
	pol.Shape = dedup.Sliding
	as := &assetFixes{name: "phone-1", fixes: fixes, parked: make([]bool, len(fixes))}
	var last fixPoint
	farthest, farthestAt := 0.0, 0
	err = replayAsset(dedup.Keyer{Window: rec.Window, Prefix: analyzePrefix}, pol, as,
		func(d *dedup.Deduper, _ int, p ping.Ping) dedup.Observation { return d.Observe(p) },
		func(i int, v dedup.Verdict) {
			if v.Decision == dedup.Accepted {
				last = fixes[i]
				return
			}
			if d := geo.DistanceM(last.lat, last.lon, fixes[i].lat, fixes[i].lon); i >= walking && d > farthest {
				farthest, farthestAt = d, i-walking
			}
		})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("recommended radius %g m, printed bound %g m; the walk's farthest suppressed fix (walk fix %d) lies %.1f m from the last accepted one",
		rec.RadiusM, printed, farthestAt, farthest)
	noted := slices.ContainsFunc(rep.Notes, func(n string) bool { return strings.Contains(n, "farther than the") })
	if farthest > printed+0.5 && !noted {
		t.Errorf("analyze prints \"a suppressed ping then lies at most %g m from the last accepted one\" (radius %g m), "+
			"but in sliding at that radius a walking fix reporting 40 m accuracy is suppressed %.1f m from it, and no note says so: %q",
			printed, rec.RadiusM, farthest, rep.Notes)
	}
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

// README, Sizing from your own traffic: analyze notes "fixes whose
// reported accuracy is wider than the printed lag bound (the stay holds
// such a fix by its accuracy, so a suppressed one may lie that far from the
// last accepted one)"; the note itself says "one that reports standing
// still [may lie] up to about 2.8 times it". A fix reporting a speed under
// 0.5 m/s has its accuracy doubled (dedup uncertainty) and √2 of that
// besides (lag2): the printed bound is broken by a fix reporting standing
// still whose accuracy is over about a third of it, not only over it.
// OwnTracks Android and Traccar Client send speed 0 when the fix has none
// (dedup/track.go). A phone parked outdoors (σ 3 m, 8 m accuracy, speed 0)
// walks off reporting 16 m and speed 0: the recommendation prints its lag
// bound, the replay suppresses walking fixes far beyond it, and no note
// said so, since 16 m is under the bound. (Helper 4's review, stop 65.)
func TestAStillFixUnderTheBoundButPastItIsNoted(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	start := time.Date(2026, 8, 8, 12, 0, 0, 0, time.UTC)
	const lat0, lon0 = 52.52, 13.40
	mPerDegLat, mPerDegLon := 111320.0, 111320.0*math.Cos(lat0*math.Pi/180)
	var capture strings.Builder
	var fixes []fixPoint
	add := func(i int, east, north, acc float64) {
		f := fixPoint{t: start.Add(time.Duration(i) * 5 * time.Second), lat: lat0 + north/mPerDegLat, lon: lon0 + east/mPerDegLon,
			accuracy: acc, speed: 0, hasSpeed: true}
		fixes = append(fixes, f)
		fmt.Fprintf(&capture, `{"asset_id":"phone-1","occurred_at":%q,"lat":%.8f,"lon":%.8f,"accuracy":%g,"speed":0}`+"\n",
			f.t.Format(time.RFC3339), f.lat, f.lon, acc)
	}
	for i := range 1440 { // 2 h parked, 5 s cadence
		add(i, 3*rng.NormFloat64(), 3*rng.NormFloat64(), 8)
	}
	walking := len(fixes)
	for i := range 60 { // 5 min walking east at 1.2 m/s, no speed reading (0)
		add(1440+i, 6*float64(i+1)+3*rng.NormFloat64(), 3*rng.NormFloat64(), 16)
	}
	p := ping.NewParser()
	p.AccuracyPath = "accuracy"
	p.SpeedPath = "speed"
	rep, err := Analyze(strings.NewReader(capture.String()), Options{Parser: p})
	if err != nil {
		t.Fatal(err)
	}
	rec := rep.Recommended
	printed := dedup.LagFactor * rec.RadiusM
	pol := Options{Radius: rec.RadiusM}.withDefaults().policy(rec.Window)
	pol.Shape = dedup.Sliding
	as := &assetFixes{name: "phone-1", fixes: fixes, parked: make([]bool, len(fixes))}
	var last fixPoint
	farthest := 0.0
	err = replayAsset(dedup.Keyer{Window: rec.Window, Prefix: analyzePrefix}, pol, as,
		func(d *dedup.Deduper, _ int, p ping.Ping) dedup.Observation { return d.Observe(p) },
		func(i int, v dedup.Verdict) {
			if v.Decision == dedup.Accepted {
				last = fixes[i]
				return
			}
			if d := geo.DistanceM(last.lat, last.lon, fixes[i].lat, fixes[i].lon); i >= walking && d > farthest {
				farthest = d
			}
		})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("radius %g m, printed bound %g m, farthest suppressed walking fix %.1f m; notes %q", rec.RadiusM, printed, farthest, rep.Notes)
	noted := slices.ContainsFunc(rep.Notes, func(n string) bool { return strings.Contains(n, "farther than the") })
	if farthest > printed+0.5 && !noted {
		t.Errorf("analyze prints a lag bound of %g m (radius %g m), but in sliding at that radius a walking fix reporting 16 m "+
			"and speed 0 is suppressed %.1f m from the last accepted one, and no note says so: %q", printed, rec.RadiusM, farthest, rep.Notes)
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
	rng := rand.New(rand.NewPCG(5, 5))
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
				east += 8 * float64(i-300) // under way for the second half
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
		lines = append(lines, string(body))
		if b%3 == 0 { // the answer was lost: the app sends the same batch again
			lines = append(lines, string(body))
		}
	}
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
	rng := rand.New(rand.NewPCG(6, 6))
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
		for range 5 { // answers lost: the same batch, sent again at each interval
			lines = append(lines, string(body))
		}
	}
	slices.Reverse(lines) // exported newest first
	rep, err := Analyze(strings.NewReader(strings.Join(lines, "\n")+"\n"), presetOptions(t, "overland"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(rep.Notes, func(n string) bool { return strings.Contains(n, "come after a later fix") }) {
		t.Errorf("a capture exported newest first (11 of its 12 batches' fixes come after a later fix, each batch sent 5 times) is not noted: %q", rep.Notes)
	}
}
