package telemetrydedup

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// rejection is a ping answered with a 4xx and a JSON body saying why.
type rejection struct {
	status int
	body   errorBody
	// pings is how many pings a batch refused whole holds, counted each
	// in decisions_total as analyze counts them; 0 for one ping.
	pings int
}

// reason is the {http.telemetry_dedup.reason} of a rejection: the rule an
// invalid ping broke, or what was wrong with the body.
func (r rejection) reason() string {
	if r.body.Rule != "" {
		return r.body.Rule
	}
	if r.status == http.StatusRequestEntityTooLarge {
		return reasonTooLarge
	}
	return reasonMalformed
}

// deadLetterable: malformed and invalid pings go to the dead-letter stream;
// an oversize body stays a 413, it was never read whole.
func (r rejection) deadLetterable() bool {
	return r.status != http.StatusRequestEntityTooLarge
}

// errorBody is the JSON answered with every 4xx and 5xx the handler writes.
type errorBody struct {
	// Decision repeats X-Dedup.
	Decision dedup.Decision `json:"decision"`
	// Error says what is wrong, for a person.
	Error string `json:"error"`
	// Field is the JSON path of the offending field of an invalid ping.
	Field string `json:"field,omitempty"`
	// Rule is the rule the field broke, or malformed or too_large for a
	// body that could not be read as pings: what X-Dedup-Reason, the
	// reason placeholder and a batch's rejection entries say.
	Rule string `json:"rule,omitempty"`
}

// rejectionFor maps parse and read errors to their answer. Other errors (a
// body read that failed mid-way) are not the sender's ping to judge.
func rejectionFor(err error) (rejection, bool) {
	var invalid *ping.InvalidPingError
	var malformed *ping.MalformedError
	var tooLarge *tooLargeError
	var batchTooLarge *ping.BatchTooLargeError
	switch {
	case errors.As(err, &batchTooLarge):
		return rejection{http.StatusRequestEntityTooLarge, errorBody{Decision: decisionRejected, Error: batchTooLarge.Error(), Rule: reasonTooLarge},
			batchTooLarge.Count}, true
	case errors.As(err, &invalid):
		return rejection{http.StatusUnprocessableEntity, errorBody{
			Decision: decisionRejected, Error: invalid.Error(), Field: invalid.Field, Rule: string(invalid.Rule)}, 0}, true
	case errors.As(err, &malformed):
		return rejection{http.StatusBadRequest, errorBody{Decision: decisionRejected, Error: malformed.Error(), Rule: reasonMalformed}, 0}, true
	case errors.As(err, &tooLarge):
		return rejection{http.StatusRequestEntityTooLarge, errorBody{Decision: decisionRejected, Error: tooLarge.Error(), Rule: reasonTooLarge}, 0}, true
	default:
		return rejection{}, false
	}
}

// writeSuppressed answers a duplicate so that the sender counts it as
// delivered.
func (a *answers) writeSuppressed(w http.ResponseWriter, reason string) {
	a.suppressed.write(w, headerDecision, string(dedup.Suppressed), headerReason, reason)
}

// write sends the answer's status, Content-Type and body, with the headers
// given as name, value pairs.
func (b bodyAnswer) write(w http.ResponseWriter, headers ...string) {
	kv := append(make([]string, 0, 8), headers...)
	if b.contentType != "" {
		kv = append(kv, "Content-Type", b.contentType)
	}
	if b.status != http.StatusNoContent { // which must not carry one (RFC 9110)
		kv = append(kv, "Content-Length", strconv.Itoa(len(b.body)))
	}
	setHeaders(w.Header(), kv)
	w.WriteHeader(b.status)
	_, _ = w.Write(b.body)
}

// setHeaders sets canonical header names to values, given as name, value
// pairs, with one allocation for all their values where Header.Set makes
// one each: a duplicate's answer has four. Each value is a slice of its
// own, capped at its one element, so that a later handler that edits or
// appends to one (Caddy's header directive does both) changes no other.
func setHeaders(h http.Header, kv []string) {
	values := make([]string, len(kv)/2)
	for i := range values {
		values[i] = kv[2*i+1]
		h[kv[2*i]] = values[i : i+1 : i+1]
	}
}

