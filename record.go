package telemetrydedup

import (
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
)

// Placeholders set on every request the handler sees.
const (
	placeholderDecision = "http.telemetry_dedup.decision"
	placeholderReason   = "http.telemetry_dedup.reason"
	placeholderKey      = "http.telemetry_dedup.key"
	placeholderAsset    = "http.telemetry_dedup.asset"
	placeholderBucket   = "http.telemetry_dedup.bucket"
	placeholderCell     = "http.telemetry_dedup.cell"
	// The event a ping carries and its state, as path=value.
	placeholderEvent = "http.telemetry_dedup.event"
	placeholderState = "http.telemetry_dedup.state"

	// A batch's counts.
	placeholderAccepted   = "http.telemetry_dedup.accepted"
	placeholderSuppressed = "http.telemetry_dedup.suppressed"
	placeholderRejected   = "http.telemetry_dedup.rejected"
	placeholderInFlight   = "http.telemetry_dedup.in_flight"
)

// record records what became of each ping of the request, then sets the
// request's placeholders.
func (h *Handler) record(r *http.Request, repl *caddy.Replacer, req *request) {
	for i := range req.elements {
		h.recordOutcome(r, &req.elements[i])
	}
	if req.single() {
		setPingPlaceholders(repl, &req.elements[0])
	} else {
		setBatchPlaceholders(repl, req)
	}
}

// recordOutcome records one ping's outcome, the same whether it came alone
// or in a batch: a ping that cannot be keyed goes to the dead letters if
// there are any; then the decision is counted with its reason, the
// stuck-asset tracker sees every claimed ping, and a debug line is written
// (per-request info lines are noise at telemetry rates).
func (h *Handler) recordOutcome(r *http.Request, e *element) {
	if e.err != nil {
		return // the request fails with it; Caddy logs it
	}
	if e.rejection != nil && e.rejection.deadLetterable() && h.deadLetters != nil {
		if err := h.deadLetters.add(r.Context(), newDeadLetter(r, e.raw, e.rejection)); err != nil {
			h.storeErrors.log("dead-lettering an invalid ping failed; rejecting it instead", err)
		} else {
			e.decision = decisionDeadLettered
		}
	}
	metrics.decisions.WithLabelValues(string(e.decision), e.reason).Inc()
	if e.claimed() {
		h.watchForStuck(e.obs.Asset, dedup.Verdict{Decision: e.decision, Reason: dedup.Reason(e.reason)})
	}
	if c := h.logger.Check(zapcore.DebugLevel, "telemetry_dedup decision"); c != nil {
		c.Write(zap.String("decision", string(e.decision)), zap.String("reason", e.reason),
			zap.String("asset", e.asset), zap.String("key", e.key()))
	}
}

// claimed reports an element the store decided.
func (e *element) claimed() bool {
	switch e.decision {
	case dedup.Accepted, dedup.Suppressed, dedup.InFlight:
		return true
	}
	return false
}

// key is the key the element was decided on, if it reached the store.
func (e *element) key() string {
	if e.claim == nil {
		return ""
	}
	return e.claim.Key()
}

func setPingPlaceholders(repl *caddy.Replacer, e *element) {
	repl.Set(placeholderDecision, string(e.decision))
	repl.Set(placeholderReason, e.reason)
	repl.Set(placeholderKey, e.key())
	if e.claim != nil {
		repl.Set(placeholderAsset, e.asset)
		repl.Set(placeholderBucket, strconv.FormatInt(e.obs.Bucket, 10))
		repl.Set(placeholderCell, e.obs.Cell.String())
		repl.Set(placeholderEvent, e.obs.Event)
		repl.Set(placeholderState, e.obs.State)
	}
}

func setBatchPlaceholders(repl *caddy.Replacer, req *request) {
	c := countElements(req.elements)
	repl.Set(placeholderDecision, string(c.decision()))
	repl.Set(placeholderReason, "")
	repl.Set(placeholderAccepted, c.accepted)
	repl.Set(placeholderSuppressed, c.suppressed)
	repl.Set(placeholderRejected, c.rejected)
	repl.Set(placeholderInFlight, c.inFlight)
}

// watchForStuck feeds the stuck-asset tracker and warns, once per asset
// per hour, about an asset that looks stuck.
func (h *Handler) watchForStuck(asset string, v dedup.Verdict) {
	now := time.Now()
	if !h.stuck.Observe(asset, v, now) {
		return
	}
	a, _ := h.stuck.Lookup(asset, now)
	h.logger.Warn("asset looks stuck: nearly all its recent pings are suppressed and none was accepted for stuck_after; "+
		"is it repeating a cached fix or is its clock frozen?",
		zap.String("asset", asset), zap.Float64("ratio", a.Ratio), zap.Uint64("pings", a.Pings),
		zap.String("last_reason", string(a.LastReason)), zap.Time("since", a.Since))
}
