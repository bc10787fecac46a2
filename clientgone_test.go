package telemetrydedup

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// A sender that hangs up while its request waits for the store is not a
// store failure: the redelivery of a ping the upstream already took must
// not be forwarded "unchecked" (a second copy upstream, and a store error
// counted) just because its sender went away before Redis answered.
func TestSenderHangingUpBeforeTheClaimForwardsNoDuplicate(t *testing.T) {
	rdb := redistest.Start(t)
	for _, shape := range []string{"tumbling", "sliding"} {
		t.Run(shape, func(t *testing.T) {
			tt := tableHandler(t, fmt.Sprintf(`{"key_prefix":"gone:%s:","shape":%q,"near_cache":0,"store":{"type":"redis","url":%q,"timeout":1000000000}}`,
				shape, shape, rdb.URL()))
			body := `{"asset_id":"veh-gone","occurred_at":"` + time.Now().Add(-time.Minute).UTC().Format(time.RFC3339) + `","lat":52.52,"lon":13.40}`
			if res := tt.post(body, "application/json", nil); res.status != http.StatusCreated {
				t.Fatalf("first delivery: %d %s", res.status, res.body)
			}
			time.Sleep(50 * time.Millisecond) // the settlement lands

			// The redelivery, whose sender hangs up while Redis is slow to
			// answer (paused for 300ms, well within the store's timeout).
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			rdb.Pause()
			time.AfterFunc(100*time.Millisecond, cancel)
			resumed := make(chan struct{})
			time.AfterFunc(300*time.Millisecond, func() { rdb.Resume(); close(resumed) })
			defer func() { <-resumed }()
			// Another sender's ping goes first: its batch is the one on its
			// way to Redis, and the redelivery queues behind it, as under load.
			other := make(chan response)
			go func() {
				other <- tt.post(strings.Replace(body, "veh-gone", "veh-other", 1), "application/json", nil)
			}()
			time.Sleep(20 * time.Millisecond)
			defer func() { <-other }()
			r := httptest.NewRequest(http.MethodPost, "/telemetry", strings.NewReader(body)).WithContext(ctx)
			r.Header.Set("Content-Type", "application/json")
			r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, caddyhttp.NewTestReplacer(r)))
			w := httptest.NewRecorder()
			forwarded := 0
			_ = tt.h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				_, _ = io.ReadAll(r.Body)
				forwarded++
				w.WriteHeader(http.StatusCreated)
				return nil
			}))
			if forwarded != 0 {
				t.Fatalf("the redelivery of a delivered ping was forwarded upstream again (X-Dedup %q, reason %q): its sender hanging up was taken for a store failure",
					w.Header().Get("X-Dedup"), w.Header().Get("X-Dedup-Reason"))
			}
		})
	}
}
