package dedup

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// outcomes counts what a Reconciler reports.
type outcomes struct {
	mu sync.Mutex
	n  map[ReconcileOutcome]int
}

func (o *outcomes) report(outcome ReconcileOutcome, n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[ReconcileOutcome]int{}
	}
	o.n[outcome] += n
}

func (o *outcomes) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return fmt.Sprint(o.n)
}

// testReconciler is a Reconciler with the confirmations given, short enough
// for a test, stopped when the test ends.
func testReconciler(t *testing.T, s Store, capacity int, confirm ...time.Duration) (*Reconciler, *outcomes) {
	t.Helper()
	o := &outcomes{}
	r := newReconciler(s, capacity, o.report, confirm)
	t.Cleanup(func() { r.Close() })
	return r, o
}

// drained waits until r has finished every claim it was given.
func drained(t *testing.T, r *Reconciler) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); r.Len() > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d claims still waiting", r.Len())
		}
	}
}

// A claim whose store call timed out may have landed. The reconciler
// releases it by token: the sender's retry is then accepted, and a claim
// that another request made meanwhile is never touched.
func TestReconcilerReleasesAClaimThatLanded(t *testing.T) {
	eachStoreAndShape(t, func(t *testing.T, s Store, pol *Policy) {
		ctx := context.Background()
		orphan := claimOf(pol, parked, 1, time.Now())
		if v, err := decideOne(ctx, s, orphan); err != nil || v.Decision != Accepted {
			t.Fatalf("the orphan's claim: %v %v", v, err)
		}
		r, o := testReconciler(t, s, 0, 50*time.Millisecond)
		r.Hand([]*Claim{orphan}, true)
		drained(t, r)
		if got := o.String(); got != "map[released:1]" {
			t.Fatalf("outcomes %s, want one released", got)
		}
		retry := claimOf(pol, parked, 2, time.Now())
		if v, err := decideOne(ctx, s, retry); err != nil || v.Decision != Accepted {
			t.Fatalf("the sender's retry after reconciling: %v %v, want accepted", v, err)
		}

		// Handing the orphan over again (its confirmation, say) leaves the
		// retry's claim alone.
		r.Hand([]*Claim{orphan}, true)
		drained(t, r)
		if v, err := decideOne(ctx, s, claimOf(pol, parked, 3, time.Now())); err != nil || v.Decision != InFlight {
			t.Fatalf("the retry's claim after the orphan was released again: %v %v, want it still in flight", v, err)
		}
	})
}

// A claim that never landed is reported not held, and one that lands only
// after the store first answered (behind the answer, or retransmitted) is
// released by the confirmation.
func TestReconcilerReleasesAClaimThatLandsLate(t *testing.T) {
	eachStoreAndShape(t, func(t *testing.T, s Store, pol *Policy) {
		ctx := context.Background()
		late := claimOf(pol, parked, 1, time.Now())
		r, o := testReconciler(t, s, 0) // no confirmation: the test lands the claim itself, below
		r.Hand([]*Claim{late}, true)
		drained(t, r)
		if got := o.String(); got != "map[not_held:1]" {
			t.Fatalf("outcomes %s, want not_held", got)
		}

		r2, o2 := testReconciler(t, s, 0, 200*time.Millisecond)
		r2.Hand([]*Claim{late}, true)
		time.Sleep(50 * time.Millisecond) // after the first answer, before the confirmation
		if v, err := decideOne(ctx, s, late); err != nil || v.Decision != Accepted {
			t.Fatalf("the late landing: %v %v", v, err)
		}
		drained(t, r2)
		if got := o2.String(); got != "map[not_held:1 released_late:1]" {
			t.Fatalf("outcomes %s, want not_held then released_late", got)
		}
		if v, err := decideOne(ctx, s, claimOf(pol, parked, 2, time.Now())); err != nil || v.Decision != Accepted {
			t.Fatalf("the sender's retry: %v %v, want accepted", v, err)
		}
	})
}

// When the request's unchecked forward succeeded, the claim (if it landed)
// is settled: a redelivery is then suppressed, not asked to come back.
func TestReconcilerSettlesAClaimWhoseForwardSucceeded(t *testing.T) {
	eachStoreAndShape(t, func(t *testing.T, s Store, pol *Policy) {
		ctx := context.Background()
		orphan := claimOf(pol, parked, 1, time.Now())
		if _, err := decideOne(ctx, s, orphan); err != nil {
			t.Fatal(err)
		}
		r, o := testReconciler(t, s, 0)
		r.Hand([]*Claim{orphan}, false)
		drained(t, r)
		if got := o.String(); got != "map[settled:1]" {
			t.Fatalf("outcomes %s, want settled", got)
		}
		if v, err := decideOne(ctx, s, claimOf(pol, parked, 2, time.Now())); err != nil || v != suppressed(Redelivery) {
			t.Fatalf("a redelivery after settling: %v %v, want suppressed redelivery", v, err)
		}
	})
}

// A hung Redis: the claim's SET NX times out, the reconciler keeps trying
// while Redis is paused, and releases the claim once it answers, whether the
// SET landed before or after the first answer.
func TestReconcilerOutlastsAHungRedis(t *testing.T) {
	srv := redistest.Start(t)
	s := newRedisStore(t, srv)
	s.timeout = 50 * time.Millisecond
	pol := testPolicy(Tumbling)
	ctx := context.Background()
	if _, err := decideOne(ctx, s, claimOf(pol, parked, 9, time.Now())); err != nil { // a connection ready before the hang
		t.Fatal(err)
	}
	if _, err := releaseOne(ctx, s, claimOf(pol, parked, 9, time.Now())); err != nil {
		t.Fatal(err)
	}

	srv.Pause()
	orphan := claimOf(pol, parked, 1, time.Now())
	if _, err := decideOne(ctx, s, orphan); !MayHaveWritten(err) {
		t.Fatalf("a claim on a hung Redis: %v, want a timeout", err)
	}
	r, o := testReconciler(t, s, 0, 50*time.Millisecond)
	r.Hand([]*Claim{orphan}, true)
	time.Sleep(500 * time.Millisecond) // several failed attempts
	srv.Resume()
	drained(t, r)
	if got := o.String(); got != "map[released:1]" && got != "map[not_held:1 released_late:1]" {
		t.Fatalf("outcomes %s, want the landed claim released", got)
	}
	// The retry goes through a store of the default timeout: 50 ms, which
	// makes the hang's calls fail fast, timed out on a loaded machine.
	if v, err := decideOne(ctx, newRedisStore(t, srv), claimOf(pol, parked, 2, time.Now())); err != nil || v.Decision != Accepted {
		t.Fatalf("the sender's retry: %v %v, want accepted", v, err)
	}
}

// A claim a hung Redis runs from its socket buffer on resuming lands older
// than in_flight_timeout by its claim time. Until its reconciler releases
// it, a redelivery must be told to come back, not that it was delivered:
// the claim waits in_flight_timeout from when it reached Redis, and only
// then counts as settled.
func TestClaimThatLandsLateWaitsFromItsLanding(t *testing.T) {
	for _, shape := range Shapes {
		t.Run(string(shape), func(t *testing.T) {
			srv := redistest.Start(t)
			s := newRedisStore(t, srv)
			s.timeout = 50 * time.Millisecond
			pol := testPolicy(shape)
			pol.InFlightTimeout = time.Second
			ctx := context.Background()
			ready := claimOf(pol, ping.Ping{Asset: "veh-1", Time: articleBase, Lat: 1, Lon: 1}, 9, time.Now())
			if _, err := decideOne(ctx, s, ready); err != nil { // a connection ready before the hang
				t.Fatal(err)
			}

			srv.Pause()
			orphan := claimOf(pol, parked, 1, time.Now())
			if _, err := decideOne(ctx, s, orphan); !MayHaveWritten(err) {
				t.Fatalf("a claim on a hung Redis: %v, want a timeout", err)
			}
			time.Sleep(2 * pol.InFlightTimeout)
			srv.Resume()
			landed := time.Now()
			for srv.Client().Exists(ctx, orphan.Key()).Val() == 0 {
				if time.Since(landed) > time.Second {
					t.Fatal("the claim written before the hang never landed")
				}
				time.Sleep(time.Millisecond)
			}
			// The redeliveries go through a store of the default timeout:
			// 50 ms, which makes the hang's call fail fast, timed out on a
			// loaded machine.
			after := newRedisStore(t, srv)
			if v, err := decideOne(ctx, after, claimOf(pol, parked, 2, time.Now())); err != nil || v != (Verdict{Decision: InFlight, Reason: Redelivery}) {
				t.Fatalf("a redelivery just after the late claim landed: %v %v, want in flight", v, err)
			}
			time.Sleep(pol.InFlightTimeout - time.Since(landed) + 100*time.Millisecond)
			if v, err := decideOne(ctx, after, claimOf(pol, parked, 3, time.Now())); err != nil || v != suppressed(Redelivery) {
				t.Fatalf("a redelivery in_flight_timeout after it landed: %v %v, want suppressed (counts as settled)", v, err)
			}
		})
	}
}

