package telemetrydedup

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
)

// Response headers sent to the sender.
const (
	headerDecision = "X-Dedup"
	headerReason   = "X-Dedup-Reason"
)

// Decisions the handler makes without a claim, in addition to dedup's
// accepted, suppressed and in_flight.
const (
	decisionRejected     = "rejected"
	decisionDeadLettered = "dead_lettered"
	decisionUnchecked    = "unchecked"
	decisionUnavailable  = "unavailable"
	decisionSkipped      = "skipped"

	// What shadow mode says instead of answering.
	decisionWouldSuppress = "would_suppress"
	decisionWouldReject   = "would_reject"

	reasonStoreError = "store_error"
	reasonMalformed  = "malformed"
	reasonTooLarge   = "too_large"
	reasonNotAPing   = "not_a_ping"
)

// unavailableRetryAfter is the Retry-After, in seconds, of a fail-closed 503.
const unavailableRetryAfter = "5"

func writeSuppressed(w http.ResponseWriter, reason dedup.Reason) {
	h := w.Header()
	h.Set(headerDecision, string(dedup.Suppressed))
	h.Set(headerReason, string(reason))
	h.Set("Content-Length", "0")
	w.WriteHeader(http.StatusOK)
}

// writeInFlight asks the sender to come back: the first delivery of this
// observation may still fail, and then the retry is the one that counts.
func writeInFlight(w http.ResponseWriter, reason dedup.Reason) {
	h := w.Header()
	h.Set(headerDecision, string(dedup.InFlight))
	h.Set(headerReason, string(reason))
	h.Set("Retry-After", "1")
	writeJSON(w, http.StatusConflict, errorBody{
		Decision: string(dedup.InFlight),
		Error:    "the first delivery of this observation is still being processed; retry shortly",
	})
}

func writeUnavailable(w http.ResponseWriter) {
	w.Header().Set(headerDecision, decisionUnavailable)
	w.Header().Set("Retry-After", unavailableRetryAfter)
	writeJSON(w, http.StatusServiceUnavailable, errorBody{
		Decision: decisionUnavailable,
		Error:    "the deduplication store is unavailable and on_store_error is closed; retry later",
	})
}

// rejection is a ping answered with a 4xx and a JSON body saying why.
type rejection struct {
	status int
	body   errorBody
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
	Decision string `json:"decision"`
	// Error says what is wrong, for a person.
	Error string `json:"error"`
	// Field is the JSON path of the offending field of an invalid ping.
	Field string `json:"field,omitempty"`
	// Rule is the rule the field broke.
	Rule string `json:"rule,omitempty"`
}

// rejectionFor maps parse and read errors to their answer. Other errors (a
// body read that failed mid-way) are not the sender's ping to judge.
func rejectionFor(err error) (rejection, bool) {
	var invalid *dedup.InvalidPingError
	var malformed *dedup.MalformedError
	var tooLarge *tooLargeError
	var batchTooLarge *dedup.BatchTooLargeError
	switch {
	case errors.As(err, &batchTooLarge):
		return rejection{http.StatusRequestEntityTooLarge, errorBody{Decision: decisionRejected, Error: batchTooLarge.Error()}}, true
	case errors.As(err, &invalid):
		return rejection{http.StatusUnprocessableEntity, errorBody{
			Decision: decisionRejected, Error: invalid.Error(), Field: invalid.Field, Rule: string(invalid.Rule)}}, true
	case errors.As(err, &malformed):
		return rejection{http.StatusBadRequest, errorBody{Decision: decisionRejected, Error: malformed.Error()}}, true
	case errors.As(err, &tooLarge):
		return rejection{http.StatusRequestEntityTooLarge, errorBody{Decision: decisionRejected, Error: tooLarge.Error()}}, true
	default:
		return rejection{}, false
	}
}

func writeRejection(w http.ResponseWriter, r rejection) {
	w.Header().Set(headerDecision, decisionRejected)
	writeJSON(w, r.status, r.body)
}

// writeDeadLettered answers 202: the ping is kept, though not as a ping.
func writeDeadLettered(w http.ResponseWriter, r rejection) {
	w.Header().Set(headerDecision, decisionDeadLettered)
	r.body.Decision = decisionDeadLettered
	writeJSON(w, http.StatusAccepted, r.body)
}

func writeJSON(w http.ResponseWriter, status int, body errorBody) {
	b, _ := json.Marshal(body) // a struct of strings always marshals
	b = append(b, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
