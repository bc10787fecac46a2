package telemetrydedup

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/pipeline"
)

// redisConnection is one shared client, the pipeline that batches its
// commands, the breaker in front of it and the reconciler behind it, living
// in the usage pool and closed with the last config that used it.
type redisConnection struct {
	client     redis.UniversalClient
	pipeline   *pipeline.Pipeline
	breaker    *dedup.Breaker
	store      dedup.Store
	reconciler *dedup.Reconciler
	reports    *reconcileReport // the reconciler's
	// keyspace holds every connection open on the same Redis data, this
	// one included, under keyspaceID.
	keyspace   *keyspace
	keyspaceID string
	// user is the ACL user it logs in as ("" for the default user), and
	// prefixes the key prefixes of the handlers whose stores hold it: the
	// keys it may be handed jobs on (keyspace.heirs).
	user     string
	prefixes keyPrefixes
	// handedOver is set once it has handed its reconciler's jobs over:
	// the line that says so is written once, at info level.
	handedOver atomic.Bool
	// users counts the requests of every config that use the connection.
	users atomic.Int64
	// holders counts the store modules that hold the connection, one per
	// handler of every config loaded with it: the last waits for its
	// requests and its reconciler when it lets go (RedisStore.Cleanup).
	holders atomic.Int64
	// drainUntil is the latest a holder that let go before the last one
	// waits for the requests (Unix nanoseconds): the last waits as long.
	drainUntil atomic.Int64
	// loggers are the loggers of the configs that use the connection.
	loggers connectionLoggers
	where   string        // the topology, for log lines
	timeout time.Duration // each store call's
}

// connectionLoggers are the loggers of the configs sharing a connection,
// latest last. The connection's lines (breaker, reconciler) go to the
// latest: a reload that changes the logs (an output, a level) takes them
// over, and a config that is unloaded, or failed to load, gives them back
// to the one before, rather than leave them to a log that may be closed.
type connectionLoggers struct {
	mu   sync.Mutex
	list []*zap.Logger
}

func (l *connectionLoggers) add(logger *zap.Logger) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.list = append(l.list, logger)
}

// remove gives back a config's logger; the last one stays, for the lines
// of the connection's own closing.
func (l *connectionLoggers) remove(logger *zap.Logger) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i := slices.Index(l.list, logger); i >= 0 && len(l.list) > 1 {
		l.list = slices.Delete(l.list, i, i+1)
	}
}

// current is the logger the connection's lines go to.
func (l *connectionLoggers) current() *zap.Logger {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.list[len(l.list)-1]
}

