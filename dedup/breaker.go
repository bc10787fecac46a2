package dedup

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/pipeline"
)

// Defaults of the store circuit breaker.
const (
	DefaultBreakerFailures = 5
	// DefaultBreakerCooldown is the longest an open breaker waits between
	// two probes: a recovered store is used again within about a second.
	DefaultBreakerCooldown = time.Second
	// MinBreakerCooldown is the shortest cooldown a config may set: the
	// wait before the first probe. Below it, nearly every call after a
	// failed probe probed a store that is down, and logged two transitions.
	MinBreakerCooldown = breakerFirstProbe
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

// ErrOwedElsewhere marks a failure of releases owed on a call's keys that
// another connection's reconciler holds (one a reload replaced, or one
// closing), returned by a ReleaseFirst function: the call is not made, but
// the breaker does not count it, since the store it guards did not fail.
// Counted, the calls on those keys while another connection closed opened
// the breaker for every asset.
var ErrOwedElsewhere = errors.New("another Redis connection on the same data owes releases on these keys that it has not made (it is closing, or its calls failed)")

// ErrZoneForgotten is the cause of the last transition a zone gets, to
// closed, when the breaker forgets it while it is not closed: no call
// asked for it in zoneIdle. Its master failed over (its slots went to
// another address), or no key of its slots came: whether it answers again
// is not known, and the next call through it starts afresh.
var ErrZoneForgotten = errors.New("no call asked for this master for a while, so the breaker forgot it; whether it answers again is not known")

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
//
// A breaker can be split into zones (ZoneBy), each with its own count,
// state and probes: on a Redis Cluster, one per master, so that a master
// that hangs fails fast only the calls on its own slots. With one breaker
// for the whole Cluster, the timeouts of one hung master, coming in bursts
// between the successes of the others, opened it for every asset.
type Breaker struct {
	failures int
	cooldown time.Duration
	onChange func(zone string, from, to BreakerState, cause error)
	now      func() time.Time
	// While owed reports true, a call first runs releaseOwed (ReleaseFirst).
	owed        func([]*Claim) bool
	releaseOwed func(context.Context, []*Claim) error
	// zone names the zone of a key; nil: a single zone, one.
	zone func(key string) string

	mu    sync.Mutex
	one   breakerZone             // the only zone, unless zone is set
	zones map[string]*breakerZone // else these, made on first use
	// swept is when the calls last looked for idle zones to forget.
	swept time.Time
}

// zoneIdle is how long a zone no call has asked for is kept. On a Cluster,
// the zone of a master that failed over is asked for by no call again:
// kept, it would stay open for good (State, Open).
const zoneIdle = time.Minute

// breakerZone is the state of one zone of a breaker.
type breakerZone struct {
	name        string
	state       BreakerState
	consecutive int
	openedAt    time.Time
	wait        time.Duration // from openedAt to the next probe
	probing     bool
	used        time.Time // when a call last asked for it
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
	b := &Breaker{failures: failures, cooldown: cooldown, now: time.Now}
	if onChange != nil {
		b.onChange = func(_ string, from, to BreakerState, cause error) { onChange(from, to, cause) }
	}
	return b
}

// ZoneBy splits the breaker into zones: zone names the zone of a key (a
// claim's is Claim.Key), and each zone counts the failures of the calls on
// its claims, opens and is probed on its own. A call whose claims lie in
// several zones sends those of the zones that let it through and fails
// the others with ErrBreakerOpen (a DecideError); its outcome counts in
// each zone by that zone's own claims. A call with
// no claims goes through and counts nowhere. A zone no call has asked for
// in zoneIdle is forgotten. onChange, if not nil, replaces NewBreaker's
// and is told of every transition of every zone, with the zone's name. Set
// it before the breaker is used.
//
// On a Redis Cluster, zone is ClusterMasterZone: a master that hangs opens
// the breaker for the claims on its slots only, while the other masters,
// which the pipeline serves from queues of their own, go on answering.
func (b *Breaker) ZoneBy(zone func(key string) string, onChange func(zone string, from, to BreakerState, cause error)) {
	b.zone, b.zones = zone, map[string]*breakerZone{}
	if onChange != nil {
		b.onChange = onChange
	}
}

// ClusterMasterZone names a key's zone on a Redis Cluster: the address of
// its master, as the client's slot map says, which is the queue the
// pipeline puts the command on. The empty name stands for a key whose
// master the client cannot tell: its slot map cannot be loaded within
// timeout (the store's), which bounds the wait as the store call would.
// A loaded slot map is read with no wait and no allocation.
func ClusterMasterZone(client *redis.ClusterClient, timeout time.Duration) func(key string) string {
	return func(key string) string {
		m, err := client.MasterForKey(loadedOnly, key)
		if err != nil {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			if m, err = client.MasterForKey(ctx, key); err != nil {
				return ""
			}
		}
		return m.Options().Addr
	}
}

// loadedOnly is a context that has ended: a slot map that must be loaded
// first is not, and the lookup fails at once.
var loadedOnly = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// State returns the current state; of a breaker in zones, the worst zone's:
// open if any zone is open, else half open if any is, else closed.
func (b *Breaker) State() BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.zone == nil {
		return b.one.state
	}
	b.forgetIdleLocked()
	worst := BreakerClosed
	for _, z := range b.zones {
		worst = max(worst, z.state)
	}
	return worst
}

