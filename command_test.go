package telemetrydedup

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/uber/h3-go/v4"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/analyze"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/fixtures"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// run parses args with cmd's flags and runs f, as the caddy binary would.
func run(t *testing.T, cmd *cobra.Command, f func(caddycmd.Flags, *strings.Reader, *bytes.Buffer) (int, error), stdin string, args ...string) (string, error) {
	t.Helper()
	if err := cmd.Flags().Parse(args); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	_, err := f(caddycmd.Flags{FlagSet: cmd.Flags()}, strings.NewReader(stdin), &out)
	return out.String(), err
}

func runKeyCmd(t *testing.T, stdin string, args ...string) (string, error) {
	return run(t, keyCommand(), func(fs caddycmd.Flags, in *strings.Reader, out *bytes.Buffer) (int, error) {
		return runKey(fs, in, out)
	}, stdin, args...)
}

const articlePing = `{"asset_id":"veh-88","occurred_at":"2026-08-08T12:00:00Z","lat":52.5200087,"lon":13.4049547}`

func TestKeyCommandPrintsTheProductionKey(t *testing.T) {
	out, err := runKeyCmd(t, "", articlePing)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"veh-88", "1786190400", "2026-08-08T12:00:00Z", "8c1f1d48945d9ff", "dedup:93978d4cc1c8ffa35f6c00a4a1fc01dd"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	out, err = runKeyCmd(t, `{"position":{"deviceId":7,"fixTime":"2026-08-08T14:00:00.000+0200","latitude":52.5200087,"longitude":13.4049547}}`,
		"--preset", "traccar", "--shape", "sliding", "--key-prefix", "fleet:", "--json", "-")
	if err != nil {
		t.Fatal(err)
	}
	var r keyReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("--json output %q: %v", out, err)
	}
	if r.Asset != "7" || r.Bucket != 1786190400 || !strings.HasPrefix(r.Key, "fleet:") ||
		!strings.HasPrefix(r.StateKey, "fleet:{") || !strings.HasSuffix(r.StateKey, "}:t") || !strings.HasSuffix(r.SeenKey, ":m1786190400") {
		t.Fatalf("key report %+v", r)
	}
}

// --scope keys the ping as a scoped handler does, and no asset id of an
// unscoped handler reaches the same key.
func TestKeyCommandKeysAScopedPing(t *testing.T) {
	keyOf := func(args ...string) string {
		t.Helper()
		out, err := runKeyCmd(t, "", append(args, "--json")...)
		if err != nil {
			t.Fatal(err)
		}
		var r keyReport
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("--json output %q: %v", out, err)
		}
		return r.Key
	}
	truck := func(asset string) string {
		return `{"asset_id":"` + asset + `","occurred_at":"2026-08-08T12:00:00Z","lat":52.5200087,"lon":13.4049547}`
	}
	scoped := keyOf("--scope", "acme.example", truck("truck-2"))
	at := time.Date(2026, 8, 8, 12, 0, 0, 0, time.UTC)
	p := ping.Ping{Asset: dedup.ScopedAsset("acme.example", "truck-2"), Time: at, Lat: 52.5200087, Lon: 13.4049547}
	if want := (dedup.Keyer{Window: dedup.DefaultWindow, Resolution: dedup.DefaultResolution, Prefix: dedup.DefaultKeyPrefix}).Observe(p).Key; scoped != want {
		t.Errorf("--scope acme.example keys truck-2 as %s; the handler keys it %s", scoped, want)
	}
	if forged := keyOf(truck("12:acme.example/truck-2")); forged == scoped {
		t.Errorf("the unscoped asset 12:acme.example/truck-2 has acme's scoped key %s", scoped)
	}
	if unscoped := keyOf(truck("truck-2")); unscoped == scoped {
		t.Error("the scope did not change the key")
	}
}

func TestKeyCommandExplainsAnInvalidPing(t *testing.T) {
	_, err := runKeyCmd(t, "", `{"asset_id":"veh-88","occurred_at":"2026-08-08T12:00:00","lat":52.52,"lon":13.40}`)
	if err == nil || !strings.Contains(err.Error(), "occurred_at") || !strings.Contains(err.Error(), "offset") {
		t.Fatalf("got %v, want the timezone rule on occurred_at", err)
	}
	if _, err := runKeyCmd(t, "", "--asset", "{http.request.host}", articlePing); err == nil {
		t.Fatal("an asset template was accepted without a request")
	}
}

