package dedup

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// claimKeys are the keys a claim writes.
func claimKeys(c *Claim) []string {
	if c.Policy.Shape == Tumbling {
		return []string{c.Observation.Key}
	}
	return []string{c.StateKey, c.SeenKey}
}

// A release on Sentinel has reached the replica when its answer comes, so
// a failover right after it cannot bring the claim back; nothing is left
// for the reconciler to confirm.
func TestFailoverStoreReleaseReachesTheReplicaBeforeItsAnswer(t *testing.T) {
	st := redistest.StartSentinel(t)
	client := st.FailoverClient()
	store := newRedisStoreOn(t, client)
	r, _ := testReconciler(t, store, 0, time.Minute)
	failover := NewFailoverStore(store, client, r.Confirm)
	replica := st.Replica().Client()
	ctx := context.Background()
	for _, shape := range Shapes {
		t.Run(string(shape), func(t *testing.T) {
			pol := testPolicy(shape)
			c := claimOf(pol, ping.Ping{Asset: "veh-" + string(shape), Time: articleBase, Lat: parked.Lat, Lon: parked.Lon}, 1, time.Now())
			if v := decide(t, failover, c); v.Decision != Accepted {
				t.Fatalf("first sighting %v, want accepted", v)
			}
			for deadline := time.Now().Add(5 * time.Second); replica.Exists(ctx, claimKeys(c)[0]).Val() == 0; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the claim never reached the replica")
				}
			}
			if released, err := releaseOne(ctx, failover, c); err != nil || !released {
				t.Fatalf("release: %v %v, want released", released, err)
			}
			if shape == Tumbling && replica.Exists(ctx, c.Observation.Key).Val() != 0 {
				t.Error("the replica still held the claim when the release was answered")
			}
			if shape != Tumbling && replica.HExists(ctx, c.SeenKey, seenField(c)).Val() {
				t.Error("the replica still held the ping's seen entry when the release was answered")
			}
			if n := r.Len(); n != 0 {
				t.Errorf("%d claims handed to the reconciler, want none: a replica acknowledged the release", n)
			}
		})
	}
}

// The master answers a release and dies before its replica has it: the
// promoted replica holds the claim again. Without more, the observation's
// retries would be told to come back until in_flight_timeout and then that
// it was delivered. FailoverStore hands the release no replica acknowledged
// to the reconciler, whose confirmations release the claim again on the
// new master, and the retry is accepted.
func TestFailoverStoreReleasesAgainWhatAFailoverBroughtBack(t *testing.T) {
	st, link := redistest.StartSentinelLinked(t)
	client := st.FailoverClient()
	store := newRedisStoreOn(t, client)
	r, outcomes := testReconciler(t, store, 0, 100*time.Millisecond, time.Second, 2*time.Second, 4*time.Second, 8*time.Second, 16*time.Second, 32*time.Second)
	failover := NewFailoverStore(store, client, r.Confirm)
	ctx := context.Background()

	pol := testPolicy(Tumbling)
	pol.InFlightTimeout = 10 * time.Minute // the claim the failover brings back stays in flight for the whole test
	c := claimOf(pol, parked, 1, time.Now())
	claimOnTheReplica(t, st, failover, c)

	link.Hold()
	if released, err := releaseOne(ctx, failover, c); err != nil || !released {
		t.Fatalf("release: %v %v, want released", released, err)
	}
	if r.Len() != 1 || !r.OwesFor([]*Claim{c}) {
		t.Fatalf("%d claims handed to the reconciler (owed for its key: %v), want the release no replica acknowledged, owed until confirmed", r.Len(), r.OwesFor([]*Claim{c}))
	}
	failOverWithoutWhatTheLinkHeld(t, st, link)
	if link.Dropped() == 0 {
		t.Fatal("the cut dropped nothing: the replica may have had the release after all")
	}

	retry := claimOf(pol, parked, 2, time.Now())
	deadline := time.Now().Add(30 * time.Second)
	for {
		v, err := decideOne(ctx, failover, retry)
		if err == nil && v.Decision == Accepted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the retry after the failover: %v %v, want accepted (reconciler: %s)", v, err, outcomes)
		}
		time.Sleep(100 * time.Millisecond)
	}
	outcomes.mu.Lock()
	defer outcomes.mu.Unlock()
	if got := outcomes.n[ReconcileReleasedLate]; got != 1 {
		t.Errorf("released_late %d (outcomes %s), want the one claim the failover brought back", got, outcomes)
	}
}

