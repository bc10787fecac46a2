package telemetrydedup

import (
	"context"
	"net/http"
	"time"
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
	body                 []byte
	receivedAt           time.Time
	remoteAddr           string
}

func newDeadLetter(r *http.Request, body []byte, rej *rejection) deadLetter {
	return deadLetter{
		reason: rej.reason(), field: rej.body.Field, error: rej.body.Error,
		body: body, receivedAt: time.Now().UTC(), remoteAddr: r.RemoteAddr,
	}
}