func TestAnalyzeCommand(t *testing.T) {
	var capture strings.Builder
	start := time.Date(2026, 8, 8, 12, 0, 0, 0, time.UTC)
	for a := range 3 {
		for i := range 180 { // 30 minutes at 10 s, parked with ~1 m of jitter
			fmt.Fprintf(&capture, `{"asset_id":"veh-%d","occurred_at":%q,"lat":%.7f,"lon":%.7f}`+"\n",
				a, start.Add(time.Duration(i)*10*time.Second).Format(time.RFC3339), 52.52+float64(a)*0.01+float64(i%5)*0.000003, 13.40+float64(i%3)*0.000004)
		}
	}
	capture.WriteString("not json\n")
	cmd := analyzeCommand()
	out, err := run(t, cmd, func(fs caddycmd.Flags, in *strings.Reader, out *bytes.Buffer) (int, error) {
		return runAnalyze(fs, in, out)
	}, capture.String(), "--windows", "1m,5m", "--retry-ladder", "1m 1h", "--outage-margin", "0s", "-")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"540", "malformed 1", "window 5m0s", "ttl 1h0m0s", "recommended"} {
		if !strings.Contains(out, want) {
			t.Errorf("analyze output lacks %q:\n%s", want, out)
		}
	}
}

// A capture of an OsmAnd tracker's requests, as an access log keeps them
// (query strings, or whole URLs), is read with the osmand preset as the
// directive reads the requests; --encoding json reads none of it, and
// says so instead of recommending a configuration from nothing.
func TestAnalyzeCommandReadsFormPings(t *testing.T) {
	var capture strings.Builder
	start := time.Date(2026, 8, 8, 12, 0, 0, 0, time.UTC)
	for i := range 120 { // 20 minutes at 10 s, parked
		query := fmt.Sprintf("id=86200000000000%d&lat=%.7f&lon=13.4049547&timestamp=%d&accuracy=5",
			i%2, 52.5200087+float64(i%3)*0.000005, start.Add(time.Duration(i)*10*time.Second).Unix())
		if i%4 == 0 {
			query = "http://traccar.example:5055/?" + query
		}
		capture.WriteString(query + "\n")
	}
	analyzeWith := func(flags ...string) (string, error) {
		return run(t, analyzeCommand(), func(fs caddycmd.Flags, in *strings.Reader, out *bytes.Buffer) (int, error) {
			return runAnalyze(fs, in, out)
		}, capture.String(), append(flags, "--json", "-")...)
	}
	var read struct {
		Pings   int            `json:"pings"`
		Skipped map[string]int `json:"skipped"`
	}
	out, err := analyzeWith("--preset", "osmand")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(out), &read); err != nil {
		t.Fatal(err)
	}
	if read.Pings != 120 || len(read.Skipped) > 0 {
		t.Errorf("--preset osmand read %d of 120 form pings, skipped %v", read.Pings, read.Skipped)
	}
	if _, err := analyzeWith("--preset", "osmand", "--encoding", "json"); err == nil ||
		!strings.Contains(err.Error(), "none of the 120 lines") || !strings.Contains(err.Error(), "malformed: 120") {
		t.Errorf("--encoding json on form pings: %v, want it to say none of the 120 lines is a ping, all malformed", err)
	}
}

// Durations in the tools' flags read as the directive reads them, and a 0
// written out is refused, not taken for the default; a negative one is
// refused as negative, whether or not 0 means something.
func TestToolDurationFlagsReadAsTheDirectives(t *testing.T) {
	for _, tt := range []struct {
		command string
		flags   []string
		err     string // "" means accepted
	}{
		{"key", []string{"--window", "0s"}, "--window 0s: must be more than 0"},
		{"key", []string{"--window", "-5m"}, "--window -5m: must not be negative"},
		{"analyze", []string{"--session-idle", "1d", "--outage-margin", "1d", "--shape", "session"}, ""},
		{"analyze", []string{"--session-idle", "0s", "--shape", "session"}, "--session-idle 0s: must be more than 0"},
		{"analyze", []string{"--outage-margin", "0s"}, ""},
		{"analyze", []string{"--outage-margin", "-1h"}, "--outage-margin -1h: must not be negative"},
	} {
		t.Run(tt.command+" "+strings.Join(tt.flags, " "), func(t *testing.T) {
			var err error
			if tt.command == "key" {
				_, err = runKeyCmd(t, "", append(tt.flags, articlePing)...)
			} else {
				_, err = runAnalyzeCmd(t, articlePing+"\n", append(tt.flags, "-")...)
			}
			if tt.err == "" && err != nil || tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)) {
				t.Errorf("got %v, want %q", err, cmp.Or(tt.err, "no error"))
			}
		})
	}
}

func runAnalyzeCmd(t *testing.T, stdin string, args ...string) (string, error) {
	return run(t, analyzeCommand(), func(fs caddycmd.Flags, in *strings.Reader, out *bytes.Buffer) (int, error) {
		return runAnalyze(fs, in, out)
	}, stdin, args...)
}

