package analyze

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/uber/h3-go/v4"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/geo"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/fleetsim"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// synthFleet describes a synthetic capture with known properties: every
// asset alternates a stationary period (the true position plus Gaussian
// noise of sigmaM per axis, so the radial jitter is Rayleigh) with a
// straight move of stepM per fix, reporting every cadence.
type synthFleet struct {
	assets, cycles  int
	parked, moving  int // fixes per stationary and per moving period
	cadence         time.Duration
	sigmaM, stepM   float64
	redeliveryShare float64 // lines sent twice in a row
	// outlierShare of the parked fixes are multipath outliers, outlierM
	// from the true position in a random direction.
	outlierShare, outlierM float64
	seed                   uint64
}

var synthStart = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

// mPerDegree is the length of a degree of latitude on H3's sphere.
const mPerDegree = geo.EarthRadiusM * math.Pi / 180

// capture returns the fleet's pings as NDJSON, interleaved as a fleet's
// pings arrive: one round of every asset per cadence.
func (f synthFleet) capture() []byte {
	rng := rand.New(rand.NewPCG(f.seed, 0))
	tracks := make([][]ping.Ping, f.assets)
	for a := range tracks {
		tracks[a] = f.track(rng, fmt.Sprintf("veh-%04d", a))
	}
	var buf bytes.Buffer
	for k := range tracks[0] {
		for _, track := range tracks {
			line := pingLine(track[k])
			buf.Write(line)
			if rng.Float64() < f.redeliveryShare {
				buf.Write(line)
			}
		}
	}
	return buf.Bytes()
}

func (f synthFleet) track(rng *rand.Rand, asset string) []ping.Ping {
	lat, lon := 52.3+0.4*rng.Float64(), 13.1+0.6*rng.Float64()
	t := synthStart.Add(time.Duration(rng.IntN(int(f.cadence/time.Second))) * time.Second)
	var track []ping.Ping
	emit := func(parked bool) {
		nLat, nLon := offsetM(lat, lon, f.sigmaM*rng.NormFloat64(), f.sigmaM*rng.NormFloat64())
		if parked && f.outlierShare > 0 && rng.Float64() < f.outlierShare {
			bearing := 2 * math.Pi * rng.Float64()
			nLat, nLon = offsetM(lat, lon, f.outlierM*math.Cos(bearing), f.outlierM*math.Sin(bearing))
		}
		track = append(track, ping.Ping{Asset: asset, Time: t, Lat: nLat, Lon: nLon})
		t = t.Add(f.cadence)
	}
	for range f.cycles {
		for range f.parked {
			emit(true)
		}
		heading := 2 * math.Pi * rng.Float64()
		for range f.moving {
			lat, lon = offsetM(lat, lon, f.stepM*math.Cos(heading), f.stepM*math.Sin(heading))
			emit(false)
		}
	}
	return track
}

// offsetM moves a position north and east by metres.
func offsetM(lat, lon, northM, eastM float64) (float64, float64) {
	return lat + northM/mPerDegree, lon + eastM/(mPerDegree*math.Cos(lat*math.Pi/180))
}

func pingLine(p ping.Ping) []byte {
	return fmt.Appendf(nil, `{"asset_id":%q,"occurred_at":%q,"lat":%.8f,"lon":%.8f,"speed_kmh":0}`+"\n",
		p.Asset, p.Time.Format(time.RFC3339), p.Lat, p.Lon)
}

// testFleet parks 15 minutes and drives 5 at 3 m/s, three times, with
// σ = 2 m: p95 jitter ≈ 4.9 m, between the resolution-13 edge (3.6 m)
// and the resolution-12 edge (9.4 m).
var testFleet = synthFleet{
	assets: 12, cycles: 3, parked: 90, moving: 30,
	cadence: 10 * time.Second, sigmaM: 2, stepM: 30, redeliveryShare: 0.02, seed: 7,
}

func analyze(t *testing.T, capture []byte, opts Options) *Report {
	t.Helper()
	rep, err := Analyze(bytes.NewReader(capture), opts)
	if err != nil {
		t.Fatalf("Analyze: %v", err)
	}
	return rep
}

