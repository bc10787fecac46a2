package telemetrydedup

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/analyze"
)

// With encoding form the handler refuses every JSON body with 400
// (layers.go refuseJSONAsForm; README, encoding: "form, the URL's query
// string, or when the URL has none an application/x-www-form-urlencoded
// body (the OsmAnd protocol; a JSON body there is 400, saying so)").
// analyze --encoding form, which "reads pings with the directive's paths
// and presets ... --encoding" (README, Sizing from your own traffic),
// instead reads every line that starts with { or [ as a JSON ping
// (analyze.go pings: the form parser only for lines that do not), so a
// capture of JSON bodies is sized, replayed and given a recommendation as
// if the handler decided them, where the handler would refuse every one.
// What a user sees: a normal report with 180 pings and "recommended ..."
// for a configuration that answers all of them 400.
// (Helper 1's audit, stop 59: so it was until then; the test holds the fix.)
func TestAnalyzeEncodingFormRefusesJSONLinesAsTheHandler(t *testing.T) {
	var capture strings.Builder
	start := time.Date(2026, 8, 8, 12, 0, 0, 0, time.UTC)
	for i := range 180 {
		fmt.Fprintf(&capture, `{"asset_id":"veh-1","occurred_at":%q,"lat":%.7f,"lon":13.4}`+"\n",
			start.Add(time.Duration(i)*10*time.Second).Format(time.RFC3339), 52.52+float64(i%5)*0.000003)
	}
	out, err := runAnalyzeCmd(t, capture.String(), "--encoding", "form", "-")
	if err == nil {
		t.Errorf("analyze --encoding form sized a capture of JSON bodies, each of which the handler answers 400:\n%s", out)
	}
}

// A capture written with `jq . pings.json > capture.ndjson` (or copied
// from a log that pretty-prints bodies) holds each ping over several
// lines. analyze reads one request body a line (README, Sizing from your
// own traffic: "Capture some pings, one request body a line"), so every
// line is a fragment, and the error a user gets is
//
//	none of the 12 lines is a ping this configuration reads (most skipped
//	as malformed: 12, the first at line 1: the request body is not valid
//	JSON: unexpected end of JSON input (line 1, column 1)); check --preset,
//	--batch, --asset, --time, --lat and --lon against a line of the capture
//	(caddy telemetry-dedup key reads one ping and says why)
//
// which sends the user to the path flags (wrong: they are right) and to
// the key command (which reads the whole pretty-printed ping without
// complaint). The fix is to put one body on each line (jq -c), which the
// message never says, as it does name jq -r .request.uri for an access
// log (command.go noPingsError).
// (Helper 1's audit, stop 59: so it was until then; the test holds the fix.)
func TestAnalyzeSaysToPutOneBodyALineForPrettyPrintedJSON(t *testing.T) {
	var capture strings.Builder
	start := time.Date(2026, 8, 8, 12, 0, 0, 0, time.UTC)
	for i := range 2 {
		fmt.Fprintf(&capture, "{\n  \"asset_id\": \"veh-1\",\n  \"occurred_at\": %q,\n  \"lat\": 52.52,\n  \"lon\": 13.4\n}\n",
			start.Add(time.Duration(i)*10*time.Second).Format(time.RFC3339))
	}
	_, err := runAnalyzeCmd(t, capture.String(), "-")
	if err == nil {
		t.Fatal("no error for a capture of pretty-printed pings")
	}
	msg := err.Error()
	for _, fix := range []string{"jq -c", "one a line", "per line", "several lines", "pretty"} {
		if strings.Contains(msg, fix) {
			return
		}
	}
	t.Errorf("a capture of pretty-printed JSON pings: %v\nwant the error to say that each body must be on one line (e.g. jq -c)", err)
}