// --radius and --session-idle are refused where the directive refuses
// radius and session_idle: with a shape that has no use for them, or 0,
// which the directive refuses and the replay would have taken for 25 m.
func TestAnalyzeCommandRefusesShapeFlagsAsTheDirective(t *testing.T) {
	for _, tt := range []struct {
		flags []string
		err   string // "" means accepted
	}{
		{[]string{"--radius", "0", "--shape", "sliding"}, "--radius 0: must be more than 0"},
		{[]string{"--radius", "-5", "--shape", "session"}, "--radius -5: -5m is not a distance"},
		{[]string{"--radius", "30"}, "--radius 30: needs shape sliding or session"},
		{[]string{"--radius", "30", "--shape", "tumbling"}, "--radius 30: needs shape sliding or session"},
		{[]string{"--session-idle", "20m"}, "--session-idle 20m: needs shape session"},
		{[]string{"--session-idle", "20m", "--shape", "sliding"}, "--session-idle 20m: needs shape session"},
		{[]string{"--radius", "30", "--shape", "sliding"}, ""},
		{[]string{"--radius", "25m", "--shape", "sliding"}, ""}, // as the directive writes it (helper 1's review, stop 63)
		{[]string{"--radius", "25 m", "--shape", "sliding"}, `--radius "25 m": use metres`},
		{[]string{"--radius", "30", "--session-idle", "20m", "--shape", "session"}, ""},
		{[]string{"--shape", "sliding"}, ""}, // the default radius
	} {
		t.Run(strings.Join(tt.flags, " "), func(t *testing.T) {
			_, err := runAnalyzeCmd(t, articlePing+"\n", append(tt.flags, "-")...)
			if tt.err == "" && err != nil || tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)) {
				t.Errorf("got %v, want %q", err, cmp.Or(tt.err, "no error"))
			}
		})
	}
}

// analyzeCounts is what an analyze --json run read.
type analyzeCounts struct {
	Lines    int            `json:"lines"`
	Elements int            `json:"elements"`
	Pings    int            `json:"pings"`
	Skipped  map[string]int `json:"skipped"`
}

// A capture line holds what a request body holds, split as the directive
// splits it: Overland's wrapped batches with --preset overland, a JSON
// array, or a wrapper of the site's own with --batch, every element a ping.
func TestAnalyzeCommandReadsBatches(t *testing.T) {
	overland := fixtures.SenderLine(t, "overland/batch_composed.json") // two fixes and a visit record
	var batch struct {
		Locations []json.RawMessage `json:"locations"`
	}
	if err := json.Unmarshal([]byte(overland), &batch); err != nil {
		t.Fatal(err)
	}
	feature := string(batch.Locations[0])
	offline := make([]string, 150) // what the app sends after a while without network
	for i := range offline {
		offline[i] = strings.Replace(feature, "2024-10-24T14:48:38Z",
			time.Date(2024, 10, 24, 15, 0, 0, 0, time.UTC).Add(time.Duration(i)*time.Second).Format(time.RFC3339), 1)
	}
	own := `{"fleet":"north","fixes":[` + articlePing + "," + strings.Replace(articlePing, "12:00:00", "12:00:10", 1) + "]}"
	for _, tt := range []struct {
		name    string
		capture []string
		flags   []string
		want    analyzeCounts
	}{
		{"overland batches", []string{overland, `{"locations":[` + strings.Join(offline, ",") + "]}"}, []string{"--preset", "overland"},
			analyzeCounts{Lines: 2, Elements: 153, Pings: 152, Skipped: map[string]int{"not_a_ping": 1}}},
		{"owntracks array", []string{fixtures.SenderLine(t, "owntracks-android/location_multiple_messages.json")}, []string{"--preset", "owntracks"},
			analyzeCounts{Lines: 1, Elements: 2, Pings: 2}},
		{"a wrapper of the site's own", []string{own, articlePing}, []string{"--batch", "fixes"},
			analyzeCounts{Lines: 2, Elements: 3, Pings: 2, Skipped: map[string]int{"malformed": 1}}},
		{"overland features one a line", []string{feature, feature}, []string{"--preset", "overland", "--batch", "off"},
			analyzeCounts{Lines: 2, Elements: 2, Pings: 2}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runAnalyzeCmd(t, strings.Join(tt.capture, "\n"), append(tt.flags, "--json", "-")...)
			if err != nil {
				t.Fatal(err)
			}
			var got analyzeCounts
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatal(err)
			}
			if len(got.Skipped) == 0 {
				got.Skipped = nil
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("read %+v, want %+v", got, tt.want)
			}
		})
	}
	if _, err := runAnalyzeCmd(t, fixtures.SenderLine(t, "traccar-client-sdk/json_array_body_composed.json"), "--preset", "osmand", "-"); err == nil ||
		!strings.Contains(err.Error(), "none of the 2 elements the 1 line holds") || !strings.Contains(err.Error(), "not_a_ping: 2") {
		t.Errorf("an array of no fixes: %v, want it to count both elements as not a ping", err)
	}
	if _, err := runAnalyzeCmd(t, articlePing, "--batch", "fixes[0]", "-"); err == nil || !strings.Contains(err.Error(), "--batch fixes[0]") {
		t.Errorf("--batch fixes[0]: %v, want it refused as the directive refuses batch fixes[0]", err)
	}
}