// A tumbling claim that lands late (a hung Redis runs it from its socket
// buffer on resuming, TestClaimThatLandsLateWaitsFromItsLanding) is dated
// by its key's remaining TTL: landed = TTL - PTTL. That TTL is the one the
// claim was written with, the claimant's; the judge subtracts its own.
// Two instances (or a reload) with a different ttl, retry_ladder or
// outage_margin on one key space, and the same window, share the keys:
// the judge dates the claim an hour off (or cannot date it at all) and
// tells the redelivery 200 suppressed while the claimant's reconciler has
// not yet released the claim whose request failed. The claim's own TTL
// (or its landing time) must be stored with it, as its in_flight_timeout
// now is. The same judge with the claimant's TTL holds it (the control).
func TestALateClaimIsDatedByTheTTLItWasWrittenWith(t *testing.T) {
	for _, judgeTTL := range []time.Duration{time.Hour, 2 * time.Hour, 30 * time.Minute} {
		t.Run(fmt.Sprintf("claimant ttl 1h, judge ttl %s", judgeTTL), func(t *testing.T) {
			srv := redistest.Start(t)
			s := newRedisStore(t, srv)
			claimant := testPolicy(Tumbling)
			claimant.TTL, claimant.InFlightTimeout = time.Hour, 5*time.Second
			judge := *claimant
			judge.TTL = judgeTTL
			// Made 10 s ago, landed now: what a Redis that hung 10 s runs
			// from its socket buffer the moment it resumes.
			decide(t, s, claimOf(claimant, parked, 1, time.Now().Add(-10*time.Second)))
			if v := decide(t, s, claimOf(&judge, parked, 2, time.Now())); v != (Verdict{Decision: InFlight, Reason: Redelivery}) {
				t.Fatalf("a redelivery just after the claim landed, judged under ttl %s (claim written under 1h): %+v, want in_flight "+
					"(told it was delivered before the claimant's reconciler released the failed claim: the ping is lost)", judgeTTL, v)
			}
		})
	}
}

// downStore fails every call until up is set.
type downStore struct {
	Store
	mu      sync.Mutex
	up      bool
	calls   int
	decides int
}

func (d *downStore) Decide(ctx context.Context, claims []*Claim) ([]Verdict, error) {
	d.mu.Lock()
	d.decides++
	d.mu.Unlock()
	if err := d.err(); err != nil {
		return nil, err
	}
	return d.Store.Decide(ctx, claims)
}

func (d *downStore) err() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls++
	if d.up {
		return nil
	}
	return errors.New("i/o timeout")
}

func (d *downStore) callCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls
}

func (d *downStore) Release(ctx context.Context, claims []*Claim) ([]bool, error) {
	if err := d.err(); err != nil {
		return nil, err
	}
	return d.Store.Release(ctx, claims)
}

func (d *downStore) Settle(claims []*Claim, done func(error)) {
	if err := d.err(); err != nil {
		done(err)
		return
	}
	d.Store.Settle(claims, done)
}

// The queue is bounded: claims handed over beyond it are dropped and
// counted, and the claims in it are retried with a growing backoff, not in
// a busy loop.
func TestReconcilerIsBounded(t *testing.T) {
	store := &downStore{Store: NewMemoryStore(0)}
	r, o := testReconciler(t, store, 3)
	pol := testPolicy(Tumbling)
	c := func(token uint64) *Claim { return claimOf(pol, parked, token, time.Now()) }
	if !r.Hand([]*Claim{c(1), c(2)}, true) || !r.Hand([]*Claim{c(3)}, false) {
		t.Fatal("claims within the bound were refused")
	}
	if r.Hand([]*Claim{c(4)}, true) {
		t.Fatal("a claim beyond the bound was taken")
	}
	time.Sleep(time.Second)
	calls := store.callCount()
	// 100, 200, 400 ms: at most 4 tries of each of the two calls in a second.
	if calls < 2 || calls > 10 {
		t.Fatalf("%d store calls in a second while the store was down; want a few, backing off", calls)
	}
	store.mu.Lock()
	store.up = true
	store.mu.Unlock()
	drained(t, r)
	if got := o.String(); got != "map[dropped:1 not_held:2 settled:1]" {
		t.Fatalf("outcomes %s", got)
	}
}

// A store that never answers within the claim's TTL: there is nothing left
// to act on, and the claim is let go.
// A store that answers again is told so (its breaker closes): the claims
// waiting out a backoff go now, not when their backoff ends.
func TestReconcilerWakesWhenTheStoreAnswersAgain(t *testing.T) {
	store := &downStore{Store: NewMemoryStore(0)}
	pol := testPolicy(Tumbling)
	orphan := claimOf(pol, parked, 1, time.Now())
	if _, err := decideOne(context.Background(), store.Store, orphan); err != nil {
		t.Fatal(err)
	}
	r, o := testReconciler(t, store, 0)
	r.Hand([]*Claim{orphan}, true)
	time.Sleep(1600 * time.Millisecond) // tries at 0, 0.1, 0.3, 0.7 and 1.5 s: the next is 1.6 s after the last
	store.mu.Lock()
	store.up = true
	store.mu.Unlock()
	woken := time.Now()
	r.Wake()
	drained(t, r)
	if got := o.String(); got != "map[released:1]" {
		t.Fatalf("outcomes %s, want released", got)
	}
	if waited := time.Since(woken); waited > 400*time.Millisecond {
		t.Fatalf("released %s after the wake-up: it waited out its backoff", waited)
	}
}

// Once the store answers again, the first request through may be the
// retry of an observation whose failed request's claim still waits in the
// reconciler to be released, by then older than in_flight_timeout. Every
// call made while releases are owed makes them first, so the retry is
// accepted and passed on, not told that its observation was delivered:
// whether it is the probe of an open breaker or a call through a closed
// one (a hang shorter than it takes to open it).
func TestCallsReleaseWhatTheReconcilerOwesFirst(t *testing.T) {
	for _, tc := range []struct {
		name          string
		breakerOpened bool
	}{{"probe", true}, {"closed breaker", false}} {
		breakerOpened := tc.breakerOpened
		t.Run(tc.name, func(t *testing.T) {
			eachStoreAndShape(t, func(t *testing.T, s Store, pol *Policy) {
				pol.InFlightTimeout = 200 * time.Millisecond
				ctx := context.Background()
				failed := claimOf(pol, parked, 1, time.Now())
				if v, err := decideOne(ctx, s, failed); err != nil || v.Decision != Accepted {
					t.Fatalf("the first request's claim: %v %v", v, err)
				}
				store := &downStore{Store: s}
				r, o := testReconciler(t, store, 0)
				breaker := NewBreaker(1, time.Hour, nil)
				breaker.ReleaseFirst(r.OwesFor, r.ReleaseOwed)
				guarded := breaker.Guard(store)

				// The store goes away: the upstream failed, the release
				// failed and waits in the reconciler.
				r.Hand([]*Claim{failed}, true)
				calls := 4 // the reconciler's tries at 0, 0.1, 0.3 and 0.7 s; the next is at 1.5 s
				if breakerOpened {
					if _, err := decideOne(ctx, guarded, claimOf(pol, parked, 2, time.Now())); err == nil || breaker.State() != BreakerOpen {
						t.Fatalf("a claim while the store is down: %v, breaker %s", err, breaker.State())
					}
					calls++
				}
				// The store comes back just after the 0.7 s try, when the
				// claim is older than in_flight_timeout (and the breaker's
				// wait is over).
				for store.callCount() < calls {
					time.Sleep(5 * time.Millisecond)
				}
				store.mu.Lock()
				store.up = true
				store.mu.Unlock()

				retry := claimOf(pol, parked, 3, time.Now())
				if v, err := decideOne(ctx, guarded, retry); err != nil || v.Decision != Accepted {
					t.Fatalf("the sender's retry: %v %v, want accepted (the failed request's claim released first)", v, err)
				}
				if got := o.String(); got != "map[released:1]" {
					t.Fatalf("outcomes %s, want the failed request's claim released", got)
				}
				if r.Owes() || breaker.State() != BreakerClosed {
					t.Fatalf("after the retry: still owes %v, breaker %s", r.Owes(), breaker.State())
				}
			})
		})
	}
}

