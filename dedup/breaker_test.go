package dedup

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
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

// allow and done are letThrough and count for the one zone of a breaker
// not in zones.
func (b *Breaker) allow() bool    { return b.letThrough(b.zonesOf(nil)) }
func (b *Breaker) done(err error) { b.count(b.zonesOf(nil), err) }

// In zones, failures open only their own zone; a call spanning zones is
// skipped while any of them is open, and its outcome counts in each.
func TestBreakerZonesOpenOnTheirOwn(t *testing.T) {
	b := NewBreaker(2, time.Second, nil)
	var opened []string
	b.ZoneBy(func(c *Claim) string { return c.Asset }, func(zone string, _, to BreakerState, _ error) {
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
			claims = append(claims, claimOf(testPolicy(Tumbling), p, 1, clock))
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
	if _, err := s.Decide(ctx, on("b", "a")); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("a call on b and a while a is open: %v", err)
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
