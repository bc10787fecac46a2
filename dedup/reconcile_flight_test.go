package dedup

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// aHealthyCallReturns makes a call on p's key (a healthy master's, whose
// confirmation is owed) through guarded and fails the test unless it is
// made, without error, while the hung master still hangs.
func aHealthyCallReturns(t *testing.T, guarded Store, pol *Policy, what string) {
	t.Helper()
	p := parked
	p.Time = p.Time.Add(time.Second)
	done := make(chan error, 1)
	go func() {
		_, err := decideOne(context.Background(), guarded, claimOf(pol, p, 3, time.Now()))
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("a call on a healthy master's key owed a confirmation, while %s: %v", what, err)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("a call on a healthy master's key owed a confirmation still waits after 5 s, while %s", what)
	}
}

// While run's pass retries a hung master's release (each try waits out the
// store timeout), a call on a healthy master's key whose own confirmation
// is owed makes its pass at once: it is no retry of the hung master's
// observation. It waited for run's pass behind one lock, answered a store
// timeout or two late for as long as the hang lasted.
func TestAHealthyOwedCallDoesNotWaitForRunsRetryOfAHungMaster(t *testing.T) {
	ends := make(chan struct{})
	r, guarded, pol, dead, hanging := hungMasterGuarded(t, ends)
	t.Cleanup(func() { close(ends) }) // before r's Close, which waits for run's pass
	r.Confirm([]*Claim{claimOf(pol, parked, 2, time.Now())})
	r.Hand([]*Claim{claimOf(pol, dead, 1, time.Now())}, true) // due now: run's pass takes it, and hangs
	<-hanging
	aHealthyCallReturns(t, guarded, pol, "run's pass hangs on the hung master's release")
}

// While a call on the hung master's key makes its pass (it hangs), a call
// on a healthy master's key makes its own: it shared the hung one's, and
// waited out its timeout before making its own.
func TestAHealthyOwedCallDoesNotWaitForAHungKeysCall(t *testing.T) {
	ends := make(chan struct{})
	r, guarded, pol, dead, hanging := hungMasterGuarded(t, ends)
	t.Cleanup(func() { close(ends) })
	r.Confirm([]*Claim{claimOf(pol, dead, 1, time.Now())})
	r.Confirm([]*Claim{claimOf(pol, parked, 2, time.Now())})
	go func() {
		d := dead
		d.Time = d.Time.Add(time.Second)
		_, _ = decideOne(context.Background(), guarded, claimOf(pol, d, 10, time.Now())) // the hung key's retry
	}()
	<-hanging
	aHealthyCallReturns(t, guarded, pol, "the hung key's retry makes its pass")
}

// A burst of calls on one key owed a confirmation makes two passes: the
// one on its way when the burst came, and one begun after, which each
// call of the burst waits for. A confirmation stays owed once released, so
// a call that went on after every pass it waited for would make one more,
// one call after another.
func TestABurstOnAConfirmedKeyMakesTwoPasses(t *testing.T) {
	store := &gatedStore{Store: NewMemoryStore(0), gate: make(chan struct{}), answers: true}
	r, _ := testReconciler(t, store, 0, time.Hour)
	pol := testPolicy(Sliding)
	r.Confirm([]*Claim{claimOf(pol, parked, 1, time.Now())})
	retry := claimOf(pol, parked, 2, time.Now())
	const burst = 10
	errs := make(chan error, burst)
	go func() { errs <- r.ReleaseOwed(context.Background(), []*Claim{retry}) }()
	for deadline := time.Now().Add(5 * time.Second); store.releaseCount() < 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first call's pass never reached the store")
		}
	}
	for range burst - 1 {
		go func() { errs <- r.ReleaseOwed(context.Background(), []*Claim{retry}) }()
	}
	time.Sleep(100 * time.Millisecond) // the burst waits for the first pass
	close(store.gate)
	for range burst {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := store.releaseCount(); n != 2 {
		t.Errorf("a burst of %d calls on one confirmed key made %d passes, want 2", burst, n)
	}
	if !r.OwesFor([]*Claim{retry}) {
		t.Error("the confirmation is no longer owed: the early passes ended it before its schedule")
	}
}

// orderStore logs, in order, when a Decide reaches the store and when a
// Release is answered; a Release waits for gate first (a store answering
// slowly), and started is told when one begins.
type orderStore struct {
	Store
	gate    chan struct{}
	started chan struct{}
	mu      sync.Mutex
	log     []string
}

func (s *orderStore) note(what string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log = append(s.log, what)
}

func (s *orderStore) Decide(ctx context.Context, claims []*Claim) ([]Verdict, error) {
	s.note("decide " + claims[0].Asset)
	return s.Store.Decide(ctx, claims)
}

func (s *orderStore) Release(ctx context.Context, claims []*Claim) ([]bool, error) {
	select {
	case s.started <- struct{}{}:
	default:
	}
	<-s.gate
	released, err := s.Store.Release(ctx, claims)
	s.note("release answered")
	return released, err
}

func (s *orderStore) order() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.log...)
}

