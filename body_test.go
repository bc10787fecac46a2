package telemetrydedup

import (
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// A body is read into what has arrived, never into what its Content-Length
// claims: a request that declares 1 MiB and sends a byte costs kilobytes.
func TestDeclaredLengthIsNotAllocatedUpFront(t *testing.T) {
	const declared = 1 << 20
	const requests = 100
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range requests {
		r := httptest.NewRequest(http.MethodPost, "/", io.LimitReader(strings.NewReader("{"), 1))
		r.ContentLength = declared
		if _, err := readBody(r, declared, new(restoredBody)); err == nil {
			t.Fatal("a body shorter than its Content-Length was read without an error")
		}
	}
	runtime.ReadMemStats(&after)
	perRequest := (after.TotalAlloc - before.TotalAlloc) / requests
	if perRequest > 32<<10 {
		t.Fatalf("each 1-byte body declared as 1 MiB allocated %d bytes; reads must grow with what arrives", perRequest)
	}
}

func TestReadBody(t *testing.T) {
	big := strings.Repeat("x", 3*firstRead+17) // past several doublings
	for _, tt := range []struct {
		name          string
		body          string
		contentLength int64 // -1: unknown, as with chunked or HTTP/2
		limit         int64
		want          string
		status        int // of the error; 0 for none
	}{
		{name: "known length", body: `{"a":1}`, contentLength: 7, limit: 100, want: `{"a":1}`},
		{name: "unknown length", body: `{"a":1}`, contentLength: -1, limit: 100, want: `{"a":1}`},
		{name: "empty", body: "", contentLength: 0, limit: 100, want: ""},
		{name: "large, known length", body: big, contentLength: int64(len(big)), limit: 1 << 20, want: big},
		{name: "large, unknown length", body: big, contentLength: -1, limit: 1 << 20, want: big},
		{name: "exactly the limit", body: big, contentLength: -1, limit: int64(len(big)), want: big},
		{name: "declared over the limit", body: `{}`, contentLength: 101, limit: 100, status: http.StatusRequestEntityTooLarge},
		{name: "sent over the limit", body: big, contentLength: -1, limit: int64(len(big)) - 1, status: http.StatusRequestEntityTooLarge},
		{name: "shorter than declared", body: `{"a"`, contentLength: 10, limit: 100, status: http.StatusBadRequest},
		// max_body 9223372036854775807, written for "no limit": one byte
		// more overflowed, and every chunked ping panicked the handler
		// (helper 3's finding, stop 59).
		{name: "the largest limit, unknown length", body: `{"a":1}`, contentLength: -1, limit: math.MaxInt64, want: `{"a":1}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(tt.body))
			r.ContentLength = tt.contentLength
			got, err := readBody(r, tt.limit, new(restoredBody))
			if status := errorStatus(err); status != tt.status {
				t.Fatalf("error %v (status %d), want status %d", err, status, tt.status)
			}
			if err != nil {
				return
			}
			if string(got) != tt.want {
				t.Fatalf("read %d bytes, want %d", len(got), len(tt.want))
			}
			restored, _ := io.ReadAll(r.Body)
			if string(restored) != tt.want || r.ContentLength != int64(len(tt.want)) {
				t.Fatalf("restored %d bytes with ContentLength %d, want %d", len(restored), r.ContentLength, len(tt.want))
			}
			again, err := r.GetBody() // a proxy's retry reads it anew
			if err != nil {
				t.Fatal(err)
			}
			if b, _ := io.ReadAll(again); string(b) != tt.want {
				t.Fatalf("GetBody gave %d bytes, want %d", len(b), len(tt.want))
			}
		})
	}
}

// A request_body max_size below max_body stops the read first: the 413's
// message names that limit, which is the one to raise, not max_body. Caddy's
// request_body hands its limit over as a 413 handler error around
// http.MaxBytesError.
func TestRequestBodyLimitIsTheOneNamed(t *testing.T) {
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(strings.Repeat(" ", 500)))
	r.ContentLength = -1 // chunked: request_body cannot refuse it up front
	r.Body = maxSizeBody{http.MaxBytesReader(w, r.Body, 400)}
	_, err := readBody(r, 1<<20, new(restoredBody))
	if status := errorStatus(err); status != http.StatusRequestEntityTooLarge {
		t.Fatalf("error %v (status %d), want 413", err, status)
	}
	if msg := err.Error(); !strings.Contains(msg, "request_body max_size (400 B)") || strings.Contains(msg, "max_body") {
		t.Fatalf("the 413 says %q; want it to name request_body's max_size of 400 B, the limit the body broke", msg)
	}
}

// maxSizeBody is how Caddy's request_body passes on the error of its
// max_size: a 413 handler error.
type maxSizeBody struct{ io.ReadCloser }

func (b maxSizeBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		err = caddyhttp.Error(http.StatusRequestEntityTooLarge, err)
	}
	return n, err
}

// errorStatus is the status a body-read error is answered with.
func errorStatus(err error) int {
	var tooLarge *tooLargeError
	var he caddyhttp.HandlerError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &tooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.As(err, &he):
		return he.StatusCode
	}
	return -1
}