func TestAnalyzeMeasuresRayleighJitter(t *testing.T) {
	rep := analyze(t, testFleet.capture(), Options{})
	sigma := testFleet.sigmaM
	for _, tt := range []struct {
		name      string
		got, want float64
	}{
		{"p50", rep.Jitter.P50M, sigma * math.Sqrt(2*math.Ln2)},
		{"p95", rep.Jitter.P95M, sigma * math.Sqrt(2*math.Log(20))},
		{"p99", rep.Jitter.P99M, sigma * math.Sqrt(2*math.Log(100))},
	} {
		if math.Abs(tt.got-tt.want) > 0.15*tt.want {
			t.Errorf("%s jitter %.2f m, want %.2f m ± 15%%", tt.name, tt.got, tt.want)
		}
	}
	if want := testFleet.assets * testFleet.cycles; rep.Jitter.Runs != want {
		t.Errorf("%d stationary runs, want one per parking, %d", rep.Jitter.Runs, want)
	}
	if rep.Jitter.Samples < testFleet.assets*testFleet.cycles*testFleet.parked {
		t.Errorf("%d jitter samples, want at least every parked fix", rep.Jitter.Samples)
	}
}

// A receiver that throws multipath outliers (here 5% of its parked fixes,
// 40 m out) still parks in one stationary run per parking: an outlier
// alone does not end a run, so the jitter measured is the receiver's, its
// outliers included, and the radius recommended holds them.
func TestAnalyzeMeasuresJitterThroughMultipathOutliers(t *testing.T) {
	urban := testFleet
	urban.sigmaM, urban.outlierShare, urban.outlierM = 3, 0.05, 40
	rep := analyze(t, urban.capture(), Options{Shape: dedup.Sliding})
	if want := urban.assets * urban.cycles; rep.Jitter.Runs != want {
		t.Errorf("%d stationary runs, want one per parking, %d", rep.Jitter.Runs, want)
	}
	if rep.Jitter.Samples < urban.assets*urban.cycles*urban.parked*9/10 {
		t.Errorf("%d jitter samples of %d parked fixes", rep.Jitter.Samples, urban.assets*urban.cycles*urban.parked)
	}
	if rep.Jitter.P99M < 0.9*urban.outlierM {
		t.Errorf("p99 jitter %.1f m: the %g m outliers were left out", rep.Jitter.P99M, urban.outlierM)
	}
	if rep.Recommended.RadiusM < urban.outlierM {
		t.Errorf("radius %g m does not hold the receiver's %g m outliers", rep.Recommended.RadiusM, urban.outlierM)
	}
}

func TestAnalyzeSwallowedMoves(t *testing.T) {
	rep := analyze(t, testFleet.capture(), Options{})
	if steps := testFleet.assets * testFleet.cycles * (testFleet.moving - 1); rep.Moves.Count < steps {
		t.Errorf("%d real moves, want at least the %d steps between moving fixes", rep.Moves.Count, steps)
	}
	for _, tt := range []struct {
		res      int
		min, max float64
	}{
		{9, 0.6, 1},   // 174 m edges: a 30 m step mostly stays inside
		{14, 0, 0.05}, // 1.3 m edges: every step leaves
	} {
		s := resolutionStats(t, rep, tt.res)
		if s.SwallowedShare < tt.min || s.SwallowedShare > tt.max {
			t.Errorf("resolution %d (%.1f m edge) swallows %.3f of 30 m moves, want [%g, %g]",
				tt.res, s.EdgeM, s.SwallowedShare, tt.min, tt.max)
		}
	}
}

func resolutionStats(t *testing.T, rep *Report, res int) ResolutionStats {
	t.Helper()
	for _, s := range rep.Resolutions {
		if s.Resolution == res {
			return s
		}
	}
	t.Fatalf("no resolution %d in %+v", res, rep.Resolutions)
	return ResolutionStats{}
}

