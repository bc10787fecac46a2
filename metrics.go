package telemetrydedup

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
)

// The collectors live at package level and are created once: every config
// load brings a new registry, and registering the same collectors into it
// keeps their values across reloads and lets several handlers share them
// (creating them per handler would panic on the second registration).
var (
	metricsOnce sync.Once
	metrics     struct {
		decisions       *prometheus.CounterVec
		storeDuration   *prometheus.HistogramVec
		storeErrors     *prometheus.CounterVec
		releases        *prometheus.CounterVec
		inFlight        prometheus.Gauge
		memoryKeys      prometheus.GaugeFunc
		memoryEvictions prometheus.CounterFunc
		stuckAssets     [2]prometheus.GaugeFunc // enforce's and shadow's
		breakersOpen    prometheus.GaugeFunc
		// breakerTransitions is labelled by the state entered.
		breakerTransitions *prometheus.CounterVec
		roundTrips         prometheus.CounterFunc
		commands           prometheus.CounterFunc
		nearCacheLookups   *prometheus.CounterVec
		nearCacheHit       prometheus.Counter
		nearCacheMiss      prometheus.Counter
		reconciled         *prometheus.CounterVec
		reconcilePending   prometheus.GaugeFunc
	}
)

const (
	metricsNamespace = "caddy"
	metricsSubsystem = "telemetry_dedup"
)

func initMetrics() {
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: name, Help: help}
	}
	metrics.decisions = prometheus.NewCounterVec(prometheus.CounterOpts(opts("decisions_total",
		"Pings decided, by decision, reason and mode (in shadow mode, what enforce would have decided).")),
		[]string{"decision", "reason", "mode"})
	metrics.storeDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: "store_duration_seconds",
		Help: "Time of each store operation, by store and operation (decide, settle, release).",
		// Up to 5 s: a store timeout (1 s is common) is the very latency an
		// incident's panel must show, not the top bucket's bound.
		Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
	}, []string{"store", "op"})
	metrics.storeErrors = prometheus.NewCounterVec(prometheus.CounterOpts(opts("store_errors_total",
		"Store operations that failed or timed out, by store and operation (a call the open circuit breaker skips is none).")), []string{"store", "op"})
	metrics.releases = prometheus.NewCounterVec(prometheus.CounterOpts(opts("releases_total",
		"Claims given back after an upstream failure, by outcome (released, not_held, error).")), []string{"outcome"})
	metrics.inFlight = prometheus.NewGauge(prometheus.GaugeOpts(opts("in_flight",
		"Accepted pings waiting for their upstream's answer.")))
	metrics.memoryKeys = prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("memory_store_keys",
		"Keys held by the memory stores.")), func() float64 { return float64(sumStoreStats().keys) })
	metrics.memoryEvictions = prometheus.NewCounterFunc(prometheus.CounterOpts(opts("memory_store_evictions_total",
		"Unexpired keys the memory stores dropped to stay within max_keys.")),
		func() float64 { return float64(sumStoreStats().evictions) })
	metrics.stuckAssets = [2]prometheus.GaugeFunc{stuckAssetsGauge(opts, modeEnforce), stuckAssetsGauge(opts, modeShadow)}
	metrics.breakersOpen = prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("breakers_open",
		"Open circuit breakers of Redis connections, on a Redis Cluster one per master (its keys skip Redis and on_store_error applies).")),
		func() float64 { return float64(sumStoreStats().breakersOpen) })
	metrics.breakerTransitions = prometheus.NewCounterVec(prometheus.CounterOpts(opts("breaker_transitions_total",
		"Circuit breaker transitions, by the state entered (open, half_open, closed).")), []string{"to"})
	metrics.roundTrips = prometheus.NewCounterFunc(prometheus.CounterOpts(opts("redis_round_trips_total",
		"Pipelines Redis answered: the commands of concurrent requests and of a batch share one round trip.")),
		func() float64 { return float64(sumStoreStats().roundTrips) })
	metrics.commands = prometheus.NewCounterFunc(prometheus.CounterOpts(opts("redis_commands_total",
		"Commands Redis answered, in redis_round_trips_total round trips.")),
		func() float64 { return float64(sumStoreStats().commands) })
	metrics.nearCacheLookups = prometheus.NewCounterVec(prometheus.CounterOpts(opts("near_cache_lookups_total",
		"Near cache lookups, by result: a hit is a duplicate answered without a store round trip.")), []string{"result"})
	metrics.nearCacheHit = metrics.nearCacheLookups.WithLabelValues("hit")
	metrics.nearCacheMiss = metrics.nearCacheLookups.WithLabelValues("miss")
	metrics.reconciled = prometheus.NewCounterVec(prometheus.CounterOpts(opts("reconciled_total",
		"Claims whose store call failed without saying whether it wrote them (or whose settle or release failed), "+
			"reconciled by token once the store answered, by outcome (released, released_late, not_held, settled, dropped, expired, unconfirmed).")),
		[]string{"outcome"})
	metrics.reconcilePending = prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("reconcile_pending",
		"Claims waiting for the store to answer so they can be settled or released by token.")),
		func() float64 { return float64(sumStoreStats().reconciling) })
	startAtZero()
}

// stuckAssetsGauge counts the stuck assets of the handlers of one mode: a
// shadow trial in front of the live handler keeps a list of its own, and
// an asset stuck to both, counted together, was two.
func stuckAssetsGauge(opts func(name, help string) prometheus.Opts, mode string) prometheus.GaugeFunc {
	o := prometheus.GaugeOpts(opts("stuck_assets",
		"Assets whose recent pings are nearly all suppressed with none accepted for stuck_after (see the admin endpoint), by mode."))
	o.ConstLabels = prometheus.Labels{"mode": mode}
	return prometheus.NewGaugeFunc(o, func() float64 {
		n := 0
		for _, a := range allStuckAssets(time.Now()) {
			if a.Mode == mode {
				n++
			}
		}
		return float64(n)
	})
}

