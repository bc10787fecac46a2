package dedup

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/pipeline"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// On a Cluster with one master hung, the breaker fails fast the calls on
// that master's slots only: the assets whose keys live on the other
// masters, which the pipeline serves from queues of their own, are decided
// as usual. With one breaker for the whole Cluster, the hung master's
// timeouts, coming in bursts between the others' successes, opened it for
// every asset: in 3 s of similar load (2 ms between calls), 300 of the
// healthy masters' 570 calls were answered ErrBreakerOpen.
func TestBreakerZonesSkipOnlyTheHungClusterMaster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	for i, shape := range []Shape{Tumbling, Sliding} {
		t.Run(string(shape), func(t *testing.T) {
			hung := cluster.Nodes()[i]
			b, s, zone, opened := zonedClusterStore(t, cluster, 0, 0)
			ctx := context.Background()
			claim := parkedClaims(testPolicy(shape))

			// Every master has answered once: the client knows the slots.
			masters := map[string]bool{}
			for i := 0; len(masters) < 3; i++ {
				c := claim(fmt.Sprintf("warm-%d", i), uint64(i+1))
				if _, err := s.Decide(ctx, []*Claim{c}); err != nil {
					t.Fatal(err)
				}
				masters[zone(c.Key())] = true
			}

			hung.Pause()
			defer hung.Resume()
			// Under cluster-node-timeout (2s): longer, the healthy masters
			// would mark the hung one failed and refuse every slot.
			end := time.Now().Add(1500 * time.Millisecond)
			var token atomic.Uint64
			var healthyOK, healthyFailed, hungOK, hungSkipped, hungFailed atomic.Int64
			var firstErr atomic.Value
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Go(func() {
					for i := 0; time.Now().Before(end); i++ {
						c := claim(fmt.Sprintf("veh-%d-%d", g, i), token.Add(1))
						onHung := zone(c.Key()) == hung.Addr()
						_, err := s.Decide(ctx, []*Claim{c})
						switch {
						case onHung && err == nil:
							hungOK.Add(1)
						case onHung && errors.Is(err, ErrBreakerOpen):
							hungSkipped.Add(1)
						case onHung:
							hungFailed.Add(1)
						case err == nil:
							healthyOK.Add(1)
						default:
							healthyFailed.Add(1)
							firstErr.CompareAndSwap(nil, err)
						}
						time.Sleep(time.Millisecond) // a request's other work
					}
				})
			}
			wg.Wait()
			t.Logf("healthy masters' calls: %d ok, %d failed; hung master's: %d ok, %d failed, %d skipped",
				healthyOK.Load(), healthyFailed.Load(), hungOK.Load(), hungFailed.Load(), hungSkipped.Load())
			if healthyFailed.Load() > 0 {
				t.Errorf("%d calls on the healthy masters failed (first: %v)", healthyFailed.Load(), firstErr.Load())
			}
			if healthyOK.Load() < 100 {
				t.Errorf("only %d calls on the healthy masters succeeded", healthyOK.Load())
			}
			if hungOK.Load() > 0 || hungSkipped.Load() == 0 {
				t.Errorf("the hung master's calls: %d ok, %d skipped; want none ok, some skipped", hungOK.Load(), hungSkipped.Load())
			}
			if o := opened(); len(o) == 0 || slices.ContainsFunc(o, func(z string) bool { return z != hung.Addr() }) {
				t.Errorf("zones opened %v, want only the hung master's, %s", o, hung.Addr())
			}
			if n, state := b.Open(), b.State(); n > 1 || state == BreakerClosed {
				t.Errorf("%d zones open, state %s; want at most the hung master's, and not closed", n, state)
			}
		})
	}
}

// The settlements of gateway batches accepted on two masters just before
// one of them hangs (their upstreams answered after it did) are one Go
// job each, split over both masters: the hung master's part fails, the
// healthy one's is made. Decide counts a call that failed in part in each
// zone by its own claims (zonesIn), but Settle, like Release,
// counted the hung master's timeout in the healthy master's zone too: a
// burst of them opened it, and every asset on the healthy master was
// answered ErrBreakerOpen (on_store_error) though its master answered
// every command.
func TestASettlementSpanningAHungMasterOpensNoHealthyZone(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	_, s, zone, opened := zonedClusterStore(t, cluster, 3, time.Second)
	ctx := context.Background()
	claim := parkedClaims(testPolicy(Tumbling))
	hung := cluster.Nodes()[0]
	var batches [][]*Claim // each: a claim on a healthy master, one on the hung one
	var healthy string
	for i := 0; len(batches) < 3; i++ {
		c := claim(fmt.Sprintf("veh-%d", i), uint64(i+1))
		if z := zone(c.Key()); z == hung.Addr() || (healthy != "" && z != healthy) {
			continue
		}
		healthy = zone(c.Key())
		for j := 0; ; j++ {
			h := claim(fmt.Sprintf("veh-%d-%d", i, j), uint64(1000*i+j+1))
			if zone(h.Key()) == hung.Addr() {
				batches = append(batches, []*Claim{c, h})
				break
			}
		}
	}
	for _, claims := range batches {
		if v, err := s.Decide(ctx, claims); err != nil || v[0].Decision != Accepted || v[1].Decision != Accepted {
			t.Fatalf("setup: %v %v", v, err)
		}
	}

	hung.Pause()
	defer hung.Resume()
	for i, claims := range batches {
		done := make(chan error, 1)
		s.Settle(claims, func(err error) { done <- err })
		if err := <-done; err == nil {
			t.Fatalf("setup: settlement %d with a master hung succeeded", i+1)
		}
	}
	for i := range 3 {
		c := claim(fmt.Sprintf("after-%d", i), uint64(5000+i))
		if zone(c.Key()) != healthy {
			continue
		}
		if _, err := s.Decide(ctx, []*Claim{c}); err != nil {
			t.Fatalf("an asset on the healthy master %s after 3 settlements that its master made: %v (zones opened: %v)", healthy, err, opened())
		}
	}
	if o := opened(); slices.Contains(o, healthy) {
		t.Fatalf("zones opened %v; want only the hung master's %s: the healthy master %s made every settlement sent to it", o, hung.Addr(), healthy)
	}
}

