package telemetrydedup

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/pipeline"
)

// DeadLetters returns a sink that appends to a Redis stream on the store's
// server (XADD MAXLEN ~), with the store's operation timeout, through the
// store's circuit breaker (on a Cluster, the zone of the stream's master):
// skipped while it is open, and its probe once its wait is over.
func (r *RedisStore) DeadLetters(stream string, maxLen int64) deadLetterSink {
	return redisDeadLetters{client: r.client, breaker: r.breaker, stream: stream, user: r.username, maxLen: maxLen, timeout: r.timeout}
}

// checkDeadLetterStream tells, at load, a dead-letter stream Redis says
// no letter can ever be written to: its key holds another type (XADD would
// answer WRONGTYPE), or the store's user may not XADD to it (NOPERM). In
// enforce mode every invalid ping would be answered 503 forever, and a
// sender that keeps its queue in order (Overland) stall behind it; what
// the senders get is for the handler to say, which knows its mode. The
// user's right is tried with an XADD that writes nothing, whoever the user
// is: Redis checks the ACL before it refuses the ID 0-0, which it does
// before it looks at the key, and NOMKSTREAM creates none. ACL DRYRUN
// would need a right the README's rule does not give, and a refusal of it
// in ACL LOG at every load. A user without TYPE (an older README rule) has
// its type check skipped. A Redis that does not answer within the startup
// check's time is warned about and the config loads, as the store's own
// startup check does: an outage at start is on_store_error's.
func (r *RedisStore) checkDeadLetterStream(ctx context.Context, stream string) error {
	check, cancel := context.WithTimeout(ctx, startupCheckTimeout)
	defer cancel()
	kind, err := r.client.Type(check, stream).Result()
	if err == nil && kind != "none" && kind != "stream" {
		return &dedup.ConfigError{Option: "dead_letter_stream", Problem: fmt.Sprintf(
			"the key %q holds a %s, not a stream, so no dead letter can be written to it (XADD answers WRONGTYPE): "+
				"name another key with dead_letter_stream, "+
				"or delete this one (redis-cli DEL %s) if nothing needs what it holds", stream, kind, stream)}
	}
	if err == nil || pipeline.IsReply(err) { // a TYPE refused leaves the type unchecked, not the right to write
		err = r.client.Do(check, "XADD", stream, "NOMKSTREAM", "0-0", "reason", "check").Err()
		if refusesXADD(err, "NOPERM") {
			user := cmp.Or(r.username, "default")
			return &dedup.ConfigError{Option: "dead_letter_stream", Problem: fmt.Sprintf(
				"the Redis user %s may not XADD to the key %q (%v), so no dead letter can be written: %s",
				user, stream, err, grantXADD(user, stream))}
		}
	}
	if err != nil && !pipeline.IsReply(err) && ctx.Err() == nil {
		r.logger.Warn("dead_letter_stream not checked: the redis store does not answer within "+startupCheckTimeout.String()+
			"; if its key holds another type or the user may not XADD to it, no dead letter is written: in enforce mode "+
			"invalid pings are answered 503, while shadow mode forwards them all the same, and the store-error log says why",
			zap.String("dead_letter_stream", stream), zap.Error(err))
	}
	return nil
}

// grantXADD says how to let user write dead letters to stream.
func grantXADD(user, stream string) string {
	return fmt.Sprintf("grant it (ACL SETUSER %s +xadd ~%s, on every data server; README, Stores), "+
		"or name a key under its key patterns with dead_letter_stream", user, stream)
}

// redisDeadLetters appends dead letters to a Redis stream.
type redisDeadLetters struct {
	client  redis.UniversalClient
	breaker *dedup.Breaker
	stream  string
	user    string // the ACL user, for the fix of a refusal; "" for the default user
	maxLen  int64
	timeout time.Duration
}