// Call makes call, a store call on key that is no claim (a dead letter's
// append), as the breaker makes a claim's: not made (ErrBreakerOpen) while
// the zone of key is open, that zone's probe once its wait is over, and its
// outcome counted there. Only skipped while open, a call that is all that
// reaches the store would never probe it, and skip it long after it is back.
func (b *Breaker) Call(key string, call func() error) error {
	set := zoneSet{first: &b.one}
	if b.zone != nil {
		name := b.zone(key)
		b.mu.Lock()
		set.first = b.zoneLocked(name, b.now())
		b.mu.Unlock()
	}
	if !b.letThrough(set) {
		return ErrBreakerOpen
	}
	err := call()
	b.count(set, err)
	return err
}

// forgetIdleLocked forgets the zones no call has asked for in zoneIdle. A
// zone forgotten while not closed is told so (ErrZoneForgotten): nothing
// skips it any more, and its opening's warning was otherwise the last
// word on it. b.mu must be held.
func (b *Breaker) forgetIdleLocked() {
	now := b.now()
	for name, z := range b.zones {
		if now.Sub(z.used) > zoneIdle {
			if z.state != BreakerClosed {
				b.transition(z, BreakerClosed, ErrZoneForgotten)
			}
			delete(b.zones, name)
		}
	}
}

// Open returns how many of the breaker's zones are not closed: 0 or 1 for
// a breaker not in zones, on a Cluster the masters skipped. A half-open
// zone counts: while its probe is out, every other call skips it.
func (b *Breaker) Open() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.zone == nil {
		if b.one.state != BreakerClosed {
			return 1
		}
		return 0
	}
	b.forgetIdleLocked()
	n := 0
	for _, z := range b.zones {
		if z.state != BreakerClosed {
			n++
		}
	}
	return n
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
func (b *Breaker) ReleaseFirst(owed func([]*Claim) bool, release func(context.Context, []*Claim) error) {
	b.owed, b.releaseOwed = owed, release
}

// Guard wraps s so that Decide and Settle go through the breaker. Release
// always tries the store, since an accepted claim that cannot be released
// may cost an observation, but its failures still count toward opening it.
func (b *Breaker) Guard(s Store) Store { return guardedStore{next: s, breaker: b} }

// zoneSet is the zones of one call: first, and the others if its claims
// lie in several. Nil first: none (a call with no claims, in zones).
type zoneSet struct {
	first *breakerZone
	more  []*breakerZone
	// names is, when the claims lie in several zones, each claim's zone's
	// name as the call found it: a call that fails in part counts each
	// zone by its own claims, even if a slot moved meanwhile.
	names []string
}

// zonesOf returns the zones of a call on claims. Without zones it is the
// one zone, at no cost.
func (b *Breaker) zonesOf(claims []*Claim) zoneSet {
	if b.zone == nil {
		return zoneSet{first: &b.one}
	}
	return b.zonesIn(claims)
}

