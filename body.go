package telemetrydedup

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"
)

// tooLargeError reports a body over max_body (or over an earlier
// request_body max_size).
type tooLargeError struct{ limit int64 }

func (e *tooLargeError) Error() string {
	return fmt.Sprintf("the request body is larger than max_body (%s); send one ping per request or raise max_body",
		humanize.IBytes(uint64(e.limit)))
}

// readBody reads at most limit bytes of the body and puts them back for the
// next handler, with a ContentLength that matches: reverse_proxy drops a body
// whose ContentLength is 0, and a wrong length fails the upstream request.
// An oversize body is put back whole, for shadow mode to forward.
func readBody(r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, &tooLargeError{limit}
	}
	if r.ContentLength >= 0 {
		return readKnownLength(r)
	}
	var buf bytes.Buffer
	_, err := buf.ReadFrom(io.LimitReader(r.Body, limit+1))
	switch {
	case err != nil && isTooLarge(err):
		return nil, &tooLargeError{limit}
	case err != nil:
		return nil, caddyhttp.Error(http.StatusBadRequest, fmt.Errorf("reading the request body: %w", err))
	case int64(buf.Len()) > limit:
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(buf.Bytes()), r.Body), r.Body}
		return nil, &tooLargeError{limit}
	}
	body := buf.Bytes()
	restoreBody(r, body)
	return body, nil
}

// readKnownLength reads a body whose Content-Length was sent into one
// buffer of exactly that size; the server ends the body there.
func readKnownLength(r *http.Request) ([]byte, error) {
	body := make([]byte, r.ContentLength)
	if _, err := io.ReadFull(r.Body, body); err != nil {
		if isTooLarge(err) {
			return nil, err
		}
		return nil, caddyhttp.Error(http.StatusBadRequest, fmt.Errorf("reading the request body: %w", err))
	}
	restoreBody(r, body)
	return body, nil
}

func restoreBody(r *http.Request, body []byte) {
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	r.ContentLength = int64(len(body))
	r.TransferEncoding = nil // a chunked request now has a known length
}

// isTooLarge recognises the limit of an earlier request_body handler, which
// arrives either bare or wrapped as a 413 handler error.
func isTooLarge(err error) bool {
	var mbe *http.MaxBytesError
	var he caddyhttp.HandlerError
	return errors.As(err, &mbe) || (errors.As(err, &he) && he.StatusCode == http.StatusRequestEntityTooLarge)
}
