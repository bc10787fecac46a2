package dedup

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// slowAnsweringStore answers every Release, after delay (or its context's
// end, which fails it): a Redis that answers slowly but within the timeout.
type slowAnsweringStore struct {
	Store
	delay   time.Duration
	calls   atomic.Int64
	entered chan struct{} // told when the first call begins, with gate
	gate    chan struct{} // the first call waits for it, if not nil
}

func (s *slowAnsweringStore) Release(ctx context.Context, claims []*Claim) ([]bool, error) {
	if s.calls.Add(1) == 1 && s.gate != nil {
		s.entered <- struct{}{}
		<-s.gate
	}
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.Store.Release(ctx, claims)
}

// jobOf200 is one store call's worth of releases (a job of 200 claims: two
// do not fit one batch of reconcileBatch).
func jobOf200(job int) []*Claim {
	pol := testPolicy(Tumbling)
	claims := make([]*Claim, 200)
	for i := range claims {
		p := parked
		p.Asset = fmt.Sprintf("j200-%d-%d", job, i)
		claims[i] = claimOf(pol, p, uint64(job*1000+i+1), time.Now())
	}
	return claims
}

// aPassOnItsWay is a reconciler whose run pass, on a store answering each
// call in delay, is on its way over n batches of releases, all due when it
// began: the first job's pass held the others back until they all were.
func aPassOnItsWay(t *testing.T, n int, delay time.Duration) (*Reconciler, *slowAnsweringStore, []*Claim) {
	t.Helper()
	store := &slowAnsweringStore{Store: NewMemoryStore(0), delay: delay, entered: make(chan struct{}, 1), gate: make(chan struct{})}
	r := newReconciler(store, 0, nil, nil)
	r.Hand(jobOf200(0), true)
	<-store.entered
	var last []*Claim
	for job := 1; job <= n; job++ {
		last = jobOf200(job)
		r.Hand(last, true)
	}
	close(store.gate)
	for deadline := time.Now().Add(5 * time.Second); store.calls.Load() < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the second pass never began")
		}
	}
	return r, store, last
}

// Close stops run (r.stop) and waits for it (<-r.stopped): "run begins no
// store call after, the one on its way has its answer within the store's
// timeout", and Close's last pass is bounded by reconcileLastPass. But
// workOn hands fromTheQueue the calls' context without run's cancellation
// (withoutCancel), so run's pass on its way keeps taking batches off the
// queue until it has sent every job due, and Close waits for all of it.
// On a Redis that answers slowly (here 400 ms a call, within its timeout)
// a backlog of 30 batches holds Close ~6 s (15 rounds of two calls), not
// ~2.4 s (the call on its way, then the bounded last pass): an exit or a
// reload hangs for as long as run's whole pass takes.
//
// (Helper 3's review, stop 60: so it was at f910b12; the test holds the fix.)
func TestCloseDoesNotWaitForRunsWholePass(t *testing.T) {
	r, store, _ := aPassOnItsWay(t, 30, 400*time.Millisecond)
	began := time.Now()
	r.Close()
	if took := time.Since(began); took > reconcileLastPass+time.Second {
		t.Fatalf("Close took %v (%d store calls made) on a Redis answering each call in %v: want about the call on its way plus reconcileLastPass (%v)",
			took.Round(time.Millisecond), store.calls.Load(), store.delay, reconcileLastPass)
	}
}

// README (reconciled_total): "Each claim counts once". With ConfirmOwn (on
// Sentinel and Cluster, redis_connection.go) the reconciler's own release
// is counted released (or not_held) at its first answer, and becomes a
// confirming job (answered: r.confirming += n); Close then counts
// r.confirming as unconfirmed: the same claim counted twice, and every
// reload or exit within 101 s of a reconciled release logs the
// "releases no replica acknowledged ... there was no room to queue them"
// warning for it.
//
// (Helper 3's review, stop 60: so it was at f910b12; the test holds the fix.)
func TestCloseCountsAnOwnConfirmedReleaseOnce(t *testing.T) {
	mem := NewMemoryStore(0)
	c := claimOf(testPolicy(Tumbling), parked, 1, time.Now())
	if v := decide(t, mem, c); v.Decision != Accepted {
		t.Fatalf("the claim: %v", v)
	}
	o := &outcomes{}
	r := newReconciler(mem, 0, o.report, []time.Duration{time.Hour})
	r.ConfirmOwn()
	r.Hand([]*Claim{c}, true)
	for deadline := time.Now().Add(5 * time.Second); r.Unanswered() > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the release was never answered")
		}
	}
	r.Close()
	if got := o.String(); got != "map[released:1]" {
		t.Errorf("one claim handed, outcomes %s: want it counted once, map[released:1]", got)
	}
}