// analyze prints a TTL for the recommended window and the given
// --retry-ladder and --outage-margin, but never checks it against what the
// directive requires of a TTL: longer than in_flight_timeout (30 s by
// default; options.go resolvePolicy). For a 1 s tracker (a 10 s window is
// the ten report intervals analyze aims for) and a sender that retries
// within seconds (--retry-ladder "5s 10s" --outage-margin 0s), analyze
// recommends "window 10s" and "ttl 10s (last retry 10s + outage margin
// 0s)" without a word, and that configuration,
// written into the Caddyfile (window 10s, retry_ladder 5s 10s,
// outage_margin 0s, or ttl 10s), does not load: "gives keys a TTL of 10s
// ..., no longer than the default in_flight_timeout 30s".
// (Helper 1's audit, stop 59: so it was until then; the test holds the fix.)
func TestAnalyzesRecommendedTTLLoadsInTheDirective(t *testing.T) {
	var capture strings.Builder
	start := time.Date(2026, 8, 8, 12, 0, 0, 0, time.UTC)
	for i := range 600 { // 10 minutes parked at 1 s
		fmt.Fprintf(&capture, `{"asset_id":"veh-1","occurred_at":%q,"lat":%.7f,"lon":13.4}`+"\n",
			start.Add(time.Duration(i)*time.Second).Format(time.RFC3339), 52.52+float64(i%5)*0.000003)
	}
	out, err := runAnalyzeCmd(t, capture.String(), "--windows", "10s,20s", "--retry-ladder", "5s 10s", "--outage-margin", "0s", "--json", "-")
	if err != nil {
		t.Fatal(err)
	}
	var rep analyze.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	for _, n := range rep.Notes {
		if strings.Contains(n, "in_flight_timeout") {
			return // it said what to change
		}
	}
	margin := caddy.Duration(0)
	h := &Handler{Window: caddy.Duration(rep.Recommended.Window),
		RetryLadder: []caddy.Duration{caddy.Duration(5 * time.Second), caddy.Duration(10 * time.Second)}, OutageMargin: &margin}
	if _, err := h.resolve(); err != nil {
		t.Errorf("analyze recommends window %s, ttl %s (%s) without a note, and the directive refuses it: %v",
			rep.Recommended.Window, rep.Recommended.TTL, rep.Recommended.TTLFrom, err)
	}
	h = &Handler{Window: caddy.Duration(rep.Recommended.Window), TTL: caddy.Duration(rep.Recommended.TTL)}
	if _, err := h.resolve(); err != nil {
		t.Errorf("analyze's ttl %s, written as ttl, is refused too: %v", rep.Recommended.TTL, err)
	}
}

// Overland leaves properties.device_id empty unless the user sets one
// (README, Overland: "every ping would then be 422: take the identity from
// the request instead", asset {http.request.uri.query.device}; Overland's
// own README sample has "device_id": ""). README's Sizing section lists
// `analyze --preset overland overland-bodies.ndjson.gz`, but such a
// capture gives
//
//	none of the 60 elements the 3 lines hold is a ping this configuration
//	reads (most skipped as required: 60, the first at line 1:
//	properties.device_id: the asset id is empty); check --preset, --batch,
//	--asset, --time, --lat and --lon against a line of the capture ...
//
// and the asset the site uses, --asset {http.request.uri.query.device}, is
// refused ("a placeholder template needs a request; give the JSON path of
// an id, or compute the asset yourself"). No path of the body holds an
// id, and nothing says how to "compute the asset": an operator of the
// default app cannot size from the capture at all.
// (Helper 1's audit, stop 59: so it was until then; the test holds the fix.)
func TestAnalyzeSaysHowToSizeOverlandWithoutADeviceID(t *testing.T) {
	var capture strings.Builder
	start := time.Date(2026, 8, 8, 12, 0, 0, 0, time.UTC)
	for b := range 3 {
		var features []string
		for i := range 20 {
			tm := start.Add(time.Duration(b*20+i) * 10 * time.Second)
			features = append(features, fmt.Sprintf(`{"type":"Feature","geometry":{"type":"Point","coordinates":[13.4,%.7f]},`+
				`"properties":{"timestamp":%q,"speed":0,"horizontal_accuracy":10,"device_id":""}}`, 52.52+float64(i%3)*0.000003, tm.Format(time.RFC3339)))
		}
		fmt.Fprintf(&capture, `{"locations":[%s]}`+"\n", strings.Join(features, ","))
	}
	_, err := runAnalyzeCmd(t, capture.String(), "--preset", "overland", "-")
	if err == nil {
		return
	}
	if !strings.Contains(err.Error(), "jq") {
		t.Errorf("an Overland capture of the app's default (no device_id): %v\nwant a fix that works on the capture, as the access-log advice gives one", err)
	}
	_, err = runAnalyzeCmd(t, capture.String(), "--preset", "overland", "--asset", "{http.request.uri.query.device}", "-")
	if err != nil && !strings.Contains(err.Error(), "jq") {
		t.Errorf("the site's own asset template: %v\nwant it to say how to give the capture an asset", err)
	}
}