// deadLetterRefusal is a letter Redis refused because of the config: the
// stream's key holds another type (WRONGTYPE) or the user may not write it
// (NOPERM). Retries will not write it, unlike an outage's: its fix says
// what to change.
type deadLetterRefusal struct {
	err          error
	stream, user string
}

func (e *deadLetterRefusal) Error() string { return e.err.Error() }
func (e *deadLetterRefusal) Unwrap() error { return e.err }

// fix says what to change: the store-error log line's fix.
func (e *deadLetterRefusal) fix() string {
	// The line it goes with says what the pings' senders got, which the
	// handler's mode decides.
	const problem = "a configuration problem that retries will not fix: no dead letter is written until it is changed; "
	if strings.HasPrefix(e.err.Error(), "WRONGTYPE") {
		return problem + fmt.Sprintf("the key %q holds another type than a stream: name another key with dead_letter_stream, "+
			"or delete this one (redis-cli DEL %s) if nothing needs what it holds", e.stream, e.stream)
	}
	user := cmp.Or(e.user, "default")
	return problem + fmt.Sprintf("the Redis user %s may not XADD to the key %q: ", user, e.stream) + grantXADD(user, e.stream)
}

// refusal wraps err as a deadLetterRefusal if Redis refused the letter
// because of the config.
func (d redisDeadLetters) refusal(err error) error {
	if err == nil { // before anything escapes: no allocation for a letter written
		return nil
	}
	if refusesXADD(err, "WRONGTYPE") || refusesXADD(err, "NOPERM") {
		return &deadLetterRefusal{err: err, stream: d.stream, user: d.user}
	}
	return err
}

// refusesXADD reports Redis's reply refusing an XADD, starting with word:
// WRONGTYPE, or NOPERM for XADD or its key ("... to run the 'xadd'
// command", "... to access one of the keys" in 7.0, "... a key" later).
// A NOPERM for another command is the connection's handshake (SELECT
// without +select), which pipeline.Exec sets on every command: granting
// XADD would not fix it.
func refusesXADD(err error, word string) bool {
	var reply redis.Error
	if !errors.As(err, &reply) || !strings.HasPrefix(reply.Error(), word+" ") {
		return false
	}
	msg := reply.Error()
	return word != "NOPERM" || !strings.Contains(msg, "run the '") || strings.Contains(msg, "run the 'xadd'")
}

// add appends a request's letters in one pipeline, within one timeout: a
// batch of invalid pings used to wait a timeout per ping on a hung Redis.
// It is detached from the sender's cancellation, like a claim's
// settlement: a sender that hangs up does not undo the record.
func (d redisDeadLetters) add(ctx context.Context, letters []deadLetter) []error {
	errs := make([]error, len(letters))
	err := d.breaker.Call(d.stream, func() error {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.timeout)
		defer cancel()
		pipe := d.client.Pipeline()
		cmds := make([]*redis.StringCmd, len(letters))
		for i, l := range letters {
			cmds[i] = pipe.XAdd(ctx, &redis.XAddArgs{
				Stream: d.stream,
				MaxLen: d.maxLen,
				Approx: true,
				Values: []any{
					"reason", l.reason,
					"field", l.field,
					"error", l.error,
					"body", l.body,
					"body_bytes", l.bodyBytes,
					"received_at", l.receivedAt.Format(time.RFC3339Nano),
					"remote_addr", l.remoteAddr,
					"host", l.host,
					"uri", l.uri,
					"asset", l.asset,
				},
			})
		}
		err := pipeline.Exec(ctx, pipe) // the first command's error; each holds its own
		for i, cmd := range cmds {
			errs[i] = d.refusal(cmd.Err())
		}
		if pipeline.IsReply(err) {
			return nil // Redis answered, refusing the letter (a key of another type, an ACL): no outage for the breaker
		}
		return err
	})
	if errors.Is(err, dedup.ErrBreakerOpen) {
		for i := range errs {
			errs[i] = err
		}
	}
	return errs
}
