package telemetrydedup

import (
	"context"
	"encoding/json"
	"errors"
	"mime"
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
)

// Headers and placeholders of a batch answer.
const (
	headerAccepted   = "X-Dedup-Accepted"
	headerSuppressed = "X-Dedup-Suppressed"
	headerRejected   = "X-Dedup-Rejected"
	// headerRejections lists the rejected elements of a forwarded batch, as
	// JSON, since the upstream's body answers the rest.
	headerRejections = "X-Dedup-Rejections"

	placeholderAccepted   = "http.telemetry_dedup.accepted"
	placeholderSuppressed = "http.telemetry_dedup.suppressed"
	placeholderRejected   = "http.telemetry_dedup.rejected"

	decisionPartial      = "partial"
	decisionWouldPartial = "would_partial"

	// maxRejectionsHeader caps the rejections listed in a header.
	maxRejectionsHeader = 20
)

// isNDJSON reports a newline-delimited JSON body: a batch, one ping a line.
func isNDJSON(r *http.Request) bool {
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return mt == "application/x-ndjson" || mt == "application/ndjson" || mt == "application/jsonl"
}

// element is one ping of a batch and what became of it.
type element struct {
	Index    int    `json:"index"`
	Decision string `json:"decision"`
	Reason   string `json:"reason,omitempty"`
	Field    string `json:"field,omitempty"`
	Rule     string `json:"rule,omitempty"`
	Error    string `json:"error,omitempty"`
}

// batchAnswer is the JSON answered when no element of a batch goes upstream.
type batchAnswer struct {
	Decision string    `json:"decision"`
	Error    string    `json:"error,omitempty"`
	Elements []element `json:"elements"`
}

// serveBatch runs the four layers for each ping of a batch body, with all
// the claims in one store round trip, and forwards the accepted elements
// only, each byte for byte as sent.
func (h *Handler) serveBatch(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, repl *caddy.Replacer, raws [][]byte) error {
	// 1. and 2. Normalise and quantise each element.
	elements := make([]element, len(raws))
	var observations []dedup.Observation
	var at []int // which element each observation is
	for i, raw := range raws {
		elements[i].Index = i
		ping, scope, err := h.normalise(raw, repl)
		if err != nil {
			elements[i] = h.rejectElement(r, i, raw, err)
			continue
		}
		observations = append(observations, h.observe(ping, scope))
		at = append(at, i)
	}

	// 3. Claim them all at once.
	var claims []*dedup.Claim
	if len(observations) > 0 {
		var verdicts []dedup.Verdict
		var err error
		claims, verdicts, err = h.deduper.ClaimAll(r.Context(), observations)
		if err != nil {
			return h.storeFailed(w, r, next, repl, err)
		}
		for j, v := range verdicts {
			elements[at[j]].Decision, elements[at[j]].Reason = string(v.Decision), string(v.Reason)
			h.watchForStuck(observations[j].Asset, v)
		}
	}

	// 4. Record, and answer or forward.
	var accepted []*dedup.Claim
	var acceptedRaws [][]byte
	inFlight := false
	for j, c := range claims {
		switch elements[at[j]].Decision {
		case string(dedup.Accepted):
			accepted = append(accepted, c)
			acceptedRaws = append(acceptedRaws, raws[at[j]])
		case string(dedup.InFlight):
			inFlight = true
		}
	}
	for _, e := range elements {
		metrics.decisions.WithLabelValues(e.Decision, e.Reason+e.Rule).Inc()
	}
	counts := countElements(elements)
	decision := batchDecision(counts, len(elements), inFlight)
	h.recordBatch(repl, decision, counts)

	if inFlight && !h.shadow {
		// An element's first delivery is still being processed and may
		// fail: the whole batch must come back, so nothing of it is kept.
		if len(accepted) > 0 {
			if _, err := h.deduper.Release(context.WithoutCancel(r.Context()), accepted...); err != nil {
				h.logger.Error("releasing the claims of a batch sent back for retry failed; its retries may be suppressed", zap.Error(err))
			}
		}
		w.Header().Set("Retry-After", "1")
		writeBatchAnswer(w, http.StatusConflict, decision, counts, elements,
			"the first delivery of some pings of this batch is still being processed; retry the batch shortly")
		return nil
	}
	setBatchHeaders(w, counts, elements)
	switch {
	case h.shadow:
		w.Header().Set(headerDecision, shadowDecision(decision))
		return h.forward(w, r, next, accepted...)
	case len(accepted) == 0 && counts.rejected == 0:
		w.Header().Set(headerDecision, decision)
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(http.StatusOK)
		return nil
	case len(accepted) == 0:
		writeBatchAnswer(w, http.StatusUnprocessableEntity, decision, counts, elements,
			"no ping of this batch is new, and some are invalid: see elements")
		return nil
	}
	w.Header().Set(headerDecision, decision)
	if len(accepted) < len(raws) {
		restoreBody(r, dedup.JoinBatch(acceptedRaws, isNDJSON(r)))
	}
	return h.forward(w, r, next, accepted...)
}

