package telemetrydedup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
)

// landedButTimedOut writes every claim and then says the call timed out: a
// SET NX that lands after its caller gave up.
type landedButTimedOut struct{ dedup.Store }

func (s landedButTimedOut) Decide(ctx context.Context, claims []*dedup.Claim) ([]dedup.Verdict, error) {
	s.Store.Decide(ctx, claims)
	return nil, context.DeadlineExceeded
}

// What becomes of a claim whose store call timed out after writing it
// depends on what became of its request: released when nothing reached the
// upstream or the upstream failed (the retry is accepted), settled when the
// upstream took it (the redelivery is suppressed), as release_on_failure
// says for an accepted claim.
func TestUnsureClaimsFollowTheRequestsOutcome(t *testing.T) {
	for _, tt := range []struct {
		name, options string
		upstream      int
		answered      int
		outcome       dedup.ReconcileOutcome
		redelivery    string
	}{
		{"closed: 503, nothing forwarded", `"on_store_error":"closed"`, http.StatusCreated, http.StatusServiceUnavailable, dedup.ReconcileReleased, "accepted"},
		{"closed, release off: still nothing forwarded", `"on_store_error":"closed","release_on_failure":false`, http.StatusCreated, http.StatusServiceUnavailable, dedup.ReconcileReleased, "accepted"},
		{"open, the upstream took it", `"on_store_error":"open"`, http.StatusCreated, http.StatusCreated, dedup.ReconcileSettled, "suppressed"},
		{"open, the upstream failed", `"on_store_error":"open"`, http.StatusBadGateway, http.StatusBadGateway, dedup.ReconcileReleased, "accepted"},
		{"open, the upstream failed, release off", `"on_store_error":"open","release_on_failure":false`, http.StatusBadGateway, http.StatusBadGateway, dedup.ReconcileSettled, "suppressed"},
		{"shadow, the upstream took it", `"mode":"shadow"`, http.StatusCreated, http.StatusCreated, dedup.ReconcileSettled, "would_suppress"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := new(Handler)
			if err := json.Unmarshal([]byte(`{"key_prefix":"unsure:`+tt.name+`:",`+tt.options+`}`), h); err != nil {
				t.Fatal(err)
			}
			h = provisioned(t, h)
			store := dedup.NewMemoryStore(0)
			outcomes := make(chan dedup.ReconcileOutcome, 10)
			h.reconciler = dedup.NewReconciler(store, 0, func(o dedup.ReconcileOutcome, _ int) { outcomes <- o })
			t.Cleanup(func() { h.reconciler.Close() })
			h.deduper.Store = landedButTimedOut{store}

			body := `{"asset_id":"veh-1","occurred_at":"` + time.Now().Add(-time.Minute).UTC().Format(time.RFC3339) + `","lat":52.52,"lon":13.40}`
			if got := serveWith(h, body, tt.upstream); got.Code != tt.answered || got.Header().Get("X-Dedup") != string(h.settings.onStoreError) {
				t.Fatalf("the request whose claim timed out: %d %s", got.Code, got.Header().Get("X-Dedup"))
			}
			select {
			case o := <-outcomes:
				if o != tt.outcome {
					t.Fatalf("the claim was %s, want %s", o, tt.outcome)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the claim was never reconciled")
			}
			h.deduper.Store = store // the store answers again
			if got := serveWith(h, body, http.StatusCreated).Header().Get("X-Dedup"); got != tt.redelivery {
				t.Fatalf("the redelivery: %s, want %s", got, tt.redelivery)
			}
		})
	}
}

// serveWith runs one request through h, next answering upstream.
func serveWith(h *Handler, body string, upstream int) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/telemetry", strings.NewReader(body))
	r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, caddy.NewReplacer()))
	w := httptest.NewRecorder()
	_ = h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		w.WriteHeader(upstream)
		return nil
	}))
	return w
}

// The upstream request of a claimed ping carries a deadline: in_flight_timeout
// after the claim, less the time a release may take, so that the claim is
// finished before it counts as settled.
func TestClaimedUpstreamRequestsAreBounded(t *testing.T) {
	h := provisioned(t, &Handler{InFlightTimeout: caddy.Duration(2 * time.Second)})
	var deadline time.Time
	var bounded bool
	start := time.Now()
	r := httptest.NewRequest(http.MethodPost, "/telemetry", strings.NewReader(
		`{"asset_id":"veh-bound","occurred_at":"`+time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)+`","lat":52.52,"lon":13.40}`))
	r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, caddy.NewReplacer()))
	var claimedBy time.Time // the claim was made between start and this
	_ = h.ServeHTTP(httptest.NewRecorder(), r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		claimedBy = time.Now()
		deadline, bounded = r.Context().Deadline()
		w.WriteHeader(http.StatusCreated)
		return nil
	}))
	// The memory store: nothing to wait for but the 100ms margin.
	bound := 2*time.Second - finishMargin
	if !bounded || deadline.Before(start.Add(bound)) || deadline.After(claimedBy.Add(bound)) {
		t.Fatalf("the upstream request's deadline is %v after the request came (set: %v), want %v after its claim", deadline.Sub(start), bounded, bound)
	}
}

