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
func (f *flakyStore) Settle(context.Context, []*Claim) error { f.calls++; return f.down }
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

	// The cool-down passes; the probe fails: open again, for another cool-down.
	clock = clock.Add(time.Second)
	if _, err := s.Decide(ctx, nil); errors.Is(err, ErrBreakerOpen) || store.calls != 4 {
		t.Fatalf("no probe after the cool-down: %v, %d calls", err, store.calls)
	}
	if _, err := s.Decide(ctx, nil); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("a failed probe must reopen the breaker: %v", err)
	}

	// The store is back; the next probe closes the breaker.
	store.down = nil
	clock = clock.Add(time.Second)
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

func TestBreakerAllowsOneProbeAtATime(t *testing.T) {
	b := NewBreaker(1, time.Second, nil)
	clock := articleBase
	b.now = func() time.Time { return clock }
	b.done(errors.New("down"))
	clock = clock.Add(time.Second)
	if !b.allow() {
		t.Fatal("no probe after the cool-down")
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
