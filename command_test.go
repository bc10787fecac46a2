package telemetrydedup

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/spf13/cobra"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
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
// written out is refused, not taken for the default.
func TestToolDurationFlagsReadAsTheDirectives(t *testing.T) {
	if _, err := runKeyCmd(t, "", "--window", "0s", articlePing); err == nil || !strings.Contains(err.Error(), "--window 0s: must be more than 0") {
		t.Errorf("key --window 0s: %v, want it refused", err)
	}
	analyzeWith := func(flags ...string) error {
		_, err := run(t, analyzeCommand(), func(fs caddycmd.Flags, in *strings.Reader, out *bytes.Buffer) (int, error) {
			return runAnalyze(fs, in, out)
		}, articlePing+"\n", append(flags, "-")...)
		return err
	}
	if err := analyzeWith("--session-idle", "1d", "--outage-margin", "1d"); err != nil {
		t.Errorf("analyze with durations in days: %v", err)
	}
	if err := analyzeWith("--session-idle", "0s"); err == nil || !strings.Contains(err.Error(), "--session-idle 0s") {
		t.Errorf("analyze --session-idle 0s: %v, want it refused", err)
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
