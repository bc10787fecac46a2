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