// writeInFlight asks the sender to come back: the first delivery of this
// observation may still fail, and then the retry is the one that counts.
func (a *answers) writeInFlight(w http.ResponseWriter, reason string) {
	h := w.Header()
	h.Set(headerDecision, string(dedup.InFlight))
	h.Set(headerReason, reason)
	h.Set("Retry-After", a.inFlight.retryAfter)
	writeJSON(w, a.inFlight.status, errorBody{
		Decision: dedup.InFlight,
		Error:    "the first delivery of this observation is still being processed; retry shortly",
	})
}

// writeUnavailable asks the sender to come back: the store could not judge
// the ping, or, for a ping that cannot be keyed (rej), keep its dead letter.
func writeUnavailable(w http.ResponseWriter, rej *rejection) {
	w.Header().Set(headerDecision, string(decisionUnavailable))
	w.Header().Set("Retry-After", unavailableRetryAfter)
	body := errorBody{
		Decision: decisionUnavailable,
		Error:    "the deduplication store is unavailable and on_store_error is closed; retry later",
	}
	if rej != nil {
		body = rej.body
		body.Decision = decisionUnavailable
		body.Error += "; the dead-letter stream could not be written, so the ping is not kept: retry later"
	}
	writeJSON(w, http.StatusServiceUnavailable, body)
}

func writeRejection(w http.ResponseWriter, r rejection) {
	w.Header().Set(headerDecision, string(decisionRejected))
	writeJSON(w, r.status, r.body)
}

// writeDeadLettered answers 202: the ping is kept, though not as a ping.
// The body is the report naming the field and rule, unless the sender's
// client needs a body of its own to stop sending; X-Dedup-Reason names the
// rule either way.
func (a *answers) writeDeadLettered(w http.ResponseWriter, r rejection) {
	if a.deadLettered.hasBody {
		a.deadLettered.write(w, headerDecision, string(decisionDeadLettered), headerReason, r.reason())
		return
	}
	w.Header().Set(headerDecision, string(decisionDeadLettered))
	w.Header().Set(headerReason, r.reason())
	r.body.Decision = decisionDeadLettered
	writeJSON(w, a.deadLettered.status, r.body)
}

// carriesNoContent reports a status whose answer has no body (RFC 9110):
// 204 and 205. OkHttp fails either when its Content-Length is not 0.
func carriesNoContent(status int) bool {
	return status == http.StatusNoContent || status == http.StatusResetContent
}