// While what the reconciler owes cannot be released, a call fails without
// being made: the retry does not overtake the release, and the caller
// knows nothing of its call was written.
func TestCallFailsWhileWhatIsOwedCannotBeReleased(t *testing.T) {
	store := &downStore{Store: NewMemoryStore(0)}
	breaker, guarded, pol := owingOneRelease(t, store, 2)
	for attempt := range 2 {
		_, err := decideOne(context.Background(), guarded, claimOf(pol, parked, 3, time.Now()))
		if !errors.Is(err, ErrReleasesOwed) || MayHaveWritten(err) {
			t.Fatalf("call %d while the release still fails: %v, want ErrReleasesOwed (nothing written)", attempt, err)
		}
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	if store.decides != 0 {
		t.Fatal("a claim went to the store ahead of the release it waits for")
	}
	if breaker.State() != BreakerOpen {
		t.Fatalf("breaker %s after two failed calls, want open", breaker.State())
	}
}

// owingOneRelease puts store behind a breaker that opens after failures
// and makes every call first release what its reconciler owes: the release
// of one claim, handed over now.
func owingOneRelease(t *testing.T, store Store, failures int) (*Breaker, Store, *Policy) {
	t.Helper()
	r, _ := testReconciler(t, store, 0)
	breaker := NewBreaker(failures, time.Hour, nil)
	breaker.ReleaseFirst(r.OwesFor, r.ReleaseOwed)
	pol := testPolicy(Tumbling)
	r.Hand([]*Claim{claimOf(pol, parked, 1, time.Now())}, true)
	return breaker, breaker.Guard(store), pol
}

// gatedStore is a store that hangs: every Release waits for the gate (or
// its caller's cancellation), then fails, as calls to a paused Redis wait
// out their timeout; or, with answers, Redis answers once the gate opens.
// The first failFirst calls fail at once.
type gatedStore struct {
	Store
	gate      chan struct{}
	answers   bool
	failFirst int
	mu        sync.Mutex
	releases  int
}

func (g *gatedStore) Release(ctx context.Context, claims []*Claim) ([]bool, error) {
	g.mu.Lock()
	g.releases++
	failNow := g.releases <= g.failFirst
	g.mu.Unlock()
	if failNow {
		return nil, errors.New("connection refused")
	}
	select {
	case <-g.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if g.answers {
		return g.Store.Release(ctx, claims)
	}
	return nil, errors.New("i/o timeout")
}

func (g *gatedStore) releaseCount() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.releases
}

// The call that began a shared pass may be given up by its sender (a
// phone that hung up); the pass goes on for the calls sharing it, which
// succeed once the store answers, instead of failing with that sender's
// cancellation.
func TestASharedPassOutlivesTheCallThatBeganIt(t *testing.T) {
	store := &gatedStore{Store: NewMemoryStore(0), gate: make(chan struct{}), answers: true, failFirst: 1}
	_, guarded, pol := owingOneRelease(t, store, 1000)
	waitFor := func(n int) {
		for deadline := time.Now().Add(5 * time.Second); store.releaseCount() < n; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d release calls, waiting for %d", store.releaseCount(), n)
			}
		}
	}
	waitFor(1) // the reconciler's own first try failed: the release is owed, with a backoff
	leader, hangUp := context.WithCancel(context.Background())
	go decideOne(leader, guarded, claimOf(pol, parked, 2, time.Now()))
	waitFor(2) // the first call's pass is on its way, hung
	follower := make(chan error, 1)
	go func() {
		_, err := decideOne(context.Background(), guarded, claimOf(pol, parked, 3, time.Now()))
		follower <- err
	}()
	time.Sleep(100 * time.Millisecond) // the second call joins the pass
	hangUp()
	time.Sleep(20 * time.Millisecond)
	close(store.gate)
	if err := <-follower; err != nil {
		t.Fatalf("the call sharing the pass: %v, want it made once the store answered", err)
	}
}

// A burst of calls while a release is owed and the store hangs shares one
// pass over what is owed, instead of each waiting out the store behind
// the one before it (seconds, for a burst, in an outage).
func TestCallsWhileReleasesAreOwedShareOnePass(t *testing.T) {
	store := &gatedStore{Store: NewMemoryStore(0), gate: make(chan struct{})}
	_, guarded, pol := owingOneRelease(t, store, 1000)

	const burst = 10
	errs := make(chan error, burst)
	for i := range burst {
		go func() {
			_, err := decideOne(context.Background(), guarded, claimOf(pol, parked, uint64(10+i), time.Now()))
			errs <- err
		}()
	}
	time.Sleep(200 * time.Millisecond) // the burst waits on the hung store
	close(store.gate)
	for range burst {
		if err := <-errs; !errors.Is(err, ErrReleasesOwed) {
			t.Fatalf("a call while the release is owed and fails: %v, want ErrReleasesOwed", err)
		}
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	if store.releases > burst/2 {
		t.Fatalf("%d release calls for a burst of %d: each call made its own", store.releases, burst)
	}
}

// A settlement is no retry that an owed release must reach the store
// before: it goes through while the store hangs on one, and the accepted
// request it belongs to is not held up.
func TestASettlementDoesNotWaitForTheReleasesOwed(t *testing.T) {
	store := &gatedStore{Store: NewMemoryStore(0), gate: make(chan struct{})}
	defer close(store.gate)
	_, guarded, pol := owingOneRelease(t, store, 1000)
	accepted := claimOf(pol, parked, 2, time.Now())
	if v, err := decideOne(context.Background(), store, accepted); err != nil || v.Decision != Accepted {
		t.Fatalf("the claim to settle: %v %v", v, err)
	}
	settled := make(chan error, 1)
	go guarded.Settle([]*Claim{accepted}, func(err error) { settled <- err })
	select {
	case err := <-settled:
		if err != nil {
			t.Fatalf("settle: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the settlement waited for the release the store hangs on")
	}
}

func TestReconcilerGivesUpAtTheTTL(t *testing.T) {
	pol := testPolicy(Tumbling)
	pol.TTL = 300 * time.Millisecond
	r, o := testReconciler(t, &downStore{Store: NewMemoryStore(0)}, 0)
	r.Hand([]*Claim{claimOf(pol, parked, 1, time.Now())}, true)
	drained(t, r)
	if got := o.String(); got != "map[expired:1]" {
		t.Fatalf("outcomes %s, want expired", got)
	}
}

func TestMayHaveWritten(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{ErrBreakerOpen, false},
		{fmt.Errorf("deciding: %w", ErrBreakerOpen), false},
		{context.DeadlineExceeded, true},
		{errors.New("read tcp 127.0.0.1:1234: connection reset by peer"), true},
		{errors.New("dial tcp 127.0.0.1:6379: connect: connection refused"), true}, // see MayHaveWritten
	} {
		if got := MayHaveWritten(tt.err); got != tt.want {
			t.Errorf("MayHaveWritten(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// The pending gauge counts what waits for the store's first answer: a
// claim kept a while to catch a late landing has its answer, and closing
// the reconciler then gives up on nothing.
func TestUnansweredCountsOnlyWhatWaitsForTheStore(t *testing.T) {
	// The store answers once the gate opens: until then the claim is
	// unanswered however fast the reconciler is.
	s := &gatedStore{Store: NewMemoryStore(0), gate: make(chan struct{}), answers: true}
	r, o := testReconciler(t, s, 0, time.Hour)
	pol := testPolicy(Tumbling)
	c := claimOf(pol, parked, 1, time.Now())
	if _, err := decideOne(context.Background(), s, c); err != nil {
		t.Fatal(err)
	}
	if r.Hand([]*Claim{c}, true); r.Unanswered() != 1 {
		t.Fatalf("%d unanswered after handing one claim over", r.Unanswered())
	}
	close(s.gate)
	for deadline := time.Now().Add(10 * time.Second); o.String() != "map[released:1]"; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("outcomes %s, want the claim released", o)
		}
	}
	if r.Unanswered() != 0 || r.Len() != 1 {
		t.Fatalf("answered, kept for its confirmation: %d unanswered of %d waiting, want 0 of 1", r.Unanswered(), r.Len())
	}
	if left := r.Close(); left != (Unreconciled{}) || o.String() != "map[released:1]" {
		t.Fatalf("Close gave up on %+v, outcomes %s: an answered claim was given up on", left, o)
	}
}

// Close waits for a pass on its way: the claims it releases are counted
// released, not given up on as well, and nothing is left counted as
// waiting.
func TestCloseWaitsForAPassOnItsWay(t *testing.T) {
	store := &gatedStore{Store: NewMemoryStore(0), gate: make(chan struct{}), answers: true, failFirst: 1}
	r, o := testReconciler(t, store, 0)
	pol := testPolicy(Tumbling)
	landed := claimOf(pol, parked, 1, time.Now())
	if _, err := decideOne(context.Background(), store, landed); err != nil {
		t.Fatal(err)
	}
	r.Hand([]*Claim{landed}, true)
	for deadline := time.Now().Add(5 * time.Second); store.releaseCount() < 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the reconciler never tried")
		}
	}
	passed := make(chan error, 1)
	go func() { passed <- r.ReleaseOwed(context.Background(), []*Claim{landed}) }()
	for deadline := time.Now().Add(5 * time.Second); store.releaseCount() < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the pass never reached the store")
		}
	}
	closed := make(chan Unreconciled)
	go func() { closed <- r.Close() }()
	time.Sleep(20 * time.Millisecond)
	close(store.gate)
	left := <-closed
	if err := <-passed; err != nil {
		t.Fatalf("the pass: %v", err)
	}
	if got := o.String(); got != "map[released:1]" || left != (Unreconciled{}) || r.Unanswered() != 0 {
		t.Fatalf("outcomes %s, given up on %+v, %d unanswered; want the claim released once, nothing waiting", got, left, r.Unanswered())
	}
}

