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
	if v := decide(t, failover, c); v.Decision != Accepted {
		t.Fatalf("first sighting %v, want accepted", v)
	}
	replica := st.Replica().Client()
	for deadline := time.Now().Add(5 * time.Second); replica.Exists(ctx, c.Observation.Key).Val() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the claim never reached the replica")
		}
	}

	link.Hold()
	if released, err := releaseOne(ctx, failover, c); err != nil || !released {
		t.Fatalf("release: %v %v, want released", released, err)
	}
	if r.Len() != 1 || r.Owes() {
		t.Fatalf("%d claims handed to the reconciler (owed: %v), want the release no replica acknowledged, which no call waits for", r.Len(), r.Owes())
	}
	st.Master().Kill()
	link.Cut()
	if link.Dropped() == 0 {
		t.Fatal("the cut dropped nothing: the replica may have had the release after all")
	}
	st.WaitForFailover(t, 45*time.Second)

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
// call. A master without replicas has none to promote without the
// releases: nothing waits for a replica, and nothing is left to confirm.
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
	if r.Len() != 0 {
		t.Errorf("%d claims handed to the reconciler, want none: no master has a replica", r.Len())
	}
}
