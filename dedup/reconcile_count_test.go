package dedup

import (
	"context"
	"testing"
	"time"
)

// hungBesideStore releases through Store, except the claims of asset
// hung, whose master does not answer: a ReleaseError failing those alone,
// with the others' real answers (as FailoverStore and RedisStore on a
// Cluster answer since 974da94).
type hungBesideStore struct {
	Store
	hung string
}

func (s *hungBesideStore) Release(ctx context.Context, claims []*Claim) ([]bool, error) {
	var through []*Claim
	var at []int
	failed := make([]bool, len(claims))
	for i, c := range claims {
		if failed[i] = c.Asset == s.hung; !failed[i] {
			through, at = append(through, c), append(at, i)
		}
	}
	got, err := s.Store.Release(ctx, through)
	if err != nil {
		return nil, err
	}
	released := make([]bool, len(claims))
	for j, i := range at {
		released[i] = got[j]
	}
	if len(through) == len(claims) {
		return released, nil
	}
	return nil, &ReleaseError{Err: context.DeadlineExceeded, Released: released, Failed: failed}
}

// A request's claim call timed out (a gateway's batch: one asset on a
// healthy master, one on a master that hangs); the reconciler is handed
// both. Its passes release the healthy one (attempt's failed branch marks
// it j.released, "counted released when the job is answered") and fail the
// hung one, until Caddy reloads or exits: Close then reports both as
// unreconciled (Unreconciled.Releases, which the caller counts
// reconciled_total{outcome="dropped"} and logs as "claims of timed-out
// store calls could not be reconciled; they stand until in_flight_timeout,
// and the retries ... may be suppressed"). The healthy claim was released:
// it stands nowhere, its retry is accepted; it is never counted released,
// and is counted dropped instead. (The same holds for a job that reaches
// its TTL: finishIfExpired counts every claim expired.)
func TestAReleasedClaimBesideAHungOneIsNotCountedDroppedAtClose(t *testing.T) {
	pol := testPolicy(Sliding)
	mem := NewMemoryStore(0)
	healthy := claimOf(pol, parked, 1, time.Now())
	p := parked
	p.Asset = "on-the-hung-master"
	hung := claimOf(pol, p, 2, time.Now())
	for _, c := range []*Claim{healthy, hung} {
		if v, err := decideOne(context.Background(), mem, c); err != nil || v.Decision != Accepted {
			t.Fatalf("setup: %v %v", v, err)
		}
	}
	o := &outcomes{}
	r := newReconciler(&hungBesideStore{Store: mem, hung: p.Asset}, 0, o.report, nil)
	r.Hand([]*Claim{healthy, hung}, true)
	time.Sleep(50 * time.Millisecond) // the first pass: healthy released, hung failed
	if v, err := decideOne(context.Background(), mem, claimOf(pol, parked, 3, time.Now())); err != nil || v.Decision != Accepted {
		t.Fatalf("the healthy asset's retry: %v %v, want accepted (its claim was released)", v, err)
	}
	left := r.Close()
	o.mu.Lock()
	defer o.mu.Unlock()
	if left.Releases != 1 || o.n[ReconcileReleased] != 1 {
		t.Errorf("Close left %d releases unreconciled (outcomes %v); want 1, the hung master's, and the released claim counted released", left.Releases, o.n)
	}
}

// Close's last pass (workOn) still stops at the first failed store call,
// a partial one included (a ReleaseError: one master of a Cluster hangs),
// and postpones every job behind it without trying it: on a Cluster with
// one hung master, the releases owed on the healthy masters that sit in a
// later batch (past reconcileBatch claims, e.g. behind one gateway batch
// of 256 assets) are never sent at Caddy's exit or reload. Close counts
// them dropped, and their claims stand until in_flight_timeout: the
// senders' retries of those failed requests are answered in flight (409)
// and then suppressed, on masters that answer fine. 255d990 made
// releaseOwedPass go on past such a failure ("a pass that stopped at the
// first failure failed the keys it had not tried, healthy masters'
// among them"); the last pass, which README says makes "one last pass
// over every claim it holds", was left stopping.
func TestClosesLastPassReleasesHealthyMastersClaimsBehindAHungOnesBatch(t *testing.T) {
	pol := testPolicy(Sliding)
	mem := NewMemoryStore(0)
	gateway := make([]*Claim, 0, reconcileBatch)
	hp := parked
	hp.Asset = "on-the-hung-master"
	gateway = append(gateway, claimOf(pol, hp, 1, time.Now()))
	for i := range reconcileBatch - 1 {
		p := parked
		p.Asset = "gw-" + string(rune('A'+i%26)) + string(rune('A'+i/26))
		gateway = append(gateway, claimOf(pol, p, uint64(10+i), time.Now()))
	}
	healthy := claimOf(pol, parked, 2, time.Now())
	for _, c := range append(gateway, healthy) {
		if v, err := decideOne(context.Background(), mem, c); err != nil || v.Decision != Accepted {
			t.Fatalf("setup: %v %v", v, err)
		}
	}
	o := &outcomes{}
	r := newReconciler(&hungBesideStore{Store: mem, hung: hp.Asset}, 0, o.report, nil)
	r.Hand(gateway, true)
	r.Hand([]*Claim{healthy}, true)
	left := r.Close()
	v, err := decideOne(context.Background(), mem, claimOf(pol, parked, 3, time.Now()))
	if err != nil || v.Decision != Accepted {
		t.Errorf("the healthy master's asset's retry after Close: %v %v, want accepted (Close left %d releases unreconciled, outcomes %v)", v.Decision, err, left.Releases, o)
	}
}
