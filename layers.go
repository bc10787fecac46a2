package telemetrydedup

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// request is one request's pings and what became of each. A single ping is
// a batch of one: every ping takes the same path through the four layers,
// and only the answer is rendered differently.
type request struct {
	batch    ping.Batch
	elements []element
	// unsure are the claims of a store call that failed without saying
	// whether it wrote them: reconciled once the request's outcome is known.
	unsure []*dedup.Claim
	// sentBack are the claims of the new pings of a batch sent back whole
	// (it holds a ping that must come back): given back, not forwarded.
	sentBack []*dedup.Claim
	// one holds the element of a single ping, saving an allocation, and
	// oneBytes its bytes, saving the batch another.
	one      [1]element
	oneBytes [1][]byte
	// placeholders answers for the request in its replacer, if it was the
	// first request there (see publishPlaceholders), saving another.
	placeholders outcomePlaceholders
	// body is what the next handler reads the body from, saving a third.
	body restoredBody
}

// setBatch makes the request that of a batch, its elements not yet read.
func (req *request) setBatch(batch ping.Batch) {
	req.batch = batch
	if len(batch.Elements) == 1 {
		req.elements = req.one[:]
	} else {
		req.elements = make([]element, len(batch.Elements))
	}
}

// element is one ping of a request and what became of it.
type element struct {
	raw   []byte // the ping as sent, for the upstream and the dead letters
	asset string // the asset id as sent or resolved, outside any key scope
	scope string
	obs   dedup.Observation
	// claims holds the element's claim on the store once it was claimed:
	// a slice of one, of the store call's, that forward takes as it is.
	claims []*dedup.Claim

	// decision is empty while the element waits for its claim.
	decision dedup.Decision
	// reason is why: the reason of a suppression, the rule a rejected ping
	// broke, or what else happened (store_error, not_a_ping, sent_back).
	reason string
	// rejection is the answer a ping that cannot be keyed gets alone.
	rejection *rejection
	// err is a failure no rule names; the request fails with it (500).
	err error
}

// single reports a request that carried one ping, not a batch.
func (req *request) single() bool { return req.batch.Single() }

// normalise reads the body within max_body (restored for the next handler),
// splits the request into its pings and reads and validates each. A
// request that cannot be read or split is one element, rejected as a
// whole.
func (h *Handler) normalise(r *http.Request, repl *caddy.Replacer) *request {
	req := new(request)
	ct := contentTypeOf(r)
	form := h.settings.readsForm(ct)
	body, err := readBody(r, h.settings.maxBody, &req.body)
	if tooLarge, ok := err.(*tooLargeError); ok { // readBody's own: an errors.As target would cost every request an allocation
		tooLarge.sent = h.sentShape(ct, form, tooLarge.head)
	}
	if err == nil && len(body) > 0 && !(form && r.URL.RawQuery != "") {
		// An empty body is no compressed one (a GET's pings are in its
		// query), and a form's query outranks its body, which is not read.
		err = refuseContentEncoding(r)
	}
	if err == nil {
		var batch ping.Batch
		if batch, err = h.split(r, ct, body, form, req.oneBytes[:0]); err == nil {
			h.normaliseBatch(req, batch, repl)
			return req
		}
	}
	sent := body
	if form && r.URL.RawQuery != "" {
		sent = []byte(r.URL.RawQuery)
	}
	req.setBatch(ping.Batch{Framing: ping.Single, Elements: [][]byte{sent}})
	req.elements[0].raw = sent
	req.elements[0].refuse(err)
	req.elements[0].asset = h.refusedAsset("", repl)
	return req
}

// refusedAsset names the asset of a ping refused before it was keyed, for
// its dead letter and the decision's debug line: the one read (a ping its
// values' rules refused), else the asset template's value, which is
// nowhere else in the letter; none that could not be an asset id (too
// long, a control character), which no log or stream should print.
func (h *Handler) refusedAsset(read string, repl *caddy.Replacer) string {
	asset := read
	if asset == "" && h.settings.assetTemplate != "" {
		asset, _ = expandTemplate(repl, "asset", h.settings.assetTemplate)
	}
	if !ping.PrintableAsset(asset) {
		return ""
	}
	return asset
}