func TestAnalyzeRecommends(t *testing.T) {
	rep := analyze(t, testFleet.capture(), Options{})
	p95 := testFleet.sigmaM * math.Sqrt(2*math.Log(20))
	if h3.HexagonEdgeLengthAvgM(12) < p95 || h3.HexagonEdgeLengthAvgM(13) >= p95 {
		t.Fatalf("the fleet's p95 %.1f m does not single out resolution 12", p95)
	}
	want := Recommendation{
		Resolution: 12, EdgeM: h3.HexagonEdgeLengthAvgM(12),
		RadiusM: 10,              // the floor: 1.25 × the p99 jitter of σ = 2 m is 7.6 m
		Window:  5 * time.Minute, // the smallest candidate of at least 10 × 10 s
		TTL:     6*time.Hour + 30*time.Minute, TTLFrom: "last retry 6h0m0s + outage margin 30m0s",
	}
	// A receiver this good keeps to one admission a window at the base radius.
	if got := rep.Recommended.ParkedAdmissionsPerWindow; got <= 0 || got > maxParkedPerWindow {
		t.Errorf("the replay at the recommended radius admits %.2f parked fixes a window, want (0, %g]", got, maxParkedPerWindow)
	}
	want.ParkedAdmissionsPerWindow = rep.Recommended.ParkedAdmissionsPerWindow
	if rep.Recommended != want {
		t.Errorf("recommended %+v, want %+v", rep.Recommended, want)
	}
	if rep.MedianInterval != testFleet.cadence {
		t.Errorf("median interval %s, want the cadence %s", rep.MedianInterval, testFleet.cadence)
	}
	if len(rep.Notes) != 0 {
		t.Errorf("notes %q, want none", rep.Notes)
	}
	margin := time.Hour
	rep = analyze(t, testFleet.capture(), Options{RetryLadder: []time.Duration{time.Minute, time.Hour}, OutageMargin: &margin})
	if rep.Recommended.TTL != 2*time.Hour {
		t.Errorf("ttl %s from ladder 1m 1h and margin 1h, want 2h", rep.Recommended.TTL)
	}
	// In session, the directive's TTL outlasts session_idle: so does the
	// one recommended.
	rep = analyze(t, testFleet.capture(), Options{Shape: dedup.Session, SessionIdle: 8 * time.Hour})
	if rep.Recommended.TTL != 8*time.Hour {
		t.Errorf("ttl %s with session_idle 8h, want 8h", rep.Recommended.TTL)
	}
}

func TestAnalyzeRecommendationFallbacks(t *testing.T) {
	moving := testFleet
	moving.parked = 0
	sparse := testFleet
	sparse.cadence = 2 * time.Minute
	for _, tt := range []struct {
		name   string
		fleet  synthFleet
		want   func(Recommendation) bool
		noteOn string
	}{
		{"no stationary runs", moving, func(r Recommendation) bool { return r.Resolution == dedup.DefaultResolution }, "no stationary run"},
		{"no window spans ten intervals", sparse, func(r Recommendation) bool { return r.Window == 15*time.Minute }, "largest candidate"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rep := analyze(t, tt.fleet.capture(), Options{})
			if !tt.want(rep.Recommended) {
				t.Errorf("recommended %+v", rep.Recommended)
			}
			if !strings.Contains(strings.Join(rep.Notes, "\n"), tt.noteOn) {
				t.Errorf("notes %q, want one saying %q", rep.Notes, tt.noteOn)
			}
		})
	}
}

// The replay must be the production decision: a plain Deduper fed the
// parsed pings through Keyer.Observe, in capture order and with one store
// for all assets, reaches the same counts.
func TestAnalyzeMatchesADirectReplay(t *testing.T) {
	capture := testFleet.capture()
	const res, window = 12, 5 * time.Minute
	for _, shape := range dedup.Shapes {
		t.Run(string(shape), func(t *testing.T) {
			rep := analyze(t, capture, Options{Shape: shape, Resolutions: []int{res}, Windows: []time.Duration{window}})
			want := directReplay(t, capture, ping.NewParser(), dedup.Policy{Shape: shape, Window: window, SessionIdle: dedup.DefaultSessionIdle, Radius: dedup.DefaultRadius,
				TTL: 24 * time.Hour, InFlightTimeout: dedup.DefaultInFlightTimeout}, res)
			if got := rep.Candidates[0]; !reflect.DeepEqual(got, want) {
				t.Errorf("Analyze %+v\ndirect  %+v", got, want)
			}
		})
	}
}