// Confirm's jobs have "a budget of their own ... a flood of them must not
// take the room of" others (roomLocked). ConfirmOwn moves the reconciler's
// own answered releases into that budget (answered: r.confirming += n,
// unchecked) for 101 s: after an outage whose releases the reconciler made
// (here 2 of a queue of 2), the FailoverStore's next unacknowledged release
// (a new master after a Sentinel failover has no replica online, so every
// release goes to Confirm) finds no room and is counted unconfirmed and
// never made again: the retry after the next failover is suppressed.
//
// (Helper 3's review, stop 60: so it was at f910b12; the test holds the fix.)
func TestOwnConfirmationsDoNotTakeConfirmsBudget(t *testing.T) {
	o := &outcomes{}
	r := newReconciler(NewMemoryStore(0), 2, o.report, []time.Duration{time.Hour})
	defer r.Close()
	r.ConfirmOwn()
	pol := testPolicy(Tumbling)
	other := parked
	other.Asset = "veh-other"
	r.Hand([]*Claim{claimOf(pol, parked, 1, time.Now()), claimOf(pol, other, 2, time.Now())}, true)
	for deadline := time.Now().Add(5 * time.Second); r.Unanswered() > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the releases were never answered")
		}
	}
	third := parked
	third.Asset = "veh-third"
	if !r.Confirm([]*Claim{claimOf(pol, third, 3, time.Now())}) {
		t.Errorf("Confirm refused a release with its budget empty of Confirm's jobs: the reconciler's own confirmations took it (outcomes %s)", o)
	}
}

// gatedFailingStore fails every release and settlement, the first ones
// once gate is closed (entered is told when the first begins).
type gatedFailingStore struct {
	Store
	gate    chan struct{}
	entered chan struct{}
	calls   atomic.Int64
}

func (s *gatedFailingStore) fail() error {
	s.calls.Add(1)
	select {
	case s.entered <- struct{}{}:
	default:
	}
	<-s.gate
	return fmt.Errorf("i/o timeout")
}

func (s *gatedFailingStore) Release(ctx context.Context, claims []*Claim) ([]bool, error) {
	return nil, s.fail()
}

func (s *gatedFailingStore) Settle(claims []*Claim, done func(error)) { done(s.fail()) }

// workOn postpones what a pass left of a zone whose release call failed
// whole, settlements included, "rather than their timeout now and again".
// A zone whose settlement call failed whole is only dropped from that
// pass (inZones): its settlements not yet taken stay due, untilNext is 0,
// and run begins the next pass at once, two more calls, and so on through
// the whole queue: on a hung Redis a settlement call after the other,
// each its timeout, rather than two a backoff, as the releases go
// (TestAFailingStoreTriesEachBatchOnceAPass).
//
// (Helper 3's review, stop 60: so it was at f910b12; the test holds the fix.)
func TestAFailedSettlementZoneWaitsOutItsBackoff(t *testing.T) {
	for _, release := range []bool{true, false} {
		store := &gatedFailingStore{Store: NewMemoryStore(0), gate: make(chan struct{}), entered: make(chan struct{}, 1)}
		r, _ := testReconciler(t, store, 0)
		r.Hand(jobOf200(0), release)
		<-store.entered
		for job := 1; job < 8; job++ { // due while the first pass hangs
			r.Hand(jobOf200(job), release)
		}
		close(store.gate)
		time.Sleep(reconcileFirstRetry / 2)
		n := store.calls.Load()
		r.Close()
		if n > 3 {
			t.Errorf("release=%v: %d store calls on a failing store before the first backoff ended, want 3 (the first, then the next pass's two)", release, n)
		}
	}
}

// blipStore times out its first Release (Redis paused ~50 ms, as by a
// fork for BGSAVE), and answers every one after, in 20 ms.
type blipStore struct {
	Store
	calls atomic.Int64
}

func (s *blipStore) Release(ctx context.Context, claims []*Claim) ([]bool, error) {
	if s.calls.Add(1) == 1 {
		time.Sleep(50 * time.Millisecond)
		return nil, fmt.Errorf("i/o timeout")
	}
	time.Sleep(20 * time.Millisecond) // a round trip of 200 scripts
	return s.Store.Release(ctx, claims)
}