// rejectElement records an element that cannot be keyed, in the dead-letter
// stream if there is one.
func (h *Handler) rejectElement(r *http.Request, i int, raw []byte, err error) element {
	e := element{Index: i, Decision: decisionRejected}
	if errors.Is(err, dedup.ErrNotAPing) {
		e.Rule, e.Error = reasonNotAPing, err.Error()
		return e
	}
	rej, ok := rejectionFor(err)
	if !ok {
		rej = rejection{http.StatusBadRequest, errorBody{Error: err.Error()}}
	}
	e.Field, e.Rule, e.Error = rej.body.Field, rej.reason(), rej.body.Error
	if h.deadLetters != nil {
		if err := h.deadLetters.add(r, raw, rej); err != nil {
			h.storeErrors.log("dead-lettering an invalid ping failed; rejecting it instead", err)
		} else {
			e.Decision = decisionDeadLettered
		}
	}
	return e
}

// elementCounts sums a batch's elements by what became of them.
type elementCounts struct {
	accepted, suppressed, rejected int
}

func countElements(elements []element) elementCounts {
	var c elementCounts
	for _, e := range elements {
		switch e.Decision {
		case string(dedup.Accepted):
			c.accepted++
		case string(dedup.Suppressed), string(dedup.InFlight):
			c.suppressed++
		default:
			c.rejected++
		}
	}
	return c
}

// batchDecision is the X-Dedup of a batch: accepted or suppressed when all
// its elements were, partial when they were a mix.
func batchDecision(c elementCounts, n int, inFlight bool) string {
	switch {
	case inFlight:
		return string(dedup.InFlight)
	case c.accepted == n:
		return string(dedup.Accepted)
	case c.suppressed == n:
		return string(dedup.Suppressed)
	case c.rejected == n:
		return decisionRejected
	default:
		return decisionPartial
	}
}

// shadowDecision is what shadow mode says instead of what enforce does.
func shadowDecision(decision string) string {
	switch decision {
	case string(dedup.Accepted):
		return decision
	case string(dedup.Suppressed), string(dedup.InFlight):
		return decisionWouldSuppress
	case decisionRejected:
		return decisionWouldReject
	default:
		return decisionWouldPartial
	}
}

// recordBatch sets the batch's placeholders and logs it at debug level;
// each element was counted in the metrics already.
func (h *Handler) recordBatch(repl *caddy.Replacer, decision string, c elementCounts) {
	repl.Set(placeholderDecision, decision)
	repl.Set(placeholderReason, "")
	repl.Set(placeholderAccepted, c.accepted)
	repl.Set(placeholderSuppressed, c.suppressed)
	repl.Set(placeholderRejected, c.rejected)
	if ce := h.logger.Check(zapcore.DebugLevel, "telemetry_dedup batch decision"); ce != nil {
		ce.Write(zap.String("decision", decision), zap.Int("accepted", c.accepted), zap.Int("suppressed", c.suppressed), zap.Int("rejected", c.rejected))
	}
}

func setBatchHeaders(w http.ResponseWriter, c elementCounts, elements []element) {
	h := w.Header()
	h.Set(headerAccepted, strconv.Itoa(c.accepted))
	h.Set(headerSuppressed, strconv.Itoa(c.suppressed))
	h.Set(headerRejected, strconv.Itoa(c.rejected))
	if c.rejected == 0 {
		return
	}
	var rejected []element
	for _, e := range elements {
		if e.Decision != string(dedup.Accepted) && e.Decision != string(dedup.Suppressed) && len(rejected) < maxRejectionsHeader {
			rejected = append(rejected, element{Index: e.Index, Decision: e.Decision, Field: e.Field, Rule: e.Rule})
		}
	}
	b, _ := json.Marshal(rejected) // a slice of plain structs always marshals
	h.Set(headerRejections, string(b))
}

func writeBatchAnswer(w http.ResponseWriter, status int, decision string, c elementCounts, elements []element, msg string) {
	setBatchHeaders(w, c, elements)
	w.Header().Set(headerDecision, decision)
	b, _ := json.Marshal(batchAnswer{Decision: decision, Error: msg, Elements: elements})
	b = append(b, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