// The batch-order fault of analyze (analyze/zz_h1_test.go,
// TestAnalyzeDecidesABatchInDeviceTimeOrderAsTheHandlerDoes) seen end to
// end: the same requests, posted to a provisioned handler with shape
// sliding, and given to `analyze --shape sliding` as its capture (one body
// a line). Each body is a batch of 30 fixes newest first, as the
// Transistorsoft SDK posts with locationsOrderDirection DESC. The handler
// decides each batch in device-time order (Deduper.ClaimAll); analyze
// replays the pings in capture order, and its table's "admitted" for the
// same window is not what the handler admitted.
// (Helper 1's audit, stop 59: so it was until then; the test holds the fix.)
func TestAnalyzeAdmitsWhatTheHandlerAdmitsForANewestFirstBatch(t *testing.T) {
	rng := rand.New(rand.NewPCG(59, 1))
	start := time.Now().UTC().Add(-3 * time.Hour).Truncate(time.Minute)
	lat, lon := 52.52, 13.40
	var fixes []string
	add := func(i int, la, lo float64) {
		fixes = append(fixes, fmt.Sprintf(`{"asset_id":"h1-desc","occurred_at":%q,"lat":%.7f,"lon":%.7f}`,
			start.Add(time.Duration(i)*10*time.Second).Format(time.RFC3339), la, lo))
	}
	i := 0
	for cycle := range 3 {
		for range 120 { // 20 min parked, σ 5 m
			add(i, lat+5*rng.NormFloat64()/111_000, lon+5*rng.NormFloat64()/68_000)
			i++
		}
		for range 30 { // 5 min driving north-east, 30 m a fix
			lat, lon = lat+30/111_000.0, lon+float64(cycle+1)*10/68_000.0
			add(i, lat, lon)
			i++
		}
	}
	var bodies []string
	for j := 0; j < len(fixes); j += 30 {
		batch := slices.Clone(fixes[j:min(j+30, len(fixes))])
		slices.Reverse(batch)
		bodies = append(bodies, "["+strings.Join(batch, ",")+"]")
	}

	tt := tableHandler(t, `{"shape":"sliding","key_prefix":"h1desc:"}`)
	before := decisionCountsNow()
	for _, body := range bodies {
		if res := tt.post(body, "application/json", nil); res.status >= 300 {
			t.Fatalf("%d %s", res.status, res.body)
		}
	}
	admitted := 0
	for k, n := range decisionCountsNow().since(before) {
		if strings.HasPrefix(k, "accepted/") {
			admitted += n
		}
	}

	out, err := runAnalyzeCmd(t, strings.Join(bodies, "\n")+"\n", "--shape", "sliding", "--resolutions", "12", "--windows", "5m", "--json", "-")
	if err != nil {
		t.Fatal(err)
	}
	var rep analyze.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if got := rep.Candidates[0]; got.Admitted != admitted {
		t.Errorf("analyze --shape sliding (window 5m) says %d of %d pings admitted, suppressed %v; the handler admitted %d",
			got.Admitted, got.Pings, got.Suppressed, admitted)
	}
}