// parkedClaims makes claims of the parked ping under pol, one an asset,
// claimed now.
func parkedClaims(pol *Policy) func(asset string, token uint64) *Claim {
	return func(asset string, token uint64) *Claim {
		p := parked
		p.Asset = asset
		return claimOf(pol, p, token, time.Now())
	}
}

// zonedClusterStore is a breaker in zones (failures and cooldown as
// NewBreaker's), a RedisStore on cluster behind it, the zone of a key, and
// the zones the breaker has opened so far, in order.
func zonedClusterStore(t *testing.T, cluster *redistest.Cluster, failures int, cooldown time.Duration) (*Breaker, Store, func(key string) string, func() []string) {
	t.Helper()
	client, pipe := clusterPipeline(t, cluster)
	b, zone, opened := zonedBreaker(client, failures, cooldown)
	return b, b.Guard(NewRedisStore(pipe, 200*time.Millisecond)), zone, opened
}

// clusterPipeline is a Cluster client on cluster and a pipeline on it,
// both closed when the test ends.
func clusterPipeline(t *testing.T, cluster *redistest.Cluster) (*redis.ClusterClient, *pipeline.Pipeline) {
	t.Helper()
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), ContextTimeoutEnabled: true})
	pipe := pipeline.New(client)
	t.Cleanup(func() { pipe.Close(); _ = client.Close() })
	return client, pipe
}

// zonedBreaker is a breaker in zones, one a master of client's (failures
// and cooldown as NewBreaker's), the zone of a key, and the zones it has
// opened so far, in order.
func zonedBreaker(client *redis.ClusterClient, failures int, cooldown time.Duration) (*Breaker, func(key string) string, func() []string) {
	b := NewBreaker(failures, cooldown, nil)
	zone := ClusterMasterZone(client, 200*time.Millisecond)
	var mu sync.Mutex
	var opened []string
	b.ZoneBy(zone, func(zone string, _, to BreakerState, _ error) {
		if to == BreakerOpen {
			mu.Lock()
			opened = append(opened, zone)
			mu.Unlock()
		}
	})
	return b, zone, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(opened)
	}
}

// On a Cluster, a master that failed over (its slots now at its replica's
// address) has its zone forgotten after zoneIdle; forgotten open, it is
// told so (a last transition with ErrZoneForgotten, which the connection
// logs as forgotten, not as closed: helper 8 found a master still down
// whose slots had no key for a minute told closed), so that the log's
// "opened" warning for that master is not the last word on it, with every
// call succeeding and breakers_open back at 0. (Helper 7's review, stop
// 62.)
func TestAFailedOverMastersOutageEndsInTheLog(t *testing.T) {
	b := NewBreaker(2, time.Second, nil)
	masterOf := map[string]string{"a": "10.0.0.1:6379", "b": "10.0.0.2:6379"}
	assetOf := map[string]string{}
	var mu sync.Mutex
	state := map[string]BreakerState{}
	causes := map[string]error{}
	b.ZoneBy(func(key string) string { return masterOf[assetOf[key]] }, func(zone string, from, to BreakerState, cause error) {
		mu.Lock()
		defer mu.Unlock()
		state[zone], causes[zone] = to, cause
	})
	clock := articleBase
	b.now = func() time.Time { return clock }
	store := &flakyStore{down: errors.New("i/o timeout")}
	s := b.Guard(store)
	ctx := context.Background()
	on := func(asset string) []*Claim {
		p := parked
		p.Asset = asset
		c := claimOf(testPolicy(Tumbling), p, 1, clock)
		assetOf[c.Key()] = asset
		return []*Claim{c}
	}
	s.Decide(ctx, on("a"))
	s.Decide(ctx, on("a"))
	if state["10.0.0.1:6379"] != BreakerOpen {
		t.Fatalf("setup: master a's zone is %v to the log, want open", state["10.0.0.1:6379"])
	}
	masterOf["a"] = "10.0.0.3:6379" // failed over to its replica
	store.down = nil
	for range 3 {
		clock = clock.Add(time.Minute)
		for _, asset := range []string{"a", "b"} {
			if _, err := s.Decide(ctx, on(asset)); err != nil {
				t.Fatalf("asset %s after the failover: %v", asset, err)
			}
		}
	}
	mu.Lock()
	st, cause := state["10.0.0.1:6379"], causes["10.0.0.1:6379"]
	mu.Unlock()
	// Told by the calls alone: it was told only when breakers_open was
	// read, at a metrics scrape (helper 9's review).
	if st != BreakerClosed || !errors.Is(cause, ErrZoneForgotten) {
		t.Errorf("3 minutes after master 10.0.0.1 failed over, every call succeeding and no metrics scrape, the last transition "+
			"the log was told for its zone is %v (%v): its 'opened' warning is followed by no word that the breaker forgot it", st, cause)
	}
	if n := b.Open(); n != 0 {
		t.Errorf("%d zones open 3 minutes after the failover", n)
	}
}
