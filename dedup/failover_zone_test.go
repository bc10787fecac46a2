package dedup

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"
)

// On a Cluster the handler releases through a FailoverStore (README,
// Sentinel failover: "on Sentinel and on a Cluster each release goes to
// its master on a connection of its own"). The releases of gateway
// batches accepted on two masters, whose upstreams failed after one of the
// masters hung, fail at the hung master; FailoverStore.Release answers a
// plain error, not one that says which claims failed (a ReleaseError or
// a PartialError, as RedisStore.Release and Settle do), so the breaker
// counts the hung master's timeout in the healthy master's zone too
// (countByClaim falls back to count). A burst of them opens the healthy
// zone, and every asset on the healthy master is answered ErrBreakerOpen
// (on_store_error: unchecked, or 503 failing closed) though its master
// never failed (here its releases were not even sent: releaseOn goes
// master after master on one shared timeout, and releaseOrder put the hung
// master's claim first, so the healthy one's group found its time used up;
// README, Redis Cluster: "A master's outage is confined to its own
// slots"). TestASettlementSpanningAHungMaster-
// OpensNoHealthyZone fixed this for settlements; README, Redis Cluster: "a
// troubled master's failures no longer count toward opening the zones of
// the other masters such requests touch".
// (Helper 2's audit, stop 59: so it was until then; the test holds the fix.)
func TestAFailoverReleaseSpanningAHungMasterOpensNoHealthyZone(t *testing.T) {
	cluster, client, fs := failoverOnCluster(t, 200*time.Millisecond)
	b, zone, zonesOpened := zonedBreaker(client, 3, time.Second)
	s := b.Guard(fs)
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
		if _, err := s.Release(ctx, claims); err == nil {
			t.Fatalf("setup: release %d with a master hung succeeded", i+1)
		}
	}
	for i := range 6 {
		c := claim(fmt.Sprintf("after-%d", i), uint64(5000+i))
		if zone(c.Key()) != healthy {
			continue
		}
		if _, err := s.Decide(ctx, []*Claim{c}); err != nil {
			t.Errorf("an asset on the healthy master %s after 3 batch releases failed at the other master: %v (zones opened: %v)", healthy, err, zonesOpened())
			break
		}
	}
	if opened := zonesOpened(); slices.Contains(opened, healthy) {
		t.Errorf("zones opened %v; want only the hung master's %s: the healthy master %s failed nothing", opened, hung.Addr(), healthy)
	}
}
