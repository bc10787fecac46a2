package redistest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster of master-only nodes owned by a test, ready to
// take commands in every slot.
//
// To see which node a key lives on, use NodeFor, which asks the cluster
// (CLUSTER KEYSLOT, then CLUSTER SLOTS). Client().ClusterKeySlot(ctx, key)
// gives just the slot, and Client().MasterForKey(ctx, key) the client's own,
// possibly stale, idea of the owner. Keys with the same hash tag ("{user:1}:a"
// and "{user:1}:b") always share a slot and so a node.
type Cluster struct {
	t      testing.TB
	nodes  []*Server
	client *redis.ClusterClient
}

// StartCluster runs a cluster of masters nodes (at least 3, as redis-cli
// requires) without replicas, so that tests of cluster-aware code meet real
// MOVED redirections and cross-slot errors. It returns once every node
// reports cluster_state:ok and a client has written to every master. The
// cluster is stopped when the test ends.
//
// Each node also uses a second free port for its cluster bus
// (--cluster-port), so no node depends on its port+10000 being free. A node
// can be killed and restarted like any Server; it comes back with its slots
// because its nodes-<port>.conf is kept.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	if masters < 3 {
		t.Fatalf("StartCluster(%d): a Redis Cluster needs at least 3 masters", masters)
	}
	requireBinary(t, "redis-cli")
	c := &Cluster{t: t}
	for range masters {
		c.nodes = append(c.nodes, launch(t, nil, func(s *Server) ([]string, error) {
			bus := freePort(t) // never s.port: freePort hands out a port once
			return append(baseArgs(s),
				"--cluster-enabled", "yes",
				"--cluster-config-file", filepath.Join(s.dir, fmt.Sprintf("nodes-%d.conf", s.port)),
				"--cluster-port", strconv.Itoa(bus),
				"--cluster-node-timeout", "2000",
			), nil
		}))
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}

	c.client = redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 c.Addrs(),
		ContextTimeoutEnabled: true, // as Server.Client
	})
	t.Cleanup(func() { _ = c.client.Close() })
	if err := c.waitReady(ctx); err != nil {
		t.Fatalf("cluster on %v did not become ready: %v", c.Addrs(), err)
	}
	return c
}

// Addrs are the nodes' host:port addresses, in the order of Nodes, as seed
// addresses for a cluster client.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Nodes are the cluster's servers, so that a test can kill, pause or talk to
// one node directly (its Client does not follow redirections).
func (c *Cluster) Nodes() []*Server { return slices.Clone(c.nodes) }

// Client is a cluster client on all nodes, shared by the test's calls and
// closed when the test ends. Like Server.Client it honours context deadlines.
func (c *Cluster) Client() *redis.ClusterClient { return c.client }

// NodeFor returns the node that owns key's slot according to the cluster
// itself, so that tests can check where data lands or kill the node holding
// a key.
func (c *Cluster) NodeFor(key string) *Server {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := c.nodeFor(ctx, key)
	if err != nil {
		c.t.Fatalf("finding the node of key %q: %v", key, err)
	}
	return n
}

func (c *Cluster) nodeFor(ctx context.Context, key string) (*Server, error) {
	slot, err := c.client.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		return nil, err
	}
	return c.ownerOf(ctx, slot)
}

// servesSlot reports whether the shard holds the slot.
func servesSlot(sh redis.ClusterShard, slot int64) bool {
	for _, r := range sh.Slots {
		if r.Start <= slot && slot <= r.End {
			return true
		}
	}
	return false
}

