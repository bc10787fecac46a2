package telemetrydedup

import (
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
)

// Placeholders answered on every request the handler sees.
const (
	placeholderPrefix   = "http.telemetry_dedup."
	placeholderDecision = placeholderPrefix + "decision"
	placeholderReason   = placeholderPrefix + "reason"
	placeholderKey      = placeholderPrefix + "key"
	placeholderAsset    = placeholderPrefix + "asset"
	placeholderBucket   = placeholderPrefix + "bucket"
	placeholderCell     = placeholderPrefix + "cell"
	// The event a ping carries and its state, as path=value.
	placeholderEvent = placeholderPrefix + "event"
	placeholderState = placeholderPrefix + "state"

	// A request's counts: a batch's, or a single ping's (1 or 0).
	placeholderAccepted   = placeholderPrefix + "accepted"
	placeholderSuppressed = placeholderPrefix + "suppressed"
	placeholderRejected   = placeholderPrefix + "rejected"
	placeholderInFlight   = placeholderPrefix + "in_flight"
)

// record records what became of each ping of the request, then sets the
// request's placeholders.
// earlier is what an earlier run of a handler on the request published,
// if any; it returns what this one publishes. A shadow trial inside an
// enforcing handler publishes nothing, as it sets no answer headers: read
// by a header_up or an access log behind it, its key and decision were
// the backend's, a key the live store never holds and "suppressed" for a
// ping the live handler delivered.
func (h *Handler) record(r *http.Request, repl *caddy.Replacer, req *request, earlier *outcomePlaceholders) *outcomePlaceholders {
	req.sendBack()
	if h.deadLetters != nil {
		h.keepInvalid(r, req)
	}
	for i := range req.elements {
		h.recordOutcome(&req.elements[i])
	}
	if h.quietIn(earlier) {
		return earlier
	}
	return publishPlaceholders(repl, req, &h.deduper.Keyer, earlier)
}

// keepInvalid dead-letters the request's pings that cannot be keyed. A
// batch sent back whole comes back with them: they are dead-lettered then,
// once, and until then sent back with it as its new pings are, not counted
// rejected at each return, which made an outage that sends batches back
// look like a flood of invalid pings. Shadow mode forwards such a batch,
// so it never comes back: their letters are written now, and counted as
// enforce counts them.
func (h *Handler) keepInvalid(r *http.Request, req *request) {
	if req.sentBack == nil {
		if !h.deadLetter(r, req.elements, h.letterErrors, h.settings.letterFailedLine()) {
			req.sendBack() // a ping whose letter failed must come back, and its batch with it
		}
		return
	}
	decision := countElements(req.elements).decision()
	if h.settings.shadow {
		h.deadLetter(r, req.elements, h.sentBackLetterErrors, sentBackLetterFailedLine)
	}
	for i := range req.elements {
		if e := &req.elements[i]; e.deadLetterable() {
			e.decision, e.reason = decision, reasonSentBack
		}
	}
}

// deadLetter keeps the request's pings that cannot be keyed, all in one
// store call, and reports whether every letter was written. A ping whose
// letter could not be written is unavailable, answered as the store's
// outage is with on_store_error closed (503 and Retry-After), so that its
// sender keeps it and sends it again: its 4xx made OwnTracks iOS delete it
// and Traccar's forwarder drop it, the loss dead-lettering is there to
// prevent, at every Redis blip. Shadow mode counts and places it so too,
// as it does every decision enforce makes, and forwards it. A failure is
// logged to failures with failedLine, which says what the senders got.
func (h *Handler) deadLetter(r *http.Request, elements []element, failures *throttledLog, failedLine string) (written bool) {
	var letters []deadLetter
	var letterOf []*element
	for i := range elements {
		if e := &elements[i]; e.deadLetterable() {
			letters = append(letters, newDeadLetter(r, e.raw, e.asset, e.rejection))
			letterOf = append(letterOf, e)
		}
	}
	if len(letters) == 0 {
		return true
	}
	var failed error
	for i, err := range h.deadLetters.add(r.Context(), letters) {
		if err != nil {
			letterOf[i].decision, letterOf[i].reason = decisionUnavailable, reasonStoreError
			failed = err
			continue
		}
		letterOf[i].decision = decisionDeadLettered
	}
	if failed != nil && !errors.Is(failed, dedup.ErrBreakerOpen) { // the breaker logs its own transitions
		failures.log(failedLine, failed)
	}
	return failed == nil
}

