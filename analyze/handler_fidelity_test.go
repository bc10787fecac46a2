package analyze

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// handlerReplay decides capture as the handler decides requests: each
// line is one request body, split by the Batch splitter, its pings read by
// the Parser and decided in ONE Deduper.ClaimAll (layers.go claim), whose
// accepted claims are settled once the upstream answered.
func handlerReplay(t *testing.T, lines []string, opts Options, w time.Duration, res int) CandidateStats {
	t.Helper()
	opts = opts.withDefaults()
	pol := opts.policy(w)
	var clock time.Time
	d := dedup.Deduper{Store: dedup.NewMemoryStore(0), Keyer: dedup.Keyer{Window: w, Resolution: res, Prefix: analyzePrefix},
		Policy: pol, Now: func() time.Time { return clock }}
	stats := CandidateStats{Resolution: res, Window: w, Suppressed: map[dedup.Reason]int{}}
	for _, line := range lines {
		batch, err := opts.Batch.Split(nil, []byte(line), false)
		if err != nil {
			t.Fatal(err)
		}
		var obs []dedup.Observation
		for _, e := range batch.Elements {
			p, err := opts.Parser.Parse(e, time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			if p.Time.After(clock) {
				clock = p.Time // the request arrives with its newest fix, as a live upload would
			}
			obs = append(obs, d.Observe(p))
		}
		claims, verdicts, err := d.ClaimAll(context.Background(), obs)
		if err != nil {
			t.Fatal(err)
		}
		var accepted []*dedup.Claim
		for j, v := range verdicts {
			stats.Pings++
			if v.Decision != dedup.Accepted {
				stats.Suppressed[v.Reason]++
				continue
			}
			stats.Admitted++
			accepted = append(accepted, claims[j])
		}
		if err := d.Settle(context.Background(), accepted...); err != nil {
			t.Fatal(err)
		}
	}
	return stats
}

// A batch whose pings are not in device-time order is decided by the
// handler in device-time order: Deduper.ClaimAll sorts every request's
// claims ("a sender's offline backlog, shuffled, is then judged like the
// live stream it would have been", dedup/deduper.go), and a
// Transistorsoft SDK with batchSync and locationsOrderDirection DESC (the
// configuration its own HTTP guide shows, HttpEvent.d.ts; Traccar Client
// 9 is that SDK, README Tracker formats), or an offline backlog as
// tools/fleetsim uploads it ("late and shuffled", README, The fleet
// simulator), sends exactly such batches. analyze
// replays every ping one at a time in capture order (analyze.go read ->
// replay.go replayAsset), so for the same capture and the same options its
// candidate table reports other admissions and other reasons than the
// handler decides: here, for each asset's fixes in batches of 30, newest
// first, analyze reports sliding admitting 2670 of 4407 pings where the
// handler admits 1157, session 2039 where it admits 1060, and tumbling
// the same admissions under other reasons (34 redeliveries for 29). The operator compares candidates and sizes the radius (whose own
// replay, radius.go parkedAdmissions, is in capture order too) from
// numbers no handler produces.
// (Helper 1's audit, stop 59: so it was until then; the test holds the fix.)
func TestAnalyzeDecidesABatchInDeviceTimeOrderAsTheHandlerDoes(t *testing.T) {
	// Each asset's pings, in batches of 30, newest first.
	parser := judgedAfterTheFact(Options{}.withDefaults().Parser)
	byAsset := map[string][]string{}
	var assets []string
	for line := range bytes.Lines(testFleet.capture()) {
		p, err := parser.Parse(line, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := byAsset[p.Asset]; !ok {
			assets = append(assets, p.Asset)
		}
		byAsset[p.Asset] = append(byAsset[p.Asset], strings.TrimSpace(string(line)))
	}
	var batches []string
	for _, a := range assets {
		lines := byAsset[a]
		for i := 0; i < len(lines); i += 30 {
			batch := slices.Clone(lines[i:min(i+30, len(lines))])
			slices.Reverse(batch)
			batches = append(batches, "["+strings.Join(batch, ",")+"]")
		}
	}
	capture := strings.Join(batches, "\n") + "\n"
	const res, window = 12, 5 * time.Minute
	for _, shape := range dedup.Shapes {
		t.Run(string(shape), func(t *testing.T) {
			opts := Options{Shape: shape, Resolutions: []int{res}, Windows: []time.Duration{window}}
			got := analyze(t, []byte(capture), opts).Candidates[0]
			want := handlerReplay(t, batches, opts, window, res)
			if got.Pings != want.Pings || got.Admitted != want.Admitted || !maps.Equal(got.Suppressed, want.Suppressed) {
				t.Errorf("analyze reports %d of %d admitted, suppressed %v;\nthe handler admits %d, suppressed %v",
					got.Admitted, got.Pings, got.Suppressed, want.Admitted, want.Suppressed)
			}
		})
	}
}

// Traccar 6's GpxExportProvider (traccar/traccar
// src/main/java/org/traccar/reports/GpxExportProvider.java at
// fbae1c1d8ee0bae7de3c0cc0acbf64df85c1c7d0, the jakarta.inject era) writes
// the document with a PrintWriter and prints device.getName() into <name>
// as it is, unescaped: a device named "Van 3 & 4" (or "<spare>") exports
// a route that is not well-formed XML. README (Traccar's GPX export) says
// analyze reads that export; instead Analyze fails the whole capture with
//
//	reading the GPX document after track point 0: XML syntax error on
//	line 1: invalid character entity & (no semicolon); give the whole file
//	as exported
//
// whose fix is wrong (the whole file was given) and whose cause (the
// device's name) it does not name. The name is not even read.
// (Helper 1's audit, stop 59: so it was until then; the test holds the fix.)
func TestAnalyzeReadsATraccar6GPXOfADeviceWithAnAmpersandInItsName(t *testing.T) {
	gpx := `<?xml version="1.0" encoding="UTF-8"?><gpx version="1.0"><trk><name>Van 3 & 4</name><trkseg>`
	start := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	for i := range 14 {
		gpx += `<trkpt lat="51.47787" lon="-5.0E-4"><ele>46.0</ele><time>` +
			start.Add(time.Duration(i)*30*time.Second).Format(time.RFC3339) + `</time></trkpt>`
	}
	gpx += `</trkseg></trk></gpx>`
	rep, err := Analyze(strings.NewReader(gpx), Options{})
	if err != nil {
		t.Fatalf("Traccar 6's GPX export of a device named \"Van 3 & 4\": %v", err)
	}
	if rep.Pings != 14 {
		t.Errorf("read %d of the 14 track points", rep.Pings)
	}
}

// Two Traccar route exports given together (cat van1.gpx van2.gpx |
// caddy telemetry-dedup analyze -, as README shows cat for the Recorder's
// files of several devices) are two GPX documents, one device each.
// readGPX checks the root only once, then reads every trkpt of the stream,
// the second document's included, as pings of the one asset "gpx"
// (gpx.go readGPX): the two vans become one asset that jumps between
// their places at every point, its jumps counted as moves and replayed
// as departures, and nothing says so (capture 1 lines holding 28
// elements, 28 pings, 1 assets). README says "the whole document is one
// device: export and analyze one device a run".
// (Helper 1's audit, stop 59: so it was until then; the test holds the fix.)
func TestAnalyzeDoesNotMergeTwoGPXExportsIntoOneAsset(t *testing.T) {
	export := func(name string, lon float64) string {
		gpx := `<?xml version="1.0" encoding="UTF-8"?><gpx version="1.0"><trk><name>` + name + `</name><trkseg>`
		start := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
		for i := range 14 {
			gpx += fmt.Sprintf(`<trkpt lat="51.47787" lon="%g"><ele>46.0</ele><time>%s</time></trkpt>`,
				lon+float64(i%3)*0.000002, start.Add(time.Duration(i)*30*time.Second).Format(time.RFC3339))
		}
		return gpx + "</trkseg></trk></gpx>\n"
	}
	rep, err := Analyze(strings.NewReader(export("Van 1", -0.0005)+export("Van 2", 0.05)), Options{})
	if err != nil {
		if !strings.Contains(err.Error(), "more than one GPX document") || !strings.Contains(err.Error(), "each export on its own") {
			t.Errorf("two GPX exports given together: %v; want them refused, saying to analyze each export on its own", err)
		}
		return
	}
	if rep.Assets != 2 {
		t.Errorf("two GPX exports of two vans 3.5 km apart, given together: read as %d asset(s) (%d pings, %d moves), silently",
			rep.Assets, rep.Pings, rep.Moves.Count)
	}
}

// analyze replays a capture "through the production Deduper" (analyze.go
// Analyze; README, Sizing from your own traffic: "what telemetry_dedup
// would admit and suppress and why"), and f3a8e28 says a line's pings are
// now replayed "as the handler decides them". But read() keeps of each
// ping only its time, position, accuracy and speed (fixPoint), and
// replayAsset rebuilds the Ping without Event and State. The handler keys
// an event and a state apart (dedup/key.go: 'e' and 's' parts; markCopies
// and seenField tell a tie apart by them) and admits an event as
// ReasonEvent. With --preset traccar (alarm events, ignition state) a
// parked van whose forwarder posts an SOS alarm and an ignition change
// is admitted 7 times by the handler in tumbling (its 2 windows, its 4
// alarms, the ignition turning on) and 2 times by analyze: the candidate
// table under-reports admissions exactly for the pings an operator most
// needs delivered, and the "event" reason column never appears.
// (Helper 5's review, stop 59: so it was until then; the test holds the fix.)
func TestAnalyzeKeepsEventsAndStatesAsTheHandlerDoes(t *testing.T) {
	preset, err := ping.ParsePreset("traccar")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	var lines []string
	for i := range 60 {
		at := start.Add(time.Duration(i) * 10 * time.Second).Format(time.RFC3339)
		attrs := fmt.Sprintf(`"ignition":%t`, i >= 20)
		if i%15 == 7 {
			attrs += `,"alarm":"sos"`
		}
		lines = append(lines, fmt.Sprintf(`{"device":{"uniqueId":"van-1"},"position":{"deviceTime":%q,"fixTime":%q,"latitude":52.52,"longitude":13.4,"attributes":{%s}}}`,
			at, at, attrs))
	}
	capture := strings.Join(lines, "\n") + "\n"
	for _, shape := range dedup.Shapes {
		t.Run(string(shape), func(t *testing.T) {
			opts := Options{Parser: preset.Parser, Shape: shape, Resolutions: []int{12}, Windows: []time.Duration{5 * time.Minute}}
			got := analyze(t, []byte(capture), opts).Candidates[0]
			want := handlerReplay(t, lines, opts, 5*time.Minute, 12)
			if got.Pings != want.Pings || got.Admitted != want.Admitted || !maps.Equal(got.Suppressed, want.Suppressed) {
				t.Errorf("--preset traccar, a parked van with 4 SOS alarms and an ignition change: analyze reports %d of %d admitted, suppressed %v;\nthe handler admits %d, suppressed %v",
					got.Admitted, got.Pings, got.Suppressed, want.Admitted, want.Suppressed)
			}
		})
	}
}

// f3a8e28 reads Traccar 6's GPX export of a device whose name holds a bare
// & (gpx.go readGPX: Strict = false), because GpxExportProvider prints
// device.getName() into <name> unescaped (handler_fidelity_test.go). The
// same unescaped name with a < not followed by a tag ("LKW <7,5t", a
// truck class German fleets name vehicles by; "Van < 4") is still not
// well-formed even to the non-strict decoder, and the whole export fails:
//
//	reading the GPX document after track point 0: XML syntax error on
//	line 1: invalid XML name: 7; give the whole file as exported
//
// whose advice is wrong (the whole file was given) and which does not
// name the device's name as the cause. README (Traccar's GPX export) says
// analyze reads that export. The name is not even read: analyze could
// escape a "<" that does not open a tag inside <name> before decoding.
// (Helper 5's review, stop 59: so it was until then; the test holds the fix.)
func TestAnalyzeReadsATraccar6GPXOfADeviceWithALessThanInItsName(t *testing.T) {
	for _, name := range []string{"LKW <7,5t", "Van < 4"} {
		gpx := `<?xml version="1.0" encoding="UTF-8"?><gpx version="1.0"><trk><name>` + name + `</name><trkseg>`
		start := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
		for i := range 14 {
			gpx += `<trkpt lat="51.47787" lon="-5.0E-4"><ele>46.0</ele><time>` +
				start.Add(time.Duration(i)*30*time.Second).Format(time.RFC3339) + `</time></trkpt>`
		}
		gpx += `</trkseg></trk></gpx>`
		rep, err := Analyze(strings.NewReader(gpx), Options{})
		if err != nil {
			t.Errorf("Traccar 6's GPX export of a device named %q: %v", name, err)
			continue
		}
		if rep.Pings != 14 {
			t.Errorf("device %q: read %d of the 14 track points", name, rep.Pings)
		}
	}
}

// A capture saved by Windows PowerShell's > is UTF-16: read as UTF-8,
// every line was a malformed ping and the advice pointed at the path
// flags (helper 1's audit, stop 59). It is refused with the conversion.
func TestAnalyzeSaysToConvertAUTF16Capture(t *testing.T) {
	line := `{"asset_id":"veh-1","occurred_at":"2026-03-01T10:00:00Z","lat":52.52,"lon":13.4}` + "\r\n"
	utf16 := []byte{0xff, 0xfe}
	for _, r := range line {
		utf16 = append(utf16, byte(r), 0)
	}
	_, err := Analyze(bytes.NewReader(utf16), Options{})
	if err == nil || !strings.Contains(err.Error(), "UTF-16") || !strings.Contains(err.Error(), "iconv -f UTF-16 -t UTF-8") {
		t.Errorf("a UTF-16 capture: %v; want it refused, saying how to convert it", err)
	}
}

// analyze judges each state field on its own, as the handler does, by
// the parser's state fields: it replayed pings without them, whose fields
// then shared the halves their paths' hashes picked. Under --preset osmand
// (Transistorsoft JSON) location.is_moving and location.alarm, carried by
// every ping, shared one, and a parked phone whose is_moving turned true
// was admitted by the handler but reported suppressed. (Helper 5's review,
// stop 63.)
func TestAnalyzeComparesEachStateFieldAsTheHandlerDoes(t *testing.T) {
	preset, err := ping.ParsePreset("osmand")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	var lines []string
	for i := range 40 {
		at := start.Add(time.Duration(i) * 5 * time.Second).Format(time.RFC3339)
		lines = append(lines, fmt.Sprintf(`{"device_id":"phone-1","location":{"timestamp":%q,"is_moving":%t,"coords":{"latitude":52.52,"longitude":13.4,"accuracy":5,"speed":0}}}`,
			at, i >= 20))
	}
	capture := strings.Join(lines, "\n") + "\n"
	for _, shape := range []dedup.Shape{dedup.Sliding, dedup.Session} {
		t.Run(string(shape), func(t *testing.T) {
			opts := Options{Parser: preset.Parser, Shape: shape, Resolutions: []int{12}, Windows: []time.Duration{5 * time.Minute}}
			got := analyze(t, []byte(capture), opts).Candidates[0]
			want := handlerReplay(t, lines, opts, 5*time.Minute, 12)
			if got.Pings != want.Pings || got.Admitted != want.Admitted || !maps.Equal(got.Suppressed, want.Suppressed) {
				t.Errorf("--preset osmand, a parked phone whose is_moving turns true: analyze reports %d of %d admitted, suppressed %v;\nthe handler admits %d, suppressed %v",
					got.Admitted, got.Pings, got.Suppressed, want.Admitted, want.Suppressed)
			}
		})
	}
}
