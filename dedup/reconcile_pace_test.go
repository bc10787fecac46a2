package dedup

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/pipeline"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// outageStore fails every release while down (as a Redis that is out:
// the reconciler backs off), and counts the releases that failed after.
type outageStore struct {
	Store
	down     atomic.Bool
	failedUp atomic.Int64 // claims whose release failed once up
	firstErr atomic.Value
}

func (s *outageStore) Release(ctx context.Context, claims []*Claim) ([]bool, error) {
	if s.down.Load() {
		return nil, errors.New("connection refused")
	}
	r, err := s.Store.Release(ctx, claims)
	if err != nil {
		s.failedUp.Add(int64(len(claims)))
		s.firstErr.CompareAndSwap(nil, err.Error())
	}
	return r, err
}

// acceptedBacklog accepts n sliding claims on store, one asset each.
func acceptedBacklog(t *testing.T, store Store, n int, tokenBase uint64) []*Claim {
	t.Helper()
	pol := testPolicy(Sliding)
	claims := make([]*Claim, n)
	for i := range claims {
		p := parked
		p.Asset = fmt.Sprintf("bk-%d-%05d", tokenBase, i)
		claims[i] = claimOf(pol, p, tokenBase+uint64(i), time.Now())
	}
	ctx := context.Background()
	for i := 0; i < n; i += 256 {
		batch := claims[i:min(i+256, n)]
		if _, err := store.Decide(ctx, batch); err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
	return claims
}

// aFullBacklogOnAHealthyRedis starts a Redis and accepts a reconciler
// queue's worth of sliding claims on it (tokens from tokenBase): store
// has the default timeout, setup a long one for the test's own calls.
func aFullBacklogOnAHealthyRedis(t *testing.T, tokenBase uint64) (store, setup *RedisStore, claims []*Claim) {
	t.Helper()
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	pipe := pipeline.New(client)
	t.Cleanup(func() { pipe.Close(); _ = client.Close() })
	store = NewRedisStore(pipe, DefaultRedisTimeout)
	setup = NewRedisStore(pipe, 10*time.Second)
	return store, setup, acceptedBacklog(t, setup, DefaultReconcileQueue, tokenBase)
}

// A Redis outage ends (the breaker closes: Wake) with the reconciler
// holding a full queue of releases (10,000 single-ping requests whose
// upstream failed meanwhile). Its pass makes them all, none failing, on a
// Redis that answers every call. From f80ac76 to stop 60 (helper 2's
// review) run's pass sent all its batches at once: ~40 store calls of 256
// release scripts
// join the pipeline's queue at one instant, all with one deadline (the
// store timeout, 50 ms by default), and the pipeline sends them 512
// commands a round trip, one round trip after the other. The tail expires
// unsent (or is sent after its caller gave up): thousands of releases fail
// on a Redis that answered every call, back off and go again all at once,
// so the backlog takes seconds to drain (keys owed all the while, the
// requests' decisions waiting behind it up to the store timeout), and the
// claims whose answer was lost are counted not_held though the reconciler
// released them. One batch after the other (before f80ac76): ~0.2 s, all
// released, none failed; so now, a round trip's worth at a time.
func TestARunPassOfAFullQueueReleasesItAllOnAHealthyRedis(t *testing.T) {
	store, setup, claims := aFullBacklogOnAHealthyRedis(t, 1_000_000)

	ds := &outageStore{Store: store}
	ds.down.Store(true)
	o := &outcomes{}
	r := newReconciler(ds, 0, o.report, nil)
	defer r.Close()
	for _, c := range claims {
		r.Hand([]*Claim{c}, true) // a request of one ping each
	}
	time.Sleep(1700 * time.Millisecond) // every job failed and backs off
	ds.down.Store(false)

	acceptedBacklog(t, setup, 1, 5_000_000) // warm the scripts
	var lat []time.Duration
	var failed int
	var mu sync.Mutex
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		pol := testPolicy(Sliding)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			p := parked
			p.Asset = fmt.Sprintf("probe-%d", i)
			c := claimOf(pol, p, 9_000_000+uint64(i), time.Now())
			start := time.Now()
			_, err := store.Decide(context.Background(), []*Claim{c})
			mu.Lock()
			lat = append(lat, time.Since(start))
			if err != nil {
				failed++
			}
			mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
	})
	time.Sleep(20 * time.Millisecond)
	woke := time.Now()
	r.Wake() // the breaker closed: Redis answers again
	deadline := time.Now().Add(20 * time.Second)
	for r.Unanswered() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	drained := time.Since(woke)
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	sorted := append([]time.Duration(nil), lat...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	t.Logf("backlog of %d releases drained in %v; decisions of requests meanwhile: %d, failed %d, p50 %v max %v; outcomes %v",
		len(claims), drained, len(lat), failed, sorted[len(sorted)/2], sorted[len(sorted)-1], o)
	if n := ds.failedUp.Load(); n > 0 {
		t.Errorf("%d of the reconciler's releases failed on a Redis that answered every one (%v): its ~%d batches, sent at once with one deadline, outlast the store timeout (%v) in the pipeline's queue; the backlog took %v to drain, each key owed meanwhile",
			n, ds.firstErr.Load(), (len(claims)+reconcileBatch-1)/reconcileBatch, DefaultRedisTimeout, drained)
	}
	o.mu.Lock()
	notHeld := o.n[ReconcileNotHeld]
	o.mu.Unlock()
	if notHeld > 0 {
		t.Errorf("%d claims counted reconciled_total{not_held}, though every claim was held and the reconciler released it: their batch went to Redis after its caller had given up, and the retry found them gone", notHeld)
	}
}