// batchOfReleases is the claims of one failed request's batch, job-th of
// its kind: a store call's worth (reconcileBatch) of pings of distinct
// assets.
func batchOfReleases(job int) []*Claim {
	pol := testPolicy(Tumbling)
	var claims []*Claim
	for i := range reconcileBatch {
		p := parked
		p.Asset = fmt.Sprintf("veh-%d-%d", job, i)
		claims = append(claims, claimOf(pol, p, uint64(job*reconcileBatch+i+1), time.Now()))
	}
	return claims
}

// A pass over the releases due on a failing store tries each batch once,
// side by side, and keeps every claim for the next pass: one after the
// other, on a hung Redis each batch waited its own timeout, and every call
// that must first release what is owed waited for the whole pass (eight
// failed batches of 200: 0.9 s at a 100 ms timeout); stopping at the
// first left the healthy masters' releases of a Cluster behind it unsent.
func TestAFailingStoreTriesEachBatchOnceAPass(t *testing.T) {
	store := &gatedStore{Store: NewMemoryStore(0), gate: make(chan struct{})} // hangs, then fails
	r, _ := testReconciler(t, store, 0)
	hand := func(job int) { r.Hand(batchOfReleases(job), true) }
	hand(0)
	for deadline := time.Now().Add(5 * time.Second); store.releaseCount() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no release was tried")
		}
	}
	for job := 1; job < 8; job++ { // due while the first pass hangs
		hand(job)
	}
	close(store.gate)
	time.Sleep(reconcileFirstRetry / 2) // the next pass has had time to try every batch due
	if n := store.releaseCount(); n > 8 {
		t.Fatalf("%d release calls on a failing store before the first backoff ended, want one for each of the 8 batches at most", n)
	}
	if r.Len() != 8*reconcileBatch {
		t.Fatalf("%d claims waiting, want all %d kept for the next pass", r.Len(), 8*reconcileBatch)
	}
}

// While the store fails and its breaker keeps closing (Wake, from request
// goroutines), a pass that stops at a failed batch must not read the jobs
// it put back on the queue: the race detector sees it.
func TestAPassStoppedByAFailureRacesNoWake(t *testing.T) {
	store := &downStore{Store: NewMemoryStore(0)}
	r, _ := testReconciler(t, store, 0)
	for job := range 2 {
		r.Hand(batchOfReleases(job), true)
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				r.Wake()
			}
		}
	}()
	for deadline := time.Now().Add(5 * time.Second); store.callCount() < 2000 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	close(stop)
	<-done
}

