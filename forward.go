package telemetrydedup

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
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
// the upstream request is detached from the sender's cancellation (a sender
// that hangs up does not undo an upstream that went on to store the
// observation) and bounded by the claims' age (see upstreamContext).
func (h *Handler) forward(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, decision dedup.Decision, reason string, claims []*dedup.Claim) error {
	if !h.quiet(r) {
		w.Header().Set(headerDecision, string(decision))
		if reason != "" {
			w.Header().Set(headerReason, reason)
		}
	}
	if len(claims) == 0 {
		return next.ServeHTTP(w, r)
	}
	rec := caddyhttp.NewResponseRecorder(w, nil, nil) // never buffers: only watches the status
	ctx := h.upstreamContext(r.Context(), claims)
	added := ctx.counted.add(len(claims))
	defer ctx.counted.takeBack(added)

	defer func() {
		// reverse_proxy aborts a broken response stream with a panic. If the
		// upstream had answered 2xx by then, it has the observation.
		if p := recover(); p != nil {
			h.finish(r.Context(), claims, undelivered(rec.Status()))
			panic(p)
		}
	}()
	err := next.ServeHTTP(rec, r.WithContext(ctx))
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil && h.exiting.Err() == nil {
		// The upstream failed for the bound, not merely after it: a live
		// handler inside a shadow trial has a bound of its own.
		h.upstreamCuts.log(h.settings.upstreamCutLine(), upstreamCutError(h.settings.upstreamBound))
	}
	h.finish(r.Context(), claims, err != nil || undelivered(finalStatus(rec.Status())))
	return err
}

// upstreamCutLine says what a cut at upstreamBound does, and what to
// change: in Caddy's log it is otherwise reverse_proxy's "context
// deadline exceeded", at a deadline no proxy option set.
func (s *settings) upstreamCutLine() string {
	const fix = "raise in_flight_timeout above the upstream's slowest answer, or have the upstream answer sooner"
	if !s.release {
		return "telemetry_dedup cut an upstream request that had not answered (504) and settled its claims " +
			"(release_on_failure off), so that every claim is finished within in_flight_timeout: the sender's retry is " +
			"suppressed, and the pings are lost if the upstream did not go on to store them; " + fix
	}
	return "telemetry_dedup cut an upstream request that had not answered (504) and released its claims, " +
		"so that every claim is finished within in_flight_timeout: the sender's retry goes to the upstream again, " +
		"which stores it twice if it went on to store the first; " + fix
}

// upstreamCutError is the bound an upstream request was cut at.
type upstreamCutError time.Duration

func (e upstreamCutError) Error() string {
	return fmt.Sprintf("no answer within %s of the claim (in_flight_timeout less the store's timeout and %s)", time.Duration(e), finishMargin)
}

// quiet reports a shadow trial inside an enforcing handler: the answer is
// the enforcing handler's, and keeps the headers it set. The trial's
// X-Dedup: would_suppress on a ping the live handler had accepted told
// the sender, and the access log, the trial's verdict as the live one.
func (h *Handler) quiet(r *http.Request) bool {
	if !h.settings.shadow {
		return false
	}
	return h.quietIn(earlierOutcome(r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)))
}

// quietIn is quiet for the outcome an earlier handler published on the
// request, if one did: the trial sets neither headers nor placeholders.
func (h *Handler) quietIn(earlier *outcomePlaceholders) bool {
	return h.settings.shadow && earlier != nil && earlier.enforced()
}

// upstreamContext is the context of the upstream request of claimed pings:
// the request's values without the sender's cancellation, and cut
// upstreamBound after the claims were made (or a few milliseconds sooner:
// see sharedDeadlines). An upstream that hangs past it
// is cut (the proxy answers 504) and the claims released (settled with
// release_on_failure off), in time to be
// finished before in_flight_timeout: a claim older than that is always
// finished, so counting it as settled loses nothing. It is cut the same
// way when Caddy exits while the request still runs (a grace_period
// shorter than the request): the process would end it unfinished, its
// claim standing in the store as if delivered. That cut's cause is a
// passed deadline too, so that the proxy answers 504, not the 499 of a
// sender's hang-up, a 4xx some clients drop the ping on.
func (h *Handler) upstreamContext(request context.Context, claims []*dedup.Claim) *upstreamRequest {
	// The claims of one request are made at one instant, in one store call.
	c := &upstreamRequest{Context: upstreamDeadlines.at(h.exiting, claims[0].At.Add(h.settings.upstreamBound)), request: request}
	if c.counted, _ = request.Value(inFlightCounted{}).(*inFlightCount); c.counted == nil {
		c.counted = &c.own
	}
	return c
}