// A gzip-compressed capture is read through, from a file or standard input.
func TestAnalyzeCommandReadsAGzipCapture(t *testing.T) {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	for i := range 141 {
		fmt.Fprintf(zw, `{"asset_id":"veh-1","occurred_at":%q,"lat":52.5200087,"lon":13.4049547}`+"\n",
			time.Date(2026, 8, 8, 12, 0, 0, 0, time.UTC).Add(time.Duration(i)*10*time.Second).Format(time.RFC3339))
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "capture.ndjson.gz")
	if err := os.WriteFile(path, gz.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, args := range map[string][]string{"file": {path}, "stdin": {"-"}} {
		t.Run(name, func(t *testing.T) {
			out, err := runAnalyzeCmd(t, gz.String(), append(args, "--json")...)
			if err != nil {
				t.Fatal(err)
			}
			var got analyzeCounts
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatal(err)
			}
			if got.Lines != 141 || got.Pings != 141 {
				t.Errorf("read %+v, want 141 lines and pings", got)
			}
		})
	}
}

// A (0, 0) ping is keyed, and analyzed, with --null-island allow, as a
// site with null_island allow keys it; without, the error says what to
// give.
func TestKeyCommandNullIsland(t *testing.T) {
	const nullIsland = `{"asset_id":"buoy-1","occurred_at":"2026-08-08T12:00:00Z","lat":0,"lon":0}`
	for _, tt := range []struct {
		flags []string
		err   string // "" means keyed
	}{
		{nil, "--null-island allow"},
		{[]string{"--null-island", "reject"}, "--null-island allow"},
		{[]string{"--null-island", "allow"}, ""},
		{[]string{"--null-island", "yes"}, "--null-island yes"},
	} {
		t.Run(strings.Join(tt.flags, " "), func(t *testing.T) {
			out, err := runKeyCmd(t, "", append(tt.flags, nullIsland)...)
			cell := h3.LatLngToCell(h3.NewLatLng(0, 0), dedup.DefaultResolution)
			switch {
			case tt.err == "" && (err != nil || !strings.Contains(out, cell.String())):
				t.Errorf("got %v, %s; want the key of cell %s", err, out, cell)
			case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
				t.Errorf("got %v, want %q", err, tt.err)
			}
			_, err = runAnalyzeCmd(t, nullIsland+"\n", append(tt.flags, "-")...)
			if tt.err == "" && err != nil || tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)) {
				t.Errorf("analyze: got %v, want %q", err, cmp.Or(tt.err, "no error"))
			}
		})
	}
}

// The key command keys a ping as the directive configured the same way
// does: state and event fields (both enter the key), a zone for naive
// timestamps, and a form ping of Traccar's OsmAnd port as a query string,
// a form body or a whole URL.
func TestKeyCommandMatchesTheDirective(t *testing.T) {
	at := time.Now().UTC().Add(-time.Hour).Truncate(time.Second)
	query := fmt.Sprintf("id=862000000000001&lat=52.5200087&lon=13.4049547&timestamp=%d&ignition=true&alarm=sos", at.Unix())
	for _, tt := range []struct {
		name           string
		handler        Handler
		contentType    string
		body, argument string
		flags          []string
	}{
		{"state", Handler{State: []string{"ignition"}}, "application/json",
			`{"asset_id":"veh-1","occurred_at":"` + at.Format(time.RFC3339) + `","lat":52.5200087,"lon":13.4049547,"ignition":true}`, "", []string{"--state", "ignition"}},
		{"event", Handler{Event: []string{"alarm"}}, "application/json",
			`{"asset_id":"veh-1","occurred_at":"` + at.Format(time.RFC3339) + `","lat":52.5200087,"lon":13.4049547,"alarm":"sos"}`, "", []string{"--event", "alarm"}},
		{"time zone", Handler{TimeZone: "Europe/Berlin"}, "application/json",
			`{"asset_id":"veh-1","occurred_at":"` + at.In(mustZone(t, "Europe/Berlin")).Format("2006-01-02T15:04:05") + `","lat":52.5200087,"lon":13.4049547}`, "", []string{"--time-zone", "Europe/Berlin"}},
		{"osmand query string", Handler{Preset: "osmand"}, "application/x-www-form-urlencoded", query, query, []string{"--preset", "osmand"}},
		{"osmand URL", Handler{Preset: "osmand"}, "application/x-www-form-urlencoded", query, "http://traccar.example:5055/?" + query, []string{"--preset", "osmand"}},
		{"a window in days", Handler{Window: caddy.Duration(24 * time.Hour)}, "application/json",
			`{"asset_id":"veh-1","occurred_at":"` + at.Format(time.RFC3339) + `","lat":52.5200087,"lon":13.4049547}`, "", []string{"--window", "1d"}},
		{"null island allowed", Handler{NullIsland: "allow"}, "application/json",
			`{"asset_id":"buoy-1","occurred_at":"` + at.Format(time.RFC3339) + `","lat":0,"lon":0}`, "", []string{"--null-island", "allow"}},
		// The track shapes decide on the asset's state key: the tumbling
		// key is nowhere in the store.
		{"sliding", Handler{Shape: "sliding"}, "application/json",
			`{"asset_id":"veh-1","occurred_at":"` + at.Format(time.RFC3339) + `","lat":52.5200087,"lon":13.4049547}`, "", []string{"--shape", "sliding"}},
		{"session", Handler{Shape: "session"}, "application/json",
			`{"asset_id":"veh-1","occurred_at":"` + at.Format(time.RFC3339) + `","lat":52.5200087,"lon":13.4049547}`, "", []string{"--shape", "session"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			prefix := "dedup:"
			tt.handler.KeyPrefix = &prefix
			h := provisioned(t, &tt.handler)
			r := httptest.NewRequest(http.MethodPost, "/telemetry", strings.NewReader(tt.body))
			r.Header.Set("Content-Type", tt.contentType)
			repl := caddyhttp.NewTestReplacer(r)
			r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
			next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil })
			if err := h.ServeHTTP(httptest.NewRecorder(), r, next); err != nil {
				t.Fatal(err)
			}
			want := repl.ReplaceKnown("{http.telemetry_dedup.key}", "")
			if want == "" || repl.ReplaceKnown("{http.telemetry_dedup.decision}", "") != "accepted" {
				t.Fatalf("the directive did not key the ping: %s", repl.ReplaceKnown("{http.telemetry_dedup.decision} {http.telemetry_dedup.reason}", ""))
			}
			argument := cmp.Or(tt.argument, tt.body)
			out, err := runKeyCmd(t, "", append(tt.flags, "--json", argument)...)
			if err != nil {
				t.Fatal(err)
			}
			var got keyReport
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("--json output %q: %v", out, err)
			}
			if got.Key != want {
				t.Fatalf("key command: %s; the directive keyed the ping %s", got.Key, want)
			}
		})
	}
}

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// A misspelt subcommand is an error, not the help and a success.
func TestUnknownSubcommandFails(t *testing.T) {
	cmd := &cobra.Command{Use: "telemetry-dedup"}
	caddycmd.Commands()["telemetry-dedup"].CobraFunc(cmd)
	cmd.SetArgs([]string{"analyse", "capture.ndjson"})
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "use analyze or key") {
		t.Fatalf("telemetry-dedup analyse: %v, want an unknown subcommand error", err)
	}
}