// A release owed on one key holds up only the calls on that key, which may
// be the retry of its observation. A call on another asset goes to the
// store at once: a release owed on a key that cannot be written (on a
// Cluster, its master down or its slot migrating) failed every call.
func TestAReleaseOwedHoldsUpOnlyCallsOnItsKey(t *testing.T) {
	store := &gatedStore{Store: NewMemoryStore(0), gate: make(chan struct{})} // releases hang
	defer close(store.gate)
	_, guarded, pol := owingOneRelease(t, store, 1000)
	elsewhere := parked
	elsewhere.Asset = "elsewhere"
	other := make(chan error, 1)
	go func() {
		_, err := decideOne(context.Background(), guarded, claimOf(pol, elsewhere, 5, time.Now()))
		other <- err
	}()
	select {
	case err := <-other:
		if err != nil {
			t.Fatalf("a call on another asset: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a call on another asset waited for a release it has nothing to do with")
	}
	same := make(chan error, 1)
	go func() {
		_, err := decideOne(context.Background(), guarded, claimOf(pol, parked, 6, time.Now()))
		same <- err
	}()
	select {
	case err := <-same:
		t.Fatalf("a call on the owed key went ahead of its release: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
}

// A Confirm job is owed for its whole confirmation period, and an early
// pass (ReleaseOwed from a call) must not advance its schedule, a failed
// one neither: its backoff is no confirmation's time. Here the last
// confirmation is due ~5 s after Confirm; one failed early pass at 0.4 s
// and the key's next call 150 ms later used to end the job, and what its
// key owed, at ~0.55 s.
func TestAFailedEarlyPassDoesNotShortenTheConfirmations(t *testing.T) {
	store := &downStore{Store: NewMemoryStore(0), up: true}
	r, _ := testReconciler(t, store, 0, 50*time.Millisecond, 100*time.Millisecond, 5*time.Second)
	pol := testPolicy(Tumbling)
	c := claimOf(pol, parked, 1, time.Now())
	r.Confirm([]*Claim{c})
	time.Sleep(400 * time.Millisecond) // two scheduled passes done; the last is ~4.75 s away
	if !r.OwesFor([]*Claim{c}) {
		t.Fatal("setup: the key is not owed during its confirmations")
	}
	store.mu.Lock()
	store.up = false
	store.mu.Unlock()
	if err := r.ReleaseOwed(context.Background(), []*Claim{c}); err == nil { // a call on the key, Redis blipped
		t.Fatal("setup: the early pass did not fail")
	}
	store.mu.Lock()
	store.up = true
	store.mu.Unlock()
	time.Sleep(150 * time.Millisecond)
	if err := r.ReleaseOwed(context.Background(), []*Claim{c}); err != nil { // the key's next call, Redis back
		t.Fatal(err)
	}
	time.Sleep(850 * time.Millisecond)
	if !r.OwesFor([]*Claim{c}) {
		t.Errorf("1.4 s after Confirm (last confirmation due at ~5.15 s) the key is no longer owed: one failed early pass ended the confirmations (Len %d)", r.Len())
	}
}

// countingStore counts the claims each Release carries.
type countingStore struct {
	Store
	mu       sync.Mutex
	calls    int
	released int
	fail     func(*Claim) bool
}

func (s *countingStore) Release(ctx context.Context, claims []*Claim) ([]bool, error) {
	s.mu.Lock()
	s.calls++
	s.released += len(claims)
	s.mu.Unlock()
	for _, c := range claims {
		if s.fail != nil && s.fail(c) {
			return nil, errors.New("i/o timeout") // one master of the batch hangs
		}
	}
	return s.Store.Release(ctx, claims)
}

func (s *countingStore) counts() (int, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls, s.released
}

// While confirmations live, a call on one owed key releases again the
// confirmations on its own key, not every one: with 1,000 on other assets,
// each ping of a busy owed asset re-released 1,000 claims (4 store calls)
// and waited for them, 20,000 releases for 20 pings.
func TestACallOnAnOwedKeyReleasesOnlyWhatItOwes(t *testing.T) {
	store := &countingStore{Store: NewMemoryStore(0)}
	r, _ := testReconciler(t, store, 0, time.Hour) // confirmations not due during the test
	b := NewBreaker(1000, time.Hour, nil)
	b.ReleaseFirst(r.OwesFor, r.ReleaseOwed)
	guarded := b.Guard(store)
	pol := testPolicy(Sliding)
	for i := range 1000 {
		p := parked
		p.Asset = "other-" + string(rune('A'+i%26)) + string(rune('A'+i/26))
		r.Confirm([]*Claim{claimOf(pol, p, uint64(i+10), time.Now())})
	}
	r.Confirm([]*Claim{claimOf(pol, parked, 1, time.Now())})
	for i := range 20 {
		p := parked
		p.Time = p.Time.Add(time.Duration(i+1) * time.Second)
		if _, err := decideOne(context.Background(), guarded, claimOf(pol, p, uint64(2000+i), time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	calls, released := store.counts()
	if released > 20*2 {
		t.Errorf("20 pings of one owed asset made %d Release calls carrying %d claims", calls, released)
	}
}

// On a Cluster a confirmation on a hung master's key fails a pass that
// carries it: a call on an owed key of a healthy master must not carry it,
// or it fails too (ErrReleasesOwed) for as long as the other master hangs.
func TestAHungMastersConfirmationFailsNoCallOnAHealthyMaster(t *testing.T) {
	store := &countingStore{Store: NewMemoryStore(0)}
	r, _ := testReconciler(t, store, 0, time.Hour)
	b := NewBreaker(1000, time.Hour, nil)
	b.ReleaseFirst(r.OwesFor, r.ReleaseOwed)
	guarded := b.Guard(store)
	pol := testPolicy(Sliding)
	dead := parked
	dead.Asset = "on-the-hung-master"
	r.Confirm([]*Claim{claimOf(pol, dead, 1, time.Now())}) // released just before its master hung
	r.Confirm([]*Claim{claimOf(pol, parked, 2, time.Now())})
	store.mu.Lock()
	store.fail = func(c *Claim) bool { return c.Asset == dead.Asset }
	store.mu.Unlock()
	p := parked
	p.Time = p.Time.Add(time.Second)
	if _, err := decideOne(context.Background(), guarded, claimOf(pol, p, 3, time.Now())); err != nil {
		t.Errorf("a call on a healthy master's owed key: %v", err)
	}
}

// Close counts the confirmations it abandons (a reload during a failover)
// as unconfirmed.
func TestCloseCountsTheConfirmationsItAbandons(t *testing.T) {
	o := &outcomes{}
	r := newReconciler(NewMemoryStore(0), 0, o.report, []time.Duration{time.Hour})
	r.Confirm([]*Claim{claimOf(testPolicy(Tumbling), parked, 1, time.Now())})
	r.Close()
	if o.String() != "map[unconfirmed:1]" {
		t.Errorf("a confirmation abandoned by Close counted nowhere (outcomes %s)", o)
	}
}

// Close makes one last pass over the claims it holds, their backoff
// ignored, within a bound. A Redis that came back (restarted with its
// data) just before Caddy exits has the release of a failed request's
// claim made, and its sender's retry after the restart is accepted, rather
// than told to come back and then that the ping was delivered; a delivered
// ping's redelivery is suppressed. A Redis still hung holds Close no
// longer than a call on its way and one more call, each its timeout, and
// what it never answered is returned by kind, for its caller to count and
// log.
func TestCloseMakesALastPass(t *testing.T) {
	elsewhere := parked
	elsewhere.Asset = "veh-89"
	for _, tt := range []struct {
		name     string
		timeout  time.Duration // the store's
		comeBack bool          // Redis restarts before Close
		outcomes string
		left     Unreconciled
	}{
		{name: "Redis came back", timeout: 500 * time.Millisecond, comeBack: true, outcomes: "map[released:1 settled:1]"},
		{name: "Redis still hung", timeout: time.Second, outcomes: "map[]", left: Unreconciled{Releases: 1, Settlements: 1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := redistest.StartWith(t, "--appendonly", "yes", "--appendfsync", "always")
			redisStore := newRedisStore(t, srv)
			redisStore.timeout = tt.timeout
			store := &failureCounter{Store: redisStore}
			pol := testPolicy(Tumbling)
			failed, delivered := claimOf(pol, parked, 1, time.Now()), claimOf(pol, elsewhere, 2, time.Now())
			for _, c := range []*Claim{failed, delivered} {
				if v := decide(t, store, c); v.Decision != Accepted {
					t.Fatalf("claim %d: %v", c.Token, v)
				}
			}

			if tt.comeBack {
				srv.Kill()
			} else {
				srv.Pause()
			}
			r, o := testReconciler(t, store, 0)
			r.Hand([]*Claim{failed}, true)
			r.Hand([]*Claim{delivered}, false)
			if tt.comeBack {
				for deadline := time.Now().Add(10 * time.Second); store.failed.Load() < 5; time.Sleep(5 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("%d releases failed while Redis was down, want 5", store.failed.Load())
					}
				}
				srv.Restart() // the next try is 1.6 s away
			}
			began := time.Now()
			left := r.Close()
			// The release on its way when Close came has its answer within
			// one store timeout; the last pass then holds Close at most
			// reconcileLastPass, or two timeouts if shorter. The bound was
			// two timeouts and a second, the sum itself at a timeout of 1 s,
			// and a CI run measured 3.005 s.
			if took, bound := time.Since(began), tt.timeout+min(2*tt.timeout, reconcileLastPass); took > bound+500*time.Millisecond {
				t.Errorf("Close took %v, with a store timeout of %v: want %v at most", took, tt.timeout, bound)
			}
			if got := o.String(); got != tt.outcomes || left != tt.left {
				t.Fatalf("outcomes %s, left %+v; want %s, %+v", got, left, tt.outcomes, tt.left)
			}
			if !tt.comeBack {
				srv.Kill()
				return
			}
			if v := decide(t, store, claimOf(pol, parked, 3, time.Now())); v.Decision != Accepted {
				t.Errorf("the failed request's retry: %v, want accepted", v)
			}
			if v := decide(t, store, claimOf(pol, elsewhere, 4, time.Now())); v != suppressed(Redelivery) {
				t.Errorf("the delivered ping's redelivery: %v, want suppressed", v)
			}
		})
	}
}

// Close lets the store call on its way have its answer. Cancelling the
// wait of one queued behind another batch (a request's, in an outage) did
// not stop its command, which the pipeline sends all the same: Redis
// released the claim, and the last pass, behind it, found the key gone
// and counted the claim not_held, as one whose call never wrote it.
func TestCloseCountsTheReleaseOnItsWay(t *testing.T) {
	srv := redistest.Start(t)
	store := &countingStore{Store: newRedisStore(t, srv)} // a store timeout of 1 s
	pol := testPolicy(Tumbling)
	landed := claimOf(pol, parked, 1, time.Now())
	if v := decide(t, store, landed); v.Decision != Accepted {
		t.Fatalf("the claim: %v", v)
	}
	srv.Pause()
	elsewhere := parked
	elsewhere.Asset = "veh-89"
	store.Settle([]*Claim{claimOf(pol, elsewhere, 2, time.Now())}, func(error) {}) // the batch on its way
	r, o := testReconciler(t, store, 0)
	r.Hand([]*Claim{landed}, true)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if calls, _ := store.counts(); calls == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the reconciler never tried")
		}
	}
	closed := make(chan Unreconciled, 1)
	go func() { closed <- r.Close() }()
	time.Sleep(100 * time.Millisecond)
	srv.Resume() // Redis runs the release it was sent, then answers
	if left := <-closed; o.String() != "map[released:1]" || left != (Unreconciled{}) {
		t.Fatalf("outcomes %s, given up on %+v; want the claim released", o, left)
	}
	if n := srv.Client().Exists(context.Background(), landed.Key()).Val(); n != 0 {
		t.Fatal("the claim is still in Redis")
	}
}

// A ReleaseOwed pass sends its store calls a round trip's worth at a time
// (reconcileAtOnce), and the next as one is answered: on a Redis answering
// slowly, a pass over thousands of owed releases (a fleet's retries as
// Redis comes back) made them one after the other, and held every call
// waiting on it, and an exit, a store call for each batch (measured: 4 s at
// a 200 ms timeout with 10,000 owed), or, when it stopped at the first
// failure, failed the keys it had not tried; all at once, on a healthy
// Redis the tail expired in the pipeline's queue (helper 2, stop 60).
// Close waits for the pass on its way.
func TestAReleaseOwedPassSendsARoundTripsWorthAtOnce(t *testing.T) {
	store := &passStepStore{Store: NewMemoryStore(0), entered: make(chan struct{}, 3), steps: make(chan struct{})}
	defer close(store.steps)
	r, o := testReconciler(t, store, 0)
	var owed []*Claim
	for job := range 3 { // three store calls' worth
		claims := batchOfReleases(job)
		r.Hand(claims, true)
		owed = append(owed, claims...)
	}
	passed := make(chan error, 1)
	go func() { passed <- r.ReleaseOwed(context.WithValue(context.Background(), passKey{}, true), owed) }()
	for i := range reconcileAtOnce {
		select {
		case <-store.entered:
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of the pass's store calls on their way while none is answered, want %d: it sends them one after the other", i, reconcileAtOnce)
		}
	}
	select {
	case <-store.entered:
		t.Fatalf("more than %d of the pass's store calls on their way at once", reconcileAtOnce)
	case <-time.After(100 * time.Millisecond):
	}
	closed := make(chan Unreconciled, 1)
	go func() { closed <- r.Close() }()
	for closing := false; !closing; time.Sleep(time.Millisecond) {
		r.mu.Lock()
		closing = r.closed
		r.mu.Unlock()
	}
	for range 3 {
		store.steps <- struct{}{}
	}
	if left, want := <-closed, fmt.Sprint(map[ReconcileOutcome]int{ReconcileNotHeld: 3 * reconcileBatch}); left != (Unreconciled{}) || o.String() != want {
		t.Errorf("given up on %+v, outcomes %s; want every claim answered, %s", left, o, want)
	}
	if err := <-passed; err != nil {
		t.Errorf("the pass's calls were all answered, and it failed: %v", err)
	}
}

// passStepStore refuses run's calls at once (an outage: they back off),
// answers a ReleaseOwed pass's (its caller's ctx carries passKey) one step
// at a time, as a Redis answering slowly, and Close's last pass's (the
// only ones with a deadline) at once.
type passStepStore struct {
	Store
	entered chan struct{} // a pass's call has begun
	steps   chan struct{} // one may answer
}

func (s *passStepStore) Release(ctx context.Context, claims []*Claim) ([]bool, error) {
	if _, last := ctx.Deadline(); ctx.Value(passKey{}) != nil {
		s.entered <- struct{}{}
		<-s.steps
	} else if !last {
		return nil, errors.New("connection refused")
	}
	return s.Store.Release(ctx, claims)
}

// failureCounter counts the releases of its store that failed.
type failureCounter struct {
	Store
	failed atomic.Int32
}

func (f *failureCounter) Release(ctx context.Context, claims []*Claim) ([]bool, error) {
	released, err := f.Store.Release(ctx, claims)
	if err != nil {
		f.failed.Add(1)
	}
	return released, err
}

// hungMasterGuarded is a reconciler and a breaker that releases what is
// owed first, in front of a store whose releases of the returned asset's
// claims hang for delay and fail, as a hung Cluster master's do. hanging
// is told when such a release begins to hang.
func hungMasterGuarded(t *testing.T, ends <-chan struct{}) (r *Reconciler, guarded Store, pol *Policy, dead ping.Ping, hanging <-chan struct{}) {
	t.Helper()
	store := &hangingStore{Store: NewMemoryStore(0), dead: "on-the-hung-master", ends: ends, hanging: make(chan struct{}, 1)}
	r, _ = testReconciler(t, store, 0, time.Hour)
	b := NewBreaker(1000, time.Hour, nil)
	b.ReleaseFirst(r.OwesFor, r.ReleaseOwed)
	dead = parked
	dead.Asset = store.dead
	return r, b.Guard(store), testPolicy(Sliding), dead, store.hanging
}

// hangingStore hangs (until ends is closed) and then fails any Release
// carrying a claim of the dead asset, as a paused master's calls wait out
// the store timeout. hanging, if not nil, is told when such a Release
// begins to hang.
type hangingStore struct {
	Store
	dead    string
	ends    <-chan struct{}
	hanging chan struct{}
}

func (s *hangingStore) Release(ctx context.Context, claims []*Claim) ([]bool, error) {
	for _, c := range claims {
		if c.Asset == s.dead {
			select {
			case s.hanging <- struct{}{}:
			default: // nil, or told already
			}
			select {
			case <-s.ends:
			case <-ctx.Done():
			}
			return nil, errors.New("i/o timeout")
		}
	}
	return s.Store.Release(ctx, claims)
}

// A hung master's own calls time out and their claims are handed to the
// reconciler as releases (forward.go reconcile). A call on a healthy
// master's key, owed only a confirmation, must not carry them and fail.
func TestAHungMastersUnansweredReleaseFailsNoCallOnAHealthyKey(t *testing.T) {
	r, guarded, pol, dead, _ := hungMasterGuarded(t, endsAfter(0))
	r.Confirm([]*Claim{claimOf(pol, parked, 2, time.Now())}) // healthy master, only a confirmation owed
	time.Sleep(50 * time.Millisecond)
	r.Hand([]*Claim{claimOf(pol, dead, 1, time.Now())}, true) // a timed-out decision on the hung master
	time.Sleep(20 * time.Millisecond)                         // run's first attempt failed; it waits out its backoff
	p := parked
	p.Time = p.Time.Add(time.Second)
	if _, err := decideOne(context.Background(), guarded, claimOf(pol, p, 3, time.Now())); err != nil {
		t.Errorf("a call on a healthy master's key owed only a confirmation, while the hung master has an unanswered release: %v", err)
	}
}

// A call on a healthy master's confirmed key that comes while a call on the
// hung master's confirmed key leads a pass joins that pass: it fails only
// if the pass did not release its own key's confirmation.
func TestACallOnAHealthyKeyDoesNotShareTheHungKeysFailure(t *testing.T) {
	r, guarded, pol, dead, hanging := hungMasterGuarded(t, endsAfter(300*time.Millisecond))
	r.Confirm([]*Claim{claimOf(pol, dead, 1, time.Now())})
	r.Confirm([]*Claim{claimOf(pol, parked, 2, time.Now())})
	go func() {
		d := dead
		d.Time = d.Time.Add(time.Second)
		_, _ = decideOne(context.Background(), guarded, claimOf(pol, d, 10, time.Now())) // the hung key's retry
	}()
	// Not a sleep: a retry that began its pass late would find the healthy
	// call waiting, and a pass begun with both keys wanted carries both.
	<-hanging
	p := parked
	p.Time = p.Time.Add(time.Second)
	start := time.Now()
	_, err := decideOne(context.Background(), guarded, claimOf(pol, p, 3, time.Now()))
	if err != nil {
		t.Errorf("a call on a healthy master's confirmed key, after %v: %v", time.Since(start).Round(time.Millisecond), err)
	}
}

// A call on a healthy key, while a burst of the hung key's calls waits
// for the hung key's pass, makes a pass of its own that carries only its
// own key's confirmation: carrying the hung key's release too, it would
// fail with it.
func TestTheHungKeysCallsLeaveNoReleaseForTheNextPass(t *testing.T) {
	ends := make(chan struct{})
	r, guarded, pol, dead, hanging := hungMasterGuarded(t, ends)
	hung := claimOf(pol, dead, 1, time.Now())
	r.Confirm([]*Claim{hung})
	r.Confirm([]*Claim{claimOf(pol, parked, 2, time.Now())})
	retry := func(token uint64) {
		d := dead
		d.Time = d.Time.Add(time.Second)
		_, _ = decideOne(context.Background(), guarded, claimOf(pol, d, token, time.Now()))
	}
	go retry(10) // leads the pass that hangs
	<-hanging
	const joiners = 20 // a burst of the hung asset's retries, which share that pass
	for i := range joiners {
		go retry(uint64(11 + i))
	}
	time.Sleep(100 * time.Millisecond) // the burst waits for the hung pass
	time.AfterFunc(time.Second, func() { close(ends) })
	p := parked
	p.Time = p.Time.Add(time.Second)
	if _, err := decideOne(context.Background(), guarded, claimOf(pol, p, 3, time.Now())); err != nil {
		t.Errorf("a call on a healthy key, after a pass that failed the hung key's %d calls: %v", 1+joiners, err)
	}
}

// endsAfter is closed after d, when a hangingStore's hang ends.
func endsAfter(d time.Duration) <-chan struct{} {
	ends := make(chan struct{})
	time.AfterFunc(d, func() { close(ends) })
	return ends
}

// A confirmation whose claim's TTL ran out has nothing left to act on: a
// call on its key ends it, rather than find its key owed until its next
// scheduled time.
func TestAnExpiredConfirmationLeavesItsKeyOwedNothing(t *testing.T) {
	store := &hangingStore{Store: NewMemoryStore(0), dead: "none"}
	r, _ := testReconciler(t, store, 0, 50*time.Millisecond, time.Hour)
	pol := testPolicy(Sliding)
	pol.TTL = 300 * time.Millisecond
	c := claimOf(pol, parked, 1, time.Now())
	r.Confirm([]*Claim{c})
	time.Sleep(600 * time.Millisecond)
	if err := r.ReleaseOwed(context.Background(), []*Claim{c}); err != nil {
		t.Fatal(err)
	}
	if r.OwesFor([]*Claim{c}) {
		t.Errorf("a confirmation whose claim expired 300 ms ago still holds its key owed (Len %d)", r.Len())
	}
}

type recordingStore struct {
	Store
	slow string
	mu   sync.Mutex
	log  []uint64
}

func (s *recordingStore) Release(ctx context.Context, claims []*Claim) ([]bool, error) {
	for _, c := range claims {
		if c.Asset == s.slow {
			time.Sleep(200 * time.Millisecond)
		}
	}
	s.mu.Lock()
	for _, c := range claims {
		s.log = append(s.log, c.Token)
	}
	s.mu.Unlock()
	return s.Store.Release(ctx, claims)
}

func (s *recordingStore) has(token uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Contains(s.log, token)
}

// A caller that joins a pass begun before it registered its key
// still has its confirmation released before it returns.
func TestAJoinerHasItsConfirmationReleased(t *testing.T) {
	r, store, b := aSlowPassOnAnotherKey(t)
	if err := r.ReleaseOwed(context.Background(), []*Claim{b}); err != nil {
		t.Fatal(err)
	}
	if !store.has(2) {
		t.Error("b's ReleaseOwed returned before b's confirmation was released again")
	}
}

// A caller whose context ends while it waits for a pass leaves no flight
// behind once the passes land: one left would hold every later call on its
// keys.
func TestAWaitingCallerLeavesNoFlightBehind(t *testing.T) {
	r, store, _ := aSlowPassOnAnotherKey(t)
	slow := parked
	slow.Asset = "slow"
	a := claimOf(testPolicy(Sliding), slow, 3, time.Now()) // the slow key's retry
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := r.ReleaseOwed(ctx, []*Claim{a}); err == nil {
		t.Fatal("setup: expected the cancelled caller to return early")
	}
	time.Sleep(400 * time.Millisecond)
	r.mu.Lock()
	n := len(r.flights)
	r.mu.Unlock()
	if n != 0 {
		t.Errorf("%d flights still on their way after the slow pass landed", n)
	}
	if !store.has(1) {
		t.Error("the slow key's confirmation was never released again")
	}
}

// aSlowPassOnAnotherKey holds two confirmations, a on a slow key and b, and
// starts a call on a's key whose pass hangs 200 ms on its release; it
// returns once that pass is on its way, with b's claim.
func aSlowPassOnAnotherKey(t *testing.T) (*Reconciler, *recordingStore, *Claim) {
	t.Helper()
	store := &recordingStore{Store: NewMemoryStore(0), slow: "slow"}
	r, _ := testReconciler(t, store, 0, time.Hour)
	pol := testPolicy(Sliding)
	slow := parked
	slow.Asset = "slow"
	a := claimOf(pol, slow, 1, time.Now())
	b := claimOf(pol, parked, 2, time.Now())
	r.Confirm([]*Claim{a})
	r.Confirm([]*Claim{b})
	go func() { _ = r.ReleaseOwed(context.Background(), []*Claim{a}) }()
	time.Sleep(50 * time.Millisecond)
	return r, store, b
}

type passKey struct{}

// passHangStore fails at once for run's work (context.Background), and
// hangs then fails for a ReleaseOwed pass (its caller's ctx carries
// passKey): a store that hangs, seen from the calls in an outage.
type passHangStore struct {
	Store
	hang           time.Duration
	mu             sync.Mutex
	passes, hung   int
	mostHungAtOnce int
}

func (s *passHangStore) Release(ctx context.Context, claims []*Claim) ([]bool, error) {
	if ctx.Value(passKey{}) == nil {
		return nil, errors.New("connection refused")
	}
	s.mu.Lock()
	s.passes++
	s.hung++
	s.mostHungAtOnce = max(s.mostHungAtOnce, s.hung)
	s.mu.Unlock()
	time.Sleep(s.hang)
	s.mu.Lock()
	s.hung--
	s.mu.Unlock()
	return nil, errors.New("i/o timeout")
}

// A burst of calls on distinct owed keys while the store hangs: each call
// makes its own key's pass, side by side with the others, so the burst
// waits out one timeout, not one after another (nor a pass that carried
// another key's release: a hung master's would fail the calls on a
// healthy one's keys).
func TestABurstOnDistinctOwedKeysMakesItsPassesSideBySide(t *testing.T) {
	const hang = 300 * time.Millisecond
	store := &passHangStore{Store: NewMemoryStore(0), hang: hang}
	r, _ := testReconciler(t, store, 0)
	pol := testPolicy(Tumbling)
	const burst = 10
	claims := make([]*Claim, burst)
	for i := range burst {
		p := parked
		p.Asset = fmt.Sprintf("veh-%d", i)
		claims[i] = claimOf(pol, p, uint64(i+1), time.Now())
		r.Hand([]*Claim{claims[i]}, true)
	}
	time.Sleep(30 * time.Millisecond) // run's first attempt fails at once
	ctx := context.WithValue(context.Background(), passKey{}, true)
	start := time.Now()
	errs := make(chan error, burst)
	go func() { errs <- r.ReleaseOwed(ctx, claims[:1]) }()
	time.Sleep(50 * time.Millisecond) // the first call's pass hangs
	for i := 1; i < burst; i++ {
		go func() { errs <- r.ReleaseOwed(ctx, claims[i:i+1]) }()
	}
	for range burst {
		if err := <-errs; err == nil {
			t.Fatal("a call on an owed key whose release failed returned nil")
		}
	}
	took := time.Since(start)
	store.mu.Lock()
	defer store.mu.Unlock()
	// Counted, not timed: the time bound only says the burst is not one
	// pass after another (3 s).
	if store.passes != burst || store.mostHungAtOnce < burst/2 || took > hang*5 {
		t.Fatalf("the burst took %v: %d hung passes, at most %d at once; want one per call, side by side", took, store.passes, store.mostHungAtOnce)
	}
}

// TakeOver moves the releases another Reconciler owes on a call's keys,
// with their counts, and only those: the receiver makes them, and the
// giver owes them no more. A receiver that is closed, or has no room,
// takes nothing: the giver keeps them, still owed.
func TestTakeOverMovesWhatIsOwedOnTheKeys(t *testing.T) {
	from, _ := testReconciler(t, &downStore{Store: NewMemoryStore(0)}, 0, time.Hour)
	pol := testPolicy(Tumbling)
	owed := claimOf(pol, parked, 1, time.Now())
	other := &Claim{Observation: Observation{Key: "another key"}, Policy: pol, Token: 2, At: time.Now()}
	if !from.Hand([]*Claim{owed}, true) || !from.Hand([]*Claim{other}, true) {
		t.Fatal("handing over")
	}
	retry := []*Claim{claimOf(pol, parked, 3, time.Now())}

	full, _ := testReconciler(t, NewMemoryStore(0), 1, time.Hour)
	full.Hand([]*Claim{{Observation: Observation{Key: "full"}, Policy: pol, Token: 4, At: time.Now()}}, false)
	closed, _ := testReconciler(t, NewMemoryStore(0), 0, time.Hour)
	closed.Close()
	for name, r := range map[string]*Reconciler{"full": full, "closed": closed} {
		if r.TakeOver(from, retry) {
			t.Errorf("a %s receiver took them over", name)
		}
		if !from.OwesFor(retry) || from.Len() != 2 || from.Unanswered() != 2 {
			t.Fatalf("after a %s receiver: the giver owes %v, holds %d, %d unanswered", name, from.OwesFor(retry), from.Len(), from.Unanswered())
		}
	}

	mem := NewMemoryStore(0)
	if v, err := mem.Decide(context.Background(), []*Claim{owed}); err != nil || v[0].Decision != Accepted {
		t.Fatalf("the claim that landed: %v %v", v, err)
	}
	r, o := testReconciler(t, mem, 0, time.Hour)
	if !r.TakeOver(from, retry) {
		t.Fatal("an open receiver with room refused")
	}
	if from.OwesFor(retry) || from.Len() != 1 || from.Unanswered() != 1 || !from.Owes() {
		t.Fatalf("the giver: owes %v on the key, holds %d, %d unanswered, owes %v; want only the other key's", from.OwesFor(retry), from.Len(), from.Unanswered(), from.Owes())
	}
	if err := r.ReleaseOwed(context.Background(), retry); err != nil {
		t.Fatal(err)
	}
	if r.OwesFor(retry) || r.Unanswered() != 0 || o.String() != "map[released:1]" {
		t.Fatalf("the receiver: owes %v, %d unanswered, outcomes %s", r.OwesFor(retry), r.Unanswered(), o)
	}
	if v, err := mem.Decide(context.Background(), retry); err != nil || v[0].Decision != Accepted {
		t.Fatalf("the retry: %v %v; want accepted", v, err)
	}
}

// TakeOverJobs with a filter moves only the jobs all of whose claims'
// keys it accepts: a connection that served two sites hands each site's
// jobs to a connection of that site, and keeps a job on keys none serves.
func TestTakeOverJobsMovesOnlyTheJobsOnTheKeysItIsGiven(t *testing.T) {
	from, _ := testReconciler(t, &downStore{Store: NewMemoryStore(0)}, 0, time.Hour)
	pol := testPolicy(Tumbling)
	claim := func(key string, token uint64) *Claim {
		return &Claim{Observation: Observation{Key: key}, Policy: pol, Token: token, At: time.Now()}
	}
	a, b, both := claim("a:1", 1), claim("b:1", 2), []*Claim{claim("a:2", 3), claim("b:2", 4)}
	for _, c := range [][]*Claim{{a}, {b}, both} {
		if !from.Hand(c, true) {
			t.Fatal("handing over")
		}
	}
	to, _ := testReconciler(t, &downStore{Store: NewMemoryStore(0)}, 0, time.Hour)
	if n := to.TakeOverJobs(from, func(key string) bool { return strings.HasPrefix(key, "a:") }); n != 1 {
		t.Fatalf("the receiver took %d claims; want the one on a:", n)
	}
	if !to.OwesFor([]*Claim{a}) || to.Len() != 1 {
		t.Errorf("the receiver holds %d claims, owes a:1 %v; want the job on a: alone", to.Len(), to.OwesFor([]*Claim{a}))
	}
	if !from.OwesFor([]*Claim{b}) || !from.OwesFor(both[:1]) || from.OwesFor([]*Claim{a}) || from.Len() != 3 {
		t.Errorf("the giver holds %d claims, owes b:1 %v, the mixed job %v, a:1 %v; want the job on b: and the one on a: and b: kept",
			from.Len(), from.OwesFor([]*Claim{b}), from.OwesFor(both[:1]), from.OwesFor([]*Claim{a}))
	}
}

// TakeOverJobs moves every job another Reconciler holds, settlements,
// releases and confirmations alike, with their counts and their due
// times: the receiver makes them, and the giver, left with nothing, closes
// without dropping any. A receiver that is closed, or has room for none
// of them (its queue and Confirm's budget both full), takes none: the
// giver keeps them, still owed.
func TestTakeOverJobsMovesEveryJobWithItsCounts(t *testing.T) {
	from, given := testReconciler(t, &downStore{Store: NewMemoryStore(0)}, 0, time.Hour)
	pol := testPolicy(Tumbling)
	claim := func(key string, token uint64) *Claim {
		return &Claim{Observation: Observation{Key: key}, Policy: pol, Token: token, At: time.Now()}
	}
	failed, delivered, unconfirmed := claim("failed", 1), claim("delivered", 2), claim("unconfirmed", 3)
	if !from.Hand([]*Claim{failed}, true) || !from.Hand([]*Claim{delivered}, false) || !from.Confirm([]*Claim{unconfirmed}) {
		t.Fatal("handing over")
	}
	owed := [][]*Claim{{failed}, {unconfirmed}}

	full, _ := testReconciler(t, &downStore{Store: NewMemoryStore(0)}, 1, time.Hour)
	if !full.Hand([]*Claim{claim("full", 4)}, false) || !full.Confirm([]*Claim{claim("full-confirming", 5)}) {
		t.Fatal("filling the receiver")
	}
	closed, _ := testReconciler(t, NewMemoryStore(0), 0)
	closed.Close()
	for name, r := range map[string]*Reconciler{"full": full, "closed": closed} {
		if r.TakeOverJobs(from, nil) != 0 {
			t.Errorf("a %s receiver took them over", name)
		}
		if from.Len() != 3 || from.Unanswered() != 2 || !from.OwesFor(owed[0]) || !from.OwesFor(owed[1]) {
			t.Fatalf("after a %s receiver: the giver holds %d, %d unanswered, owes %v %v", name, from.Len(), from.Unanswered(), from.OwesFor(owed[0]), from.OwesFor(owed[1]))
		}
	}

	mem := NewMemoryStore(0)
	if v, err := mem.Decide(context.Background(), []*Claim{failed, delivered}); err != nil || v[0].Decision != Accepted || v[1].Decision != Accepted {
		t.Fatalf("the claims that landed: %v %v", v, err)
	}
	r, o := testReconciler(t, mem, 0) // no confirmations of its own: what it answers, it finishes
	if r.TakeOverJobs(from, nil) != 3 {
		t.Fatal("an open receiver with room refused")
	}
	if from.Len() != 0 || from.Unanswered() != 0 || from.Owes() {
		t.Fatalf("the giver: holds %d, %d unanswered, owes %v; want nothing", from.Len(), from.Unanswered(), from.Owes())
	}
	from.mu.Lock()
	if len(from.owedKeys) != 0 || from.confirming != 0 {
		t.Errorf("the giver still counts owed keys %v, %d claims confirming", from.owedKeys, from.confirming)
	}
	from.mu.Unlock()
	if left := from.Close(); left != (Unreconciled{}) || given.String() != "map[]" {
		t.Fatalf("the giver's close gave up on %+v, outcomes %s; want nothing", left, given)
	}
	for deadline := time.Now().Add(10 * time.Second); r.Len() > 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the receiver still holds %d claims", r.Len())
		}
	}
	if o.String() != "map[released:1 settled:1]" || r.Unanswered() != 0 || r.OwesFor(owed[0]) {
		t.Fatalf("the receiver: outcomes %s, %d unanswered, owes the failed claim %v", o, r.Unanswered(), r.OwesFor(owed[0]))
	}
	// The confirmation keeps its time, an hour away: it is still owed.
	if !r.OwesFor(owed[1]) || r.Len() != 1 {
		t.Fatalf("the receiver: owes the confirmation %v, holds %d; want it kept until its time", r.OwesFor(owed[1]), r.Len())
	}
	if v, err := mem.Decide(context.Background(), []*Claim{claim("failed", 5)}); err != nil || v[0].Decision != Accepted {
		t.Fatalf("the failed claim's retry: %v %v; want accepted", v, err)
	}
}

// Two connections on one Redis take over from each other at once, while
// releases and confirmations are handed to both and their calls make what
// they owe: every claim ends up made by one of them, and neither is left
// counting a claim, a release owed or an owed key it no longer holds (a
// job the receiver answered before the giver stopped counting it would
// otherwise leave the giver owing on its key: every later call on it
// would wait for a release no pass can find).
func TestTwoReconcilersTakingOverFromEachOtherKeepTheirCounts(t *testing.T) {
	mem := NewMemoryStore(0)
	a, _ := testReconciler(t, mem, 0, 10*time.Millisecond)
	b, _ := testReconciler(t, mem, 0, 10*time.Millisecond)
	pol := testPolicy(Tumbling)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				key := fmt.Sprintf("k%d", i%7)
				c := &Claim{Observation: Observation{Key: key}, Policy: pol, Token: uint64(g*1000 + i), At: time.Now()}
				own, other := a, b
				if (g+i)%2 == 0 {
					own, other = b, a
				}
				switch i % 3 {
				case 0:
					other.Hand([]*Claim{c}, true)
				case 1:
					other.Confirm([]*Claim{c})
				}
				if !own.TakeOver(other, []*Claim{c}) {
					t.Error("an open receiver with room refused")
				}
				if own.OwesFor([]*Claim{c}) {
					if err := own.ReleaseOwed(context.Background(), []*Claim{c}); err != nil {
						t.Error(err)
					}
				}
			}
		}()
	}
	wg.Wait()
	drained(t, a)
	drained(t, b)
	if a.Owes() || b.Owes() || a.Unanswered() != 0 || b.Unanswered() != 0 {
		t.Fatalf("drained, a owes %v (%d unanswered), b owes %v (%d unanswered)", a.Owes(), a.Unanswered(), b.Owes(), b.Unanswered())
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(a.owedKeys) != 0 || len(b.owedKeys) != 0 || a.confirming != 0 || b.confirming != 0 || a.claims != 0 || b.claims != 0 {
		t.Fatalf("left counted: owed keys %v %v, confirming %d %d, claims %d %d", a.owedKeys, b.owedKeys, a.confirming, b.confirming, a.claims, b.claims)
	}
}