// The in_flight gauge counts the accepted pings waiting for the upstream,
// as the decisions count them: a batch of three is three.
func TestInFlightCountsPingsNotRequests(t *testing.T) {
	prefix := "in-flight-pings:"
	h := provisioned(t, &Handler{KeyPrefix: &prefix})
	at := time.Now().Add(-time.Minute).UTC()
	var batch []string
	for i := range 3 {
		batch = append(batch, `{"asset_id":"veh-`+string(rune('a'+i))+`","occurred_at":"`+at.Format(time.RFC3339)+`","lat":52.52,"lon":13.40}`)
	}
	r := httptest.NewRequest(http.MethodPost, "/telemetry", strings.NewReader("["+strings.Join(batch, ",")+"]"))
	r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, caddy.NewReplacer()))
	before := inFlightNow(t)
	var during float64
	_ = h.ServeHTTP(httptest.NewRecorder(), r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		during = inFlightNow(t)
		w.WriteHeader(http.StatusCreated)
		return nil
	}))
	if during-before != 3 || inFlightNow(t) != before {
		t.Fatalf("in_flight went %v -> %v -> %v for a batch of 3, want +3 while it waits, and back", before, during, inFlightNow(t))
	}
}

func inFlightNow(t *testing.T) float64 {
	var m dto.Metric
	if err := metrics.inFlight.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

// The upstream request of a claimed ping keeps the request's values (the
// replacer reverse_proxy's header_up reads), outlives the sender's hang-up
// (its claim is finished by the upstream's answer, not abandoned), and is
// cut when Caddy exits, as a passed deadline, so that the proxy answers
// 504 and not the 499 of a hang-up. Waiting, it costs no goroutine.
func TestAnUpstreamRequestIsCutAtExitOnly(t *testing.T) {
	prefix := "cut-at-exit:"
	h := provisioned(t, &Handler{KeyPrefix: &prefix})
	exiting, exit := context.WithCancelCause(context.Background())
	h.exiting = exiting
	const n = 100
	type upstreamSaw struct {
		replacer bool
		cause    error
	}
	arrived, saw := make(chan context.Context, n), make(chan upstreamSaw, n)
	hangUps := make([]context.CancelFunc, n)
	at := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	before := runtime.NumGoroutine()
	for i := range n {
		body := fmt.Sprintf(`{"asset_id":"veh-%d","occurred_at":"%s","lat":52.52,"lon":13.40}`, i, at)
		ctx, hangUp := context.WithCancel(context.WithValue(context.Background(), caddy.ReplacerCtxKey, caddy.NewReplacer()))
		hangUps[i] = hangUp
		r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/telemetry", strings.NewReader(body))
		go h.ServeHTTP(httptest.NewRecorder(), r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			arrived <- r.Context()
			<-r.Context().Done()
			_, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
			saw <- upstreamSaw{ok, context.Cause(r.Context())}
			return caddyhttp.Error(http.StatusGatewayTimeout, context.Cause(r.Context()))
		}))
	}
	upstream := make([]context.Context, 0, n)
	for range n {
		upstream = append(upstream, <-arrived)
	}
	if extra := runtime.NumGoroutine() - before - n; extra > 5 {
		t.Errorf("%d requests waiting for the upstream run %d goroutines besides their own", n, extra)
	}
	for _, hangUp := range hangUps {
		hangUp()
	}
	time.Sleep(50 * time.Millisecond)
	for _, ctx := range upstream {
		if ctx.Err() != nil {
			t.Fatalf("the sender's hang-up cut the upstream request: %v", context.Cause(ctx))
		}
	}
	exit(context.DeadlineExceeded)
	for range n {
		s := <-saw
		if !s.replacer || !errors.Is(s.cause, context.DeadlineExceeded) {
			t.Fatalf("the upstream request cut at exit: replacer %v, cause %v; want the replacer, and a passed deadline", s.replacer, s.cause)
		}
	}
}