// writeJSON answers status with body as JSON, or with none for a status
// that carries none (an operator's dead_lettered 204 or 205).
func writeJSON(w http.ResponseWriter, status int, body any) {
	if carriesNoContent(status) {
		if status == http.StatusResetContent {
			w.Header().Set("Content-Length", "0") // how RFC 9110 would have a 205 say it holds nothing; a 204 has none
		}
		w.WriteHeader(status)
		return
	}
	b, _ := json.Marshal(body) // structs of strings and numbers always marshal
	b = append(b, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// elementReport is one ping of a batch in a batch's JSON answer.
type elementReport struct {
	// Index is the ping's place in the batch, from 0.
	Index int `json:"index"`
	// Decision is what became of the ping.
	Decision dedup.Decision `json:"decision"`
	// Reason says why, for a decision that has one.
	Reason string `json:"reason,omitempty"`
	// Field, Rule and Error say what is wrong with a rejected or
	// dead-lettered ping, as a single ping's answer does.
	Field string `json:"field,omitempty"`
	Rule  string `json:"rule,omitempty"`
	Error string `json:"error,omitempty"`
}

func reportOf(i int, e element) elementReport {
	r := elementReport{Index: i, Decision: e.decision}
	if e.rejection == nil {
		r.Reason = e.reason
		return r
	}
	r.Field, r.Rule, r.Error = e.rejection.body.Field, e.rejection.reason(), e.rejection.body.Error
	return r
}

// batchAnswer is the JSON answered when no ping of a batch goes upstream.
type batchAnswer struct {
	// Decision is the batch's, as its X-Dedup header says it.
	Decision dedup.Decision `json:"decision"`
	// Error says why the batch was answered here, and what to do.
	Error string `json:"error,omitempty"`
	// Elements are the batch's pings, in order.
	Elements []elementReport `json:"elements"`
}

func batchAnswerOf(decision dedup.Decision, msg string, elements []element) batchAnswer {
	a := batchAnswer{Decision: decision, Error: msg, Elements: make([]elementReport, len(elements))}
	for i, e := range elements {
		a.Elements[i] = reportOf(i, e)
	}
	return a
}

// writeBatchRetry sends a whole batch back: some of its pings were still in
// flight, or the store was unavailable.
func (a *answers) writeBatchRetry(w http.ResponseWriter, decision dedup.Decision, elements []element, inFlight bool) {
	w.Header().Set(headerDecision, string(decision))
	if inFlight {
		w.Header().Set("Retry-After", a.inFlight.retryAfter)
		writeJSON(w, a.inFlight.status, batchAnswerOf(decision,
			"the first delivery of some pings of this batch is still being processed; retry the batch shortly", elements))
		return
	}
	w.Header().Set("Retry-After", unavailableRetryAfter)
	msg := "the deduplication store is unavailable and on_store_error is closed; retry the batch later"
	for _, e := range elements {
		if e.decision == decisionUnavailable && e.rejection != nil && e.reason == reasonStoreError { // its letter failed, not merely sent back unwritten
			msg = "the dead-letter stream could not be written, so the pings of this batch that cannot be keyed are not kept: retry the batch later"
			break
		}
	}
	writeJSON(w, http.StatusServiceUnavailable, batchAnswerOf(decision, msg, elements))
}

// writeBatchAnswered answers a batch none of whose pings goes upstream:
// duplicates only, or duplicates beside pings that cannot be keyed. A
// batch that holds a duplicate is answered as delivered, as a batch with a
// new ping is by its upstream, its rejected pings left out (they are in
// X-Dedup-Rejections): it is often the resend of one that went upstream
// partial and whose answer the sender never got, and a 4xx for it made
// Overland, which resends a batch until it is told "ok", resend it
// forever. Only a batch of nothing but pings that cannot be keyed is
// refused.
func (a *answers) writeBatchAnswered(w http.ResponseWriter, decision dedup.Decision, c elementCounts, elements []element) {
	w.Header().Set(headerDecision, string(decision))
	switch {
	case c.rejected > c.deadLettered && c.suppressed == 0:
		writeJSON(w, rejectedBatchStatus(elements), batchAnswerOf(decision,
			"no ping of this batch is new, and some cannot be keyed: see elements", elements))
	case c.deadLettered > 0 && a.deadLettered.hasBody:
		a.deadLettered.write(w)
	case c.deadLettered > 0:
		writeJSON(w, a.deadLettered.status, batchAnswerOf(decision,
			"no ping of this batch is new; the ones that cannot be keyed are in the dead-letter stream", elements))
	default:
		a.suppressed.write(w)
	}
}

// rejectedBatchStatus is 400 when every rejected ping of a batch was
// malformed, and 422 when some were invalid: the status each gets alone.
func rejectedBatchStatus(elements []element) int {
	for _, e := range elements {
		if e.decision == decisionRejected && e.rejection.status != http.StatusBadRequest {
			return http.StatusUnprocessableEntity
		}
	}
	return http.StatusBadRequest
}

// rejectionsJSON lists a batch's rejected and dead-lettered pings, at most
// maxRejectionsHeader of them.
func rejectionsJSON(elements []element) string {
	var listed []elementReport
	for i, e := range elements {
		if e.rejection != nil && len(listed) < maxRejectionsHeader {
			r := reportOf(i, e)
			r.Error = "" // a header line stays short; the field and rule say what is wrong
			listed = append(listed, r)
		}
	}
	b, _ := json.Marshal(listed)
	return string(b)
}