// A format that carries each fix's accuracy and speed (here the
// directive's accuracy and speed options) has them judged in the replay as
// the stay judges them: a parked phone's fix within its reported accuracy
// is no evidence of a move, and a fix reporting a speed of travel is a
// departure. Replayed as bare positions, the sliding and session counts
// were not what the handler decides on the same capture.
func TestAnalyzeReplaysAccuracyAndSpeed(t *testing.T) {
	cfg := fleetsim.Config{Assets: 6, Duration: time.Hour, Cadence: 5 * time.Second, SigmaM: 8,
		ReportAccuracy: true, ReportSpeed: true, Seed: 7, Start: synthStart}
	var capture bytes.Buffer
	for _, d := range fleetsim.Generate(cfg) {
		for _, p := range d.Pings {
			fmt.Fprintf(&capture, `{"asset_id":%q,"occurred_at":%q,"lat":%.7f,"lon":%.7f,"accuracy":%g,"speed":%g}`+"\n",
				p.Asset, p.Time.Format(time.RFC3339Nano), p.Lat, p.Lon, p.Accuracy, p.Speed)
		}
	}
	parser := ping.NewParser()
	parser.AccuracyPath, parser.SpeedPath, parser.SpeedUnit = "accuracy", "speed", ping.MetresPerSecond
	const res, window = 12, 5 * time.Minute
	for _, shape := range []dedup.Shape{dedup.Sliding, dedup.Session} {
		t.Run(string(shape), func(t *testing.T) {
			rep := analyze(t, capture.Bytes(), Options{Parser: parser, Shape: shape, Resolutions: []int{res}, Windows: []time.Duration{window}})
			want := directReplay(t, capture.Bytes(), parser, dedup.Policy{Shape: shape, Window: window, SessionIdle: dedup.DefaultSessionIdle, Radius: dedup.DefaultRadius,
				TTL: 24 * time.Hour, InFlightTimeout: dedup.DefaultInFlightTimeout}, res)
			if got := rep.Candidates[0]; !reflect.DeepEqual(got, want) {
				t.Errorf("Analyze %+v\ndirect  %+v", got, want)
			}
		})
	}
}