// Caddy exits (or a reload drops the connection) just after a Redis
// outage, the reconciler holding 10,000 releases: Close's last pass
// (reconcileLastPass, 2 s) makes them all. Sent all at once (f80ac76 to
// stop 60), the
// batches the pipeline cannot send within the store timeout (50 ms)
// expire unsent, and Close gives them up (dropped: their senders' retries
// are answered 409, then suppressed), though Redis answered every call
// and one batch after the other released all of them in ~0.2 s.
func TestClosesLastPassMakesEveryReleaseAHealthyRedisTakes(t *testing.T) {
	store, _, claims := aFullBacklogOnAHealthyRedis(t, 2_000_000)

	ds := &outageStore{Store: store}
	ds.down.Store(true)
	o := &outcomes{}
	r := newReconciler(ds, 0, o.report, nil)
	for _, c := range claims {
		r.Hand([]*Claim{c}, true)
	}
	time.Sleep(300 * time.Millisecond) // every job failed and backs off
	ds.down.Store(false)
	start := time.Now()
	left := r.Close()
	took := time.Since(start)
	t.Logf("Close took %v, left %+v, outcomes %v", took, left, o)
	if left.Releases > 0 {
		t.Errorf("Close gave up %d of %d releases on a Redis that answered every call (%d failed: %v): sent at once, they expired in the pipeline's queue", left.Releases, len(claims), ds.failedUp.Load(), ds.firstErr.Load())
	}
}

// A release a hung master failed is handed to the reconciler (the
// handler's finish: Hand) and, from f80ac76 to stop 60, was confirmed too
// (FailoverStore: Confirm). If Caddy exits (or the connection closes) before the master
// answers, Close returns the Hand job's claim as unreconciled (the caller
// counts it dropped and logs it) and counts the Confirm job's as
// unconfirmed: one claim, two outcomes in reconciled_total, and two
// warnings (README documents released_late plus not_held as the only
// double count). The Confirm job was never answered (answers = 1 is set
// for a release the store answered), so Close takes it for a confirmation
// abandoned.
func TestAFailedReleaseIsCountedOnceAtClose(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	pipe := pipeline.New(client)
	t.Cleanup(func() { pipe.Close(); _ = client.Close() })
	store := NewRedisStore(pipe, 200*time.Millisecond)
	o := &outcomes{}
	r := newReconciler(store, 0, o.report, reconcileConfirmations)
	r.ConfirmOwn() // as redis_connection.go has it beside a FailoverStore
	fs := NewFailoverStore(store, client, r.Confirm)
	ctx := context.Background()
	c := claimOf(testPolicy(Sliding), parked, 1, time.Now())
	if v, err := decideOne(ctx, fs, c); err != nil || v.Decision != Accepted {
		t.Fatalf("the claim: %v %v", v, err)
	}
	srv.Pause()
	defer srv.Resume()
	_, err := fs.Release(ctx, []*Claim{c})
	if err == nil {
		t.Fatal("a release on a hung Redis succeeded")
	}
	r.Hand([]*Claim{c}, true) // forward.go finish: failedReleases
	left := r.Close()
	o.mu.Lock()
	unconfirmed := o.n[ReconcileUnconfirmed]
	o.mu.Unlock()
	if left.Releases+unconfirmed > 1 {
		t.Errorf("one claim whose release failed counted %d times at Close: %d dropped (Unreconciled.Releases) and %d unconfirmed (outcomes %v)", left.Releases+unconfirmed, left.Releases, unconfirmed, o)
	}
}