// sentShape tells what an oversize body held, for the fix its 413 names,
// from head, what was read of it: form fields are one ping; NDJSON and a
// JSON array are batches, and so is an array under the route's batch
// wrapper (Overland's always), where an object is one ping; anything else
// the OwnTracks apps post, read or not, is one of their messages, and
// anything else Traccar's forwarders post one position or event; a JSON
// object read up to the limit is one ping.
func (h *Handler) sentShape(ct contentType, form bool, head []byte) sentShape {
	splitter := &h.settings.splitter
	opening := openingOf(head)
	if splitter.Wrapper != "" && opening == '{' {
		opening = splitter.WrapperOpening(head) // its pings are in the wrapper
	}
	switch {
	case form:
		return sentOne
	case splitter.Wrapper != "" && h.Preset == "overland":
		return sentOverland
	case ct.ndjson() || opening == '[':
		return sentBatch
	case h.Preset == "owntracks":
		return sentOwnTracks
	case h.Preset == "traccar":
		return sentTraccar
	case opening == '{':
		return sentOne
	}
	return sentUnknown
}

// refuseContentEncoding refuses a compressed body: its pings cannot be
// read as sent, and none of the real senders compresses (a gzip body would
// otherwise be refused as invalid UTF-8, which says nothing of the fix).
func refuseContentEncoding(r *http.Request) error {
	// Every coding of every header line: a list ("identity, gzip"), or
	// lines of their own, each names a coding applied to the body.
	var ce string
	for _, line := range r.Header.Values("Content-Encoding") {
		for _, coding := range strings.Split(line, ",") {
			if coding = strings.TrimSpace(coding); coding != "" && !strings.EqualFold(coding, "identity") {
				ce = coding
			}
		}
	}
	if ce == "" {
		return nil
	}
	return &ping.MalformedError{Reason: "the request body is Content-Encoding " + ce +
		"; telemetry_dedup reads the pings as sent: have the sender send them uncompressed"}
}

// split finds a request's pings: in its form fields, or in its body,
// appended to elements.
func (h *Handler) split(r *http.Request, ct contentType, body []byte, form bool, elements [][]byte) (ping.Batch, error) {
	if form {
		if err := h.settings.refuseJSONAsForm(r.URL.RawQuery, body); err != nil {
			return ping.Batch{}, err
		}
		return h.settings.formParser.SplitForm(r.URL.RawQuery, body)
	}
	if len(body) == 0 && h.settings.parser.EmptyFix == "" && !h.settings.parser.SkipEmpty && queryHoldsAPosition(r.URL.RawQuery) {
		return ping.Batch{}, &ping.MalformedError{Reason: "the request body is empty, and its query string holds a position " +
			"(the OsmAnd protocol, as OsmAnd and Traccar Client send it): " + h.osmandFix("a query string's fields")}
	}
	batch, err := h.settings.splitter.Split(elements, body, ct.ndjson())
	if tooMany, ok := errors.AsType[*ping.BatchTooLargeError](err); ok && h.sentShape(ct, form, body) == sentOverland {
		tooMany.Fix = sentOverland.fix() + " raise max_batch" // the app resends the batch whole; it cannot split it
	}
	return batch, err
}

// osmandFix says how to read form fields (the OsmAnd protocol's, in a
// query string or a form body: what) on a route that read them as JSON.
// With encoding auto the route reads them unless the request says JSON,
// as Traccar's port tells its two formats apart. With preset osmand,
// encoding auto reads both (encoding form would refuse Traccar Client 9's
// JSON); any other route's JSON senders need it as it is, so a route of
// its own with preset osmand. Told to add preset osmand, a route without a
// preset read its own senders' JSON as Transistorsoft bodies and passed
// every one on unkeyed, and one with its own field paths kept them over
// the preset's; encoding form alone looks for asset_id and occurred_at,
// and beside a preset whose senders post JSON only does not load.
func (h *Handler) osmandFix(what string) string {
	switch {
	case h.settings.encoding == encodingAuto:
		return "this route reads form fields unless the Content-Type says JSON: " +
			"have the sender send " + what + " without Content-Type: application/json (a form body as application/x-www-form-urlencoded)"
	case h.Preset == "osmand":
		return "read it with encoding auto, which reads " + what + " and a JSON body alike"
	}
	return "give such senders a route of their own with preset osmand: this route reads JSON bodies"
}

// formBodyFix gives a body that looks form encoded, read as JSON, the fix
// of this route (osmandFix) in place of the parser's, which knows none:
// told to use preset osmand or encoding form, a route with preset osmand
// was told to add what it has, and any other one what would not load or
// would pass its own senders on unkeyed.
func (h *Handler) formBodyFix(err error) error {
	if m, ok := errors.AsType[*ping.MalformedError](err); ok && m.FormEncoded {
		return &ping.MalformedError{Reason: strings.TrimSuffix(m.Reason, ping.FormEncodedFix) + h.osmandFix("its fields")}
	}
	return err
}

