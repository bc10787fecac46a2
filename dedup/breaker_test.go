package dedup

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/pipeline"
)

// flakyStore fails while down is set, and counts the calls that reach it.
// The breaker's state machine is tested against it; the integration tests
// kill and pause a real Redis.
type flakyStore struct {
	down  error
	calls int
}

func (f *flakyStore) Decide(context.Context, []*Claim) ([]Verdict, error) {
	f.calls++
	return []Verdict{accepted}, f.down
}
func (f *flakyStore) Settle(_ []*Claim, done func(error)) { f.calls++; done(f.down) }
func (f *flakyStore) Release(context.Context, []*Claim) ([]bool, error) {
	f.calls++
	return []bool{f.down == nil}, f.down
}

func TestBreakerOpensProbesAndCloses(t *testing.T) {
	var transitions []string
	b := NewBreaker(3, time.Second, func(from, to BreakerState, _ error) {
		transitions = append(transitions, fmt.Sprintf("%s->%s", from, to))
	})
	clock := articleBase
	b.now = func() time.Time { return clock }
	store := &flakyStore{down: errors.New("connection refused")}
	s := b.Guard(store)
	ctx := context.Background()

	for i := range 3 {
		if _, err := s.Decide(ctx, nil); errors.Is(err, ErrBreakerOpen) {
			t.Fatalf("call %d failed fast before the breaker had seen 3 failures", i+1)
		}
	}
	for range 10 {
		if _, err := s.Decide(ctx, nil); !errors.Is(err, ErrBreakerOpen) {
			t.Fatalf("open breaker let a call through: %v", err)
		}
	}
	if store.calls != 3 || b.State() != BreakerOpen {
		t.Fatalf("%d calls reached the store, state %s; want 3 and open", store.calls, b.State())
	}

	// The first wait passes; the probe fails: open again, for longer.
	clock = clock.Add(breakerFirstProbe)
	if _, err := s.Decide(ctx, nil); errors.Is(err, ErrBreakerOpen) || store.calls != 4 {
		t.Fatalf("no probe after the cool-down: %v, %d calls", err, store.calls)
	}
	if _, err := s.Decide(ctx, nil); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("a failed probe must reopen the breaker: %v", err)
	}

	// The store is back; the next probe closes the breaker.
	store.down = nil
	clock = clock.Add(2 * breakerFirstProbe)
	for i := range 5 {
		if _, err := s.Decide(ctx, nil); err != nil {
			t.Fatalf("call %d after recovery: %v", i, err)
		}
	}
	want := "[closed->open open->half_open half_open->open open->half_open half_open->closed]"
	if fmt.Sprint(transitions) != want {
		t.Fatalf("transitions %v, want %s", transitions, want)
	}
}

// Probes start 100 ms after the breaker opens and back off, doubling, to the
// cooldown: a store that is back is used again within one cooldown, however
// long it was down, and a short outage costs a fraction of a second.
func TestBreakerProbesWithAGrowingBackoff(t *testing.T) {
	b := NewBreaker(1, time.Second, nil)
	clock := articleBase
	b.now = func() time.Time { return clock }
	store := &flakyStore{down: errors.New("down")}
	s := b.Guard(store)
	ctx := context.Background()
	s.Decide(ctx, nil) // opens it

	// probeAfter advances the clock a millisecond at a time until a call
	// reaches the store, and returns how long that took.
	probeAfter := func() time.Duration {
		t.Helper()
		start := clock
		for calls := store.calls; clock.Sub(start) < time.Minute; {
			clock = clock.Add(time.Millisecond)
			s.Decide(ctx, nil)
			if store.calls > calls {
				return clock.Sub(start)
			}
		}
		t.Fatal("no probe for a minute")
		return 0
	}
	var waits []time.Duration
	for range 7 {
		waits = append(waits, probeAfter())
	}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000, 1000}
	for i := range want {
		want[i] *= time.Millisecond
	}
	if fmt.Sprint(waits) != fmt.Sprint(want) {
		t.Fatalf("probes after %v, want %v", waits, want)
	}

	// The store comes back just after a failed probe: the next one, at most
	// a cooldown later, closes the breaker; the calls in between failed
	// fast, one per millisecond here, a second's worth.
	store.down = nil
	skipped := store.calls
	if wait := probeAfter(); wait != time.Second || b.State() != BreakerClosed {
		t.Fatalf("recovered store used again after %v (state %s), want 1s", wait, b.State())
	}
	if got := store.calls - skipped; got != 1 {
		t.Fatalf("%d calls reached the store while it waited for the probe", got)
	}

	// Closed, the backoff starts over: the next outage probes after 100 ms.
	store.down = errors.New("down again")
	s.Decide(ctx, nil)
	if wait := probeAfter(); wait != breakerFirstProbe {
		t.Fatalf("after recovering, the first probe of a new outage came after %v, want %v", wait, breakerFirstProbe)
	}
}