// f3a8e28 made analyze --encoding form refuse every JSON line with the
// handler's 400 message (analyze.go pings, Options.FormOnly). A Caddy JSON
// access log is exactly such a capture, and the one an OsmAnd site has:
// README (Sizing from your own traffic) and noPingsError tell the user to
// give analyze its URLs (jq -r .request.uri access.log), and
// TestAnalyzeSaysHowToReadCaddysOwnAccessLog holds that advice for
// --preset osmand. With --encoding form beside it (as a site that reads
// only OsmAnd's form pings configures its route), or --encoding form
// alone with the form paths given, each access-log line is now skipped as
// malformed with "the request body is JSON ... send JSON with
// Content-Type: application/json and set encoding auto, which reads it as
// JSON, or encoding json", and the advice is "check --preset, --batch,
// --asset, --time, --lat and --lon": the access-log advice is gone, and
// what the user is told to do (send JSON, switch the encoding) is wrong
// for a log whose URLs hold form pings. noPingsError gives the jq advice
// only for SkipNotAPing; it should give it too when the top reason is the
// JSON-as-form refusal (ping.JSONAsFormError) and the lines look like an
// access log (or whenever every line was a JSON line under FormOnly).
// The first case (--preset osmand --encoding form) gave the jq advice
// before f3a8e28 (checked on f3a8e28^, where its lines were not_a_ping);
// the second was already sent to the path flags (rule required).
// (Helper 5's review, stop 59: so it was until then; the test holds the fix.)
func TestAnalyzeEncodingFormStillSaysHowToReadAnAccessLog(t *testing.T) {
	var log strings.Builder
	start := time.Date(2026, 8, 8, 6, 0, 0, 0, time.UTC)
	for i := range 30 {
		tm := start.Add(time.Duration(i) * 10 * time.Second)
		fmt.Fprintf(&log, `{"level":"info","ts":%d.1,"logger":"http.log.access","msg":"handled request","request":{"remote_ip":"1.2.3.4","proto":"HTTP/1.1","method":"POST","host":"t.example","uri":"/?id=dev1&lat=52.52%03d&lon=13.40%03d&timestamp=%d&hdop=9&speed=0"},"status":200}`+"\n",
			tm.Unix(), i%7, i%5, tm.Unix())
	}
	for _, args := range [][]string{
		{"--preset", "osmand", "--encoding", "form", "-"},
		{"--encoding", "form", "--asset", "id", "--time", "timestamp", "-"},
	} {
		_, err := runAnalyzeCmd(t, log.String(), args...)
		if err == nil || !strings.Contains(err.Error(), "jq -r .request.uri") {
			t.Errorf("analyze %s on Caddy's JSON access log: %v\nwant the error to say how to extract its URLs", strings.Join(args, " "), err)
		}
	}
}

// The fix a skipped ping's error gives is in analyze's words: its flags,
// not the directive's options ("set null_island allow" named an option the
// command does not take; helper 1's audit, stop 59; a form line's "else
// encoding form", helper 4's review, stop 66).
func TestAnalyzeNamesItsFlagsInTheFixesOfSkippedPings(t *testing.T) {
	var capture strings.Builder
	start := time.Date(2026, 8, 8, 12, 0, 0, 0, time.UTC)
	for i := range 60 {
		lat, lon := 52.52+float64(i%5)*0.000003, 13.4
		if i == 7 {
			lat, lon = 0, 0
		}
		at := start.Add(time.Duration(i) * 10 * time.Second).Format(time.RFC3339)
		if i == 9 {
			at = at[:len(at)-1] // no offset
		}
		if i == 11 { // a form line, read without --encoding
			fmt.Fprintf(&capture, "asset_id=veh-1&occurred_at=%s&lat=%v&lon=%v\n", at, lat, lon)
			continue
		}
		fmt.Fprintf(&capture, `{"asset_id":"veh-1","occurred_at":%q,"lat":%v,"lon":%v}`+"\n", at, lat, lon)
	}
	out, err := runAnalyzeCmd(t, capture.String(), "--json", "-")
	if err != nil {
		t.Fatal(err)
	}
	var rep analyze.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	for reason, flag := range map[string]string{"null_island": "--null-island allow", "timezone": "--time-zone Europe/Berlin",
		"malformed": "--preset osmand, else --encoding form"} {
		if first := rep.FirstSkipped[reason]; !strings.Contains(first, flag) {
			t.Errorf("the first ping skipped as %s: %q; want its fix to name %s", reason, first, flag)
		}
	}
}

// A capture of form pings read with --preset osmand --encoding json is told
// the encoding that reads them, not to give the --preset osmand it gave.
// (Helper 5's review, stop 66.)
func TestAnalyzeWithPresetOsmandIsToldTheEncodingOfAFormCapture(t *testing.T) {
	lines := strings.Repeat("id=veh-88&timestamp=2026-08-08T12:00:00Z&lat=52.52&lon=13.40\n", 3)
	_, err := runAnalyzeCmd(t, lines, "--preset", "osmand", "--encoding", "json", "-")
	if err == nil || !strings.Contains(err.Error(), "--encoding auto") || strings.Contains(err.Error(), "give --preset osmand") {
		t.Errorf("analyze --preset osmand --encoding json <form pings>: %v; want it told --encoding auto", err)
	}
	if _, err := runAnalyzeCmd(t, lines, "--preset", "osmand", "--encoding", "auto", "-"); err != nil {
		t.Errorf("with --encoding auto: %v", err)
	}
}