func directReplay(t *testing.T, capture []byte, parser ping.Parser, pol dedup.Policy, res int) CandidateStats {
	t.Helper()
	parser.MaxFuture = math.MaxInt64
	var now time.Time
	d := dedup.Deduper{Store: dedup.NewMemoryStore(0), Keyer: dedup.Keyer{Window: pol.Window, Resolution: res, Prefix: "analyze:"},
		Policy: pol, Now: func() time.Time { return now }}
	stats := CandidateStats{Resolution: res, Window: pol.Window, Suppressed: map[dedup.Reason]int{}}
	for line := range bytes.Lines(capture) {
		p, err := parser.Parse(line, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		now = p.Time
		c, v, err := d.Claim(context.Background(), d.Keyer.Observe(p))
		if err != nil {
			t.Fatal(err)
		}
		stats.Pings++
		if v.Decision != dedup.Accepted {
			stats.Suppressed[v.Reason]++
			continue
		}
		stats.Admitted++
		d.Settle(context.Background(), c)
	}
	stats.SuppressionRatio = float64(stats.Pings-stats.Admitted) / float64(stats.Pings)
	return stats
}

func TestAnalyzeCountsBadLines(t *testing.T) {
	const valid = `{"asset_id":"a","occurred_at":"2026-03-01T00:00:00Z","lat":52.5,"lon":13.4}`
	lines := []struct {
		line, skip string // skip "" means a ping
		elements   int    // the pings the line holds, when not one
	}{
		{valid, "", 0},
		{`{"asset_id":"a","occurred_at":"2100-01-01T00:00:00Z","lat":52.5,"lon":13.4}`, "", 0}, // max_future is ignored
		{"", "", 0}, // blank lines are not counted
		{" \t", "", 0},
		{`not json`, SkipMalformed, 0},
		{`[1, 2]`, SkipMalformed, 2}, // an array's elements are each a ping
		{`{"occurred_at":"2026-03-01T00:00:00Z","lat":52.5,"lon":13.4}`, string(ping.RuleRequired), 0},
		{`{"asset_id":"a","occurred_at":"2026-03-01T00:00:00","lat":52.5,"lon":13.4}`, string(ping.RuleTimezone), 0},
		{`{"asset_id":"a","occurred_at":"2026-03-01T00:00:00Z","lat":91,"lon":13.4}`, string(ping.RuleRange), 0},
		{`{"asset_id":"a","occurred_at":"2026-03-01T00:00:00Z","lat":"52.5","lon":13.4}`, string(ping.RuleType), 0},
		{`{"asset_id":"a","occurred_at":"2026-03-01T00:00:00Z","lat":0,"lon":0}`, string(ping.RuleNullIsland), 0},
		{`{"asset_id":"a","pad":"` + strings.Repeat("x", maxLineBytes) + `"}`, SkipTooLarge, 0},
		{"\xEF\xBB\xBF" + valid, SkipMalformed, 0}, // a byte order mark, as the handler refuses it
		{"[" + valid + "," + valid + "]", "", 2},
		{valid + "\r", "", 0}, // CRLF line ends
		// a line of the OwnTracks Recorder's .rec files: its message follows
		// the time stamp and the padded topic, each ended by a tab
		{"2026-03-01T00:00:00Z\t*                 \t" + valid, "", 0},
		{"2026-03-01T00:00:00Z\t" + valid, SkipMalformed, 0},           // no topic
		{"2026-03-01 00:00:00Z\t*\t" + valid, SkipMalformed, 0},        // not the Recorder's time stamp
		{`"2026-03-01T00:00:00Z\t*\t` + valid + `"`, SkipMalformed, 0}, // a JSON string
		{valid, "", 0}, // the last line has no newline
	}
	var capture []string
	wantLines, wantElements, wantPings, wantSkipped := 0, 0, 0, map[string]int{}
	for _, l := range lines {
		capture = append(capture, l.line)
		if strings.TrimSpace(l.line) == "" {
			continue
		}
		n := max(l.elements, 1)
		wantLines++
		wantElements += n
		if l.skip == "" {
			wantPings += n
		} else {
			wantSkipped[l.skip] += n
		}
	}
	rep := analyze(t, []byte(strings.Join(capture, "\n")), Options{})
	if rep.Lines != wantLines || rep.Elements != wantElements || rep.Pings != wantPings || !reflect.DeepEqual(rep.Skipped, wantSkipped) {
		t.Errorf("%d lines, %d elements, %d pings, skipped %v; want %d, %d, %d, %v",
			rep.Lines, rep.Elements, rep.Pings, rep.Skipped, wantLines, wantElements, wantPings, wantSkipped)
	}
}

func TestAnalyzeWithAPreset(t *testing.T) {
	preset, err := ping.ParsePreset("owntracks")
	if err != nil {
		t.Fatal(err)
	}
	capture := strings.Join([]string{
		`{"_type":"location","tid":"ab","tst":1772323200,"lat":52.52,"lon":13.40}`,
		`{"_type":"card","name":"Alice"}`,
		`{"_type":"location","tid":"ab","tst":1772323210,"lat":52.52,"lon":13.40}`,
		`{"_type":"location","tid":"cd","tst":1772323200,"lat":48.85,"lon":2.35}`,
	}, "\n")
	rep := analyze(t, []byte(capture), Options{Parser: preset.Parser})
	if rep.Pings != 3 || rep.Assets != 2 || rep.Skipped[SkipNotAPing] != 1 {
		t.Errorf("%d pings of %d assets, skipped %v; want 3 pings of 2 assets, one not a ping", rep.Pings, rep.Assets, rep.Skipped)
	}
	if c := rep.Candidates[0]; c.Admitted != 2 || c.Suppressed[dedup.Reobservation] != 1 {
		t.Errorf("candidate %+v, want 2 admitted and the repeated fix a re-observation", c)
	}
}

// The radius of sliding and session sits a quarter above the p99 of the
// measured parked jitter, so a stay holds its receiver's jitter.
func TestAnalyzeRecommendsARadiusAboveTheJitter(t *testing.T) {
	noisy := testFleet
	noisy.sigmaM = 5
	rep := analyze(t, noisy.capture(), Options{Shape: dedup.Sliding})
	p99 := noisy.sigmaM * math.Sqrt(2*math.Log(100)) // Rayleigh
	if r := rep.Recommended.RadiusM; r != math.Ceil(1.25*rep.Jitter.P99M) || r < 1.1*p99 || r > 1.5*p99 {
		t.Errorf("radius %g m for measured p99 %.1f m (true %.1f m)", r, rep.Jitter.P99M, p99)
	}
	moving := testFleet
	moving.parked = 0
	if rep := analyze(t, moving.capture(), Options{}); rep.Recommended.RadiusM != dedup.DefaultRadius {
		t.Errorf("radius %g m without stationary runs, want the default", rep.Recommended.RadiusM)
	}
}

func TestAnalyzeRejectsBadOptions(t *testing.T) {
	for _, tt := range []struct {
		name   string
		opts   Options
		option string
	}{
		{"fractional window", Options{Windows: []time.Duration{1500 * time.Millisecond}}, "window"},
		{"resolution 16", Options{Resolutions: []int{16}}, "resolution"},
		{"ladder not increasing", Options{RetryLadder: []time.Duration{time.Hour, time.Minute}}, "retry_ladder"},
		{"negative radius", Options{Shape: dedup.Sliding, Radius: -3}, "radius"},
		{"unknown shape", Options{Shape: "hopping"}, "shape"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Analyze(strings.NewReader(""), tt.opts)
			var ce *dedup.ConfigError
			if !errors.As(err, &ce) || ce.Option != tt.option {
				t.Errorf("error %v, want a dedup.ConfigError on %s", err, tt.option)
			}
		})
	}
}

