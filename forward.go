package telemetrydedup

import (
	"context"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
)

// Outcomes of a release, as counted in releases_total.
const (
	releaseReleased = "released"
	releaseNotHeld  = "not_held"
	releaseError    = "error"
)

// forward passes the request on, saying what it is in X-Dedup. When it
// carries claims, the upstream's real answer settles or releases them, and
// the upstream request is detached from the sender's cancellation: a sender
// that hangs up does not undo an upstream that went on to store the
// observation.
func (h *Handler) forward(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, decision dedup.Decision, reason string, claims []*dedup.Claim) error {
	w.Header().Set(headerDecision, string(decision))
	if reason != "" {
		w.Header().Set(headerReason, reason)
	}
	if len(claims) == 0 {
		return next.ServeHTTP(w, r)
	}
	rec := caddyhttp.NewResponseRecorder(w, nil, nil) // never buffers: only watches the status
	detached := context.WithoutCancel(r.Context())
	metrics.inFlight.Inc()
	defer metrics.inFlight.Dec()

	defer func() {
		// reverse_proxy aborts a broken response stream with a panic. If the
		// upstream had answered below 500 by then, it has the observation.
		if p := recover(); p != nil {
			h.finish(detached, claims, rec.Status() == 0 || rec.Status() >= 500)
			panic(p)
		}
	}()
	err := next.ServeHTTP(rec, r.WithContext(detached))
	h.finish(detached, claims, err != nil || rec.Status() >= 500)
	return err
}

// finish settles the claims of a forwarded request, or releases them when
// the upstream failed and release_on_failure is on.
func (h *Handler) finish(ctx context.Context, claims []*dedup.Claim, failed bool) {
	if !failed || !h.settings.release {
		if err := h.deduper.Settle(ctx, claims...); err != nil {
			h.storeErrors.log("settling a claim failed; exact redeliveries wait for in_flight_timeout instead", err)
		}
		return
	}
	released, err := h.deduper.Release(ctx, claims...)
	if err != nil {
		metrics.releases.WithLabelValues(releaseError).Add(float64(len(claims)))
		// The claims stay; the sender's retries get 409 until
		// in_flight_timeout, then count as duplicates. Rare, and worth a line
		// of its own.
		h.logger.Error("releasing the claims of a failed request failed; its retries may be suppressed",
			zap.String("key", claims[0].Key()), zap.Int("claims", len(claims)), zap.Error(err))
		return
	}
	metrics.releases.WithLabelValues(releaseReleased).Add(float64(released))
	metrics.releases.WithLabelValues(releaseNotHeld).Add(float64(len(claims) - released))
	if c := h.logger.Check(zapcore.DebugLevel, "released claims after upstream failure"); c != nil {
		c.Write(zap.String("key", claims[0].Key()), zap.Int("released", released), zap.Int("claims", len(claims)))
	}
}
