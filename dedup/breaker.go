package dedup

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Defaults of the store circuit breaker.
const (
	DefaultBreakerFailures = 5
	// DefaultBreakerCooldown is the longest an open breaker waits between
	// two probes: a recovered store is used again within about a second.
	DefaultBreakerCooldown = time.Second
)

// breakerFirstProbe is how long a breaker that has just opened waits before
// its first probe; every failed probe doubles the wait, up to the cooldown.
// A short outage (a failover, a restart) is over within a few probes, and a
// probe that failed just before the store came back costs one cooldown of
// unchecked pings at most, not a fixed five seconds of them.
const breakerFirstProbe = 100 * time.Millisecond

// ErrBreakerOpen is returned instead of calling a store that has just failed
// repeatedly: the handler applies on_store_error at once rather than making
// every request wait for the store timeout.
var ErrBreakerOpen = errors.New("the store's circuit breaker is open after repeated failures; skipping the store until a probe succeeds")

// ErrReleasesOwed is returned for a call not made because the releases
// owed before it (Breaker.ReleaseFirst) failed: nothing of the call was
// written, and the store is failing.
var ErrReleasesOwed = errors.New("the store did not take the releases of failed requests that must reach it first, so this call was not made")

// BreakerState is where a circuit breaker stands.
type BreakerState int32

// The breaker states.
const (
	// BreakerClosed: calls go to the store.
	BreakerClosed BreakerState = iota
	// BreakerHalfOpen: the cool-down is over and one probe call is allowed
	// through; the others still fail fast.
	BreakerHalfOpen
	// BreakerOpen: calls fail fast with ErrBreakerOpen.
	BreakerOpen
)

// String is the state's label in metrics and logs.
func (s BreakerState) String() string {
	switch s {
	case BreakerHalfOpen:
		return "half_open"
	case BreakerOpen:
		return "open"
	default:
		return "closed"
	}
}

// Breaker counts consecutive store failures. After Failures in a row it
// opens, and 100 ms later lets one probe through: success closes it, failure
// opens it again for twice as long, up to Cooldown. One breaker can guard the
// stores of several handlers that share a connection.
type Breaker struct {
	failures int
	cooldown time.Duration
	onChange func(from, to BreakerState, cause error)
	now      func() time.Time
	// While owed reports true, a call first runs releaseOwed (ReleaseFirst).
	owed        func([]*Claim) bool
	releaseOwed func(context.Context) error

	mu          sync.Mutex
	state       BreakerState
	consecutive int
	openedAt    time.Time
	wait        time.Duration // from openedAt to the next probe
	probing     bool
}

// NewBreaker returns a closed breaker (defaults for failures <= 0 and
// cooldown <= 0); cooldown caps the wait between probes. onChange, if not
// nil, is told of every transition, so that the log gets one line per
// transition, not one per request.
func NewBreaker(failures int, cooldown time.Duration, onChange func(from, to BreakerState, cause error)) *Breaker {
	if failures <= 0 {
		failures = DefaultBreakerFailures
	}
	if cooldown <= 0 {
		cooldown = DefaultBreakerCooldown
	}
	return &Breaker{failures: failures, cooldown: cooldown, onChange: onChange, now: time.Now}
}

// State returns the current state.
func (b *Breaker) State() BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

// ReleaseFirst makes every decision the breaker lets through, while owed
// reports true of its claims, first call release, and go to the store
// only if it succeeds; if it fails, the call has failed. (A settlement
// does not wait: it is no retry.) A connection passes its reconciler's
// OwesFor and ReleaseOwed: once the store answers again, the first request
// through may be the retry of an observation whose failed request's claim
// still waits to be released, by then older than in_flight_timeout, and it
// must find that claim gone, not settled. Set it before the breaker is
// used.
func (b *Breaker) ReleaseFirst(owed func([]*Claim) bool, release func(context.Context) error) {
	b.owed, b.releaseOwed = owed, release
}

// Guard wraps s so that Decide and Settle go through the breaker. Release
// always tries the store, since an accepted claim that cannot be released
// may cost an observation, but its failures still count toward opening it.
func (b *Breaker) Guard(s Store) Store { return guardedStore{next: s, breaker: b} }

// allow reports whether a call may go to the store now. Once the wait is
// over the first caller becomes the probe.
func (b *Breaker) allow() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case BreakerClosed:
		return true
	case BreakerOpen:
		if b.now().Sub(b.openedAt) < b.wait {
			return false
		}
		b.transition(BreakerHalfOpen, nil)
		b.probing = true
		return true
	default: // half open: one probe at a time
		if b.probing {
			return false
		}
		b.probing = true
		return true
	}
}

// enter lets a call through or says why not: the breaker is open, or the
// releases owed before it (ReleaseFirst) failed, in which case the call
// counts as failed and is not made.
func (b *Breaker) enter(ctx context.Context, claims []*Claim) error {
	if !b.allow() {
		return ErrBreakerOpen
	}
	if b.owed != nil && b.owed(claims) {
		if err := b.releaseOwed(ctx); err != nil {
			b.done(err)
			return fmt.Errorf("%w: %w", ErrReleasesOwed, err)
		}
	}
	return nil
}

// done records a call's outcome. A call cancelled by its own caller (the
// sender hung up) says nothing about the store.
func (b *Breaker) done(err error) {
	if errors.Is(err, context.Canceled) {
		b.mu.Lock()
		b.probing = false
		b.mu.Unlock()
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = false
	if err == nil {
		b.consecutive = 0
		if b.state != BreakerClosed {
			b.transition(BreakerClosed, nil)
		}
		return
	}
	b.consecutive++
	switch {
	case b.state == BreakerHalfOpen: // the probe failed
		b.open(min(2*b.wait, b.cooldown), err)
	case b.state == BreakerClosed && b.consecutive >= b.failures:
		b.open(min(breakerFirstProbe, b.cooldown), err)
	}
}

// open opens the breaker until the next probe, wait from now.
func (b *Breaker) open(wait time.Duration, cause error) {
	b.openedAt, b.wait = b.now(), wait
	b.transition(BreakerOpen, cause)
}

func (b *Breaker) transition(to BreakerState, cause error) {
	from := b.state
	b.state = to
	if b.onChange != nil {
		b.onChange(from, to, cause)
	}
}

// guardedStore is a Store behind a Breaker.
type guardedStore struct {
	next    Store
	breaker *Breaker
}

func (g guardedStore) Decide(ctx context.Context, claims []*Claim) ([]Verdict, error) {
	if err := g.breaker.enter(ctx, claims); err != nil {
		return nil, err
	}
	v, err := g.next.Decide(ctx, claims)
	g.breaker.done(err)
	return v, err
}

func (g guardedStore) Settle(claims []*Claim, done func(error)) {
	// A settlement need not wait for the releases owed (it is no retry
	// they must reach the store before), and the request it belongs to
	// is being answered.
	if !g.breaker.allow() {
		done(ErrBreakerOpen)
		return
	}
	g.next.Settle(claims, func(err error) {
		g.breaker.done(err)
		done(err)
	})
}

func (g guardedStore) Release(ctx context.Context, claims []*Claim) ([]bool, error) {
	released, err := g.next.Release(ctx, claims)
	if err != nil {
		g.breaker.done(err)
	}
	return released, err
}