// queryHoldsAPosition reports a query string with a latitude and a
// longitude (lat and lon, or location=lat,lon), as an OsmAnd-protocol
// sender's GET or empty POST has (an OwnTracks route passes an empty body
// on as no ping, whatever its query: SkipEmpty). Told
// to limit the handler to POSTs with a matcher, the JSON route's advice
// for an empty body, an operator let such a sender's every fix through
// unexamined.
func queryHoldsAPosition(query string) bool {
	if query == "" {
		return false
	}
	fields, _ := url.ParseQuery(query)
	return fields.Has("lat") && fields.Has("lon") || fields.Has("location")
}

// refuseJSONAsForm refuses, with encoding form, a JSON body where the form
// fields would be read: as fields it is one field named after the whole
// body, and its ping would be rejected as missing fields it plainly holds.
// A form body never starts with a brace or a bracket (they are
// percent-encoded in it). With encoding auto such a body is what the
// preset makes of it: osmand's passes on unkeyed, as Traccar reads it.
func (s *settings) refuseJSONAsForm(query string, body []byte) error {
	if s.encoding != encodingForm || query != "" {
		return nil
	}
	if opening := openingOf(body); opening != '{' && opening != '[' {
		return nil
	}
	return ping.JSONAsFormError()
}

// readsForm reports a request whose fields are form encoded: always with
// encoding form, and with auto unless its Content-Type is JSON, which is
// how Traccar's OsmAnd port tells its two formats apart.
func (s *settings) readsForm(ct contentType) bool {
	switch s.encoding {
	case encodingForm:
		return true
	case encodingAuto:
		return !ct.is("application/json") && !ct.ndjson()
	}
	return false
}

// normaliseBatch reads and validates each ping of batch into req.
func (h *Handler) normaliseBatch(req *request, batch ping.Batch, repl *caddy.Replacer) {
	req.setBatch(batch)
	extracts := h.settings.extracts
	if batch.Framing == ping.Form {
		extracts = h.settings.formExtracts
	}
	now := time.Now()
	var scope string
	var scopeErr error
	if h.settings.keyScope.enabled() {
		scope, scopeErr = h.settings.keyScope.expand(repl) // the request's, the same for each ping
	}
	for i, raw := range batch.Elements {
		e := &req.elements[i]
		e.raw = batch.Sent(i)
		p, err := h.readPing(extracts, raw, repl, scopeErr, now)
		switch {
		case errors.Is(err, ping.ErrNotAPing):
			e.decision, e.reason = decisionSkipped, skipReason(err)
		case err != nil:
			e.refuse(h.formBodyFix(err))
			e.asset = h.refusedAsset(p.Asset, repl)
		default:
			e.obs.Ping, e.asset, e.scope = p, p.Asset, scope
		}
	}
}

// skipReason says why a ping is passed on unkeyed: not a position, or,
// for a sender whose backend keeps it anyway, the rule of where or when a
// fix can be that it breaks.
func skipReason(err error) string {
	var implausible ping.ImplausibleError
	if errors.As(err, &implausible) {
		return string(implausible.Rule)
	}
	return reasonNotAPing
}

// readPing reads one ping through extracts and validates it with the
// cache's parser. scopeErr is why the request's key scope
// could not be filled, if it could not: the ping's own faults are reported
// first, as they would be without a scope.
func (h *Handler) readPing(extracts *ping.ExtractCache, raw []byte, repl *caddy.Replacer, scopeErr error, now time.Time) (p ping.Ping, err error) {
	s := &h.settings
	if p, err = extracts.Extract(raw); err != nil {
		return p, err
	}
	if s.assetTemplate != "" {
		if p.Asset, err = expandTemplate(repl, "asset", s.assetTemplate); err != nil {
			return p, err
		}
	}
	if scopeErr != nil {
		return p, scopeErr
	}
	parser := extracts.Parser()
	p = parser.AtServerClock(p, now)
	return p, parser.Validate(p, now)
}

// refuse marks an element that cannot be keyed: rejected with the answer
// its error calls for, or failed when no rule names the error.
func (e *element) refuse(err error) {
	rej, ok := rejectionFor(err)
	if !ok {
		e.err = err
		return
	}
	e.decision, e.reason, e.rejection = decisionRejected, rej.reason(), &rej
}

// quantise computes the bucket, cell and key of every ping still waiting,
// in its key scope: the scope becomes part of the identity keys are made of.
func (h *Handler) quantise(req *request) {
	for i := range req.elements {
		if e := &req.elements[i]; e.waiting() {
			p := e.obs.Ping
			p.Asset = dedup.ScopedAsset(e.scope, p.Asset)
			e.obs = h.deduper.Observe(p)
		}
	}
}

// claim is the element's claim on the store, or nil before it was claimed.
func (e *element) claim() *dedup.Claim {
	if len(e.claims) == 0 {
		return nil
	}
	return e.claims[0]
}

// waiting reports an element that is a valid ping, not yet claimed.
func (e *element) waiting() bool { return e.decision == "" && e.err == nil }