// analyze with a list flag written out empty silently used the default
// list, as if the flag had not been given.
func TestAnalyzeCommandRefusesEmptyListFlags(t *testing.T) {
	for _, flag := range []string{"--retry-ladder", "--windows"} {
		_, err := runAnalyzeCmd(t, articlePing+"\n", flag, "", "-")
		if err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("%s \"\": got %v, want an error naming %s", flag, err, flag)
		}
	}
}

// key --scope takes the scope's value as it entered the key; given the
// key_scope template itself it printed a key no request ever has, as
// --asset with a template is refused for.
func TestKeyCommandRefusesAScopeTemplate(t *testing.T) {
	_, err := runKeyCmd(t, articlePing, "--scope", "{http.request.host}")
	if err == nil || !strings.Contains(err.Error(), "--scope") {
		t.Errorf("--scope {http.request.host}: got %v, want an error naming --scope", err)
	}
	if _, err := runKeyCmd(t, articlePing, "--scope", "tenant-a.example"); err != nil {
		t.Errorf("--scope with a value: %v", err)
	}
}

// A capture whose timestamps carry no UTC offset is read with --time-zone,
// as the directive reads it with time_zone; without it, the error says to
// give it, not to check the paths, which are right.
func TestAnalyzeCommandSaysToGiveATimeZone(t *testing.T) {
	var capture strings.Builder
	start := time.Date(2026, 8, 8, 12, 0, 0, 0, time.UTC)
	for i := range 30 {
		fmt.Fprintf(&capture, `{"asset_id":"veh-1","occurred_at":%q,"lat":52.5200087,"lon":13.4049547}`+"\n",
			start.Add(time.Duration(i)*10*time.Second).Format("2006-01-02T15:04:05"))
	}
	_, err := runAnalyzeCmd(t, capture.String(), "-")
	if err == nil || !strings.Contains(err.Error(), "timezone: 30") || !strings.Contains(err.Error(), "--time-zone") {
		t.Errorf("naive timestamps without --time-zone: got %v, want the timezone rule and --time-zone named", err)
	}
	if _, err := runAnalyzeCmd(t, capture.String(), "--time-zone", "Europe/Berlin", "-"); err != nil {
		t.Errorf("with --time-zone Europe/Berlin: %v", err)
	}
}

