package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Sentinel is a master, one replica and three sentinels watching them, owned
// by a test, so that failover handling can be tested against real Redis
// Sentinel: kill Master(), call WaitForFailover, and the replica has taken
// over.
//
// The sentinels notice a dead master after one second
// (down-after-milliseconds 1000); a failover then usually completes within
// a few seconds, and within about 15 when the sentinels' first leader
// election is split.
type Sentinel struct {
	// MasterName is the name the sentinels monitor the master under, which
	// clients pass as redis.FailoverOptions.MasterName.
	MasterName string

	t         testing.TB
	data      [2]*Server // the first master and the first replica
	sentinels []*Server

	mu         sync.Mutex
	masterAddr string // last master the sentinels agreed on in StartSentinel or WaitForFailover
}

const sentinelQuorum = 2

// StartSentinel starts the master, the replica (--replicaof the master) and
// three sentinels (quorum 2), and returns once the replica is in sync and
// every sentinel knows the master, the replica and the two other sentinels,
// which is what a failover needs. Everything is stopped when the test ends.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	return startSentinel(t, func(master *Server) string { return master.Addr() })
}

// StartSentinelLinked is StartSentinel with the replica replicating through
// a Link, which it returns: a test can then keep the master's last writes
// from the replica before it kills the master.
func StartSentinelLinked(t testing.TB) (*Sentinel, *Link) {
	t.Helper()
	var link *Link
	st := startSentinel(t, func(master *Server) string {
		link = StartLink(t, master.Addr())
		return link.Addr()
	})
	return st, link
}

// startSentinel starts the setup with the replica replicating from the
// address replicaOf gives for the master.
func startSentinel(t testing.TB, replicaOf func(master *Server) string) *Sentinel {
	t.Helper()
	st := &Sentinel{MasterName: "redistest", t: t}
	// Without a delay a diskless full sync starts at once, instead of after
	// the 5s the master would wait for more replicas to join it; the replica
	// may become a master and sync another server.
	noDelay := []string{"--repl-diskless-sync-delay", "0"}
	master := StartWith(t, noDelay...)
	host, port, err := net.SplitHostPort(replicaOf(master))
	if err != nil {
		t.Fatal(err)
	}
	replica := StartWith(t, append(noDelay, "--replicaof", host, port)...)
	st.data = [2]*Server{master, replica}
	st.masterAddr = master.Addr()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := poll(ctx, func() error { return replicaInSync(ctx, master, replica) }); err != nil {
		t.Fatalf("replica %s did not sync with master %s: %v", replica.Addr(), master.Addr(), err)
	}

	for range 3 {
		st.sentinels = append(st.sentinels, launch(t, nil, func(s *Server) ([]string, error) {
			// Written anew on each attempt: the port is in it, and a
			// sentinel rewrites the file (so it must stay writable).
			conf := filepath.Join(s.dir, "sentinel.conf")
			name := st.MasterName
			text := strings.Join([]string{
				"port " + strconv.Itoa(s.port),
				"bind 127.0.0.1",
				"dir " + s.dir,
				"sentinel resolve-hostnames no",
				fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d %d", name, master.port, sentinelQuorum),
				fmt.Sprintf("sentinel down-after-milliseconds %s 1000", name),
				fmt.Sprintf("sentinel failover-timeout %s 5000", name),
				fmt.Sprintf("sentinel parallel-syncs %s 1", name),
			}, "\n") + "\n"
			if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
				return nil, err
			}
			return []string{conf, "--sentinel"}, nil
		}))
	}
	for _, s := range st.sentinels {
		if err := poll(ctx, func() error { return st.sentinelReady(ctx, s) }); err != nil {
			t.Fatalf("sentinel %s did not discover the setup: %v", s.Addr(), err)
		}
	}
	return st
}

// Addrs are the sentinels' host:port addresses, as
// redis.FailoverOptions.SentinelAddrs.
func (st *Sentinel) Addrs() []string {
	addrs := make([]string, len(st.sentinels))
	for i, s := range st.sentinels {
		addrs[i] = s.Addr()
	}
	return addrs
}

// Master is the data server the sentinels currently agree is the master, so
// that a test can kill whichever server holds that role, also after a
// failover. While the sentinels disagree (during a failover) it is the last
// master they agreed on.
func (st *Sentinel) Master() *Server {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	addr, err := st.agreedMasterAddr(ctx)
	if err != nil {
		st.mu.Lock()
		addr = st.masterAddr
		st.mu.Unlock()
	}
	return st.dataServer(addr, true)
}

// Replica is the data server that is not Master: the replica before a
// failover, and the old, usually killed, master after one.
func (st *Sentinel) Replica() *Server {
	return st.dataServer(st.Master().Addr(), false)
}

func (st *Sentinel) dataServer(addr string, match bool) *Server {
	for _, s := range st.data {
		if (s.Addr() == addr) == match {
			return s
		}
	}
	st.t.Fatalf("the sentinels name %s as master, which is none of %s and %s",
		addr, st.data[0].Addr(), st.data[1].Addr())
	return nil
}

// FailoverClient returns a new Sentinel-backed client on the master, closed
// when the test ends: the kind of client whose reconnection to the new
// master a failover test is about. Like Server.Client it honours context
// deadlines.
func (st *Sentinel) FailoverClient() *redis.Client {
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            st.MasterName,
		SentinelAddrs:         st.Addrs(),
		ContextTimeoutEnabled: true, // as Server.Client
	})
	st.t.Cleanup(func() { _ = c.Close() })
	return c
}