// A cooldown shorter than the first probe's wait caps it too.
func TestBreakerCooldownBelowTheFirstProbe(t *testing.T) {
	b := NewBreaker(1, 30*time.Millisecond, nil)
	clock := articleBase
	b.now = func() time.Time { return clock }
	b.done(errors.New("down"))
	clock = clock.Add(30 * time.Millisecond)
	if !b.allow() {
		t.Fatal("no probe after a 30ms cooldown")
	}
}

func TestBreakerAllowsOneProbeAtATime(t *testing.T) {
	b := NewBreaker(1, time.Second, nil)
	clock := articleBase
	b.now = func() time.Time { return clock }
	b.done(errors.New("down"))
	clock = clock.Add(breakerFirstProbe)
	if !b.allow() {
		t.Fatal("no probe after the first wait")
	}
	if b.allow() {
		t.Fatal("a second call went through while the probe is out")
	}
	if b.Open() != 1 {
		t.Fatalf("%d open while the probe is out and every other call is skipped; want 1 (the breakers_open gauge)", b.Open())
	}
	b.done(nil)
	if !b.allow() || b.State() != BreakerClosed {
		t.Fatalf("a successful probe must close the breaker (state %s)", b.State())
	}
}

// A sender hanging up cancels its context; that is not the store failing.
func TestBreakerIgnoresCancelledCalls(t *testing.T) {
	b := NewBreaker(2, time.Second, nil)
	for range 10 {
		b.done(context.Canceled)
	}
	if b.State() != BreakerClosed {
		t.Fatalf("cancelled calls opened the breaker")
	}
	b.done(context.DeadlineExceeded)
	b.done(context.DeadlineExceeded)
	if b.State() != BreakerOpen {
		t.Fatalf("two timeouts did not open it")
	}
}

func TestBreakerLetsReleasesThrough(t *testing.T) {
	b := NewBreaker(1, time.Hour, nil)
	store := &flakyStore{down: errors.New("down")}
	s := b.Guard(store)
	s.Decide(context.Background(), nil)
	store.down = nil
	if ok, err := s.Release(context.Background(), nil); err != nil || !ok[0] || store.calls != 2 {
		t.Fatalf("release behind an open breaker: %v %v, %d calls", ok, err, store.calls)
	}
}