// upstreamRequest is the context of an upstream request: the request's
// values, as context.WithoutCancel gives them, but the deadline, shared
// with the requests claimed at about the same time, and the exit (its
// parent) of its first field. Its Value answers the context package's
// lookup of the cancellation a context derives from with the shared
// deadline's own, so that the transport's context for the request joins
// that deadline's children: no goroutine and no callback a request.
type upstreamRequest struct {
	context.Context // the shared deadline: its Deadline, Done and Err
	request         context.Context
	// counted is the request's count in the in_flight gauge: an outer
	// telemetry_dedup handler's, or own.
	counted *inFlightCount
	own     inFlightCount
}

// Value is the shared deadline's, which holds nothing but its
// cancellation, or else the request's; and the request's count in the
// in_flight gauge.
func (c *upstreamRequest) Value(key any) any {
	if key == (inFlightCounted{}) {
		return c.counted
	}
	if v := c.Context.Value(key); v != nil {
		return v
	}
	return c.request.Value(key)
}

// inFlightCounted is the context key of a request's inFlightCount.
type inFlightCounted struct{}

// inFlightCount is how many of a request's pings the in_flight gauge
// counts: as many as the telemetry_dedup handler on its way that accepted
// the most. A shadow trial in front of the live handler waits for the
// same upstream, so its pings and the live handler's are one count, not
// two; and it may have judged fewer of them new. The handlers of one
// request run one inside the other, on one goroutine.
type inFlightCount struct{ pings int }

// add counts pings more than the request counts already, and returns how
// many it added.
func (c *inFlightCount) add(pings int) int {
	added := max(0, pings-c.pings)
	c.pings += added
	metrics.inFlight.Add(float64(added))
	return added
}

// takeBack takes back what add added, once the upstream answered.
func (c *inFlightCount) takeBack(added int) {
	c.pings -= added
	metrics.inFlight.Sub(float64(added))
}

// undelivered reports an upstream answer (0: none) that does not show the
// upstream took the observation: anything but a 2xx. Those are the answers
// the real clients resend an observation after (a 4xx included: a backend's
// 429, its 401 while a token is wrong, Traccar's 400 for a device it does
// not know yet), so the retry must find the claim gone; were it kept, the
// retry would be answered "suppressed" for an observation the backend never
// took, and the client would drop it. A client that drops an observation
// on a 4xx (OwnTracks iOS) sends no retry to meet the released claim.
func undelivered(status int) bool { return status < 200 || status >= 300 }

// finalStatus is the status of a handler that returned: net/http answers
// 200 for one that wrote nothing.
func finalStatus(status int) int {
	if status == 0 {
		return http.StatusOK
	}
	return status
}

// finish settles the claims of a forwarded request, or releases them when
// the upstream failed and release_on_failure is on. If the store cannot
// say, the reconciler takes over. The answer waits for a release (the
// sender's retry must find the claims gone) but not for a settlement: the
// upstream's answer is the sender's whatever becomes of it, and the store
// has it ahead of the redelivery that answer might prompt. A release is
// detached from the sender of the request (ctx): one that hung up still
// has its claims given back.
func (h *Handler) finish(ctx context.Context, claims []*dedup.Claim, failed bool) {
	if !failed || !h.settings.release {
		h.deduper.SettleLater(claims, func(err error) {
			if err != nil {
				h.settleErrors.log("settling a claim failed; the reconciler settles it once the store answers", err)
				h.reconcile(claims, false)
			}
		})
		return
	}
	released, err := h.deduper.Release(context.WithoutCancel(ctx), claims...)
	if err != nil {
		failed := countPartialRelease(claims, err)
		metrics.releases.WithLabelValues(releaseError).Add(float64(len(failed)))
		h.releaseErrors.log("releasing the claims of a failed request failed; the reconciler releases them once the store answers", err)
		h.reconcile(failed, true)
		return
	}
	metrics.releases.WithLabelValues(releaseReleased).Add(float64(released))
	metrics.releases.WithLabelValues(releaseNotHeld).Add(float64(len(claims) - released))
	if c := h.logger.Check(zapcore.DebugLevel, "released claims after upstream failure"); c != nil {
		c.Write(zap.String("key", claims[0].Key()), zap.Int("released", released), zap.Int("claims", len(claims)))
	}
}