// Close's last pass sends a zone nothing more after one call that failed
// whole (inZones: out.failing), though reconcileLastPass already bounds
// it. A single timed-out call (a Redis pausing 50 ms for a fork) at an
// exit or a reload then gives up every release of the zone not yet sent
// (the race run of TestClosesLastPassMakesEveryReleaseAHealthyRedisTakes
// shows it on a real Redis: 3,344 of 10,000 given up after one call of
// 256 timed out, Close done in 0.7 s of its 2 s), on a Redis that answers
// every later call: their senders' retries are told to come back, then
// that the ping was delivered.
//
// (Helper 3's review, stop 60: so it was at f910b12; the test holds the fix.)
func TestCloseDoesNotGiveUpAZoneForOneTimedOutCall(t *testing.T) {
	store := &blipStore{Store: NewMemoryStore(0)}
	o := &outcomes{}
	r := newReconciler(store, 0, o.report, nil)
	stopRun(r) // run makes no pass: Close's last pass makes them all
	for job := range 10 {
		r.Hand(jobOf200(job), true)
	}
	began := time.Now()
	left := r.Close()
	if left.Releases > 200 {
		t.Errorf("Close gave up %d releases after one call of 200 timed out, in %v of its %v, on a store that answered %d later calls (outcomes %s)",
			left.Releases, time.Since(began).Round(time.Millisecond), reconcileLastPass, store.calls.Load()-1, o)
	}
}

// TakeOver runs on the request path (keyspace.releaseOwed, from the
// breaker's ReleaseFirst): a request on the new connection after a reload,
// on a key the old connection owes, takes the old one's releases over. It
// "waits for a pass of from on its way (within from's store timeout)"
// (from.working.Lock). Since f910b12 run's pass takes its batches off the
// queue two calls at a time until every job due is sent, so the request
// waits for the whole pass: here 10 batches on a Redis answering each call
// in 400 ms, ~2 s, for a release (of the last job, still queued) that no
// call is on its way with.
//
// (Helper 3's review, stop 60: so it was at f910b12; the test holds the fix.)
func TestTakeOverDoesNotWaitForFromsWholePass(t *testing.T) {
	from, store, last := aPassOnItsWay(t, 10, 400*time.Millisecond)
	defer from.Close()
	to, _ := testReconciler(t, NewMemoryStore(0), 0)
	began := time.Now()
	to.TakeOver(from, last[:1])
	if took := time.Since(began); took > 2*store.delay {
		t.Errorf("a request's TakeOver waited %v for the old connection's whole run pass (a store call takes %v)", took.Round(time.Millisecond), store.delay)
	}
}

// stopRun stops r's run, as TestCloseDoesNotGiveUpAZoneForOneTimedOutCall
// does: its releases wait out a backoff, and a call on their keys makes
// them (ReleaseOwed).
func stopRun(r *Reconciler) {
	r.stop()
	<-r.stopped
	r.stopped = make(chan struct{})
	close(r.stopped)
}

// silentStore answers nothing: each Release and Settle fails after
// timeout, as a RedisStore's call to a Redis that hangs.
type silentStore struct {
	Store
	timeout time.Duration
	calls   atomic.Int64
}

func (s *silentStore) Release(ctx context.Context, claims []*Claim) ([]bool, error) {
	s.calls.Add(1)
	time.Sleep(s.timeout)
	return nil, context.DeadlineExceeded
}

func (s *silentStore) Settle(claims []*Claim, done func(error)) {
	s.calls.Add(1)
	go func() {
		time.Sleep(s.timeout)
		done(context.DeadlineExceeded)
	}()
}

// Close: "a Redis that does not answer holds it two store timeouts at
// most" (reconcileLastPass: "the pass sends a zone nothing more after
// three calls in a row failed whole"). The last pass counts the calls in a
// row afresh for its settlements (inZones is called twice, and workOn
// drops the zones that failed their releases only when !last): a hung
// Redis is sent its releases for two timeouts and then its settlements
// for two more, and holds an exit or a reload four store timeouts (here
// 4 x 300 ms), up to reconcileLastPass.
//
// (Helper 4's review, stop 60: so it was at 671af45; the test holds the fix.)
func TestCloseOnAHungRedisTakesTwoStoreTimeouts(t *testing.T) {
	store := &silentStore{Store: NewMemoryStore(0), timeout: 300 * time.Millisecond}
	r := newReconciler(store, 0, nil, nil)
	stopRun(r)
	for job := range 6 {
		r.Hand(jobOf200(job), true)
		r.Hand(jobOf200(100+job), false)
	}
	began := time.Now()
	left := r.Close()
	if took, bound := time.Since(began), 2*store.timeout+150*time.Millisecond; took > bound {
		t.Errorf("Close took %v on a hung Redis (%d store calls, left %+v), want two store timeouts, at most %v",
			took.Round(time.Millisecond), store.calls.Load(), left, bound)
	}
}