// startAtZero makes the series of every label value known in advance, at
// 0: rate() and increase() cannot count the first event of a series that
// did not exist, so a process's first release (a whole batch's claims, it
// may be) or the first opening of a breaker in an outage was on no panel.
func startAtZero() {
	for _, outcome := range []string{releaseReleased, releaseNotHeld, releaseError} {
		metrics.releases.WithLabelValues(outcome)
	}
	for _, to := range []dedup.BreakerState{dedup.BreakerOpen, dedup.BreakerHalfOpen, dedup.BreakerClosed} {
		metrics.breakerTransitions.WithLabelValues(to.String())
	}
	for _, outcome := range []dedup.ReconcileOutcome{dedup.ReconcileReleased, dedup.ReconcileReleasedLate, dedup.ReconcileNotHeld,
		dedup.ReconcileSettled, dedup.ReconcileDropped, dedup.ReconcileExpired, dedup.ReconcileUnconfirmed} {
		metrics.reconciled.WithLabelValues(string(outcome))
	}
}

// storeErrorsAtZero makes the decisions series a store outage would
// start, for this handler's on_store_error and mode, at 0: born at the
// first unchecked ping, a first outage shorter than a scrape interval
// (its duplicates forwarded, or its pings answered 503) was on no panel.
func (s *settings) storeErrorsAtZero() {
	metrics.decisions.WithLabelValues(string(s.onStoreError), reasonStoreError, s.mode())
	if s.deadLetterInvalid { // a letter that cannot be written
		metrics.decisions.WithLabelValues(string(decisionUnavailable), reasonStoreError, s.mode())
	}
}

func countNearCacheLookup(hit bool) {
	if hit {
		metrics.nearCacheHit.Inc()
	} else {
		metrics.nearCacheMiss.Inc()
	}
}

// registerMetrics adds the collectors to a config's registry. A second
// handler in the same config finds them registered already.
func registerMetrics(reg *prometheus.Registry) error {
	metricsOnce.Do(initMetrics)
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{
		metrics.decisions, metrics.storeDuration, metrics.storeErrors, metrics.releases,
		metrics.inFlight, metrics.memoryKeys, metrics.memoryEvictions, metrics.stuckAssets[0], metrics.stuckAssets[1],
		metrics.breakersOpen, metrics.breakerTransitions, metrics.nearCacheLookups, metrics.roundTrips, metrics.commands,
		metrics.reconciled, metrics.reconcilePending,
	} {
		var already prometheus.AlreadyRegisteredError
		if err := reg.Register(c); err != nil && !errors.As(err, &already) {
			return err
		}
	}
	return nil
}

// instrumentedStore times and counts every store operation. Its
// observers are resolved once, not looked up by label on every ping.
type instrumentedStore struct {
	next                   dedup.Store
	decideTime, settleTime prometheus.Observer
	releaseTime            prometheus.Observer
	decideErrs, settleErrs prometheus.Counter
	releaseErrs            prometheus.Counter
}

func newInstrumentedStore(next dedup.Store, name string) instrumentedStore {
	metricsOnce.Do(initMetrics)
	return instrumentedStore{
		next:        next,
		decideTime:  metrics.storeDuration.WithLabelValues(name, "decide"),
		settleTime:  metrics.storeDuration.WithLabelValues(name, "settle"),
		releaseTime: metrics.storeDuration.WithLabelValues(name, "release"),
		decideErrs:  metrics.storeErrors.WithLabelValues(name, "decide"),
		settleErrs:  metrics.storeErrors.WithLabelValues(name, "settle"),
		releaseErrs: metrics.storeErrors.WithLabelValues(name, "release"),
	}
}

func (s instrumentedStore) Decide(ctx context.Context, claims []*dedup.Claim) ([]dedup.Verdict, error) {
	start := time.Now()
	v, err := s.next.Decide(ctx, claims)
	observeOp(s.decideTime, s.decideErrs, start, err)
	return v, err
}

func (s instrumentedStore) Settle(claims []*dedup.Claim, done func(error)) {
	start := time.Now()
	s.next.Settle(claims, func(err error) {
		observeOp(s.settleTime, s.settleErrs, start, err)
		done(err)
	})
}

func (s instrumentedStore) Release(ctx context.Context, claims []*dedup.Claim) ([]bool, error) {
	start := time.Now()
	released, err := s.next.Release(ctx, claims)
	observeOp(s.releaseTime, s.releaseErrs, start, err)
	return released, err
}

// observeOp times a store operation and counts it failed. One the open
// breaker skipped never reached the store and is neither. On a Cluster
// with one master's breaker open, a batch's claims on the other masters
// did reach theirs: timed, and failed only if their own call failed.
func observeOp(duration prometheus.Observer, errs prometheus.Counter, start time.Time, err error) {
	skipped := errors.Is(err, dedup.ErrBreakerOpen)
	if skipped && !partlyMade(err) {
		return
	}
	duration.Observe(time.Since(start).Seconds())
	if err != nil && !skipped {
		errs.Inc()
	}
}

// partlyMade reports a call's error that leaves some of its claims with
// their verdicts: the others failed, the call went to the store.
func partlyMade(err error) bool {
	partial, ok := errors.AsType[*dedup.DecideError](err)
	return ok && slices.Contains(partial.Failed, false)
}

var _ dedup.Store = instrumentedStore{}
