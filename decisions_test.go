package telemetrydedup

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// The README's Decisions table, answer by answer, with each store: status,
// X-Dedup, X-Dedup-Reason, Retry-After, body, and whether the next handler
// was called.
func TestTheDecisionsTableAnswers(t *testing.T) {
	rdb := redistest.Start(t)
	at := time.Now().UTC().Truncate(5 * time.Minute).Add(-time.Hour)
	p := func(asset string, offset time.Duration, lat, lon float64) string {
		return fmt.Sprintf(`{"asset_id":%q,"occurred_at":%q,"lat":%v,"lon":%v}`, asset, at.Add(offset).Format(time.RFC3339Nano), lat, lon)
	}
	parked := p("veh-88", 0, 52.5200087, 13.4049547)
	stores := map[string]string{
		"memory":     `{"type":"memory"}`,
		"redis":      fmt.Sprintf(`{"type":"redis","url":%q,"timeout":1000000000}`, rdb.URL()),
		"redis down": `{"type":"redis","url":"redis://127.0.0.1:1/0","timeout":20000000,"breaker_failures":1000}`,
	}
	type want struct {
		status     int
		decision   string
		reason     string // "" means the header must be absent
		retryAfter string
		body       string // "" empty; "json" a JSON error body
		forwarded  bool
		field      string
		rule       string
	}
	for _, tt := range []struct {
		name     string
		stores   []string
		options  string
		before   []string
		inFlight []string
		ping     string
		want     want
	}{
		{name: "first sighting", ping: parked, want: want{status: 201, decision: "accepted", forwarded: true}},
		{name: "redelivery", before: []string{parked}, ping: parked, want: want{status: 200, decision: "suppressed", reason: "redelivery"}},
		{name: "re-observation", before: []string{parked}, ping: p("veh-88", 20*time.Second, 52.5200087, 13.4049547),
			want: want{status: 200, decision: "suppressed", reason: "reobservation"}},
		{name: "jitter", before: []string{parked}, ping: p("veh-88", 20*time.Second, 52.5200410, 13.4049920),
			want: want{status: 200, decision: "suppressed", reason: "jitter"}},
		{name: "real movement", before: []string{parked}, ping: p("veh-88", 20*time.Second, 52.5241, 13.4102),
			want: want{status: 201, decision: "accepted", forwarded: true}},
		{name: "another asset", before: []string{parked}, ping: p("veh-91", 0, 52.5200087, 13.4049547),
			want: want{status: 201, decision: "accepted", forwarded: true}},
		{name: "in flight", inFlight: []string{parked}, ping: parked,
			want: want{status: 409, decision: "in_flight", reason: "redelivery", retryAfter: "1", body: "json"}},
		{name: "malformed", ping: `{"asset_id":"veh-88",`, want: want{status: 400, decision: "rejected", body: "json", rule: "malformed"}},
		{name: "too large", options: `"max_body":64`, ping: parked, want: want{status: 413, decision: "rejected", body: "json", rule: "too_large"}},
		{name: "lat 91", ping: p("veh-88", 0, 91, 13.4), want: want{status: 422, decision: "rejected", body: "json", field: "lat", rule: "range"}},
		{name: "naive", ping: `{"asset_id":"veh-88","occurred_at":"2026-08-08T12:00:00","lat":52.5,"lon":13.4}`,
			want: want{status: 422, decision: "rejected", body: "json", field: "occurred_at", rule: "timezone"}},
		{name: "null island", ping: p("veh-88", 0, 0, 0), want: want{status: 422, decision: "rejected", body: "json", field: "lat", rule: "null_island"}},
		{name: "future", ping: p("veh-88", 2*time.Hour, 52.5, 13.4), want: want{status: 422, decision: "rejected", body: "json", field: "occurred_at", rule: "max_future"}},
		{name: "missing", ping: `{"occurred_at":"` + at.Format(time.RFC3339) + `","lat":52.5,"lon":13.4}`,
			want: want{status: 422, decision: "rejected", body: "json", field: "asset_id", rule: "required"}},
		{name: "store down open", stores: []string{"redis down"}, ping: parked, want: want{status: 201, decision: "unchecked", forwarded: true}},
		{name: "store down closed", stores: []string{"redis down"}, options: `"on_store_error":"closed"`, ping: parked,
			want: want{status: 503, decision: "unavailable", retryAfter: "5", body: "json"}},
		{name: "dead letter", stores: []string{"redis"}, options: `"on_invalid":"dead_letter"`, ping: p("veh-88", 0, 91, 13.4),
			want: want{status: 202, decision: "dead_lettered", reason: "range", body: "json", field: "lat", rule: "range"}},
	} {
		names := tt.stores
		if names == nil {
			names = []string{"memory", "redis"}
		}
		for _, name := range names {
			t.Run(tt.name+"/"+name, func(t *testing.T) {
				config := fmt.Sprintf(`{"key_prefix":%q,"store":%s`, "r5:"+t.Name()+":", stores[name])
				if tt.options != "" {
					config += "," + tt.options
				}
				h := tableHandler(t, config+"}")
				for _, b := range tt.before {
					if res := h.post(b, "application/json", nil); res.status >= 300 {
						t.Fatalf("setup: %d %s", res.status, res.body)
					}
				}
				for _, b := range tt.inFlight {
					h.claimInFlight(t, b)
				}
				sent := len(h.upstream)
				res := h.post(tt.ping, "application/json", nil)
				w := tt.want
				forwarded := len(h.upstream) > sent
				if res.status != w.status || res.header.Get("X-Dedup") != w.decision || forwarded != w.forwarded {
					t.Fatalf("got %d X-Dedup %q forwarded %v; want %d %q %v (body %q)", res.status, res.header.Get("X-Dedup"), forwarded, w.status, w.decision, w.forwarded, res.body)
				}
				if forwarded && string(h.upstream[sent]) != tt.ping {
					t.Errorf("upstream got %q, want the body unchanged", h.upstream[sent])
				}
				if got, ok := res.header["X-Dedup-Reason"]; (w.reason == "") != !ok || (ok && got[0] != w.reason) {
					t.Errorf("X-Dedup-Reason %q (present %v), want %q", got, ok, w.reason)
				}
				if got := res.header.Get("Retry-After"); got != w.retryAfter {
					t.Errorf("Retry-After %q, want %q", got, w.retryAfter)
				}
				switch w.body {
				case "":
					if !w.forwarded && res.body != "" {
						t.Errorf("body %q, want empty", res.body)
					}
				case "json":
					var e struct{ Decision, Error, Field, Rule string }
					if err := json.Unmarshal([]byte(res.body), &e); err != nil || !strings.HasPrefix(res.header.Get("Content-Type"), "application/json") {
						t.Fatalf("body %q (Content-Type %q) is not JSON: %v", res.body, res.header.Get("Content-Type"), err)
					}
					if e.Decision != w.decision || e.Error == "" || e.Field != w.field || e.Rule != w.rule {
						t.Errorf("error body %+v, want decision %q field %q rule %q", e, w.decision, w.field, w.rule)
					}
				}
			})
		}
	}
}