// analyze's error for a capture it reads no ping of named the commonest
// rule ("required") but neither the field (asset_id) nor a line: an
// OwnTracks or Traccar capture given without --preset said only "most
// skipped as required: 180". A capture with a few bad lines said "skipped
// malformed 1" and never which line. The first of each reason is named,
// with its line and what was wrong.
func TestAnalyzeNamesTheFirstLineOfEachSkipAndWhy(t *testing.T) {
	var ot strings.Builder
	start := time.Date(2026, 8, 8, 6, 0, 0, 0, time.UTC)
	for i := range 30 {
		fmt.Fprintf(&ot, `{"_type":"location","tid":"ja","tst":%d,"lat":52.52,"lon":13.40,"acc":12}`+"\n", start.Add(time.Duration(i)*10*time.Second).Unix())
	}
	_, err := runAnalyzeCmd(t, ot.String(), "-") // --preset owntracks forgotten
	if err == nil || !strings.Contains(err.Error(), "asset_id") || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("no ping read: %v; want the missing field (asset_id) and the first line that lacks it", err)
	}

	var plain strings.Builder
	for i := range 30 {
		fmt.Fprintf(&plain, `{"asset_id":"a1","occurred_at":"%s","lat":52.52,"lon":13.40}`+"\n", start.Add(time.Duration(i)*10*time.Second).Format(time.RFC3339))
	}
	plain.WriteString("{not json\n")
	out, err := runAnalyzeCmd(t, plain.String(), "-")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "line 31") {
		t.Errorf("a capture with one malformed line (31) reports:\n%s\nwant the line named, as for GPX", out)
	}
}

// analyze --preset osmand reads the query string or the whole URL an
// OsmAnd tracker requested. The access log of the Caddy this module runs
// in is JSON (the URL at request.uri): every line was skipped as
// not_a_ping, and the error sent the user to --preset and --batch, which
// cannot help. It says how to extract the URLs.
func TestAnalyzeSaysHowToReadCaddysOwnAccessLog(t *testing.T) {
	var log strings.Builder
	start := time.Date(2026, 8, 8, 6, 0, 0, 0, time.UTC)
	for i := range 30 {
		tm := start.Add(time.Duration(i) * 10 * time.Second)
		fmt.Fprintf(&log, `{"level":"info","ts":%d.1,"logger":"http.log.access","msg":"handled request","request":{"remote_ip":"1.2.3.4","proto":"HTTP/1.1","method":"POST","host":"t.example","uri":"/?id=dev1&lat=52.52%03d&lon=13.40%03d&timestamp=%d&hdop=9&speed=0"},"status":200}`+"\n",
			tm.Unix(), i%7, i%5, tm.Unix())
	}
	if _, err := runAnalyzeCmd(t, log.String(), "--preset", "osmand", "-"); err == nil || !strings.Contains(err.Error(), "jq -r .request.uri") {
		t.Errorf("Caddy's JSON access log: %v; want the error to say how to extract its URLs", err)
	}
}

// The advice to extract URLs from a Caddy access log (jq -r .request.uri)
// is given only where URLs hold pings: with --preset owntracks (JSON bodies,
// which an access log does not keep) a capture of transition messages was
// sent down a path that cannot work.
func TestAnalyzeGivesAccessLogAdviceOnlyWhereURLsHoldPings(t *testing.T) {
	var c strings.Builder
	for range 30 {
		c.WriteString(`{"_type":"transition","tid":"ja","tst":1700000000,"lat":52.52,"lon":13.40,"event":"enter","desc":"home","t":"c","wtst":1}` + "\n")
	}
	_, err := runAnalyzeCmd(t, c.String(), "--preset", "owntracks", "-")
	if err == nil {
		t.Fatal("no error")
	}
	if strings.Contains(err.Error(), "jq -r .request.uri") {
		t.Errorf("--preset owntracks (JSON bodies, never URLs): %v; the access-log URL advice cannot help", err)
	}
}

// A phone parked indoors scatters 30 m and says so in its accuracy: analyze
// finds its parked stretches only when it reads that field, as the
// directive's accuracy option does, and sizes the radius from them.
func TestAnalyzeReadsTheAccuracyFlag(t *testing.T) {
	var capture strings.Builder
	start := time.Date(2026, 8, 8, 12, 0, 0, 0, time.UTC)
	for i := range 360 { // an hour at 10 s, scattering 30-60 m around one spot
		angle := float64(i) * 2.4
		d := 30 + float64(i%7)*5
		fmt.Fprintf(&capture, `{"asset_id":"phone-1","occurred_at":%q,"lat":%.7f,"lon":%.7f,"acc":45}`+"\n",
			start.Add(time.Duration(i)*10*time.Second).Format(time.RFC3339),
			52.52+d*math.Sin(angle)/111_320, 13.40+d*math.Cos(angle)/(111_320*math.Cos(52.52*math.Pi/180)))
	}
	var without, with analyze.Report
	for _, tc := range []struct {
		report *analyze.Report
		flags  []string
	}{{&without, nil}, {&with, []string{"--accuracy", "acc"}}} {
		out, err := runAnalyzeCmd(t, capture.String(), append(tc.flags, "--json", "-")...)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(out), tc.report); err != nil {
			t.Fatalf("%s: %v", out, err)
		}
	}
	if without.Jitter.Runs != 0 {
		t.Fatalf("without --accuracy: %d stationary runs within 25 m of a phone scattering 30-60 m; the capture does not test the flag", without.Jitter.Runs)
	}
	if with.Jitter.Runs == 0 || with.Recommended.RadiusM <= 60 {
		t.Errorf("with --accuracy acc: %d runs, radius %g m; want the hour found parked and a radius over its 60 m scatter",
			with.Jitter.Runs, with.Recommended.RadiusM)
	}
}