// switchableDelayStore answers every Release after delay, which a test sets.
type switchableDelayStore struct {
	Store
	delay atomic.Int64
}

func (s *switchableDelayStore) Release(ctx context.Context, claims []*Claim) ([]bool, error) {
	select {
	case <-time.After(time.Duration(s.delay.Load())):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.Store.Release(ctx, claims)
}

// Close "makes one last pass over every claim it holds ... releases first,
// within reconcileLastPass", taking them in queue order: the reconciler's
// own releases the store answered already, kept for their confirmations
// (ConfirmOwn, on Sentinel and Cluster: ~101 s after each), go before a
// release the store never answered. After an outage whose releases it made
// (here 20 batches), an exit on a Redis answering in 400 ms spends its 2 s
// repeating those, and gives up the one release that was never made: its
// claim stands, "Close gave up" is logged, and the retry of its
// observation is told to come back, then that it was delivered; a
// skipped confirmation matters only if a failover follows.
//
// (Helper 4's review, stop 60: so it was at 671af45; the test holds the fix.)
func TestClosesLastPassMakesUnansweredReleasesBeforeConfirmations(t *testing.T) {
	store := &switchableDelayStore{Store: NewMemoryStore(0)}
	o := &outcomes{}
	r := newReconciler(store, 0, o.report, []time.Duration{time.Hour})
	r.ConfirmOwn()
	for job := range 20 {
		r.Hand(jobOf200(job), true)
	}
	for deadline := time.Now().Add(5 * time.Second); r.Unanswered() > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the releases were never answered")
		}
	}
	stopRun(r) // the new release waits out a backoff
	store.delay.Store(int64(400 * time.Millisecond))
	r.Hand(jobOf200(99), true)
	left := r.Close()
	if left.Releases > 0 {
		t.Errorf("Close gave up %d releases the store never answered, having spent its last pass on %d already made (outcomes %s)",
			left.Releases, 20*200, o)
	}
}

// A call on a key whose release is owed, that comes while Close's last
// pass makes it, fails (errClosing): on_store_error decides, as for any
// call whose keys Close's last pass owes. It used to wait for the shared
// lock until Close had finished, past its own deadline, and then, the
// queue emptied and the owed keys cleared, go to Redis though Close had
// given that release up: the sender's retry found the failed request's
// claim, told to come back, then that it was delivered.
//
// Setup: run stopped (its releases wait), one release on the key, a store
// whose releases hang 300 ms and fail; Close; once its last pass is
// calling the store, a call on the key. (Helper 1's review, stop 61.)
func TestACallBlockedBehindClosesLastPassDoesNotGoThrough(t *testing.T) {
	store := &silentStore{Store: NewMemoryStore(0), timeout: 300 * time.Millisecond}
	r := newReconciler(store, 0, nil, nil)
	stopRun(r)
	pol := testPolicy(Sliding)
	r.Hand([]*Claim{claimOf(pol, parked, 1, time.Now())}, true)
	retry := claimOf(pol, parked, 2, time.Now())

	closed := make(chan Unreconciled, 1)
	go func() { closed <- r.Close() }()
	for deadline := time.Now().Add(5 * time.Second); store.calls.Load() < 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("Close's last pass never called the store")
		}
	}
	if !r.OwesFor([]*Claim{retry}) {
		t.Fatal("the release is not owed while Close's last pass makes it")
	}
	answer := make(chan error, 1)
	go func() { answer <- r.ReleaseOwed(context.Background(), []*Claim{retry}) }()
	left := <-closed
	var err error
	select {
	case err = <-answer:
	case <-time.After(10 * time.Second):
		t.Fatal("ReleaseOwed never returned")
	}
	if err == nil && left.Releases > 0 {
		t.Errorf("ReleaseOwed returned nil (the call goes to Redis) though Close gave up %d release(s) on its key (%d store calls); want errClosing",
			left.Releases, store.calls.Load())
	}
}