// zonesIn returns the zones of a call on claims, in a breaker in zones.
func (b *Breaker) zonesIn(claims []*Claim) zoneSet {
	var set zoneSet
	if len(claims) == 0 {
		return set
	}
	// The names first, outside the lock: zone may have to ask the client.
	// A key whose zone cannot be told (""), a Cluster whose slot map
	// cannot be loaded, says the others cannot be either: they are not
	// asked, each at the cost of a wait.
	first := b.zone(claims[0].Key())
	var others []string
	for i, c := range claims[1:] {
		if first == "" {
			break
		}
		name := b.zone(c.Key())
		if name != first && set.names == nil { // a second zone: the claims' names are kept
			set.names = slices.Repeat([]string{first}, len(claims))
		}
		if set.names != nil {
			set.names[i+1] = name
		}
		if name != first && !slices.Contains(others, name) {
			others = append(others, name)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	set.first = b.zoneLocked(first, now)
	for _, name := range others {
		set.more = append(set.more, b.zoneLocked(name, now))
	}
	return set
}

// zoneLocked returns the zone called name, made closed if new, asked for
// now. b.mu must be held.
func (b *Breaker) zoneLocked(name string, now time.Time) *breakerZone {
	// Also at calls, not only when breakers_open is read: without a
	// metrics scrape, a failed-over master's zone was never forgotten, and
	// its opening's warning stayed the last word on it.
	if now.Sub(b.swept) > zoneIdle/2 {
		b.swept = now
		b.forgetIdleLocked()
	}
	z := b.zones[name]
	if z == nil {
		z = &breakerZone{name: name}
		b.zones[name] = z
	}
	z.used = now
	return z
}

// letThrough reports whether a call on the zones of set may go to the store
// now: none of them is open, or waits for a probe's answer. Once a zone's
// wait is over the first caller becomes its probe.
func (b *Breaker) letThrough(set zoneSet) bool {
	if set.first == nil {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if set.first.state == BreakerClosed && set.more == nil {
		return true // the common case
	}
	if !b.admits(set.first) {
		return false
	}
	for _, z := range set.more {
		if !b.admits(z) {
			return false
		}
	}
	b.admit(set.first)
	for _, z := range set.more {
		b.admit(z)
	}
	return true
}

// admits reports whether z lets a call through. b.mu must be held.
func (b *Breaker) admits(z *breakerZone) bool {
	switch z.state {
	case BreakerClosed:
		return true
	case BreakerOpen:
		return b.now().Sub(z.openedAt) >= z.wait
	default: // half open: one probe at a time
		return !z.probing
	}
}

// admit lets a call through z, which admits it: a zone not closed makes
// it its probe. b.mu must be held.
func (b *Breaker) admit(z *breakerZone) {
	switch z.state {
	case BreakerClosed:
		return
	case BreakerOpen:
		b.transition(z, BreakerHalfOpen, nil)
	}
	z.probing = true
}

// enter lets a call through or says why not: the breaker is open, or the
// releases owed before it (ReleaseFirst) failed, in which case the call
// is not made, and counts as failed unless the breaker is in zones (the
// releases owed span every zone, and their failure may be another
// master's: a healthy zone must not open for it), or they were another
// connection's (ErrOwedElsewhere), or the reconciler is closing (its last
// pass makes them): the store did not fail, and an exit logged the
// breaker's opening.
func (b *Breaker) enter(ctx context.Context, claims []*Claim) (zoneSet, error) {
	set := b.zonesOf(claims)
	if !b.letThrough(set) {
		return set, ErrBreakerOpen
	}
	if b.owed != nil && b.owed(claims) {
		if err := b.releaseOwed(ctx, claims); err != nil {
			if b.zone != nil || errors.Is(err, ErrOwedElsewhere) || errors.Is(err, errClosing) {
				b.uncounted(set)
			} else {
				b.count(set, err)
			}
			return set, fmt.Errorf("%w: %w", ErrReleasesOwed, err)
		}
	}
	return set, nil
}

// count records a call's outcome in each of its zones. A call cancelled by
// its own caller (the sender hung up) says nothing about the store.
func (b *Breaker) count(set zoneSet, err error) {
	if set.first == nil {
		return
	}
	if errors.Is(err, context.Canceled) {
		b.uncounted(set)
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.record(set.first, err)
	for _, z := range set.more {
		b.record(z, err)
	}
}

// refusing reports, per claim of a call in several zones (set), whether
// its zone refuses a call now, as letThrough would, without making a
// probe of it.
func (b *Breaker) refusing(set zoneSet) []bool {
	refused := make([]bool, len(set.names))
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, z := range append([]*breakerZone{set.first}, set.more...) {
		if b.admits(z) {
			continue
		}
		for i, name := range set.names {
			refused[i] = refused[i] || name == z.name
		}
	}
	return refused
}

// countByClaim records a call's outcome in each zone of set: when the call
// failed for some of its claims only, in each zone by its own claims
// (failed there if any of them did), else as count does. A healthy
// master's zone is not opened by the failures of a hung one that shared
// its calls (a gateway's batches, their settlements). Each zone is the one
// the call found its claims in (set.names): named again after the call, a
// zone whose slot moved meanwhile was recorded nowhere, and its probe
// stayed out for good.
func (b *Breaker) countByClaim(set zoneSet, err error) {
	failed, cause := failedClaimsOf(err)
	if failed == nil || set.names == nil || errors.Is(err, context.Canceled) {
		b.count(set, err)
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, z := range append([]*breakerZone{set.first}, set.more...) {
		var zoneErr error
		for i, name := range set.names {
			if name == z.name && failed[i] {
				zoneErr = cause
				break
			}
		}
		b.record(z, zoneErr)
	}
}

// uncounted ends a call that says nothing of its zones: a probe it was is
// over, and the next call may probe.
func (b *Breaker) uncounted(set zoneSet) {
	if set.first == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	set.first.probing = false
	for _, z := range set.more {
		z.probing = false
	}
}

// record records a call's outcome in z. b.mu must be held.
func (b *Breaker) record(z *breakerZone, err error) {
	z.probing = false
	if err == nil {
		z.consecutive = 0
		if z.state != BreakerClosed {
			b.transition(z, BreakerClosed, nil)
		}
		return
	}
	z.consecutive++
	switch {
	case z.state == BreakerHalfOpen: // the probe failed
		b.open(z, min(2*z.wait, b.cooldown), err)
	case z.state == BreakerClosed && z.consecutive >= b.failures:
		b.open(z, min(breakerFirstProbe, b.cooldown), err)
	}
}

// open opens z until its next probe, wait from now.
func (b *Breaker) open(z *breakerZone, wait time.Duration, cause error) {
	z.openedAt, z.wait = b.now(), wait
	b.transition(z, BreakerOpen, cause)
}

func (b *Breaker) transition(z *breakerZone, to BreakerState, cause error) {
	from := z.state
	z.state = to
	if b.onChange != nil {
		b.onChange(z.name, from, to, cause)
	}
}

// guardedStore is a Store behind a Breaker.
type guardedStore struct {
	next    Store
	breaker *Breaker
}

func (g guardedStore) Decide(ctx context.Context, claims []*Claim) ([]Verdict, error) {
	set, err := g.breaker.enter(ctx, claims)
	if errors.Is(err, ErrBreakerOpen) && set.more != nil {
		return g.decideApart(ctx, claims, g.breaker.refusing(set), err)
	}
	if owing, ok := errors.AsType[*DecideError](err); ok && errors.Is(err, ErrReleasesOwed) {
		return g.decideApart(ctx, claims, owing.Failed, err)
	}
	if err != nil {
		return nil, err
	}
	v, err := g.next.Decide(ctx, claims)
	g.breaker.countByClaim(set, err)
	return v, err
}

// decideApart decides the claims of a call that cannot go to the store
// whole, refused (per claim) failing with why (ErrBreakerOpen for those
// of a zone that refuses calls now, ErrReleasesOwed for those on keys
// whose owed releases failed), and the others as each would alone. A
// batch of a gateway's fleet no longer failed whole for the one master
// that hung, or for the one asset whose release it owed.
func (g guardedStore) decideApart(ctx context.Context, claims []*Claim, refused []bool, why error) ([]Verdict, error) {
	var through []*Claim
	var at []int
	for i, c := range claims {
		if !refused[i] {
			through, at = append(through, c), append(at, i)
		}
	}
	if len(through) == 0 || len(through) == len(claims) {
		return nil, why
	}
	decided, err := g.Decide(ctx, through)
	if decided == nil {
		// None has a verdict. The call's own error says whether it may
		// have written the claims let through (a timeout: the reconciler
		// takes them); why would say none was sent, and a claim that
		// landed late would stand for good. Given to those refused too,
		// it costs them a release by a token that never landed.
		return nil, failedWhole(err)
	}
	verdicts := make([]Verdict, len(claims))
	for j, i := range at {
		verdicts[i] = decided[j]
	}
	// The call's error decides whether its failed claims may have been
	// written (MayHaveWritten); the refused ones were not, and settling or
	// releasing a claim by its token where it never landed changes nothing.
	partial := spreadFailure(err, len(claims), at)
	if err == nil {
		partial.Err = why
	}
	for i := range refused {
		partial.Failed[i] = partial.Failed[i] || refused[i]
	}
	return verdicts, partial
}

func (g guardedStore) Settle(claims []*Claim, done func(error)) {
	// A settlement need not wait for the releases owed (it is no retry
	// they must reach the store before), and the request it belongs to
	// is being answered.
	set := g.breaker.zonesOf(claims)
	if !g.breaker.letThrough(set) {
		done(ErrBreakerOpen)
		return
	}
	g.next.Settle(claims, func(err error) {
		g.breaker.countByClaim(set, err)
		done(err)
	})
}

func (g guardedStore) Release(ctx context.Context, claims []*Claim) ([]bool, error) {
	released, err := g.next.Release(ctx, claims)
	if err != nil {
		g.breaker.countByClaim(g.breaker.zonesOf(claims), err)
	}
	return released, err
}

// failedClaimsOf says which claims of a store call failed, when it failed
// for some and not others: a Decide (DecideError), a Release (ReleaseError)
// or a Settle, whose pipeline call has a command a claim, in order
// (pipeline.PartialError). Nil when it failed whole, or not at all.
func failedClaimsOf(err error) (failed []bool, cause error) {
	if e, ok := errors.AsType[*DecideError](err); ok {
		return e.Failed, e.Err
	}
	if e, ok := errors.AsType[*ReleaseError](err); ok {
		return e.Failed, e.Err
	}
	if e, ok := errors.AsType[*pipeline.PartialError](err); ok {
		return e.Failed, e.Err
	}
	return nil, err
}
