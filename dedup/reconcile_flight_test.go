package dedup

import (
	"context"
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
