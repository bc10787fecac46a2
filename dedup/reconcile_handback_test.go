package dedup

import (
	"context"
	"testing"
	"time"
)

// aCallOnItsWay queues n jobs
// of 200 releases on r, all holding the key of one claim (shared), and a
// call on that key (ReleaseOwed) whose flight has begun; its answer comes
// on the channel returned.
func aCallOnItsWay(t *testing.T, n int, delay time.Duration) (*Reconciler, *slowAnsweringStore, *Claim, chan error) {
	t.Helper()
	store := &slowAnsweringStore{Store: NewMemoryStore(0), delay: delay}
	r := newReconciler(store, 0, nil, nil)
	stopRun(r)
	shared := claimOf(testPolicy(Tumbling), parked, 1, time.Now())
	for job := 1; job <= n; job++ {
		claims := jobOf200(job)
		claims[0] = shared
		r.Hand(claims, true)
	}
	answer := make(chan error, 1)
	go func() { answer <- r.ReleaseOwed(context.Background(), []*Claim{shared}) }()
	for deadline := time.Now().Add(5 * time.Second); store.calls.Load() < 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the call's flight never began")
		}
	}
	return r, store, shared, answer
}

// ReleaseOwed must not let a call through while a release owed on its keys
// is unmade. 92e0bef has a call's flight yield to a takeover (lockAlone):
// it requeues what it has not sent, the takeover moves those jobs to the
// new reconciler, and the call goes round again (round--) on the old one,
// which owes nothing now: OwesFor is false and ReleaseOwed returns nil.
// The call then reaches Redis before 8 of the 10 releases on its key: the
// retry of a failed observation is told to come back (409) or that it was
// delivered. Before 92e0bef the takeover waited for the flight, which made
// them all before the call went on.
//
// (Helper 5's review, stop 60: so it was at 92e0bef, which made a call's
// pass hand back what it had not sent; the hand-back was taken out, and
// the test guards against it.)
func TestACallDoesNotGoThroughWhileATakeoverMovesItsReleases(t *testing.T) {
	from, store, shared, answer := aCallOnItsWay(t, 10, 200*time.Millisecond)
	defer from.Close()
	to := newReconciler(NewMemoryStore(0), 0, nil, nil)
	stopRun(to) // the new connection's releases wait out a backoff: nothing makes them meanwhile
	defer to.Close()
	to.TakeOverJobs(from, nil)
	var err error
	select {
	case err = <-answer:
	case <-time.After(10 * time.Second):
		t.Fatal("ReleaseOwed never returned")
	}
	if err == nil && to.OwesFor([]*Claim{shared}) {
		t.Errorf("ReleaseOwed returned nil after %d of 10 store calls, while the releases on the call's key it handed back to the takeover are still owed (by the new reconciler): the call reaches Redis before them",
			store.calls.Load())
	}
}

// The same with Close: the flight yields to Close's last pass, which on a
// Redis answering in 200 ms makes about 20 of the 40 batches within
// reconcileLastPass and gives the rest up (Unreconciled.Releases). The
// call, which had every one of them in hand, then finds nothing owed
// (Close cleared owedKeys) and returns nil: it goes through though
// releases on its key were given up, where it should fail (errClosing,
// "made now, a call could reach Redis before them"). Before 92e0bef its
// flight made all 40 before Close began.
//
// (Helper 5's review, stop 60: so it was at 92e0bef, which made a call's
// pass hand back what it had not sent; the hand-back was taken out, and
// the test guards against it.)
func TestACallDoesNotGoThroughWhenCloseBeginsDuringItsPass(t *testing.T) {
	r, store, _, answer := aCallOnItsWay(t, 40, 200*time.Millisecond)
	left := r.Close()
	var err error
	select {
	case err = <-answer:
	case <-time.After(10 * time.Second):
		t.Fatal("ReleaseOwed never returned")
	}
	if err == nil && left.Releases > 0 {
		t.Errorf("ReleaseOwed returned nil though Close gave up %d releases (%d store calls), among them those on the call's key its flight handed back",
			left.Releases, store.calls.Load())
	}
}

// A call's round-- after a yield has no bound and no look at its ctx (the
// mine path of ReleaseOwed never checks it): while takeovers on from keep
// coming (requests on the new connection after a reload, each TakeOver of
// its own keys, which do not match the call's), one was always waiting in
// lockAlone (92e0bef) when the call's flight asked for its first batch,
// and the call went round for ever, its flight sending nothing: the
// request hung past its own deadline.
//
// (Helper 5's review, stop 60: so it was at 92e0bef, which made a call's
// pass hand back what it had not sent; the hand-back was taken out, and
// the test guards against it.)
func TestACallEndsWhileTakeoversKeepComing(t *testing.T) {
	from, store, _, answer := aCallOnItsWay(t, 10, 20*time.Millisecond)
	defer from.Close()
	to := newReconciler(NewMemoryStore(0), 0, nil, nil)
	defer to.Close()
	stop := make(chan struct{})
	defer close(stop)
	for range 4 {
		go func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				to.takeFrom(from, func(*reconcileJob) bool { return false }, true) // another key's takeover
			}
		}()
	}
	select {
	case <-answer:
	case <-time.After(5 * time.Second):
		t.Errorf("ReleaseOwed still going round after 5 s (%d store calls; 10 batches at %v make them in 100 ms) while takeovers of other keys keep coming",
			store.calls.Load(), store.delay)
	}
}