func newRedisConnection(opts *redis.UniversalOptions, r RedisStore, logger *zap.Logger) *redisConnection {
	where := describeTopology(r)
	c := &redisConnection{where: where, timeout: r.operationTimeout()}
	c.loggers.add(logger)
	// On a Cluster the breaker has a zone per master (see Breaker.ZoneBy),
	// and its log lines name the master; its address is the zone.
	onChange := func(zone string, from, to dedup.BreakerState, cause error) {
		if errors.Is(cause, dedup.ErrZoneForgotten) {
			c.loggers.current().Info("redis store circuit breaker forgot a master it skipped: no call went to it for a minute or more "+
				"(it failed over, or no key of its slots came); whether it answers again is not known, and the next call to it starts afresh",
				zap.String("redis", where), zap.String("master", zone), zap.String("from", from.String()))
			return
		}
		metricsOnce.Do(initMetrics)
		metrics.breakerTransitions.WithLabelValues(to.String()).Inc()
		if to == dedup.BreakerClosed && c.reconciler != nil {
			c.reconciler.Wake() // Redis answers again: release what waited for it now, not after a backoff
		}
		fields := []zap.Field{zap.String("redis", where), zap.String("from", from.String())}
		if zone != "" {
			fields = append(fields, zap.String("master", zone))
		}
		logger := c.loggers.current()
		switch {
		case to == dedup.BreakerOpen && from == dedup.BreakerClosed:
			logger.Warn("redis store circuit breaker opened: skipping Redis until a probe succeeds; meanwhile pings are handled as when it fails: "+
				whileRedisFails, append(fields, zap.Error(cause))...)
		case to == dedup.BreakerClosed:
			logger.Info("redis store circuit breaker closed", fields...)
		default:
			// A probe, and its failure, every breaker_cooldown for as long
			// as Redis is down: two lines a second at warn and info buried
			// the outage's own lines, held to one each per 10 s.
			if ce := logger.Check(zapcore.DebugLevel, "redis store circuit breaker "+to.String()); ce != nil {
				ce.Write(append(fields, zap.Error(cause))...)
			}
		}
	}
	breaker := dedup.NewBreaker(r.BreakerFailures, time.Duration(r.BreakerCooldown), func(from, to dedup.BreakerState, cause error) {
		onChange("", from, to, cause)
	})
	client := redis.NewUniversalClient(opts)
	c.client, c.pipeline, c.breaker = client, pipeline.New(client), breaker
	if cluster, ok := client.(*redis.ClusterClient); ok {
		// The pipeline has a queue per master, so a hung master holds up
		// only its own slots; the breaker must then fail fast only those
		// too, not every asset once that master's timeouts add up.
		breaker.ZoneBy(dedup.ClusterMasterZone(cluster, r.operationTimeout()), onChange)
	}
	store := dedup.NewRedisStore(c.pipeline, r.operationTimeout())
	// The reconciler backs off on its own, and goes around the breaker: its
	// retries during an outage must not reopen a breaker whose probe is on
	// its way, and it must reach Redis as soon as Redis answers. Its own
	// releases need no replica's word: it repeats each at its confirmations.
	c.reports = newReconcileReport(c.loggers.current, where)
	c.reconciler = dedup.NewReconciler(store, dedup.DefaultReconcileQueue, c.reports.report)
	if cluster, ok := client.(*redis.ClusterClient); ok {
		// Its passes too go to each master side by side: a hung one holds
		// up only its own releases. Its zones never wait for a slot map
		// (0): a claim is handed over from the request's path.
		c.reconciler.ZoneBy(dedup.ClusterMasterZone(cluster, 0))
	}
	c.store = breaker.Guard(store)
	if failsOver(client, r) {
		c.reconciler.ConfirmOwn()
		c.store = breaker.Guard(dedup.NewFailoverStore(store, client, c.reconciler.Confirm))
	}
	// Once Redis answers again, the releases it owes reach Redis before
	// any request's call: that request may be the retry of one of them,
	// and must find its claim gone. So do those a connection this one
	// replaced on a reload still owes: the retry comes through this one,
	// which takes them over and makes them itself (keyspace.releaseOwed).
	c.keyspaceID, c.user = keyspaceOf(opts), opts.Username
	c.keyspace = joinKeyspace(c.keyspaceID, c)
	breaker.ReleaseFirst(c.keyspace.owesFor, func(ctx context.Context, claims []*dedup.Claim) error {
		return c.keyspace.releaseOwed(ctx, c.reconciler, claims)
	})
	report(c)
	return c
}

// failsOver reports a store whose masters have replicas that take over
// when they fail: Sentinel, or a Cluster.
func failsOver(client redis.UniversalClient, r RedisStore) bool {
	_, cluster := client.(*redis.ClusterClient)
	return cluster || r.Master != ""
}

// reconcileReport counts what the reconciler did and logs what an
// operator must know: claims it could not take or gave up on, which stand
// until in_flight_timeout and then count as settled. (Those its closing
// gives up on, Destruct counts and logs.)
type reconcileReport struct {
	logger               func() *zap.Logger
	where                string
	dropped, unconfirmed throttledLog
}

func newReconcileReport(logger func() *zap.Logger, where string) *reconcileReport {
	rr := &reconcileReport{logger: logger, where: where}
	rr.dropped.every, rr.unconfirmed.every = storeErrorLogEvery, storeErrorLogEvery
	return rr
}

// report is the reconciler's report of n claims reconciled with outcome.
func (rr *reconcileReport) report(outcome dedup.ReconcileOutcome, n int) {
	countReconciled(outcome, n)
	switch outcome {
	case dedup.ReconcileUnconfirmed:
		rr.unconfirmed.logTo(rr.logger().With(zap.String("redis", rr.where)), "releases no replica acknowledged will not be made again after a failover: there was no room to queue them, "+
			"or the connection closed before a replica did; if the master fails over now, the retries of their observations may be suppressed",
			fmt.Errorf("%d claims %s", n, outcome))
	case dedup.ReconcileDropped, dedup.ReconcileExpired:
		rr.dropped.logTo(rr.logger().With(zap.String("redis", rr.where)), "claims of timed-out store calls could not be reconciled; they stand until in_flight_timeout, "+
			"and the retries of the observations whose requests failed may be suppressed",
			fmt.Errorf("%d claims %s", n, outcome))
	case dedup.ReconcileReleased, dedup.ReconcileReleasedLate:
		if c := rr.logger().Check(zapcore.DebugLevel, "released claims a timed-out store call had written"); c != nil {
			c.Write(zap.String("redis", rr.where), zap.Int("claims", n), zap.String("outcome", string(outcome)))
		}
	}
}