// On a Cluster each claim is released on its own slot's master, all in one
// call. A master with no replica online waits for none, and its releases
// are confirmed.
func TestFailoverStoreReleasesOnEachClaimsMaster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), ContextTimeoutEnabled: true})
	store := newRedisStoreOn(t, client)
	r, _ := testReconciler(t, store, 0, time.Minute)
	failover := NewFailoverStore(store, client, r.Confirm)
	ctx := context.Background()

	pol := testPolicy(Tumbling)
	var claims []*Claim
	masters := map[string]bool{}
	for i := 0; len(masters) < 3; i++ {
		if i > 100 {
			t.Fatalf("100 assets fell on only %d masters", len(masters))
		}
		p := parked
		p.Asset = "veh-" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		c := claimOf(pol, p, uint64(i+1), time.Now())
		claims = append(claims, c)
		masters[cluster.NodeFor(c.Observation.Key).Addr()] = true
	}
	if _, err := failover.Decide(ctx, claims); err != nil {
		t.Fatal(err)
	}
	released, err := failover.Release(ctx, claims)
	if err != nil {
		t.Fatal(err)
	}
	for i, ok := range released {
		if !ok {
			t.Errorf("claim %d (%s) not released", i, claims[i].Observation.Key)
		}
		if n := client.Exists(ctx, claims[i].Observation.Key).Val(); n != 0 {
			t.Errorf("claim %d (%s) still in the Cluster", i, claims[i].Observation.Key)
		}
	}
	if r.Len() != len(claims) {
		t.Errorf("%d claims handed to the reconciler, want all %d: no master has a replica online", r.Len(), len(claims))
	}
}

