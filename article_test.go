package telemetrydedup

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// The article's four verification tests, at the HTTP edge, with its exact
// pings (BASE = 2026-08-08T12:00:00Z), against each store: keys (from the
// key placeholder) and the answers.
func TestTheArticlesVerificationAtTheEdge(t *testing.T) {
	rdb := redistest.Start(t)
	stores := map[string]string{
		"memory": `{"type":"memory"}`,
		"redis":  fmt.Sprintf(`{"type":"redis","url":%q,"timeout":1000000000}`, rdb.URL()),
	}
	pingAt := func(asset, at string, lat, lon float64) string {
		return fmt.Sprintf(`{"asset_id":%q,"occurred_at":%q,"lat":%v,"lon":%v}`, asset, at, lat, lon)
	}
	const base, base20 = "2026-08-08T12:00:00Z", "2026-08-08T12:00:20Z"
	a := pingAt("veh-88", base, 52.5200087, 13.4049547)
	for name, st := range stores {
		for _, tt := range []struct {
			name     string
			b        string
			sameKey  bool
			decision string
			reason   string
		}{
			{"redelivery collapses", pingAt("veh-88", base, 52.5200087, 13.4049547), true, "suppressed", "redelivery"},
			{"jitter while parked collapses", pingAt("veh-88", base20, 52.5200410, 13.4049920), true, "suppressed", "jitter"},
			{"real movement is admitted", pingAt("veh-88", base20, 52.5241000, 13.4102000), false, "accepted", ""},
			{"two assets never share a key", pingAt("veh-91", base, 52.5200087, 13.4049547), false, "accepted", ""},
		} {
			t.Run(name+"/"+tt.name, func(t *testing.T) {
				prefix := "r5art:" + t.Name() + ":"
				h := tableHandler(t, fmt.Sprintf(`{"key_prefix":%q,"store":%s}`, prefix, st)).h
				send := func(body string) (*httptest.ResponseRecorder, string) {
					r := httptest.NewRequest(http.MethodPost, "/telemetry", strings.NewReader(body))
					repl := caddyhttp.NewTestReplacer(r)
					r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
					w := httptest.NewRecorder()
					next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { w.WriteHeader(201); return nil })
					if err := h.ServeHTTP(w, r, next); err != nil {
						t.Fatal(err)
					}
					return w, repl.ReplaceAll("{http.telemetry_dedup.key}", "")
				}
				wa, ka := send(a)
				if wa.Code != 201 || wa.Header().Get("X-Dedup") != "accepted" {
					t.Fatalf("a: %d %q %s", wa.Code, wa.Header().Get("X-Dedup"), wa.Body)
				}
				if want := prefix + "93978d4cc1c8ffa35f6c00a4a1fc01dd"; ka != want {
					t.Fatalf("key of a %q, want the article's %q", ka, want)
				}
				wb, kb := send(tt.b)
				if (ka == kb) != tt.sameKey {
					t.Errorf("keys %q and %q: same %v, want %v", ka, kb, ka == kb, tt.sameKey)
				}
				wantStatus := 201
				if tt.decision == "suppressed" {
					wantStatus = 200
				}
				if wb.Code != wantStatus || wb.Header().Get("X-Dedup") != tt.decision || wb.Header().Get("X-Dedup-Reason") != tt.reason {
					t.Errorf("b: %d %q %q, want %d %q %q", wb.Code, wb.Header().Get("X-Dedup"), wb.Header().Get("X-Dedup-Reason"), wantStatus, tt.decision, tt.reason)
				}
			})
		}
	}
}