// letterFailedLine is the store-error line of dead letters that could not
// be written: what the senders of their pings got.
func (s *settings) letterFailedLine() string {
	if s.shadow {
		return "dead-lettering invalid pings failed; shadow mode forwarded them all the same, recorded unavailable: " +
			"enforce would have answered them 503, and sent a batch holding one back whole"
	}
	return "dead-lettering invalid pings failed; they are answered 503, and a batch holding one is sent back whole, " +
		"for their senders to send them again until the stream can be written"
}

// sentBackLetterFailedLine is the store-error line of the dead letters
// shadow mode writes for a batch that enforce sends back whole, which
// enforce writes only when the batch comes back: their pings are counted
// sent_back as enforce counts them, not unavailable.
const sentBackLetterFailedLine = "dead-lettering the invalid pings of a batch failed; shadow mode forwarded the batch all the same, " +
	"so the upstream has them but the stream does not, and recorded them sent_back, as enforce would: " +
	"it sends such a batch back whole and writes their letters when it comes back"

// recordOutcome records one ping's outcome, the same whether it came alone
// or in a batch: the decision is counted with its reason, the stuck-asset
// tracker sees every claimed ping, and a debug line is written (per-request
// info lines are noise at telemetry rates) that names the scope and the
// mode, as the stuck warning does: two tenants' truck-1, or a shadow
// trial's line beside the live handler's, are told apart.
func (h *Handler) recordOutcome(e *element) {
	if e.err != nil {
		return // the request fails with it; Caddy logs it
	}
	metrics.decisions.WithLabelValues(string(e.decision), e.reason, h.settings.mode()).Add(float64(e.pings()))
	if e.claimed() {
		h.watchForStuck(e.obs.Asset, dedup.Verdict{Decision: e.decision, Reason: dedup.Reason(e.reason)}, e.claim().At)
	}
	if c := h.logger.Check(zapcore.DebugLevel, "telemetry_dedup decision"); c != nil {
		c.Write(zap.String("decision", string(e.decision)), zap.String("reason", e.reason),
			zap.String("asset", e.asset), zap.String("scope", e.scope), zap.String("key", e.key()),
			zap.String("mode", h.settings.mode()))
	}
}

// pings is how many pings the element stands for: a batch over max_batch
// is refused as one element, and each of its pings is lost to the backend
// alike (analyze counts them so).
func (e *element) pings() int {
	if e.rejection != nil && e.rejection.pings > 0 {
		return e.rejection.pings
	}
	return 1
}

// deadLetterable reports an element that cannot be keyed and goes to the
// dead-letter stream with on_invalid dead_letter.
func (e *element) deadLetterable() bool {
	return e.err == nil && e.rejection != nil && e.rejection.deadLetterable()
}

// claimed reports an element the store decided. An invalid ping sent back
// with its batch has the batch's decision, but no claim.
func (e *element) claimed() bool {
	if e.claim() == nil {
		return false
	}
	switch e.decision {
	case dedup.Accepted, dedup.Suppressed, dedup.InFlight:
		return true
	}
	return false
}

// key is the key the element was decided on, if it reached the store.
func (e *element) key() string {
	if e.claim() == nil {
		return ""
	}
	return e.claim().Key()
}

// outcomePlaceholders answers the handler's placeholders from a request's
// outcome when something reads one (an access log, a header template):
// computed on demand, not written ahead on every request, most of which
// read none.
type outcomePlaceholders struct {
	req *request
	// keyer computes the cell of a ping that was decided without one (in
	// the sliding and session shapes), if a placeholder asks for it.
	keyer *dedup.Keyer
	// judging is the handler answering or forwarding the request, nil
	// when none is, and enclosing the handlers of other key spaces it runs
	// inside, outermost first (made only when such handlers nest): a
	// telemetry_dedup handler of any of their key spaces that the request
	// meets meanwhile runs inside that one, and passes it on
	// (Handler.passNested).
	judging   *Handler
	enclosing *[]*Handler
}

// judgedIn reports whether a handler of keySpace is judging the request:
// the innermost, or one it runs inside. Checked against the innermost
// alone, the live handler at a site's top, a shadow trial inside it and
// the live one again in a handle judged every ping twice, and the inner
// one answered 409 to every ping the outer one had claimed, forever.
func (op *outcomePlaceholders) judgedIn(keySpace string) bool {
	if op.judging == nil {
		return false
	}
	if op.judging.keySpace == keySpace {
		return true
	}
	if op.enclosing != nil {
		for _, h := range *op.enclosing {
			if h.keySpace == keySpace {
				return true
			}
		}
	}
	return false
}

// enforced reports whether an enforcing handler is judging the request:
// the answer's headers are its own, which a shadow trial inside it leaves
// alone.
func (op *outcomePlaceholders) enforced() bool {
	if op.judging == nil {
		return false
	}
	if !op.judging.settings.shadow {
		return true
	}
	return op.enclosing != nil && slices.ContainsFunc(*op.enclosing, func(h *Handler) bool { return !h.settings.shadow })
}