// WaitForFailover waits, after the test has killed or paused the master,
// until the sentinels agree on another master and that server answers as
// role:master, and returns its address. It fails t if that takes longer
// than timeout (allow at least 15s, see Sentinel), or, while a sentinel is
// in tilt mode, tiltWaits more timeouts. Once it returns, a
// failover client dialing anew reaches the new master.
func (st *Sentinel) WaitForFailover(t testing.TB, timeout time.Duration) (newMasterAddr string) {
	t.Helper()
	st.mu.Lock()
	old := st.masterAddr
	st.mu.Unlock()
	var err error
	for waits := 0; waits == 0 || err != nil && waits <= tiltWaits && st.tilted(); waits++ {
		newMasterAddr, err = st.pollFailover(old, timeout)
	}
	if err != nil {
		t.Fatalf("no failover from %s within %v: %v", old, timeout, err)
	}
	st.mu.Lock()
	st.masterAddr = newMasterAddr
	st.mu.Unlock()
	return newMasterAddr
}

// tiltWaits is how many more timeouts WaitForFailover waits while a
// sentinel is in tilt mode: on a machine so loaded that its timers run
// late, a sentinel stops acting for 30 s after each late one, failovers
// included, as Sentinel is built to.
const tiltWaits = 2

// tilted reports whether a sentinel that answers is in tilt mode.
func (st *Sentinel) tilted() bool {
	for _, s := range st.sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		info := redis.NewStringCmd(ctx, "info", "sentinel")
		err := c.Process(ctx, info)
		cancel()
		_ = c.Close()
		if err == nil && infoField(info.Val(), "sentinel_tilt") == "1" {
			return true
		}
	}
	return false
}

// pollFailover waits up to timeout for the sentinels to agree on a master
// other than old that says it is one.
func (st *Sentinel) pollFailover(old string, timeout time.Duration) (newMasterAddr string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err = poll(ctx, func() error {
		addr, err := st.agreedMasterAddr(ctx)
		if err != nil {
			return err
		}
		if addr == old {
			return fmt.Errorf("the sentinels still name %s as master", old)
		}
		c := redis.NewClient(st.dataServer(addr, true).options())
		defer c.Close()
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			return fmt.Errorf("new master %s: %w", addr, err)
		}
		if role := infoField(info, "role"); role != "master" {
			return fmt.Errorf("new master %s still has role:%s", addr, role)
		}
		newMasterAddr = addr
		return nil
	})
	return newMasterAddr, err
}

// agreedMasterAddr asks every sentinel for the master's address and returns
// it if at least a quorum answered and all that answered agree; killed or
// paused sentinels are skipped.
func (st *Sentinel) agreedMasterAddr(ctx context.Context) (string, error) {
	seen := map[string]int{}
	answered := 0
	var lastErr error
	for _, s := range st.sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
		actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		hostPort, err := c.GetMasterAddrByName(actx, st.MasterName).Result()
		cancel()
		_ = c.Close()
		if err != nil || len(hostPort) != 2 {
			lastErr = fmt.Errorf("sentinel %s: %v %v", s.Addr(), hostPort, err)
			continue
		}
		answered++
		seen[net.JoinHostPort(hostPort[0], hostPort[1])]++
	}
	if answered < sentinelQuorum {
		return "", fmt.Errorf("only %d sentinels answered: %v", answered, lastErr)
	}
	if len(seen) != 1 {
		return "", fmt.Errorf("the sentinels disagree on the master: %v", seen)
	}
	for addr := range seen {
		return addr, nil
	}
	panic("unreachable")
}

// sentinelReady reports whether s monitors a healthy master, knows the
// replica as healthy, and knows both other sentinels.
func (st *Sentinel) sentinelReady(ctx context.Context, s *Server) error {
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr()})
	defer c.Close()
	m, err := c.Master(ctx, st.MasterName).Result()
	if err != nil {
		return err
	}
	if m["flags"] != "master" || m["num-slaves"] != "1" || m["num-other-sentinels"] != "2" {
		return fmt.Errorf("flags=%s num-slaves=%s num-other-sentinels=%s",
			m["flags"], m["num-slaves"], m["num-other-sentinels"])
	}
	replicas, err := c.Replicas(ctx, st.MasterName).Result()
	if err != nil {
		return err
	}
	if len(replicas) != 1 || replicas[0]["flags"] != "slave" || replicas[0]["master-link-status"] != "ok" {
		return fmt.Errorf("replicas: %v", replicas)
	}
	return nil
}

// replicaInSync reports whether the replication link between master and
// replica is up, as seen from both sides.
func replicaInSync(ctx context.Context, master, replica *Server) error {
	mc, rc := redis.NewClient(master.options()), redis.NewClient(replica.options())
	defer mc.Close()
	defer rc.Close()
	mi, err := mc.Info(ctx, "replication").Result()
	if err != nil {
		return err
	}
	ri, err := rc.Info(ctx, "replication").Result()
	if err != nil {
		return err
	}
	if n, link := infoField(mi, "connected_slaves"), infoField(ri, "master_link_status"); n != "1" || link != "up" {
		return fmt.Errorf("master connected_slaves:%s, replica master_link_status:%s", n, link)
	}
	return nil
}

// poll calls check every 100ms until it succeeds or ctx ends, and then
// returns check's last error.
func poll(ctx context.Context, check func() error) error {
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}