// One request carried pings of two assets (a gateway's batch: sliding keys
// A and B), and its release is owed (here a confirmation no replica
// acknowledged, FailoverStore -> Confirm). A retry on asset A makes a pass
// that takes that job; a retry on asset B must wait for it: B's release is
// on its way in it, not in the queue. A flight held the keys of the call
// it was for (A), and B's retry went to the store before the release owed
// on B was made (helper 1's review, stop 60).
func TestACallOnAnotherAssetOfAReleaseInFlightWaitsForIt(t *testing.T) {
	store := &orderStore{Store: NewMemoryStore(0), gate: make(chan struct{}), started: make(chan struct{}, 1)}
	r, _ := testReconciler(t, store, 0, time.Hour)
	b := NewBreaker(1000, time.Hour, nil)
	b.ReleaseFirst(r.OwesFor, r.ReleaseOwed)
	guarded := b.Guard(store)
	pol := testPolicy(Sliding)
	pa, pb := parked, parked
	pa.Asset, pb.Asset = "veh-A", "veh-B"
	r.Confirm([]*Claim{claimOf(pol, pa, 1, time.Now()), claimOf(pol, pb, 2, time.Now())})

	retryA, retryB := pa, pb
	retryA.Time, retryB.Time = pa.Time.Add(time.Second), pb.Time.Add(time.Second)
	errA := make(chan error, 1)
	go func() {
		_, err := decideOne(context.Background(), guarded, claimOf(pol, retryA, 10, time.Now()))
		errA <- err
	}()
	select {
	case <-store.started: // A's flight carries the job, held at the store
	case <-time.After(5 * time.Second):
		t.Fatal("the retry on A never made the release owed")
	}
	errB := make(chan error, 1)
	go func() {
		_, err := decideOne(context.Background(), guarded, claimOf(pol, retryB, 11, time.Now()))
		errB <- err
	}()
	select {
	case err := <-errB:
		t.Errorf("the retry on B returned (%v) while the release owed on B was still on its way; store saw %q", err, store.order())
		errB <- err
	case <-time.After(300 * time.Millisecond):
	}
	close(store.gate)
	for _, ch := range []chan error{errA, errB} {
		select {
		case err := <-ch:
			if err != nil {
				t.Errorf("a retry: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a retry still waits after the release was made")
		}
	}
	for _, what := range store.order() {
		if what == "decide "+pb.Asset {
			t.Errorf("the retry on B reached the store before the release owed on B was answered: %q", store.order())
			break
		}
		if what == "release answered" {
			break
		}
	}
}

// A steady stream of calls on one asset whose confirmation is owed (after
// a failover, for the minute of its confirmations), the store answering
// each release in a couple of milliseconds: every call goes through. A
// call waited for every pass on its keys, those of the calls that came
// after it too, and after maxOwedRounds of them failed (errStillOwed): a
// 503 or an unchecked forward for a request nothing was wrong with
// (helper 1's review, stop 60).
func TestAStreamOnAConfirmedKeyFailsNoCall(t *testing.T) {
	store := &slowAnsweringStore{Store: NewMemoryStore(0), delay: 2 * time.Millisecond}
	r, _ := testReconciler(t, store, 0, time.Hour)
	pol := testPolicy(Sliding)
	r.Confirm([]*Claim{claimOf(pol, parked, 1, time.Now())})
	retry := []*Claim{claimOf(pol, parked, 2, time.Now())}

	var calls, stillOwed, other atomic.Int64
	var firstErr atomic.Value
	stop := time.Now().Add(time.Second)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				calls.Add(1)
				err := r.ReleaseOwed(context.Background(), retry)
				switch {
				case errors.Is(err, errStillOwed):
					stillOwed.Add(1)
				case err != nil:
					other.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		})
	}
	wg.Wait()
	if stillOwed.Load() > 0 || other.Load() > 0 {
		t.Errorf("%d of %d calls on a confirmed key failed errStillOwed (and %d otherwise: %v) while the store answered every release (%d passes)",
			stillOwed.Load(), calls.Load(), other.Load(), firstErr.Load(), store.calls.Load())
	}
}

// The same stream through the breaker, as a Sentinel connection has it
// (one zone; FailoverStore confirms the releases no replica acknowledged):
// each errStillOwed counts as a store failure (Breaker.enter), a few in a
// row open the breaker, and then every call, on every asset, is refused
// (ErrBreakerOpen: forwarded unchecked, or 503 with on_store_error closed)
// while Redis answers every command at once.
func TestAStreamOnAConfirmedKeyDoesNotOpenTheBreaker(t *testing.T) {
	store := &slowAnsweringStore{Store: NewMemoryStore(0), delay: 2 * time.Millisecond}
	r, _ := testReconciler(t, store, 0, time.Hour)
	var opened atomic.Int64
	b := NewBreaker(DefaultBreakerFailures, DefaultBreakerCooldown, func(_, to BreakerState, _ error) {
		if to == BreakerOpen {
			opened.Add(1)
		}
	})
	b.ReleaseFirst(r.OwesFor, r.ReleaseOwed)
	guarded := b.Guard(store)
	pol := testPolicy(Sliding)
	r.Confirm([]*Claim{claimOf(pol, parked, 1, time.Now())})

	var token atomic.Uint64
	token.Store(100)
	stop := time.Now().Add(time.Second)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				p := parked
				n := token.Add(1)
				p.Time = p.Time.Add(time.Duration(n) * time.Second)
				_, _ = decideOne(context.Background(), guarded, claimOf(pol, p, n, time.Now()))
			}
		})
	}
	wg.Wait()
	if n := opened.Load(); n > 0 {
		t.Errorf("the breaker opened %d times in a second of calls on one confirmed asset, the store answering every release (%d passes)", n, store.calls.Load())
	}
}
