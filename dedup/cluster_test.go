package dedup

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// A 3-master Redis Cluster decides every shape exactly as the memory store
// (and so as a standalone Redis) does: the scripts' keys share a hash slot,
// so no CROSSSLOT error, and decisions do not depend on the topology.
func TestClusterAgreesWithMemory(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), ContextTimeoutEnabled: true})
	store := newRedisStoreOn(t, client)
	for _, shape := range Shapes {
		t.Run(string(shape), func(t *testing.T) {
			for seed := range uint64(10) {
				err := client.ForEachMaster(context.Background(), func(ctx context.Context, m *redis.Client) error {
					return m.FlushAll(ctx).Err()
				})
				if err != nil {
					t.Fatal(err)
				}
				pol := testPolicy(shape)
				compareStreams(t, newStream(seed), pol, NewMemoryStore(0), store)
			}
		})
	}

	// The keys of the stream's assets spread over the masters.
	nodes := map[string]bool{}
	k := defaultKeyer()
	for i := range 30 {
		state, seen := k.TrackKeys(fmt.Sprintf("veh-%d", i), articleBase)
		n1, n2 := cluster.NodeFor(state), cluster.NodeFor(seen)
		if n1 != n2 {
			t.Fatalf("an asset's state and seen keys live on different nodes: %s, %s", state, seen)
		}
		nodes[n1.Addr()] = true
	}
	if len(nodes) != 3 {
		t.Errorf("30 assets' keys landed on %d of 3 masters", len(nodes))
	}
}
