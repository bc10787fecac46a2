package telemetrydedup

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"
)

// deadLetters appends pings that cannot be keyed to a Redis stream, so that
// nothing a sender delivered is lost without a trace: an operator can read
// them back (XRANGE), fix the sender or the config, and replay them.
type deadLetters struct {
	client  redis.UniversalClient
	stream  string
	maxLen  int64
	timeout time.Duration
}

// redisClienter is implemented by stores that can lend their Redis client.
type redisClienter interface {
	redisClient() (redis.UniversalClient, time.Duration)
}

func newDeadLetters(store storeProvider, stream string, maxLen int64) (*deadLetters, error) {
	rc, ok := store.(redisClienter)
	if !ok {
		return nil, errors.New("on_invalid dead_letter needs store redis: the dead-letter stream lives on its server")
	}
	client, timeout := rc.redisClient()
	return &deadLetters{client: client, stream: stream, maxLen: maxLen, timeout: timeout}, nil
}

// add appends one rejected ping with why it was rejected, when and from
// where. It is detached from the sender's cancellation, like a claim's
// settlement: a sender that hangs up does not undo the record.
func (d *deadLetters) add(r *http.Request, body []byte, rej rejection) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), d.timeout)
	defer cancel()
	return d.client.XAdd(ctx, &redis.XAddArgs{
		Stream: d.stream,
		MaxLen: d.maxLen,
		Approx: true,
		Values: []any{
			"reason", rej.reason(),
			"field", rej.body.Field,
			"error", rej.body.Error,
			"body", body,
			"received_at", time.Now().UTC().Format(time.RFC3339Nano),
			"remote_addr", r.RemoteAddr,
		},
	}).Err()
}