// waitReady waits until every node sees the whole cluster as healthy and
// the client can write through each master, which is when the tests' first
// commands can no longer fail with CLUSTERDOWN or a stale slot map.
func (c *Cluster) waitReady(ctx context.Context) error {
	var last error
	for {
		if last = c.allNodesOK(ctx); last == nil {
			if last = c.writeToEveryMaster(ctx); last == nil {
				return nil
			}
			c.client.ReloadState(ctx)
		}
		select {
		case <-ctx.Done():
			return last
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *Cluster) allNodesOK(ctx context.Context) error {
	for _, n := range c.nodes {
		nc := redis.NewClient(n.options())
		info, err := nc.ClusterInfo(ctx).Result()
		_ = nc.Close()
		if err != nil {
			return fmt.Errorf("CLUSTER INFO on %s: %w", n.Addr(), err)
		}
		state, known := infoField(info, "cluster_state"), infoField(info, "cluster_known_nodes")
		if state != "ok" || known != strconv.Itoa(len(c.nodes)) {
			return fmt.Errorf("%s reports cluster_state:%s cluster_known_nodes:%s", n.Addr(), state, known)
		}
	}
	return nil
}

func (c *Cluster) writeToEveryMaster(ctx context.Context) error {
	hit := map[*Server]bool{}
	var keys []string
	defer func() {
		for _, k := range keys {
			_ = c.client.Del(ctx, k).Err()
		}
	}()
	for i := 0; len(hit) < len(c.nodes); i++ {
		if i == 10000 {
			return fmt.Errorf("no key reached some master: hit %d of %d", len(hit), len(c.nodes))
		}
		key := "{redistest-ready-" + strconv.Itoa(i) + "}"
		keys = append(keys, key)
		if err := c.client.Set(ctx, key, "1", 0).Err(); err != nil {
			return fmt.Errorf("SET %s: %w", key, err)
		}
		if got, err := c.client.Get(ctx, key).Result(); err != nil || got != "1" {
			return fmt.Errorf("GET %s = %q, %v", key, got, err)
		}
		n, err := c.nodeFor(ctx, key)
		if err != nil {
			return err
		}
		hit[n] = true
	}
	return nil
}

// MigrateSlot moves slot to the master to, as redis-cli --cluster reshard
// does, while the cluster keeps serving it: the slot is marked IMPORTING on
// to and MIGRATING on its owner, its keys go over one MIGRATE ... KEYS at a
// time with pause after each (so that commands meet the slot half moved),
// and every master is then told the slot is to's. A slot already on to is
// left alone.
func (c *Cluster) MigrateSlot(slot int64, to *Server, pause time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	from, err := c.ownerOf(ctx, slot)
	if err != nil || from == to {
		return err
	}
	fc, tc := redis.NewClient(from.options()), redis.NewClient(to.options())
	defer fc.Close()
	defer tc.Close()
	fromID, err := fc.ClusterMyID(ctx).Result()
	if err != nil {
		return err
	}
	toID, err := tc.ClusterMyID(ctx).Result()
	if err != nil {
		return err
	}
	s := strconv.FormatInt(slot, 10)
	if err := tc.Do(ctx, "CLUSTER", "SETSLOT", s, "IMPORTING", fromID).Err(); err != nil {
		return fmt.Errorf("SETSLOT %s IMPORTING on %s: %w", s, to.Addr(), err)
	}
	if err := fc.Do(ctx, "CLUSTER", "SETSLOT", s, "MIGRATING", toID).Err(); err != nil {
		return fmt.Errorf("SETSLOT %s MIGRATING on %s: %w", s, from.Addr(), err)
	}
	for {
		keys, err := fc.ClusterGetKeysInSlot(ctx, int(slot), 10).Result()
		if err != nil {
			return err
		}
		if len(keys) == 0 {
			break
		}
		for _, key := range keys {
			if err := fc.Do(ctx, "MIGRATE", "127.0.0.1", to.port, "", 0, 5000, "KEYS", key).Err(); err != nil {
				return fmt.Errorf("MIGRATE %s from %s to %s: %w", key, from.Addr(), to.Addr(), err)
			}
			time.Sleep(pause)
		}
	}
	// The new owner first, as redis-cli does: it then answers for the slot
	// before the old one sends MOVED there.
	order := []*Server{to, from}
	for _, n := range c.nodes {
		if n != to && n != from {
			order = append(order, n)
		}
	}
	for _, n := range order {
		nc := redis.NewClient(n.options())
		err := nc.Do(ctx, "CLUSTER", "SETSLOT", s, "NODE", toID).Err()
		_ = nc.Close()
		if err != nil {
			return fmt.Errorf("SETSLOT %s NODE on %s: %w", s, n.Addr(), err)
		}
	}
	return nil
}

// ownerOf returns the master that serves slot, according to the cluster.
func (c *Cluster) ownerOf(ctx context.Context, slot int64) (*Server, error) {
	shards, err := c.client.ClusterShards(ctx).Result()
	if err != nil {
		return nil, err
	}
	for _, sh := range shards {
		if !servesSlot(sh, slot) {
			continue
		}
		for _, m := range sh.Nodes {
			if m.Role != "master" {
				continue
			}
			addr := net.JoinHostPort(m.IP, strconv.FormatInt(m.Port, 10))
			for _, n := range c.nodes {
				if n.Addr() == addr {
					return n, nil
				}
			}
			return nil, fmt.Errorf("slot %d is served by %s, which is not one of %v", slot, addr, c.Addrs())
		}
	}
	return nil, fmt.Errorf("slot %d is not served by any node", slot)
}
