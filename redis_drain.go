package telemetrydedup

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// drainWithin returns the counter of the requests using the connection,
// and bounds how long Cleanup waits for them: a request holds a claim for
// at most inFlight, then releases it within the store's timeout.
func (r *RedisStore) drainWithin(inFlight time.Duration) *atomic.Int64 {
	r.drainMax = inFlight + r.operationTimeout() + time.Second
	return r.users
}

// Cleanup lets go of the shared client; the last config to do so closes it.
// Caddy cleans a config up as soon as a reload has replaced it, while the
// requests it started may still run: their settlements and releases need
// the connection, and without them a failed request's retry would be
// suppressed. So the last store to hold the connection lets go of it only
// once no request uses it (or drainMax has passed), and while its
// reconciler holds claims, only once it has settled or released them, or
// handed them to the connections that serve their keys: a reload that replaces
// the connection while Redis hangs would otherwise drop the releases of
// the claims that land once Redis answers. A store
// that another still holds the connection with (the new config's, on a
// reload that keeps it) lets go at once: that one waits when it goes.
func (r *RedisStore) Cleanup() error {
	if r.poolKey == "" {
		return nil
	}
	if r.loggers != nil {
		r.loggers.remove(r.logger)
	}
	if r.prefix != nil {
		r.prefixes.release(*r.prefix)
	}
	if r.holders.Add(-1) > 0 {
		r.leaveDrain(time.Now().Add(r.drainMax))
		_, err := stores.Delete(r.poolKey)
		return err
	}
	if caddy.Exiting() {
		// The handlers cut the requests still running as Caddy exits: wait
		// for them to release their claims, which takes one store call.
		// Those of a config a reload replaced count too: the connection
		// they release on may be no current config's, and nothing else
		// keeps the process from ending first.
		waitForUsers(redisUsers, time.Now().Add(r.operationTimeout()+time.Second))
	}
	if caddy.Exiting() || r.users.Load() == 0 && r.reconciler.Len() == 0 {
		_, err := stores.Delete(r.poolKey)
		return err
	}
	deadline := time.Now().Add(r.drainMax)
	if left := time.Unix(0, r.drainUntil.Load()); left.After(deadline) {
		deadline = left
	}
	draining.Add(1)
	go r.deleteWhenDrained(deadline)
	return nil
}

// leaveDrain leaves the wait for this store's requests, until deadline at
// the latest, to the last store to let go of the connection.
func (r *RedisStore) leaveDrain(deadline time.Time) {
	for {
		was := r.drainUntil.Load()
		if was >= deadline.UnixNano() || r.drainUntil.CompareAndSwap(was, deadline.UnixNano()) {
			return
		}
	}
}

// drainPoll is how often a cleaned-up config looks whether the requests
// using its connection are done; reconcilePoll, whether its reconciler
// is, which may take as long as an outage lasts.
const (
	drainPoll     = 50 * time.Millisecond
	reconcilePoll = time.Second
)

// deleteWhenDrained lets go of the connection once its requests are done
// (or deadline has passed, or Caddy exits) and its reconciler holds no
// claim, or has handed them to other connections on the same data that
// configs hold (handOver), or Caddy exits. The
// reconciler bounds its own wait: it gives up on a claim at its
// TTL, and its last look for a late landing comes 101.1 s after the store
// first answered it.
func (r *RedisStore) deleteWhenDrained(deadline time.Time) {
	defer draining.Done()
	r.waitForRequests(deadline)
	r.waitForReconciler()
	if _, err := stores.Delete(r.poolKey); err != nil {
		r.logger.Error("closing a Redis connection no config uses any more", zap.Error(err))
	}
}

