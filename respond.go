package telemetrydedup

import (
	"context"
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
)

// Response headers sent to the sender.
const (
	headerDecision = "X-Dedup"
	headerReason   = "X-Dedup-Reason"

	// A batch's counts, and its rejected elements as JSON: the upstream's
	// body answers for the rest.
	headerAccepted   = "X-Dedup-Accepted"
	headerSuppressed = "X-Dedup-Suppressed"
	headerRejected   = "X-Dedup-Rejected"
	headerInFlight   = "X-Dedup-In-Flight"
	headerRejections = "X-Dedup-Rejections"

	// maxRejectionsHeader caps the rejections listed in a header.
	maxRejectionsHeader = 20
)

// Decisions the handler makes itself, beside dedup's accepted, suppressed
// and in_flight. They are sent in X-Dedup and are part of the public
// interface.
const (
	decisionRejected     dedup.Decision = "rejected"
	decisionDeadLettered dedup.Decision = "dead_lettered"
	decisionUnchecked    dedup.Decision = "unchecked"
	decisionUnavailable  dedup.Decision = "unavailable"
	decisionSkipped      dedup.Decision = "skipped"
	// decisionPartial is a batch whose pings were decided differently.
	decisionPartial dedup.Decision = "partial"

	// What shadow mode says instead of answering.
	decisionWouldSuppress dedup.Decision = "would_suppress"
	decisionWouldReject   dedup.Decision = "would_reject"
	decisionWouldPartial  dedup.Decision = "would_partial"
)

// Reasons the handler gives itself, beside dedup's and the rules.
const (
	reasonStoreError = "store_error"
	reasonMalformed  = "malformed"
	reasonTooLarge   = "too_large"
	reasonNotAPing   = "not_a_ping"
	// reasonSentBack labels a ping of a batch sent back whole, new,
	// unchecked or, with on_invalid dead_letter, invalid: it will be
	// judged (or dead-lettered) when the batch comes back.
	reasonSentBack = "sent_back"
)

// unavailableRetryAfter is the Retry-After, in seconds, of a fail-closed 503.
const unavailableRetryAfter = "5"

// respond answers the request or forwards it: the one place where a single
// ping and a batch differ.
func (h *Handler) respond(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, req *request) error {
	for _, e := range req.elements {
		if e.err != nil {
			return e.err
		}
	}
	if req.single() {
		return h.respondPing(w, r, next, &req.elements[0])
	}
	return h.respondBatch(w, r, next, req)
}

// respondPing answers a request of one ping.
func (h *Handler) respondPing(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, e *element) error {
	d, a := e.decision, &h.settings.answers
	switch {
	case d == dedup.Accepted:
		return h.forward(w, r, next, d, e.reason, e.claims)
	case d == decisionUnchecked:
		return h.forward(w, r, next, d, "", nil)
	case d == decisionSkipped:
		return h.forward(w, r, next, d, e.reason, nil)
	case h.settings.shadow && e.rejection != nil:
		// Rejected, dead-lettered, or its letter failed (counted
		// unavailable, as enforce answers it): it cannot be keyed, and says
		// which rule it broke.
		return h.forward(w, r, next, decisionWouldReject, e.rejection.reason(), nil)
	case h.settings.shadow:
		return h.forward(w, r, next, shadowDecision(d), e.reason, nil)
	case d == dedup.Suppressed:
		a.writeSuppressed(w, e.reason)
	case d == dedup.InFlight:
		a.writeInFlight(w, e.reason)
	case d == decisionUnavailable:
		writeUnavailable(w, e.rejection)
	case d == decisionDeadLettered:
		a.writeDeadLettered(w, *e.rejection)
	default:
		writeRejection(w, *e.rejection)
	}
	return nil
}

// respondBatch answers a batch: its new pings go upstream together, in
// order and byte for byte, the rest are answered here.
func (h *Handler) respondBatch(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, req *request) error {
	c := countElements(req.elements)
	decision := c.decision()
	if !h.quiet(r) {
		setBatchHeaders(w, c, req.elements)
	}
	claims, forwarded := acceptedClaims(req.elements), forwardedElements(req.elements)
	switch {
	case h.settings.shadow:
		if req.sentBack != nil { // forwarded all the same: the upstream takes the claims enforce would give back
			claims = req.sentBack
		}
		return h.forward(w, r, next, shadowDecision(decision), "", claims)
	case req.sentBack != nil:
		h.giveBack(r.Context(), req.sentBack)
		h.settings.answers.writeBatchRetry(w, decision, req.elements, c.inFlight > 0)
		return nil
	case len(forwarded) == 0:
		h.settings.answers.writeBatchAnswered(w, decision, c, req.elements)
		return nil
	}
	if len(forwarded) < len(req.elements) {
		restoreBody(r, req.batch.Join(forwarded))
	}
	return h.forward(w, r, next, decision, "", claims)
}

// sendBack marks a batch that holds a ping that must come back later (in
// flight, not judged, or not kept as a dead letter): the whole batch must,
// so it keeps nothing of it. Its new and unchecked pings, and the
// messages that are not positions, get the batch's decision, in_flight or
// unavailable, with reasonSentBack, and the new ones' claims are to be
// given back: none is counted accepted, unchecked or skipped (passed on)
// each time the batch comes back before it gets through (its
// invalid pings, with on_invalid dead_letter, are sent back too:
// keepInvalid). Shadow mode marks it too, to record what enforce would,
// and forwards it.
func (req *request) sendBack() {
	if req.single() {
		return
	}
	c := countElements(req.elements)
	if !c.sentBackWhole() {
		return
	}
	req.sentBack = []*dedup.Claim{}
	for i := range req.elements {
		switch e := &req.elements[i]; e.decision {
		case dedup.Accepted:
			req.sentBack = append(req.sentBack, e.claim())
			e.decision, e.reason = c.decision(), reasonSentBack
		case decisionUnchecked, decisionSkipped: // not forwarded either: they have no claim to give back
			e.decision, e.reason = c.decision(), reasonSentBack
		}
	}
}