func TestAnalyzeTableShowsTheRecommendation(t *testing.T) {
	rep := analyze(t, testFleet.capture(), Options{})
	var out strings.Builder
	if err := rep.WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	for _, want := range []string{"resolution 12 (9.4 m edges)", "radius 10 m", fmt.Sprintf("parked assets' fixes are admitted %.2f times a window", rep.Recommended.ParkedAdmissionsPerWindow), "window 5m0s", "ttl 6h30m0s (last retry 6h0m0s + outage margin 30m0s)", "<- recommended"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q", want)
		}
	}
}

func TestAnalyzeReportJSONRoundTrips(t *testing.T) {
	rep := analyze(t, testFleet.capture(), Options{Shape: dedup.Session})
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&back, rep) {
		t.Errorf("round trip changed the report:\n%s", b)
	}
	for _, key := range []string{`"median_interval_ns":`, `"p95_m":`, `"swallowed_share":`, `"suppression_ratio":`, `"ttl_from":`} {
		if !bytes.Contains(b, []byte(key)) {
			t.Errorf("JSON lacks %s:\n%s", key, b)
		}
	}
}

// A stay on the antimeridian measures as the same stay anywhere else on its
// latitude: its mean position is taken the short way round, not as the
// average of longitudes near +180 and -180 (about 0, half the world away).
func TestAStayOnTheAntimeridianMeasuresAsAnywhereElse(t *testing.T) {
	capture := func(centreLon float64) []byte {
		const lat = 52.0
		perMetre := 1 / (111_320 * math.Cos(lat*math.Pi/180))
		rng := rand.New(rand.NewPCG(3, 4))
		var b bytes.Buffer
		for i := range 240 {
			east := rng.NormFloat64() * 3
			if i == 0 {
				east = -20 // the last fix of the move that parked: off the parking's centre
			}
			lon := geo.WrapLongitude(centreLon + east*perMetre)
			fmt.Fprintf(&b, `{"asset_id":"veh-1","occurred_at":%q,"lat":%.7f,"lon":%.7f}`+"\n",
				synthStart.Add(time.Duration(i)*10*time.Second).Format(time.RFC3339), lat+rng.NormFloat64()*3/111_320, lon)
		}
		return b.Bytes()
	}
	home, seam := analyze(t, capture(13.4), Options{}), analyze(t, capture(180), Options{})
	if home.Jitter.Runs != seam.Jitter.Runs || home.Jitter.Samples != seam.Jitter.Samples || math.Abs(home.Jitter.P95M-seam.Jitter.P95M) > 0.5 {
		t.Errorf("the same stay measured %+v at 13.4° E, %+v on the antimeridian", home.Jitter, seam.Jitter)
	}
}