// TakeOverJobs moves each job the receiver has room for, not all or none
// of them across its two budgets: a retired connection's release that the
// store never answered goes to its site's new connection even when that
// connection's budget for Confirm's jobs (Sentinel and Cluster releases no
// replica acknowledged) has no room for the retired one's confirmation
// too. All or none, one job over either budget kept them all with the
// retired connection, refused after a password rotation until the
// claim's TTL: the failed request's claim stood, and its sender's retry
// was told to come back, then that its ping was delivered.
//
// Setup: the receiver (capacity 2) holds two Confirm claims of its own
// (its Confirm budget full, its queue's empty); the giver holds a release
// the store never answered and a confirmation, both on a:; the receiver
// is offered the jobs on a:. (Helper 7's review, stop 61.)
func TestTakeOverJobsMovesTheJobsThatFitThoughOthersDoNot(t *testing.T) {
	pol := testPolicy(Tumbling)
	claim := func(key string, token uint64) *Claim {
		return &Claim{Observation: Observation{Key: key}, Policy: pol, Token: token, At: time.Now()}
	}
	to, _ := testReconciler(t, &downStore{Store: NewMemoryStore(0)}, 2, time.Hour)
	if !to.Confirm([]*Claim{claim("a:own1", 1), claim("a:own2", 2)}) {
		t.Fatal("the receiver's own confirmations")
	}
	from, _ := testReconciler(t, &downStore{Store: NewMemoryStore(0)}, 0, time.Hour)
	failed, unconfirmed := claim("a:failed", 3), claim("a:unconfirmed", 4)
	if !from.Hand([]*Claim{failed}, true) || !from.Confirm([]*Claim{unconfirmed}) {
		t.Fatal("handing over")
	}
	to.TakeOverJobs(from, func(key string) bool { return strings.HasPrefix(key, "a:") })
	if !to.OwesFor([]*Claim{failed}) || from.OwesFor([]*Claim{failed}) {
		t.Errorf("the release the store never answered: the receiver owes it %v, the giver %v; want it moved: the receiver's "+
			"queue has room for it (holds %d claims, all confirmations, of 2), only its Confirm budget has none for the "+
			"giver's confirmation", to.OwesFor([]*Claim{failed}), from.OwesFor([]*Claim{failed}), to.Len())
	}
	if !from.OwesFor([]*Claim{unconfirmed}) {
		t.Error("the giver no longer owes the confirmation the receiver had no room for")
	}
}
