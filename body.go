package telemetrydedup

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"
)

// tooLargeError reports a body over max_body, or over an earlier
// request_body max_size (byMaxSize): the limit to raise is the one named,
// and beside it what the sender can change instead, for what it sent.
type tooLargeError struct {
	limit     int64
	byMaxSize bool
	// head is what was read of the body: nothing when a declared length
	// over the limit refused it unread.
	head []byte
	// sent is what the body held, as far as the handler can tell.
	sent sentShape
}

func (e *tooLargeError) Error() string {
	option := "max_body"
	if e.byMaxSize {
		option = "request_body max_size"
	}
	return fmt.Sprintf("the request body is larger than %s (%s); %s raise %s",
		option, humanize.IBytes(uint64(e.limit)), e.sent.fix(), option)
}

// sentShape is what an oversize body held, told from the route's framing
// and preset, the Content-Type and what was read of the body up to the
// limit, never from the body whole.
type sentShape int

// The shapes of an oversize body.
const (
	// sentUnknown is one ping or a batch: a JSON body refused unread, or
	// one whose batch wrapper was not reached by what was read.
	sentUnknown sentShape = iota
	// sentOne is one ping: a JSON object, a wrapper's lone object, or form
	// fields.
	sentOne
	// sentBatch is a JSON array, NDJSON, or an array in the route's batch
	// wrapper.
	sentBatch
	// sentOverland is Overland's batch, which the app resends as it was
	// until it fits.
	sentOverland
	// sentOwnTracks is an OwnTracks message, which the apps post whole,
	// one a request, and which need not be a location at all.
	sentOwnTracks
	// sentTraccar is what Traccar forwards, one position or event a
	// request: an event is no ping, and neither can be made smaller.
	sentTraccar
)

// fix is what the sender can change, the words before "raise <limit>".
func (s sentShape) fix() string {
	switch s {
	case sentOne:
		return "it holds one ping: if the sender's pings are this large,"
	case sentBatch:
		return "send smaller batches (fewer pings per request), or"
	case sentOverland:
		return "Overland resends the same batch until it fits: lower its Locations per Batch setting, or"
	case sentOwnTracks:
		return "OwnTracks posts each message whole, one a request (a card or a location with a photo, a list of regions), " +
			"and Android resends a refused one forever at the head of its queue:"
	case sentTraccar:
		return "Traccar forwards each position or event whole, one a request, " +
			"and drops a refused one (a position after ten tries with forward.retry.enable):"
	}
	return "split a batch into smaller ones, or"
}

// openingOf is the first byte of body other than white space, 0 if none.
func openingOf(body []byte) byte {
	if trimmed := bytes.TrimLeft(body, " \t\r\n"); len(trimmed) > 0 {
		return trimmed[0]
	}
	return 0
}

// firstRead is the buffer a body read starts with: most pings fit, and a
// sender that declares a megabyte and sends a byte gets no more than this
// until more arrives.
const firstRead = 4 << 10

// readBody reads at most limit bytes of the body and puts them back for the
// next handler, read from rb, with a ContentLength that matches: reverse_proxy drops a body
// whose ContentLength is 0, and a wrong length fails the upstream request.
// An oversize body is put back whole, for shadow mode to forward.
//
// The buffer grows with what has arrived, never with what was declared: a
// Content-Length is a claim, and 300 connections each declaring 1 MiB and
// sending one byte must not hold 300 MiB.
func readBody(r *http.Request, limit int64, rb *restoredBody) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, &tooLargeError{limit: limit}
	}
	want := limit + 1 // one byte more tells an oversize body
	if limit == math.MaxInt64 {
		want = limit // no body is longer: max_body 9223372036854775807 overflowed to a negative read
	}
	if r.ContentLength >= 0 {
		want = r.ContentLength // the server ends the body there
	}
	body, err := readUpTo(r.Body, want)
	switch {
	case err != nil && isTooLarge(err):
		tooLarge := maxSizeError(err, limit)
		tooLarge.head = body
		return nil, tooLarge
	case err != nil:
		return nil, caddyhttp.Error(http.StatusBadRequest, fmt.Errorf("reading the request body: %w", err))
	case r.ContentLength >= 0 && int64(len(body)) < r.ContentLength:
		return nil, caddyhttp.Error(http.StatusBadRequest, fmt.Errorf("reading the request body: %w", io.ErrUnexpectedEOF))
	case int64(len(body)) > limit:
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(body), r.Body), r.Body}
		return nil, &tooLargeError{limit: limit, head: body}
	}
	rb.restore(r, body)
	return body, nil
}

// readUpTo reads until EOF or n bytes, whichever comes first, into a buffer
// that starts at firstRead and doubles as bytes arrive, so memory follows
// the bytes received.
func readUpTo(body io.Reader, n int64) ([]byte, error) {
	buf := make([]byte, 0, min(n, firstRead))
	for int64(len(buf)) < n {
		if len(buf) == cap(buf) {
			grown := make([]byte, len(buf), min(n, 2*int64(cap(buf))))
			copy(grown, buf)
			buf = grown
		}
		m, err := body.Read(buf[len(buf):min(int64(cap(buf)), n)])
		buf = buf[:len(buf)+m]
		if errors.Is(err, io.EOF) {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
	return buf, nil
}

// restoreBody puts body back as r's body.
func restoreBody(r *http.Request, body []byte) { new(restoredBody).restore(r, body) }

// restore puts body back as r's body, read from rb.
func (rb *restoredBody) restore(r *http.Request, body []byte) {
	rb.set(body)
	r.Body, r.GetBody = rb, rb.again
	r.ContentLength = int64(len(body))
	r.TransferEncoding = nil // a chunked request now has a known length
}

// restoredBody is a body read whole and put back: for the next handler, and
// again (GetBody) for a proxy that retries.
type restoredBody struct {
	bytes.Reader
	body []byte
}

// set makes rb read body from its start.
func (rb *restoredBody) set(body []byte) {
	rb.body = body
	rb.Reset(body)
}

// Close implements io.Closer: there is nothing to close.
func (*restoredBody) Close() error { return nil }

func (rb *restoredBody) again() (io.ReadCloser, error) {
	again := new(restoredBody)
	again.set(rb.body)
	return again, nil
}

// maxSizeError is the error of a read an earlier request_body handler
// stopped at its max_size, naming that limit when it is below max_body.
func maxSizeError(err error, limit int64) *tooLargeError {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) && mbe.Limit < limit {
		return &tooLargeError{limit: mbe.Limit, byMaxSize: true}
	}
	return &tooLargeError{limit: limit}
}

// isTooLarge recognises the limit of an earlier request_body handler, which
// arrives either bare or wrapped as a 413 handler error.
func isTooLarge(err error) bool {
	var mbe *http.MaxBytesError
	var he caddyhttp.HandlerError
	return errors.As(err, &mbe) || (errors.As(err, &he) && he.StatusCode == http.StatusRequestEntityTooLarge)
}