// A fleet of 1 s trackers beside 30 s phones was sized from statistics
// pooled over fixes, the trackers' thirty to one, without a word: the
// phones then kept most of their parked pings. The report says the fleet
// is mixed; a fleet of one cadence, with its jitter, is not.
func TestAMixedFleetIsNamedInTheNotes(t *testing.T) {
	capture := func(cadences ...time.Duration) []byte {
		var b bytes.Buffer
		for i, cadence := range cadences {
			for tm := time.Duration(0); tm < time.Hour; tm += cadence {
				fmt.Fprintf(&b, `{"asset_id":"a%d","occurred_at":%q,"lat":%.6f,"lon":13.4}`+"\n",
					i, time.Date(2026, 8, 8, 6, 0, 0, 0, time.UTC).Add(tm+time.Duration(i)*time.Second/3).Format(time.RFC3339Nano), 52.52+float64(tm/cadence%3)*0.00001)
			}
		}
		return b.Bytes()
	}
	mixed := func(rep *Report) bool {
		return slices.ContainsFunc(rep.Notes, func(n string) bool { return strings.Contains(n, "very different cadences") })
	}
	if rep := analyze(t, capture(time.Second, time.Second, 30*time.Second, 30*time.Second), Options{}); !mixed(rep) {
		t.Errorf("1 s and 30 s senders: notes %q, want the mix named", rep.Notes)
	}
	if rep := analyze(t, capture(10*time.Second, 12*time.Second, 15*time.Second), Options{}); mixed(rep) {
		t.Errorf("10-15 s senders: notes %q, want no mix named", rep.Notes)
	}
}

// A capture whose stationary run exists but whose every fix reports an
// accuracy worse than 100 m leaves no jitter sample: the notes said there
// was no stationary run, against the report's own count of runs, and
// pointed at the wrong cause.
func TestRunsWithoutJitterAreNotCalledNoRun(t *testing.T) {
	p := ping.NewParser()
	p.AccuracyPath = "acc"
	rep := analyze(t, parksThenDrivesOff(`,"acc":150`), Options{Parser: p.Prepared()})
	if rep.Jitter.Runs == 0 {
		t.Fatalf("setup: no stationary run found")
	}
	for _, n := range rep.Notes {
		if strings.Contains(n, "no stationary run") {
			t.Errorf("runs %d, samples %d, yet the note says: %q", rep.Jitter.Runs, rep.Jitter.Samples, n)
		}
	}
}

// parksThenDrivesOff is a capture of one asset at a 10 s cadence: 100
// fixes at one spot, then driving off at about 5.5 m/s; extra is added to
// each ping's JSON fields.
func parksThenDrivesOff(extra string) []byte {
	var b strings.Builder
	start := time.Date(2026, 8, 8, 6, 0, 0, 0, time.UTC)
	for i := range 200 {
		lat := 52.52
		if i > 100 {
			lat += float64(i-100) * 0.0005
		}
		fmt.Fprintf(&b, `{"asset_id":"a2","occurred_at":"%s","lat":%.7f,"lon":13.4%s}`+"\n",
			start.Add(time.Duration(i)*10*time.Second).Format(time.RFC3339), lat, extra)
	}
	return []byte(b.String())
}