// Calls not made because the releases owed before them failed count as
// the store's failures when their own connection's store failed them, but
// not when another connection on the same data owed them
// (ErrOwedElsewhere: a reload's old connection, closing), nor when the
// reconciler that owes them is closing (its last pass makes them):
// counted, the calls on those keys while a connection closed opened the
// breaker for every asset, and an exit logged its opening. (Helpers 2 and
// 3's reviews, stop 61.)
func TestBreakerCountsOnlyItsOwnStoresOwedReleases(t *testing.T) {
	for _, tc := range []struct {
		name      string
		err       error
		wantState BreakerState
	}{
		{"own store's failure", context.DeadlineExceeded, BreakerOpen},
		{"its own reconciler's, closing", errClosing, BreakerClosed},
		{"another connection's, closing", fmt.Errorf("%w: %w", ErrOwedElsewhere, errClosing), BreakerClosed},
		{"another connection's, its store failing", fmt.Errorf("%w: %w", ErrOwedElsewhere, context.DeadlineExceeded), BreakerClosed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBreaker(3, time.Hour, nil)
			b.ReleaseFirst(func([]*Claim) bool { return true }, func(context.Context, []*Claim) error { return tc.err })
			s := b.Guard(NewMemoryStore(0))
			for i := range 5 {
				_, err := s.Decide(context.Background(), []*Claim{claimOf(testPolicy(Tumbling), parked, uint64(i+1), time.Now())})
				if !errors.Is(err, ErrReleasesOwed) && !errors.Is(err, ErrBreakerOpen) {
					t.Fatalf("call %d: %v, want it not made", i, err)
				}
			}
			if got := b.State(); got != tc.wantState {
				t.Errorf("after 5 calls whose owed releases failed (%v): breaker %v, want %v", tc.err, got, tc.wantState)
			}
		})
	}
}

// allow and done are letThrough and count for the one zone of a breaker
// not in zones.
func (b *Breaker) allow() bool    { return b.letThrough(b.zonesOf(nil)) }
func (b *Breaker) done(err error) { b.count(b.zonesOf(nil), err) }

// In zones, failures open only their own zone; a call spanning zones has
// its claims on an open zone refused and the others decided, and its
// outcome counts in each.
func TestBreakerZonesOpenOnTheirOwn(t *testing.T) {
	b := NewBreaker(2, time.Second, nil)
	var opened []string
	zoneOf := map[string]string{} // a claim's key: its asset
	b.ZoneBy(func(key string) string { return zoneOf[key] }, func(zone string, _, to BreakerState, _ error) {
		if to == BreakerOpen {
			opened = append(opened, zone)
		}
	})
	clock := articleBase
	b.now = func() time.Time { return clock }
	store := &flakyStore{down: errors.New("down")}
	s := b.Guard(store)
	ctx := context.Background()
	on := func(assets ...string) []*Claim {
		var claims []*Claim
		for _, a := range assets {
			p := parked
			p.Asset = a
			c := claimOf(testPolicy(Tumbling), p, 1, clock)
			zoneOf[c.Key()] = a
			claims = append(claims, c)
		}
		return claims
	}
	s.Decide(ctx, on("a"))
	s.Decide(ctx, on("a"))
	if _, err := s.Decide(ctx, on("a")); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("zone a after 2 failures: %v", err)
	}
	store.down = nil
	if _, err := s.Decide(ctx, on("b")); err != nil {
		t.Fatalf("zone b while a is open: %v", err)
	}
	if v, err := s.Decide(ctx, on("b", "a")); !errors.Is(err, ErrBreakerOpen) || DecideFailed(err, 0) || !DecideFailed(err, 1) || v[0].Decision == "" {
		t.Fatalf("a call on b and a while a is open: %v; want b's claim decided and a's refused", err)
	}
	if b.State() != BreakerOpen || b.Open() != 1 {
		t.Fatalf("state %s, %d open; want open, 1", b.State(), b.Open())
	}
	// A call on b and c fails twice: both open.
	store.down = errors.New("down")
	s.Decide(ctx, on("b", "c"))
	s.Decide(ctx, on("b", "c"))
	if fmt.Sprint(opened) != "[a b c]" || b.Open() != 3 {
		t.Fatalf("opened %v, %d open; want [a b c], 3", opened, b.Open())
	}
	// After the wait, the call on a and b probes both and closes both.
	store.down = nil
	clock = clock.Add(breakerFirstProbe)
	if _, err := s.Decide(ctx, on("a", "b")); err != nil || b.Open() != 1 {
		t.Fatalf("probe of a and b: %v, %d open; want c's only", err, b.Open())
	}
}