// countPartialRelease counts the releases a failed Release call made
// nonetheless (a Cluster master that answered while another hung: a
// dedup.ReleaseError) and returns the claims it failed for, all of them
// for any other error. Counted as errors, a healthy master's releases
// showed as failures, and were counted nowhere as made.
func countPartialRelease(claims []*dedup.Claim, err error) (failed []*dedup.Claim) {
	partial, ok := errors.AsType[*dedup.ReleaseError](err)
	if !ok {
		return claims
	}
	released, notHeld := 0, 0
	for i := range claims {
		switch {
		case partial.Failed[i]:
		case partial.Released[i]:
			released++
		default:
			notHeld++
		}
	}
	metrics.releases.WithLabelValues(releaseReleased).Add(float64(released))
	metrics.releases.WithLabelValues(releaseNotHeld).Add(float64(notHeld))
	return failedReleases(claims, err)
}

// failedReleases are the claims a failed Release call did not release:
// those a dedup.ReleaseError names, or all of them.
func failedReleases(claims []*dedup.Claim, err error) (failed []*dedup.Claim) {
	partial, ok := errors.AsType[*dedup.ReleaseError](err)
	if !ok {
		return claims
	}
	for i, c := range claims {
		if partial.Failed[i] {
			failed = append(failed, c)
		}
	}
	return failed
}

// respondUnsure answers a request whose claim call failed without saying
// whether it wrote the claims (a timeout, a reset connection) as
// on_store_error says, then hands the claims to the reconciler by what
// became of the request: released when nothing went upstream (closed: 503)
// or the unchecked forward failed, settled when it succeeded, so that their
// redeliveries are suppressed as they should be. Settle and release act by
// token: a claim that never landed, or lands late, changes nothing else. An
// unchecked forward is detached and bounded as that of an accepted ping.
func (h *Handler) respondUnsure(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, req *request) error {
	if h.settings.onStoreError != decisionUnchecked && !h.settings.shadow {
		err := h.respond(w, r, next, req)
		h.reconcile(req.unsure, true)
		return err
	}
	rec := caddyhttp.NewResponseRecorder(w, nil, nil)
	ctx := h.upstreamContext(r.Context(), req.unsure)
	defer func() {
		if p := recover(); p != nil {
			h.reconcile(req.unsure, h.settings.release && undelivered(rec.Status()))
			panic(p)
		}
	}()
	err := h.respond(rec, r.WithContext(ctx), next, req)
	h.reconcile(req.unsure, h.sentBackHere(req) || h.settings.release && (err != nil || undelivered(finalStatus(rec.Status()))))
	return err
}

// sentBackHere reports a batch the handler sent back itself, none of it
// forwarded: its claims of unknown fate are released whatever
// release_on_failure says, as giveBack releases the ones it knows. No
// upstream took them, and settled, the resend's new pings were answered as
// delivered and lost.
func (h *Handler) sentBackHere(req *request) bool { return req.sentBack != nil && !h.settings.shadow }

// reconcile hands claims whose fate the store did not tell to the
// reconciler, to be released or settled by token once it answers.
func (h *Handler) reconcile(claims []*dedup.Claim, release bool) {
	if h.reconciler != nil {
		h.reconciler.Hand(claims, release) // the reconciler counts and logs what it cannot take
	}
}
