package telemetrydedup

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// provisioned returns a handler provisioned as Caddy would, with the
// memory store.
func provisioned(tb testing.TB, h *Handler) *Handler {
	tb.Helper()
	tb.Cleanup(forgetIdleMemory) // last: once the handler has let go of the store
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	tb.Cleanup(cancel)
	if err := h.Provision(ctx); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = h.Cleanup() })
	h.logger = zap.NewNop() // as in production, where debug lines are off by default
	return h
}

// serve runs one request through the handler, with next answering 201.
func serve(h *Handler, body []byte) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/telemetry", bytes.NewReader(body))
	repl := caddy.NewReplacer()
	r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
	w := httptest.NewRecorder()
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		w.WriteHeader(http.StatusCreated)
		return nil
	})
	_ = h.ServeHTTP(w, r, next)
	return w
}

// The handler's own cost per request, memory store: a duplicate answered
// here, and a new ping (a new asset, at a new place) passed on and settled.
// Both handlers are provisioned before either runs: go test prints Caddy's
// log lines in the middle of a benchmark's result line otherwise.
func BenchmarkServeHTTP(b *testing.B) {
	at := time.Now().UTC().Add(-time.Minute).Format(time.RFC3339)
	dup := []byte(`{"asset_id":"veh-88","occurred_at":"` + at + `","lat":52.5200087,"lon":13.4049547,"speed_kmh":0}`)
	dupPrefix, newPrefix := "bench-dup:", "bench-new:"
	dupHandler := provisioned(b, &Handler{KeyPrefix: &dupPrefix})
	newHandler := provisioned(b, &Handler{KeyPrefix: &newPrefix})
	fresh, i := make([][]byte, 1<<16), 0 // i goes on across -count's runs: every ping stays new
	b.Run("duplicate", func(b *testing.B) {
		h := dupHandler
		serve(h, dup)
		b.ReportAllocs()
		for b.Loop() {
			if w := serve(h, dup); w.Code != http.StatusOK {
				b.Fatal(w.Code)
			}
		}
	})
	b.Run("new", func(b *testing.B) {
		h := newHandler
		b.ReportAllocs()
		for b.Loop() {
			if i%len(fresh) == 0 { // bodies made ahead: the loop times the handler, not them
				b.StopTimer()
				for j := range fresh {
					fresh[j] = []byte(`{"asset_id":"veh-` + strconv.Itoa(i+j) + `","occurred_at":"` + at + `","lat":52.` +
						strconv.Itoa(5000000+j) + `,"lon":13.4049547,"speed_kmh":0}`)
				}
				b.StartTimer()
			}
			if w := serve(h, fresh[i%len(fresh)]); w.Code != http.StatusCreated {
				b.Fatal(w.Code)
			}
			i++
		}
	})
}