// A zone is named by its master's address. When a master fails over, its
// keys' calls go to the promoted replica's zone and none asks for the old
// master's again: that zone is forgotten after zoneIdle, rather than stay
// open for good (State open, the breakers_open gauge counting it, dead
// letters skipped).
func TestAZoneOfAFailedOverMasterIsForgotten(t *testing.T) {
	b := NewBreaker(2, time.Second, nil)
	masterOf := map[string]string{"a": "10.0.0.1:6379", "b": "10.0.0.2:6379"}
	assetOf := map[string]string{}
	b.ZoneBy(func(key string) string { return masterOf[assetOf[key]] }, nil)
	clock := articleBase
	b.now = func() time.Time { return clock }
	store := &flakyStore{down: errors.New("i/o timeout")}
	s := b.Guard(store)
	ctx := context.Background()
	on := func(asset string) []*Claim {
		p := parked
		p.Asset = asset
		c := claimOf(testPolicy(Tumbling), p, 1, clock)
		assetOf[c.Key()] = asset
		return []*Claim{c}
	}
	s.Decide(ctx, on("a"))
	s.Decide(ctx, on("a"))
	if _, err := s.Decide(ctx, on("a")); b.Open() != 1 || !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("setup: %d zones open, a's call: %v", b.Open(), err)
	}
	masterOf["a"] = "10.0.0.3:6379" // failed over to its replica
	store.down = nil
	for range 3 {
		clock = clock.Add(time.Minute)
		for _, asset := range []string{"a", "b"} {
			if _, err := s.Decide(ctx, on(asset)); err != nil {
				t.Fatalf("asset %s after the failover: %v", asset, err)
			}
		}
	}
	if n, st := b.Open(), b.State(); n != 0 || st != BreakerClosed {
		t.Fatalf("3 minutes after the failover, every call succeeding: %d zones open, State %s", n, st)
	}
}

// zonedStore fails the releases of any call holding a claim of a down
// asset, as a pipeline job split across masters answers with the first
// part's error.
type zonedStore struct {
	mu   sync.Mutex
	down map[string]bool
}

func (z *zonedStore) Decide(_ context.Context, claims []*Claim) ([]Verdict, error) {
	v := make([]Verdict, len(claims))
	for i := range v {
		v[i] = accepted
	}
	return v, nil
}
func (z *zonedStore) Settle(_ []*Claim, done func(error)) { done(nil) }
func (z *zonedStore) Release(_ context.Context, claims []*Claim) ([]bool, error) {
	z.mu.Lock()
	defer z.mu.Unlock()
	for _, c := range claims {
		if z.down[c.Asset] {
			return nil, context.DeadlineExceeded
		}
	}
	out := make([]bool, len(claims))
	for i := range out {
		out[i] = true
	}
	return out, nil
}

// The releases owed (ReleaseFirst) span every master. A request with a
// ping on a healthy master (asset a) and one on a hung master (b) failed,
// and both claims wait in one job: a call on a's key is not made while
// that job cannot be answered (its retry must find its claim gone), but
// the failure is b's master's, and must not open a's zone, whose other
// assets' calls go on.
func TestAHungMastersOwedReleasesOpenNoHealthyZone(t *testing.T) {
	b := NewBreaker(3, time.Second, nil)
	var opened []string
	var omu sync.Mutex
	assetOf := map[string]string{}
	var amu sync.Mutex
	b.ZoneBy(func(key string) string { amu.Lock(); defer amu.Unlock(); return "master-of-" + assetOf[key] },
		func(zone string, _, to BreakerState, _ error) {
			if to == BreakerOpen {
				omu.Lock()
				opened = append(opened, zone)
				omu.Unlock()
			}
		})
	store := &zonedStore{down: map[string]bool{"b": true}}
	r := NewReconciler(store, 0, nil)
	t.Cleanup(func() { r.Close() })
	b.ReleaseFirst(r.OwesFor, r.ReleaseOwed)
	s := b.Guard(store)
	claim := func(asset string, token uint64) *Claim {
		p := parked
		p.Asset = asset
		c := claimOf(testPolicy(Sliding), p, token, time.Now())
		amu.Lock()
		assetOf[c.Key()] = asset
		amu.Unlock()
		return c
	}
	r.Hand([]*Claim{claim("a", 1), claim("b", 2)}, true)
	for i := range 5 {
		if _, err := s.Decide(context.Background(), []*Claim{claim("a", uint64(10+i))}); !errors.Is(err, ErrReleasesOwed) {
			t.Fatalf("a call on a while the release a shares with b is owed: %v, want ErrReleasesOwed", err)
		}
	}
	other := claim("a2", 20)
	amu.Lock()
	assetOf[other.Key()] = "a" // another asset on a's master
	amu.Unlock()
	if _, err := s.Decide(context.Background(), []*Claim{other}); err != nil {
		t.Fatalf("another asset on a's master: %v", err)
	}
	omu.Lock()
	defer omu.Unlock()
	if len(opened) > 0 {
		t.Fatalf("zones opened: %v, want none: the failures were b's master's", opened)
	}
}