// The flags that read a ping's accuracy and speed are refused as the
// directive's options are, named as flags.
func TestAnalyzeRefusesReportedFieldFlagsAsTheDirective(t *testing.T) {
	for _, tc := range []struct{ flags []string }{
		{[]string{"--speed-unit", "furlongs"}},
		{[]string{"--accuracy", "fix[0].acc"}},
	} {
		_, err := runAnalyzeCmd(t, articlePing+"\n", append(tc.flags, "-")...)
		if want := tc.flags[0] + " " + tc.flags[1]; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v: got %v, want an error naming %s", tc.flags, err, want)
		}
	}
}

// The README says which of analyze's ping-reading flags key takes: all
// but those it names. key had no --accuracy, --speed or --speed-unit,
// while the README said it took all but --batch: an operator who copied
// an analyze invocation to look up one ping's key was told "unknown flag"
// (helper 3's finding). Each flag the README lists is either key's or
// named as not taken.
func TestKeyCommandTakesAnalyzesPingReadingFlagsTheREADMESays(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	list := regexp.MustCompile(`(?s)It reads pings with the directive's paths and presets \((.*?)\), one request body a line`).FindSubmatch(readme)
	if list == nil {
		t.Fatal("README's analyze section no longer lists its ping-reading flags")
	}
	but := regexp.MustCompile("(?s)with `analyze`'s" + `\s+ping-reading flags but (.*?) \(none of them enters a key\)`).FindSubmatch(readme)
	if but == nil {
		t.Fatal("README's key section no longer says which of analyze's ping-reading flags it leaves out")
	}
	flagsOf := func(text []byte) []string {
		var names []string
		for _, f := range regexp.MustCompile("`--([a-z-]+)`").FindAllSubmatch(text, -1) {
			names = append(names, string(f[1]))
		}
		return names
	}
	flags, notTaken := flagsOf(list[1]), flagsOf(but[1])
	if len(flags) < 10 || len(notTaken) == 0 {
		t.Fatalf("found %d flags in %q and %d left out in %q", len(flags), list[1], len(notTaken), but[1])
	}
	key, analyzeCmd := keyCommand(), analyzeCommand()
	for _, name := range flags {
		if analyzeCmd.Flags().Lookup(name) == nil {
			t.Errorf("README lists --%s among analyze's ping-reading flags, and analyze has no such flag", name)
		}
		if taken := key.Flags().Lookup(name) != nil; taken == slices.Contains(notTaken, name) {
			t.Errorf("README says key takes --%s: %v; key has it: %v", name, !slices.Contains(notTaken, name), taken)
		}
	}
}

// Guard: every flag of analyze is named in the README's section on it,
// and every flag of key in its own section or among the ping-reading flags
// of analyze's that it says key takes; a flag added without a word in the
// README would be found only by --help.
func TestREADMENamesEveryFlagOfTheSubcommands(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	section := func(title string) string {
		_, s, ok := strings.Cut(string(readme), "\n### "+title)
		if !ok {
			t.Fatalf("README has no section ### %s", title)
		}
		s, _, _ = strings.Cut(s, "\n### ")
		return s
	}
	analyzeDoc := section("Sizing from your own traffic: `caddy telemetry-dedup analyze`")
	keyDoc := section("Debugging one key: `caddy telemetry-dedup key`")
	for _, tt := range []struct {
		command string
		flags   *pflag.FlagSet
		doc     string
	}{
		{"analyze", analyzeCommand().Flags(), analyzeDoc},
		{"key", keyCommand().Flags(), keyDoc + analyzeDoc},
	} {
		tt.flags.VisitAll(func(f *pflag.Flag) {
			if !regexp.MustCompile("`--" + regexp.QuoteMeta(f.Name) + "[` ]").MatchString(tt.doc) {
				t.Errorf("README does not name %s --%s (%s)", tt.command, f.Name, f.Usage)
			}
		})
	}
}

// analyze names the flag at fault when the directive's check refuses a
// value (resolveFlags: "--radius, not radius"), but not for its candidate
// lists and its ladder, which are checked later: --windows 0s is refused
// as "window: 0s is not a whole number of seconds ...", --resolutions 16 as
// "resolution: 16 ...", --retry-ladder "5m 1m" as "retry_ladder: ...",
// options of a site the command was never given.
func TestAnalyzeNamesTheListFlagAtFault(t *testing.T) {
	for _, flags := range [][]string{
		{"--windows", "1m,0s"},
		{"--resolutions", "12,16"},
		{"--retry-ladder", "5m 1m"},
	} {
		_, err := runAnalyzeCmd(t, articlePing+"\n", append(flags, "-")...)
		if err == nil {
			t.Errorf("%s %s: no error", flags[0], flags[1])
			continue
		}
		if !strings.Contains(err.Error(), flags[0]) {
			t.Errorf("%s %s: error %q does not name %s", flags[0], flags[1], err, flags[0])
		}
	}
}