// claim claims every waiting ping of the request in one store call. When
// the store cannot answer, on_store_error decides for each ping it could
// not judge; a ping it did judge (a redelivery the near cache knows) keeps
// its verdict, as it would alone. The
// call is detached from the sender, as the forward is, and bounded by the
// store's own timeout: a sender that hangs up while its claim waits in the
// pipeline is no store failure, and must not turn a duplicate into an
// unchecked forward. Nothing below it reads the request's context values,
// so it starts from the background context, which costs no allocation.
func (h *Handler) claim(req *request) {
	ctx := context.Background()
	var oneObs [1]dedup.Observation // a single ping's claim allocates nothing here
	var oneAt [1]int
	batch, at := oneObs[:0], oneAt[:0]
	for i := range req.elements {
		if req.elements[i].waiting() {
			batch = append(batch, req.elements[i].obs)
			at = append(at, i)
		}
	}
	if len(batch) == 0 {
		return
	}
	claims, verdicts, err := h.deduper.ClaimAll(ctx, batch)
	if err != nil && !errors.Is(err, dedup.ErrBreakerOpen) { // the breaker logs its own transitions
		h.claimErrors.log(h.settings.claimFailedLine(), err)
	}
	if dedup.MayHaveWritten(err) {
		req.unsure = failedClaims(claims, err)
	}
	for j, i := range at {
		e := &req.elements[i]
		e.claims = claims[j : j+1 : j+1]
		if dedup.DecideFailed(err, j) {
			e.decision, e.reason = h.settings.onStoreError, reasonStoreError
			continue
		}
		e.decision, e.reason = verdicts[j].Decision, string(verdicts[j].Reason)
	}
}

// failedClaims are the claims of a failed claim call without a verdict:
// all of them, or those a partial failure names. The others' outcomes are
// known, and their requests settle or release them as usual.
func failedClaims(claims []*dedup.Claim, err error) []*dedup.Claim {
	if _, partial := errors.AsType[*dedup.DecideError](err); !partial {
		return claims
	}
	var failed []*dedup.Claim
	for j, c := range claims {
		if dedup.DecideFailed(err, j) {
			failed = append(failed, c)
		}
	}
	return failed
}

// claimFailedLine is the store-error line of claims the store could not
// answer: what the senders of their pings got, which on_store_error
// decides in enforce mode and shadow mode only records.
func (s *settings) claimFailedLine() string {
	switch {
	case s.shadow && s.onStoreError == decisionUnavailable:
		return "dedup store unavailable; shadow mode forwarded the pings it could not judge all the same, recorded unavailable: " +
			"enforce would have answered them 503 (on_store_error closed)"
	case s.shadow:
		return "dedup store unavailable; shadow mode forwarded the pings it could not judge unchecked, as enforce does (on_store_error open)"
	case s.onStoreError == decisionUnavailable:
		return "dedup store unavailable; the pings it could not judge are answered 503, for their senders to send them again (on_store_error closed)"
	}
	return "dedup store unavailable; the pings it could not judge go upstream unchecked, their duplicates with them (on_store_error open)"
}

// contentType is a request's media type as sent, without its parameters.
type contentType string

func contentTypeOf(r *http.Request) contentType { return mediaType(r.Header.Get("Content-Type")) }

// mediaType is the media type of a Content-Type value, without its
// parameters.
func mediaType(value string) contentType {
	v, _, _ := strings.Cut(value, ";")
	return contentType(strings.TrimSpace(v))
}

// is compares media types as RFC 9110 does: case-insensitively.
func (ct contentType) is(mediaType string) bool { return strings.EqualFold(string(ct), mediaType) }

// json reports a JSON body: application/json, or any type with the +json
// suffix (RFC 6839).
func (ct contentType) json() bool {
	return ct.is("application/json") || len(ct) > len("+json") && strings.EqualFold(string(ct[len(ct)-len("+json"):]), "+json")
}

// ndjson reports a newline-delimited JSON body: a batch, one ping a line.
func (ct contentType) ndjson() bool {
	return ct.is("application/x-ndjson") || ct.is("application/ndjson") || ct.is("application/jsonl")
}

// expandTemplate fills the asset or key_scope template from the request. A
// placeholder that is unknown or empty is an invalid ping, not a shared
// empty identity.
func expandTemplate(repl *caddy.Replacer, option, template string) (string, error) {
	v, err := repl.ReplaceOrErr(template, true, true)
	if err != nil {
		return "", &ping.InvalidPingError{Field: option, Rule: ping.RuleRequired,
			Detail: fmt.Sprintf("the %s template %s could not be filled from this request: %v", option, template, err)}
	}
	return v, nil
}