// analyze refuses a UTF-16 capture with "convert it to UTF-8 first: iconv
// ... (in PowerShell: Out-File -Encoding utf8)" (analyze.go notUTF16;
// README, Sizing from your own traffic: "A capture in UTF-16 (as Windows
// PowerShell's > saves text) is an error that gives the conversion").
// Windows PowerShell 5.1, the one whose > writes UTF-16, writes
// Out-File -Encoding utf8 WITH a UTF-8 byte order mark. The converted
// capture then starts with EF BB BF, which analyze reads as part of line 1
// (the handler's rule for a request body), so line 1 is "malformed". For a
// capture of one JSON array (README: "a JSON array of pings" is a line)
// every ping is lost, and the error reads "the body starts with a UTF-8
// byte order mark (EF BB BF), which JSON senders must not write; send it
// without" and "check --preset, --batch, --asset, --time, --lat and --lon",
// advice about senders and flags for a mark its own conversion advice put
// in the file. The GPX reader skipped a file's leading mark; the line
// reader did not. Both now skip it. (Helper 2's review, stop 65.)
func TestACaptureConvertedAsAnalyzeSaysIsRead(t *testing.T) {
	start := time.Date(2026, 8, 8, 12, 0, 0, 0, time.UTC)
	var pings []string
	for i := range 180 {
		pings = append(pings, fmt.Sprintf(`{"asset_id":"veh-1","occurred_at":%q,"lat":%.7f,"lon":13.4}`,
			start.Add(time.Duration(i)*10*time.Second).Format(time.RFC3339), 52.52+float64(i%5)*0.000003))
	}
	capture := "\uFEFF[" + strings.Join(pings, ",") + "]\r\n" // Out-File -Encoding utf8, Windows PowerShell 5.1
	out, err := runAnalyzeCmd(t, capture, "-")
	if err != nil {
		t.Errorf("a capture of one JSON array of 180 pings, saved with Out-File -Encoding utf8 as analyze's UTF-16 error advises "+
			"(Windows PowerShell writes a UTF-8 byte order mark), is refused:\n%v", err)
		return
	}
	if !strings.Contains(out, "180 pings") {
		t.Errorf("want the 180 pings read; got:\n%s", out)
	}
}

// README, Sizing from your own traffic: "--batch off for none, e.g. for
// Overland features one a line, as jq -c '.locations[]' writes them", and
// "The fix each skipped reason's first line gives names the command's
// flags (--time-zone, --null-island allow, --batch, --encoding), not the
// directive's options." A user who extracted the features and forgot the
// flag gets, for exactly that capture, "the body holds no array of pings at
// \"locations\" (batch locations); send the pings as an array there, or set
// batch off for a route whose senders post single pings": the directive's
// option (ping/batch.go), which command.go's asFlags did not rewrite (it
// rewrote only "read as one ping: set batch "). (Helper 2's review, stop
// 65.)
func TestOverlandFeaturesOneALineAreToldTheBatchFlag(t *testing.T) {
	var capture strings.Builder
	start := time.Date(2026, 8, 8, 12, 0, 0, 0, time.UTC)
	for i := range 30 {
		fmt.Fprintf(&capture, `{"type":"Feature","geometry":{"type":"Point","coordinates":[13.4,52.52]},"properties":{"timestamp":%q,"device_id":"phone1"}}`+"\n",
			start.Add(time.Duration(i)*10*time.Second).Format(time.RFC3339))
	}
	_, err := runAnalyzeCmd(t, capture.String(), "--preset", "overland", "-")
	if err == nil {
		t.Fatal("features one a line read with the overland preset's batch: no error")
	}
	if msg := err.Error(); !strings.Contains(msg, "--batch off") || strings.Contains(msg, "set batch off") {
		t.Errorf("Overland features one a line: the fix should name --batch off, not the directive's option; got:\n%v", err)
	}
}