// flush writes the lines held back: the connection closes, and logs no
// more (throttledLog.flush).
func (rr *reconcileReport) flush() {
	rr.dropped.flush()
	rr.unconfirmed.flush()
}

// countReconciled counts n claims reconciled with outcome.
func countReconciled(outcome dedup.ReconcileOutcome, n int) {
	metricsOnce.Do(initMetrics)
	metrics.reconciled.WithLabelValues(string(outcome)).Add(float64(n))
}

// Destruct closes the connection. The pipeline first sends the
// settlements of the last requests, and hands those that fail to the
// reconciler, which hands what it holds to the connections that serve
// its keys, if any (handOver), and makes a last pass over the rest through
// the pipeline too.
func (c *redisConnection) Destruct() error {
	c.pipeline.Flush()
	// Before leaving the keyspace: meanwhile a call on their keys finds the
	// releases owed in one reconciler or the other.
	c.handOver()
	left := c.reconciler.Close()
	// After the close: what no connection took (an exit), its last pass
	// makes, and until then another connection's calls on their keys must
	// not go ahead of them (they fail: keyspace.releaseOwed).
	c.keyspace.leave(c.keyspaceID, c)
	c.pipeline.Close()
	c.reports.flush()
	c.dropUnreconciled(left)
	retire(c)
	return c.client.Close()
}

// handOver gives the jobs the reconciler holds (settlements, releases,
// confirmations) to the reconcilers of other connections on the same
// Redis data that a config uses (keyspace.heirs), each job to the first
// that serves the key_prefix its keys are under, and reports whether it
// holds nothing more: the connection, which no config uses any more, may
// no longer be let in (a rotated password, refused once Redis cut its
// pool), and would retry them in vain until the claims' TTL, open as long.
// It keeps those no such connection serves, and those one that is closing
// or has no room for them would take. The first hand-over is logged at
// info level with how many claims went, the later ones (what its requests
// still running hand it meanwhile) at debug level: the metrics count them
// when the other connections make them, under their outcomes.
func (c *redisConnection) handOver() bool {
	handed := 0
	for _, heir := range c.keyspace.heirs(c) {
		handed += heir.reconciler.TakeOverJobs(c.reconciler, heir.prefixes.servesKey)
	}
	left := c.reconciler.Len()
	if handed > 0 {
		level := zapcore.InfoLevel
		if c.handedOver.Swap(true) {
			level = zapcore.DebugLevel
		}
		if ce := c.loggers.current().Check(level, "handed the claims still to be released, settled or confirmed to other connections on the same Redis that configs use for their key_prefix"); ce != nil {
			ce.Write(zap.String("redis", c.where), zap.Int("claims", handed), zap.Int("kept", left))
		}
	}
	return left == 0
}

// dropUnreconciled counts as dropped the claims the reconciler gave up on
// as the connection closed (Caddy's exit, or a reload while Redis was
// down), and warns of them by kind, with what their senders meet until
// they end: one line, rather than the reporter's for a full queue.
func (c *redisConnection) dropUnreconciled(left dedup.Unreconciled) {
	if left.Releases+left.Settlements == 0 {
		return
	}
	countReconciled(dedup.ReconcileDropped, left.Releases+left.Settlements)
	c.loggers.current().Warn("closing the Redis connection while Redis did not answer: claims it holds could not be released or settled, "+
		"and stand as pending until in_flight_timeout, then as delivered until their TTL ends: "+
		"the retries of the failed requests' pings (releases) are told to come back and then that they were delivered, "+
		"the redeliveries of the others (settlements) to come back",
		zap.String("redis", c.where), zap.Int("releases", left.Releases), zap.Int("settlements", left.Settlements))
}

func (c *redisConnection) stats() storeStats {
	rt, n := c.pipeline.RoundTrips()
	return storeStats{breakersOpen: c.breaker.Open(), roundTrips: rt, commands: n,
		reconciling: uint64(c.reconciler.Unanswered())}
}

// Interface guards
var (
	_ caddy.Destructor = (*redisConnection)(nil)
	_ statsReporter    = (*redisConnection)(nil)
)