// As in production (redis_connection.go): the FailoverStore behind a
// breaker whose ReleaseFirst is the reconciler's OwesFor and ReleaseOwed.
// After a failover that ends more than in_flight_timeout after the claim,
// the first retry that reaches the new master comes before the
// reconciler's next pass (its backoff is up to 2 s after the passes that
// failed in the outage). The release it owes is made again first, and the
// retry is accepted; when nothing owed it, it was told suppressed, and the
// observation was lost.
func TestTheFirstRetryAfterAFailoverReleasesAgainFirst(t *testing.T) {
	st, link := redistest.StartSentinelLinked(t)
	client := st.FailoverClient()
	store := newRedisStoreOn(t, client)
	r, outcomes := testReconciler(t, store, 0, reconcileConfirmations...)
	breaker := NewBreaker(5, 200*time.Millisecond, func(_, to BreakerState, _ error) {
		if to == BreakerClosed {
			r.Wake()
		}
	})
	guarded := breaker.Guard(NewFailoverStore(store, client, r.Confirm))
	breaker.ReleaseFirst(r.OwesFor, r.ReleaseOwed)
	ctx := context.Background()

	pol := testPolicy(Tumbling)
	pol.InFlightTimeout = 2 * time.Second // the failover takes longer than this
	c := claimOf(pol, parked, 1, time.Now())
	claimOnTheReplica(t, st, guarded, c)
	link.Hold()
	if released, err := releaseOne(ctx, guarded, c); err != nil || !released {
		t.Fatalf("release: %v %v", released, err)
	}
	if r.Len() != 1 {
		t.Fatalf("%d claims confirmed, want 1", r.Len())
	}
	failOverWithoutWhatTheLinkHeld(t, st, link)

	// The sender retries as soon as Redis answers again.
	retry := claimOf(pol, parked, 2, time.Now())
	deadline := time.Now().Add(30 * time.Second)
	for {
		retry.At = time.Now()
		v, err := decideOne(ctx, guarded, retry)
		if err == nil {
			if v.Decision != Accepted {
				t.Fatalf("the first retry the new master answered: %v, want accepted (reconciler: %s)", v, outcomes)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer: %v", err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// ROLE lists only the replicas online at that moment. A master that has
// just dropped its replica's connection (an output buffer limit, a network
// reset) answers ROLE with none, and Sentinel may still promote that
// replica, whose link went down only moments before: the release is
// confirmed as if no replica had acknowledged it.
func TestAReleaseWhileTheReplicaIsDisconnectedIsConfirmed(t *testing.T) {
	st, link := redistest.StartSentinelLinked(t)
	client := st.FailoverClient()
	store := newRedisStoreOn(t, client)
	r, outcomes := testReconciler(t, store, 0, 100*time.Millisecond, time.Second, 2*time.Second, 4*time.Second, 8*time.Second, 16*time.Second, 32*time.Second)
	failover := NewFailoverStore(store, client, r.Confirm)
	ctx := context.Background()

	pol := testPolicy(Tumbling)
	pol.InFlightTimeout = 10 * time.Minute
	c := claimOf(pol, parked, 1, time.Now())
	claimOnTheReplica(t, st, failover, c)
	// The master drops the replica's connection; the replica, behind the
	// held link, does not notice yet.
	link.Hold()
	master := st.Master().Client()
	if err := master.Do(ctx, "client", "kill", "type", "replica").Err(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		role, _ := master.Do(ctx, "role").Slice()
		if len(role) == 3 && len(role[2].([]any)) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ROLE still lists the replica: %v", role)
		}
	}
	if released, err := releaseOne(ctx, failover, c); err != nil || !released {
		t.Fatalf("release: %v %v", released, err)
	}
	if r.Len() != 1 {
		t.Fatalf("%d claims handed to the reconciler, want the release no replica was online for", r.Len())
	}
	failOverWithoutWhatTheLinkHeld(t, st, link)

	retry := claimOf(pol, parked, 2, time.Now())
	var last Verdict
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		v, err := decideOne(ctx, failover, retry)
		if err == nil && v.Decision == Accepted {
			return
		}
		last = v
	}
	t.Fatalf("the retries after the failover: %v, want accepted: the replica promoted without the release (reconciler: %s)", last, outcomes)
}

// ROLE is an @admin @dangerous command. A least-privilege user (+@all
// -@dangerous) gets NOPERM for it, and still gets the WAIT: a release its
// replica has at once is not confirmed for nothing.
func TestAReleaseByAUserWithoutRoleStillWaitsForTheReplica(t *testing.T) {
	st := redistest.StartSentinel(t)
	admin := st.Master().Client()
	ctx := context.Background()
	if err := admin.Do(ctx, "acl", "setuser", "app", "on", ">pw", "~*", "&*", "+@all", "-@dangerous").Err(); err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(&redis.Options{Addr: st.Master().Addr(), Username: "app", Password: "pw", ContextTimeoutEnabled: true})
	store := newRedisStoreOn(t, client)
	r, _ := testReconciler(t, store, 0, time.Minute)
	failover := NewFailoverStore(store, client, r.Confirm)
	c := claimOf(testPolicy(Tumbling), parked, 1, time.Now())
	if v := decide(t, failover, c); v.Decision != Accepted {
		t.Fatalf("first sighting %v", v)
	}
	if released, err := releaseOne(ctx, failover, c); err != nil || !released {
		t.Fatalf("release: %v %v", released, err)
	}
	t.Logf("ROLE as app: %v", client.Do(ctx, "role").Err())
	if n := r.Len(); n != 0 {
		t.Errorf("%d claims handed to the reconciler, want none: the replica is healthy and WAIT would have said so", n)
	}
}

// Confirm's jobs, kept for every confirmation offset (about 100 s), have a
// budget of their own: a flood of releases no replica acknowledged (a slow
// replica during an upstream outage) must not take the room of the claims
// of timed-out calls, which would then stand until in_flight_timeout and
// be suppressed. Confirmations beyond their budget count unconfirmed.
func TestConfirmationsDoNotCrowdOutUnansweredClaims(t *testing.T) {
	r, outcomes := testReconciler(t, NewMemoryStore(0), 10, reconcileConfirmations...)
	pol := testPolicy(Tumbling)
	for i := range 10 {
		p := parked
		p.Asset = "veh-c" + string(rune('a'+i))
		r.Confirm([]*Claim{claimOf(pol, p, uint64(i+1), time.Now())})
	}
	if !r.Hand([]*Claim{claimOf(pol, parked, 99, time.Now())}, true) {
		t.Errorf("a timed-out call's claim was dropped behind 10 confirmations (outcomes %s)", outcomes)
	}
	taken := r.Confirm([]*Claim{claimOf(pol, parked, 100, time.Now())})
	outcomes.mu.Lock()
	defer outcomes.mu.Unlock()
	if taken || outcomes.n[ReconcileUnconfirmed] != 1 {
		t.Errorf("an 11th confirmation was taken (outcomes %v), want it counted unconfirmed", outcomes.n)
	}
}

// A master group whose pipeline fails after some of its releases ran: the
// handler hands every claim to the reconciler, whose first (un-WAITed)
// answer ends what it owes, so the releases that ran are confirmed too.
func TestTheFailingGroupsOwnReleasesAreConfirmedToo(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	store := newRedisStoreOn(t, client)
	r, _ := testReconciler(t, store, 0, time.Hour)
	failover := NewFailoverStore(store, client, r.Confirm)
	ctx := context.Background()
	pol := testPolicy(Tumbling)
	later := parked
	later.Time = later.Time.Add(time.Minute)
	later.Asset = "veh-later"
	first := claimOf(pol, later, 1, time.Now())   // released first (releaseOrder: latest first)
	second := claimOf(pol, parked, 2, time.Now()) // its key no longer a claim: its EVAL fails
	for _, c := range []*Claim{first, second} {
		if v := decide(t, failover, c); v.Decision != Accepted {
			t.Fatalf("setup: %v", v)
		}
	}
	raw := srv.Client()
	raw.Del(ctx, second.Observation.Key)
	raw.RPush(ctx, second.Observation.Key, "x")
	if _, err := failover.Release(ctx, []*Claim{first, second}); err == nil {
		t.Fatal("setup: the release did not fail")
	}
	if raw.Exists(ctx, first.Observation.Key).Val() != 0 {
		t.Fatal("setup: the first claim was not released by the failed call")
	}
	if !r.OwesFor([]*Claim{first}) {
		t.Error("a release the master made before its group failed, acknowledged by no replica, is not owed (not confirmed)")
	}
}

// claimOnTheReplica claims c (tumbling) through s, and waits until
// Sentinel's replica has the claim.
func claimOnTheReplica(t *testing.T, st *redistest.Sentinel, s Store, c *Claim) {
	t.Helper()
	if v := decide(t, s, c); v.Decision != Accepted {
		t.Fatalf("first sighting %v, want accepted", v)
	}
	replica := st.Replica().Client()
	for deadline := time.Now().Add(5 * time.Second); replica.Exists(context.Background(), c.Observation.Key).Val() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the claim never reached the replica")
		}
	}
}

// failOverWithoutWhatTheLinkHeld kills the master, cuts the replica's link
// with what it held back, and waits until the replica has taken over.
func failOverWithoutWhatTheLinkHeld(t *testing.T, st *redistest.Sentinel, link *redistest.Link) {
	t.Helper()
	st.Master().Kill()
	link.Cut()
	st.WaitForFailover(t, 45*time.Second)
}