// giveBack releases the claims of a batch that is sent back for retry.
func (h *Handler) giveBack(ctx context.Context, claims []*dedup.Claim) {
	if len(claims) == 0 {
		return
	}
	if _, err := h.deduper.Release(context.WithoutCancel(ctx), claims...); err != nil {
		h.sentBackReleaseErrors.log("releasing the claims of a batch sent back for retry failed; the reconciler releases them once the store answers", err)
		h.reconcile(failedReleases(claims, err), true)
	}
}

// acceptedClaims are the claims a forwarded batch settles or releases.
func acceptedClaims(elements []element) []*dedup.Claim {
	var claims []*dedup.Claim
	for _, e := range elements {
		if e.decision == dedup.Accepted {
			claims = append(claims, e.claim())
		}
	}
	return claims
}

// forwardedElements are the pings of a batch that go upstream: the new
// ones, the unchecked ones, and the messages that are not positions, each
// as it would alone.
func forwardedElements(elements []element) [][]byte {
	var raws [][]byte
	for _, e := range elements {
		switch e.decision {
		case dedup.Accepted, decisionUnchecked, decisionSkipped:
			raws = append(raws, e.raw)
		}
	}
	return raws
}

// elementCounts sums a batch's pings by what became of them: one an
// element, and a batch over max_batch, refused as one element, each of its
// pings (element.pings), as decisions_total counts them.
type elementCounts struct {
	n                                        int
	accepted, suppressed, inFlight, rejected int // rejected counts the dead-lettered too
	deadLettered, unchecked, unavailable     int
	skipped                                  int
}

func countElements(elements []element) elementCounts {
	var c elementCounts
	for i := range elements {
		e := &elements[i]
		n := e.pings()
		c.n += n
		switch e.decision {
		case dedup.Accepted:
			c.accepted += n
		case dedup.Suppressed:
			c.suppressed += n
		case dedup.InFlight:
			c.inFlight += n
		case decisionRejected:
			c.rejected += n
		case decisionDeadLettered:
			c.rejected += n
			c.deadLettered += n
		case decisionUnchecked:
			c.unchecked += n
		case decisionUnavailable:
			c.unavailable += n
		case decisionSkipped:
			c.skipped += n
		}
	}
	return c
}

// sentBackWhole reports a batch whose answer asks for all of it again: it
// holds a ping in flight or one the store could not judge.
func (c elementCounts) sentBackWhole() bool { return c.inFlight > 0 || c.unavailable > 0 }

// decision is the X-Dedup of a batch: the decision all its elements got,
// partial for a mix; in_flight or unavailable when any must come back.
func (c elementCounts) decision() dedup.Decision {
	switch {
	case c.inFlight > 0:
		return dedup.InFlight
	case c.unavailable > 0:
		return decisionUnavailable
	case c.accepted == c.n:
		return dedup.Accepted
	case c.suppressed == c.n:
		return dedup.Suppressed
	case c.deadLettered == c.n:
		return decisionDeadLettered
	case c.rejected == c.n:
		return decisionRejected
	case c.unchecked == c.n:
		return decisionUnchecked
	case c.skipped == c.n:
		return decisionSkipped
	}
	return decisionPartial
}

// shadowDecision is what shadow mode says instead of what enforce does. A
// ping enforce would answer 503 for a store outage goes upstream
// unchecked, and says so.
func shadowDecision(d dedup.Decision) dedup.Decision {
	switch d {
	case decisionUnavailable:
		return decisionUnchecked
	case dedup.Suppressed, dedup.InFlight:
		return decisionWouldSuppress
	case decisionRejected, decisionDeadLettered:
		return decisionWouldReject
	case decisionPartial:
		return decisionWouldPartial
	}
	return d
}

// clearAnswerHeaders removes the headers another telemetry_dedup handler
// set on the request's answer: a shadow trial's in front of this one, or
// one that ran before handle_errors. This one's answer sets its own, and
// one it leaves out (a reason, a batch's in-flight count or rejections)
// would have told the sender the other's verdict as this one's. A shadow
// trial inside an enforcing handler clears and sets nothing (quiet): the
// answer is the enforcing one's.
func clearAnswerHeaders(h http.Header) {
	for _, name := range []string{headerDecision, headerReason, headerAccepted, headerSuppressed, headerRejected, headerInFlight, headerRejections} {
		h.Del(name)
	}
}

func setBatchHeaders(w http.ResponseWriter, c elementCounts, elements []element) {
	h := w.Header()
	h.Set(headerAccepted, strconv.Itoa(c.accepted))
	h.Set(headerSuppressed, strconv.Itoa(c.suppressed))
	h.Set(headerRejected, strconv.Itoa(c.rejected))
	if c.inFlight > 0 {
		h.Set(headerInFlight, strconv.Itoa(c.inFlight))
	}
	if c.rejected > 0 {
		h.Set(headerRejections, rejectionsJSON(elements))
	}
}