// waitForRequests waits until no request uses the connection, no config
// holding it any more, or deadline. Meanwhile it hands what the reconciler
// holds to other connections on the same data (handOver), not only once
// the requests are done (in_flight_timeout and more): this one may no
// longer be let in (a rotated password, refused once Redis cut its pool),
// and the confirmation that would release a claim that landed late would
// be refused meanwhile, its sender's retry told to come back, then that it
// was delivered. It offers them at each look (drainPoll) where a job came
// since the last offer began (Reconciler.Added: a job that finished
// meanwhile does not hide it), and every reconcilePoll while it holds any: a hand-over of thousands of claims to every connection of a
// Redis many sites share takes milliseconds, too much to repeat every
// drainPoll for what no one took. Once Caddy exits it waits a store
// timeout and a second more at most, as the exit hook does for the
// connections configs still hold (finishRedisAtExit): the exit cuts the
// requests waiting for their upstream, which then release their claims
// through this connection, and a request it does not cut (one still
// reading a slow sender's body) must not keep the connection open past the
// hook's wait, its last pass never made and what it gave up on never
// logged.
func (r *RedisStore) waitForRequests(deadline time.Time) {
	exiting := false
	var offered time.Time // the last hand-over
	seen := ^uint64(0)    // the jobs queued before it (Reconciler.Added)
	for r.users.Load() > 0 && time.Now().Before(deadline) {
		if r.reconciler.Len() > 0 && (r.reconciler.Added() != seen || time.Since(offered) >= reconcilePoll) {
			seen = r.reconciler.Added()
			r.handOver()
			offered = time.Now()
		}
		if !exiting && atExit.Err() != nil {
			exiting = true
			if bound := time.Now().Add(r.operationTimeout() + time.Second); bound.Before(deadline) {
				deadline = bound
			}
		}
		time.Sleep(drainPoll)
	}
}

// waitForReconciler waits until the reconciler holds no claim, or has
// handed them over (redisConnection.handOver: it tries again at each look,
// the other connection may have had no room), or Caddy exits. The exit
// hook (finishRedisAtExit) waits for the connection's close within a cap,
// and ends the wait at once: a look a second later could leave the close
// too little of the cap to end in, and the process would end before the
// reconciler's last pass, and before the line of what it gave up on.
func (r *RedisStore) waitForReconciler() {
	for r.reconciler.Len() > 0 && !caddy.Exiting() && !r.handOver() {
		select {
		case <-atExit.Done():
			return
		case <-time.After(reconcilePoll):
		}
	}
}

// waitForUsers waits until users counts no request, or deadline.
func waitForUsers(users func() int64, deadline time.Time) {
	for users() > 0 && time.Now().Before(deadline) {
		time.Sleep(drainPoll)
	}
}

// draining counts the Redis connections no config holds any more that
// wait for their requests and their reconciler (deleteWhenDrained).
var draining sync.WaitGroup

// finishRedisAtExit holds Caddy's exit for what the cleanups of the
// configs loaded do not wait for: the requests of a config a reload
// replaced, on a Redis connection no config loaded uses (the new one has
// the memory store, or not the module), and that connection's closing,
// the reconciler's last pass. Without it the process ended with their
// claims pending. A config without the module cuts nothing as Caddy
// exits: this cuts them too, and tells such a connection to close now
// (waitForReconciler). It waits a few store timeouts at most.
func finishRedisAtExit(context.Context) {
	cutAtExit(context.DeadlineExceeded)
	timeout := longestRedisTimeout()
	waitForUsers(redisUsers, time.Now().Add(timeout+time.Second))
	closed := make(chan struct{})
	go func() {
		draining.Wait()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(4*timeout + 2*time.Second): // a flush, the reconciler's last pass (two calls, 2 s at most), the pipeline's close
	}
}

// longestRedisTimeout is the longest store timeout of the Redis
// connections open.
func longestRedisTimeout() (longest time.Duration) {
	stores.Range(func(_, v any) bool {
		if c, ok := v.(*redisConnection); ok {
			longest = max(longest, c.timeout)
		}
		return true
	})
	return longest
}

// redisUsers counts the requests using any Redis connection.
func redisUsers() (n int64) {
	stores.Range(func(_, v any) bool {
		if c, ok := v.(*redisConnection); ok {
			n += c.users.Load()
		}
		return true
	})
	return n
}
