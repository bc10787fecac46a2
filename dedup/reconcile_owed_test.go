package dedup

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// A release that failed (its master hung) on Sentinel or a Cluster is, since
// 106fa4b, handed only to the reconciler (Hand), no longer to Confirm. But
// the reconciler releases through the plain RedisStore (redis_connection.go:
// "Its own releases need no replica's word"): no WAIT, and once answered its
// Hand job is no longer owed (reconcileJob.owed: answers == 0 || confirming).
// README (Sentinel failover under load) promises for a release no replica
// acknowledged: "Until the last of those, a call on the same key (the retry
// itself ...) first releases it again ..., so the first retry the new master
// answers is accepted even when the failover ended after in_flight_timeout".
// Here the master answers the reconciler's release and a failover then
// brings the claim back (simulated by writing it again): no call on the key
// releases first any more, so the sender's retry is answered in_flight until
// the next scheduled pass (up to 30 s apart: 11.1 s .. 41.1 s) and, once the
// claim is older than in_flight_timeout, suppressed: the ping is lost. Before
// 106fa4b the Confirm job kept the key owed; since stop 60 the reconciler's
// own job does (ConfirmOwn), and the claim is no longer confirmed twice.
func TestAReconciledFailedReleaseStaysOwedUntilConfirmed(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	store := newRedisStoreOn(t, client)
	o := &outcomes{}
	r := newReconciler(store, 0, o.report, reconcileConfirmations) // as redis_connection.go: the plain store
	r.ConfirmOwn()                                                 // as redis_connection.go has it beside a FailoverStore
	defer r.Close()
	fs := NewFailoverStore(store, client, r.Confirm)
	ctx := context.Background()
	c := claimOf(testPolicy(Sliding), parked, 1, time.Now())
	if v, err := decideOne(ctx, fs, c); err != nil || v.Decision != Accepted {
		t.Fatalf("the claim: %v %v", v, err)
	}
	srv.Pause()
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := fs.Release(short, []*Claim{c})
	cancel()
	if err == nil {
		srv.Resume()
		t.Fatal("a release on a hung Redis succeeded")
	}
	r.Hand([]*Claim{c}, true) // as forward.go finish: failedReleases
	srv.Resume()
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
		t.Errorf("after the reconciler's unacknowledged release, a call on the key does not release it first: the retry on the promoted replica is answered in flight, then suppressed (outcomes %v)", o)
	}
}

// slowHungStore is hungBesideStore whose hung master answers only after
// delay (its timeout): each call holding one of its claims takes delay.
type slowHungStore struct {
	hungBesideStore
	delay time.Duration
}

func (s *slowHungStore) Release(ctx context.Context, claims []*Claim) ([]bool, error) {
	for _, c := range claims {
		if c.Asset == s.hung {
			time.Sleep(s.delay)
			break
		}
	}
	return s.hungBesideStore.Release(ctx, claims)
}

// One Cluster master hangs (each call with a claim on it waits out the
// store timeout) and several gateway batches' releases on it are owed, each
// a batch of its own (reconcileBatch claims). Since 106fa4b run's pass
// (workOn) goes on past a batch that failed in part, one batch after the
// other, each waiting the timeout, while holding r.working. A request whose
// own asset owes a release on a healthy master (ReleaseFirst ->
// ReleaseOwed, which then needed r.working) waited out the
// hung master's timeout once per batch before it may go on: with the
// default queue (10,000 claims, ~40 batches) tens of seconds. workOn's own
// comment says why it stopped ("rather than each batch its own timeout now,
// one after another, while every call that must first release what is owed
// waits for this pass"); README promises a release Redis cannot take for
// one key fails/holds no call of another asset
// (TestAReleaseOwedHoldsUpOnlyCallsOnItsKey). A call's own pass sends its
// batches side by side for this reason; workOn did them in series.
func TestRunsPassPastPartialFailuresDoesNotHoldAHealthyOwedCallPerBatch(t *testing.T) {
	pol := testPolicy(Sliding)
	mem := NewMemoryStore(0)
	const hung = "on-the-hung-master"
	const batches = 4
	var jobs [][]*Claim
	token := uint64(1)
	for b := range batches {
		hp := parked
		hp.Asset = hung
		hp.Time = parked.Time.Add(time.Duration(b) * time.Hour)
		job := []*Claim{claimOf(pol, hp, token, time.Now())}
		token++
		for i := range reconcileBatch - 1 {
			p := parked
			p.Asset = fmt.Sprintf("gw-%d-%d", b, i)
			job = append(job, claimOf(pol, p, token, time.Now()))
			token++
		}
		jobs = append(jobs, job)
	}
	healthy := claimOf(pol, parked, token, time.Now())
	for _, job := range append(jobs, []*Claim{healthy}) {
		for _, c := range job {
			if v, err := decideOne(context.Background(), mem, c); err != nil || v.Decision != Accepted {
				t.Fatalf("setup: %v %v", v, err)
			}
		}
	}
	const timeout = 300 * time.Millisecond
	o := &outcomes{}
	r := newReconciler(&slowHungStore{hungBesideStore: hungBesideStore{Store: mem, hung: hung}, delay: timeout}, 0, o.report, nil)
	defer r.Close()
	for _, job := range jobs {
		r.Hand(job, true)
	}
	r.Hand([]*Claim{healthy}, true)
	time.Sleep(50 * time.Millisecond) // run's pass has begun, on the first batch
	start := time.Now()
	err := r.ReleaseOwed(context.Background(), []*Claim{healthy})
	took := time.Since(start)
	if took > 2*timeout {
		t.Errorf("a call owing a release on a healthy master waited %v (err %v) behind %d batches of a hung master's releases, one timeout (%v) each; want at most about one timeout", took, err, batches, timeout)
	}
}