// ClusterMasterZone asks the slot map within the store's timeout: while it
// cannot be loaded (a Cluster unreachable at start, every seed hung), a
// call still ends within about that, and an open zone fails fast.
func TestTheClusterZoneLookupIsBoundedByTheStoreTimeout(t *testing.T) {
	s := zonedStoreOnAHungSeed(t)
	for i := range 4 {
		start := time.Now()
		_, err := s.Decide(context.Background(), []*Claim{claimOf(testPolicy(Tumbling), parked, uint64(i+1), time.Now())})
		if took := time.Since(start); took > time.Second {
			t.Errorf("call %d with a 50ms store timeout took %v (%v)", i+1, took.Round(time.Millisecond), err)
		}
		if i == 2 && !errors.Is(err, ErrBreakerOpen) { // the 4th may be the first probe, 100 ms on
			t.Errorf("call %d after 2 failures: %v, want ErrBreakerOpen", i+1, err)
		}
	}
}

// With the slot map unloadable, a call of 40 pings on 40 assets waited a
// store timeout for each key's zone before the breaker even decided: one
// lookup that cannot be answered says the others cannot be either. (40,
// not 10: bounded once, a call takes about two timeouts, 100 ms; a lookup
// per key, 2 s; a bound of 1 s tells them apart on a loaded machine too.)
func TestAZoneLookupOfAManyPingCallIsBoundedOnce(t *testing.T) {
	s := zonedStoreOnAHungSeed(t)
	const pings = 40
	var claims []*Claim
	for i := range pings {
		p := parked
		p.Asset = fmt.Sprintf("veh-%d", i)
		claims = append(claims, claimOf(testPolicy(Tumbling), p, uint64(i+1), time.Now()))
	}
	for i := range 3 {
		start := time.Now()
		_, err := s.Decide(context.Background(), claims)
		if took := time.Since(start); took > time.Second {
			t.Errorf("call %d of %d pings with a 50ms store timeout took %v (%v)", i+1, pings, took.Round(time.Millisecond), err)
		}
	}
}

// zonedStoreOnAHungSeed is a Redis store, with a 50 ms timeout, behind a
// breaker in Cluster zones (2 failures), on a Cluster client whose only
// seed accepts connections and never answers: a slot map that cannot be
// loaded.
func zonedStoreOnAHungSeed(t *testing.T) Store {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	var cmu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			cmu.Lock()
			conns = append(conns, c)
			cmu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		cmu.Lock()
		for _, c := range conns {
			c.Close()
		}
		cmu.Unlock()
	})
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{ln.Addr().String()}, ContextTimeoutEnabled: true})
	pipe := pipeline.New(client)
	t.Cleanup(func() { pipe.Close(); _ = client.Close() })
	b := NewBreaker(2, time.Second, nil)
	b.ZoneBy(ClusterMasterZone(client, 50*time.Millisecond), nil)
	return b.Guard(NewRedisStore(pipe, 50*time.Millisecond))
}