// A failed release's key stays owed until its confirmations are done, because the reconciler's own release goes without a WAIT and a
// failover may bring the claim back (TestAReconciledFailedReleaseStaysOwedUntilConfirmed).
// The same holds for the other releases only the reconciler makes: the
// claims of a claim call that timed out on a hung master, whose request
// was then answered 503 or whose upstream failed (forward.go respondUnsure:
// h.reconcile(req.unsure, true)). Until stop 60 nothing confirmed those
// (helper 2's review): once the
// reconciler's release is answered, their keys owe nothing, and a failover
// that brings the claim back has the sender's retry answered in_flight
// (409) until the next scheduled pass (up to 30 s away), then suppressed
// once the claim is older than in_flight_timeout.
func TestAnUnsureClaimsReconciledReleaseStaysOwedUntilConfirmed(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	store := newRedisStoreOn(t, client)
	o := &outcomes{}
	r := newReconciler(store, 0, o.report, reconcileConfirmations) // as redis_connection.go: the plain store
	r.ConfirmOwn()
	defer r.Close()
	_ = NewFailoverStore(store, client, r.Confirm) // a Sentinel or Cluster connection
	ctx := context.Background()
	c := claimOf(testPolicy(Sliding), parked, 1, time.Now())
	if v, err := decideOne(ctx, store, c); err != nil || v.Decision != Accepted {
		t.Fatalf("the claim: %v %v", v, err)
	}
	// The claim call timed out (the master hung); the request failed.
	r.Hand([]*Claim{c}, true) // forward.go respondUnsure
	deadline := time.Now().Add(5 * time.Second)
	for r.Unanswered() > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if r.Unanswered() > 0 {
		t.Fatalf("the reconciler never had its release answered (outcomes %v)", o)
	}
	// A failover promotes a replica that never had the release.
	if v, err := decideOne(ctx, store, c); err != nil || v.Decision != Accepted {
		t.Fatalf("bringing the claim back: %v %v", v, err)
	}
	if !r.OwesFor([]*Claim{c}) {
		t.Errorf("after the reconciler's unacknowledged release of an unsure claim, a call on the key does not release it first: the retry on the promoted replica is answered in flight, then suppressed (outcomes %v)", o)
	}
}

// Close on a Cluster with one master of 3 hung, the reconciler holding a
// full queue of releases: its last pass makes the healthy masters'
// releases within its bound. Sent all at once (f80ac76 to stop 60), the healthy masters' parts queued past the store timeout
// (50 ms) expire unsent: Close gives up about a third of the healthy
// masters' releases (dropped), which one batch after the other made
// (12 of 6,746 given up, within reconcileLastPass). Close stays within
// its bound either way.
func TestClosesLastPassOnAClusterMakesTheHealthyMastersReleases(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), ContextTimeoutEnabled: true})
	pipe := pipeline.New(client)
	t.Cleanup(func() { pipe.Close(); _ = client.Close() })
	timeout := DefaultRedisTimeout
	store := NewRedisStore(pipe, timeout)
	setup := NewRedisStore(pipe, 10*time.Second)
	warm := acceptedBacklog(t, setup, 50, 3_500_000)
	if _, err := setup.Release(context.Background(), warm); err != nil { // the release script loaded on every master
		t.Fatal(err)
	}
	claims := acceptedBacklog(t, setup, DefaultReconcileQueue, 3_000_000)
	hung := cluster.NodeFor(claims[0].Key())
	onHung := 0
	for _, c := range claims {
		if cluster.NodeFor(c.Key()) == hung {
			onHung++
		}
	}
	ds := &outageStore{Store: store}
	ds.down.Store(true)
	o := &outcomes{}
	r := newReconciler(ds, 0, o.report, nil)
	r.ZoneBy(ClusterMasterZone(client, 0)) // as redis_connection.go has it on a Cluster
	for _, c := range claims {
		r.Hand([]*Claim{c}, true)
	}
	time.Sleep(300 * time.Millisecond)
	hung.Pause()
	defer hung.Resume()
	ds.down.Store(false)
	start := time.Now()
	left := r.Close()
	took := time.Since(start)
	t.Logf("Close took %v (store timeout %v, last pass %v); left %+v of which on the hung master %d; outcomes %v; failed %d (%v)",
		took, timeout, reconcileLastPass, left, onHung, o, ds.failedUp.Load(), ds.firstErr.Load())
	if took > 2*timeout+reconcileLastPass {
		t.Errorf("Close took %v with one master hung, past its bound", took)
	}
	if healthyLeft := left.Releases - onHung; healthyLeft > len(claims)/100 {
		t.Errorf("Close gave up %d releases, %d of them on the two healthy masters, which answered: the batches sent at once expired in their queues", left.Releases, healthyLeft)
	}
}

// outageSettleStore fails every settlement while down.
type outageSettleStore struct {
	Store
	down *atomic.Bool
}

func (s outageSettleStore) Settle(claims []*Claim, done func(error)) {
	if s.down.Load() {
		done(context.DeadlineExceeded)
		return
	}
	s.Store.Settle(claims, done)
}

// As TestClosesLastPassMakesEveryReleaseAHealthyRedisTakes, for the
// settlements (claim calls that timed out, then forwarded unchecked and
// delivered): Close's last pass sends them all at once and gives up those
// that expire in the pipeline's queue; their redeliveries are answered in
// flight (409) until in_flight_timeout. One batch after the other settled
// all 10,000.
func TestClosesLastPassMakesEverySettlementAHealthyRedisTakes(t *testing.T) {
	store, _, claims := aFullBacklogOnAHealthyRedis(t, 8_000_000)
	var down atomic.Bool
	down.Store(true)
	o := &outcomes{}
	r := newReconciler(outageSettleStore{store, &down}, 0, o.report, nil)
	for _, c := range claims {
		r.Hand([]*Claim{c}, false)
	}
	time.Sleep(300 * time.Millisecond)
	down.Store(false)
	left := r.Close()
	if left.Settlements > 0 {
		t.Errorf("Close gave up %d of %d settlements on a Redis that answered every call (outcomes %v)", left.Settlements, len(claims), o)
	}
}