// A capture read with the wrong --preset (a site's own {"asset_id":...}
// pings with --preset traccar) is told to check --preset and the paths,
// not Overland's recipe for a capture without device_id, which it was
// told whatever the preset. (Helper 1's review, stop 63.)
func TestAnalyzeWithTheWrongPresetIsNotToldOverlandsRecipe(t *testing.T) {
	var capture strings.Builder
	start := time.Date(2026, 8, 8, 12, 0, 0, 0, time.UTC)
	for i := range 60 {
		fmt.Fprintf(&capture, `{"asset_id":"veh-1","occurred_at":%q,"lat":52.52,"lon":13.40}`+"\n", start.Add(time.Duration(i)*10*time.Second).Format(time.RFC3339))
	}
	_, err := runAnalyzeCmd(t, capture.String(), "--preset", "traccar", "-")
	if err == nil || strings.Contains(err.Error(), "Overland") || !strings.Contains(err.Error(), "check --preset") {
		t.Errorf("--preset traccar over a capture of {\"asset_id\":...} pings: %v; want the advice to check --preset, not Overland's", err)
	}
}

// The key command given a whole Overland body, as the app posts it, says
// it is a batch and how to give one ping of it: it said the ping had no
// properties.device_id, though the batch's ping has one. (Helper 1's
// review, stop 63.)
func TestTheKeyCommandSaysToGiveOnePingOfABatch(t *testing.T) {
	// A FeatureCollection was keyed as one Feature, and said "id: missing",
	// where the site says the body is a collection of pings in features.
	// (Helper 4's review, stop 66.)
	for _, tt := range []struct{ preset, body, member string }{
		{"overland", `{"locations":[{"type":"Feature","geometry":{"type":"Point","coordinates":[13.4049547,52.5200087]},` +
			`"properties":{"device_id":"phone1","timestamp":"2026-08-08T12:00:00Z"}}]}`, "locations"},
		{"geojson", `{"type":"FeatureCollection","features":[{"type":"Feature","geometry":{"type":"Point","coordinates":[13.4049547,52.5200087]},` +
			`"properties":{"id":"veh-88","time":"2026-08-08T12:00:00Z"}}]}`, "features"},
	} {
		_, err := runKeyCmd(t, "", "--preset", tt.preset, tt.body)
		if want := "jq -c '." + tt.member + "[0]'"; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("key --preset %s <a batch in %s>: %v; want it told to give one element of %s", tt.preset, tt.member, err, tt.member)
		}
	}
}

// The key command's errors give their fixes in its own flags, not in the
// directive's options, which it does not take: the parser's messages
// passed through named time_zone and encoding form. And under --encoding
// form a JSON body is refused, as the directive with encoding form
// refuses it, rather than keyed. (Helper 4's review, stop 66.)
func TestTheKeyCommandNamesItsOwnFlagsInItsFixes(t *testing.T) {
	for _, tt := range []struct {
		name        string
		args        []string
		want, never string
	}{
		{"a timestamp without an offset", []string{`{"asset_id":"veh-88","occurred_at":"2026-08-08T12:00:00","lat":52.52,"lon":13.40}`},
			"--time-zone Europe/Berlin", "time_zone Europe/Berlin"},
		{"a form ping read as JSON", []string{"asset_id=veh-88&occurred_at=2026-08-08T12:00:00Z&lat=52.52&lon=13.40"},
			"--preset osmand, else --encoding form", " encoding form"},
		// The command reads no request: no Content-Type to send (helper 5's review).
		{"a JSON ping under --encoding form", []string{"--encoding", "form", articlePing},
			"--encoding auto", "Content-Type"},
		// Keyed as form fields, "asset_id: missing" (helper 5's review).
		{"a JSON array under --encoding form", []string{"--encoding", "form", "[" + articlePing + "]"},
			"--encoding auto", "missing"},
		// Told to give the --preset osmand it gave (helper 5's review).
		{"a form ping under --preset osmand --encoding json", []string{"--preset", "osmand", "--encoding", "json",
			"id=veh-88&timestamp=2026-08-08T12:00:00Z&lat=52.52&lon=13.40"}, "--encoding auto", "give --preset osmand"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runKeyCmd(t, "", tt.args...)
			if err == nil {
				t.Fatalf("keyed:\n%s", out)
			}
			if msg := err.Error(); !strings.Contains(msg, tt.want) || strings.Contains(msg, tt.never) {
				t.Errorf("%v\nwant it to name %q, never %q", err, tt.want, tt.never)
			}
		})
	}
}