// movingSlotStore answers a call as a Cluster pipeline does while a slot
// migrates: the claims on the migrating slot (tryAgain) fail, the others
// are decided, and the call's MOVED answer for a claim whose slot has just
// moved on (moved) makes the client reload its slot map, so that its key
// now names another master (moveTo).
type movingSlotStore struct {
	tryAgain, moved string // assets
	moveTo          func()
}

func (m *movingSlotStore) Decide(_ context.Context, claims []*Claim) ([]Verdict, error) {
	v := make([]Verdict, len(claims))
	failed := make([]bool, len(claims))
	for i, c := range claims {
		v[i] = accepted
		if c.Asset == m.tryAgain {
			v[i], failed[i] = Verdict{}, true
		}
		if c.Asset == m.moved && m.moveTo != nil {
			m.moveTo()
		}
	}
	if !slices.Contains(failed, true) {
		return v, nil
	}
	return v, &DecideError{Err: errors.New("TRYAGAIN Multiple keys request during rehashing of slot"), Failed: failed}
}
func (m *movingSlotStore) Settle(_ []*Claim, done func(error)) { done(nil) }
func (m *movingSlotStore) Release(_ context.Context, claims []*Claim) ([]bool, error) {
	return make([]bool, len(claims)), nil
}

// A zone's probe ends with the call it went out with, whatever the keys of
// that call name once it returns. zonesIn names each claim's zone
// anew after a call that failed in part: when resharding moves a slot off
// the probed master during the probe (its MOVED reloads the slot map), the
// probed zone is recorded nowhere, stays half open with its probe out for
// good, and refuses every later call on its other slots (ErrBreakerOpen,
// on_store_error) however healthy its master is: it is asked for, so never
// forgotten.
func TestAProbeSpanningZonesEndsWhenItsSlotMovesDuringIt(t *testing.T) {
	b := NewBreaker(1, time.Second, nil)
	zoneOf := map[string]string{} // a claim's key: its master
	b.ZoneBy(func(key string) string { return zoneOf[key] }, nil)
	clock := articleBase
	b.now = func() time.Time { return clock }
	claim := func(asset, master string) *Claim {
		p := parked
		p.Asset = asset
		c := claimOf(testPolicy(Tumbling), p, 1, clock)
		zoneOf[c.Key()] = master
		return c
	}
	store := &movingSlotStore{tryAgain: "a-migrating"}
	s := b.Guard(store)
	ctx := context.Background()
	// master a's zone opens: a call on its migrating slot fails
	if _, err := s.Decide(ctx, []*Claim{claim("a-migrating", "a")}); err == nil {
		t.Fatal("setup: the migrating slot's call succeeded")
	}
	if b.Open() != 1 {
		t.Fatalf("setup: %d zones open, want a's", b.Open())
	}
	// its probe, a gateway's batch on a and b: the migrating slot fails
	// again (TRYAGAIN), and another of a's slots moves to b meanwhile
	clock = clock.Add(breakerFirstProbe)
	moving := claim("a-moving", "a")
	store.moveTo = func() { zoneOf[moving.Key()] = "b" }
	store.tryAgain, store.moved = "b-migrating", "a-moving"
	if _, err := s.Decide(ctx, []*Claim{moving, claim("b-migrating", "b")}); err == nil {
		t.Fatal("setup: the probe call did not fail in part")
	}
	store.tryAgain, store.moved = "", ""
	// master a answers: its other assets must be decided, at least once
	// the breaker's longest wait is over
	clock = clock.Add(time.Minute / 2)
	for i := range 3 {
		clock = clock.Add(time.Second)
		if _, err := s.Decide(ctx, []*Claim{claim(fmt.Sprintf("a-%d", i), "a")}); err != nil {
			t.Fatalf("call %d on master a, healthy, %s after its probe: %v (breaker %s, %d zones not closed); want it decided",
				i+1, clock.Sub(articleBase.Add(breakerFirstProbe)), err, b.State(), b.Open())
		}
	}
}
