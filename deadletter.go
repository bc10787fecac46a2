package telemetrydedup

import (
	"context"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// deadLetterSink keeps the pings that cannot be keyed, so that nothing a
// sender delivered is lost without a trace: an operator can read them back,
// fix the sender or the config, and replay them. A store that can keep
// them offers one (deadLetterer).
type deadLetterSink interface {
	// add keeps a request's letters, and says for each whether it failed.
	add(ctx context.Context, letters []deadLetter) []error
}

// deadLetterChecker is a dead-letter store that can tell at load whether
// its stream can ever be written. A ping whose letter cannot be written is
// answered 503 in enforce mode, so that its sender keeps it; when the
// cause is the config (the key holds another type, the user may not write
// it) that 503 comes back forever and the sender's queue stalls behind
// it, so the load says so at once, where that can be known, rather than
// at the first invalid ping. A store that does not answer at load is not
// checked.
type deadLetterChecker interface {
	checkDeadLetterStream(ctx context.Context, stream string) error
}

// deadLetter is one ping that could not be keyed, with why, when and from
// where.
type deadLetter struct {
	reason, field, error string
	// body is the ping's bytes, up to maxLetterBody of them; bodyBytes
	// how many it had.
	body       []byte
	bodyBytes  int
	receivedAt time.Time
	remoteAddr string
	// host and uri are where the request came: a replay needs them, as the
	// ping's asset or tenant may be in them (Overland's receiver URL,
	// ?device=..., with the README's asset template; a key_scope host).
	host, uri string
	// asset is the ping's (refusedAsset): from a template such as
	// {http.request.header.X-User} it is nowhere else in the letter.
	asset string
}

// maxLetterBody is the most of a ping's bytes a letter keeps: every real
// client's ping fits in it many times over, and what is longer is a body
// that is no ping (a gzip body sent without its Content-Encoding, a
// truncated batch), whose head shows what it is. Kept whole, up to
// max_body, one broken sender's letters filled a Redis run with
// maxmemory and noeviction (as the README advises), and every other
// sender's claims failed: their pings went upstream unchecked.
const maxLetterBody = 8 << 10

func newDeadLetter(r *http.Request, body []byte, asset string, rej *rejection) deadLetter {
	return deadLetter{
		reason: rej.reason(), field: rej.body.Field, error: rej.body.Error,
		body: body[:min(len(body), maxLetterBody)], bodyBytes: len(body),
		receivedAt: time.Now().UTC(), remoteAddr: r.RemoteAddr,
		host: r.Host, uri: sentURI(r), asset: asset,
	}
}

// sentURI is the URI the sender requested, path and query, before any
// rewrite (handle_path, uri strip_prefix): a replay must go there.
func sentURI(r *http.Request) string {
	if orig, ok := r.Context().Value(caddyhttp.OriginalRequestCtxKey).(http.Request); ok && orig.URL != nil {
		return orig.URL.RequestURI()
	}
	return r.URL.RequestURI()
}