// enter makes h the handler judging the request, inside the one that was,
// which it returns for leave.
func (op *outcomePlaceholders) enter(h *Handler) (outer *Handler) {
	outer = op.judging
	if outer != nil {
		if op.enclosing == nil {
			op.enclosing = new([]*Handler)
		}
		*op.enclosing = append(*op.enclosing, outer)
	}
	op.judging = h
	return outer
}

// leave gives the request back to outer, the handler h's enter returned.
func (op *outcomePlaceholders) leave(outer *Handler) {
	op.judging = outer
	if outer != nil {
		*op.enclosing = (*op.enclosing)[:len(*op.enclosing)-1]
	}
}

// placeholderOutcome names, to the replacer, the outcomePlaceholders that
// answer it, so that a handler that runs twice on one request (a retried
// route) finds the provider it registered and publishes its latest outcome.
// The provider answers it itself: a replacer's Set would allocate its map
// on most requests, which set nothing else. No config can write its name
// (a NUL byte), so it is no placeholder: under http.telemetry_dedup, it
// rendered the provider's pointers in a header or log line.
const placeholderOutcome = "\x00telemetry_dedup outcome"

// earlierOutcome is the outcomePlaceholders a handler registered on the
// request before, if one did.
func earlierOutcome(repl *caddy.Replacer) *outcomePlaceholders {
	if v, ok := repl.Get(placeholderOutcome); ok {
		return v.(*outcomePlaceholders)
	}
	return nil
}

// publishPlaceholders makes the request's outcome readable as
// placeholders, through earlier if a handler registered it on the
// request before, and returns what answers them.
func publishPlaceholders(repl *caddy.Replacer, req *request, keyer *dedup.Keyer, earlier *outcomePlaceholders) *outcomePlaceholders {
	op := earlier
	if op == nil {
		op = &req.placeholders
		repl.Map(op.get)
	}
	op.req, op.keyer = req, keyer
	return op
}

// get is the value of placeholder key: a single ping's decision, reason and
// key, and, once it reached the store, its asset, bucket, cell, event and
// state; a batch's decision, an empty reason and its counts.
func (op *outcomePlaceholders) get(key string) (any, bool) {
	if key == placeholderOutcome {
		return op, true
	}
	if !strings.HasPrefix(key, placeholderPrefix) {
		return nil, false
	}
	if op.req.single() {
		if v, ok := op.elementPlaceholder(key, &op.req.elements[0]); ok {
			return v, true
		}
	}
	if v, ok := batchPlaceholder(key, op.req.elements); ok {
		return v, true
	}
	if slices.Contains(placeholderNames, key) {
		// Known but not set for this request (a batch has no one key, a
		// ping that was never claimed no bucket): empty, never the
		// placeholder's own name, which header_up would send as it is.
		return "", true
	}
	return nil, false
}

// placeholderNames are every placeholder the handler answers.
var placeholderNames = []string{placeholderDecision, placeholderReason, placeholderKey, placeholderAsset, placeholderBucket,
	placeholderCell, placeholderEvent, placeholderState, placeholderAccepted, placeholderSuppressed, placeholderRejected, placeholderInFlight}

func (op *outcomePlaceholders) elementPlaceholder(key string, e *element) (any, bool) {
	switch key {
	case placeholderDecision:
		return string(e.decision), true
	case placeholderReason:
		return e.reason, true
	case placeholderKey:
		return e.key(), true
	}
	if e.claim() == nil {
		return nil, false
	}
	switch key {
	case placeholderAsset:
		return e.asset, true
	case placeholderBucket:
		return strconv.FormatInt(e.obs.Bucket, 10), true
	case placeholderCell:
		if e.obs.Cell == 0 { // decided by the asset's stay, without a cell
			return op.keyer.Cell(e.obs.Lat, e.obs.Lon).String(), true
		}
		return e.obs.Cell.String(), true
	case placeholderEvent:
		return e.obs.Event, true
	case placeholderState:
		return e.obs.State, true
	}
	return nil, false
}

func batchPlaceholder(key string, elements []element) (any, bool) {
	c := countElements(elements)
	switch key {
	case placeholderDecision:
		return string(c.decision()), true
	case placeholderReason:
		return "", true
	case placeholderAccepted:
		return c.accepted, true
	case placeholderSuppressed:
		return c.suppressed, true
	case placeholderRejected:
		return c.rejected, true
	case placeholderInFlight:
		return c.inFlight, true
	}
	return nil, false
}
