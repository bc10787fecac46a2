package redistest

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	s := Start(t)
	c := s.Client()
	if err := c.Set(ctxTimeout(t, 2*time.Second), "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}

	s.Pause()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	began := time.Now()
	err := c.Get(ctx, "k").Err()
	cancel()
	if !isTimeout(err) {
		t.Fatalf("GET on a paused server: got %v, want a timeout", err)
	}
	if took := time.Since(began); took > 2*time.Second {
		t.Errorf("GET on a paused server took %v to time out", took)
	}

	s.Resume()
	got, err := c.Get(ctxTimeout(t, 2*time.Second), "k").Result()
	if err != nil || got != "v" {
		t.Fatalf("GET after Resume = %q, %v; want v", got, err)
	}
}

func TestKillPausedServer(t *testing.T) {
	t.Parallel()
	s := Start(t)
	s.Pause()
	began := time.Now()
	s.Kill()
	if took := time.Since(began); took > 2*time.Second {
		t.Errorf("Kill of a paused server took %v", took)
	}
	s.Restart()
	if err := s.Client().Ping(ctxTimeout(t, 2*time.Second)).Err(); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
	s.Pause() // left paused on purpose: cleanup must not hang on it
}

func TestStartWithAndAddUser(t *testing.T) {
	t.Parallel()
	s := StartWith(t, "--requirepass", "admin-secret")
	ctx := ctxTimeout(t, 5*time.Second)

	anon := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer anon.Close()
	if err := anon.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("PING without a password: got %v, want NOAUTH (are StartWith's args applied?)", err)
	}
	if err := s.Client().Ping(ctx).Err(); err != nil {
		t.Fatalf("Client on a --requirepass server: %v", err)
	}

	s.AddUser(t, "alice", "alice-secret")
	alice := redis.NewClient(&redis.Options{Addr: s.Addr(), Username: "alice", Password: "alice-secret"})
	defer alice.Close()
	if err := alice.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET as alice: %v", err)
	}
	wrong := redis.NewClient(&redis.Options{Addr: s.Addr(), Username: "alice", Password: "nope", MaxRetries: -1})
	defer wrong.Close()
	if err := wrong.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("PING as alice with a wrong password: got %v, want WRONGPASS", err)
	}

	s.Restart()
	if err := anon.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("PING without a password after Restart: got %v, want NOAUTH", err)
	}
}

func TestTLS(t *testing.T) {
	t.Parallel()
	s, files := StartTLS(t)
	ctx := ctxTimeout(t, 10*time.Second)

	if err := s.Client().Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET through Client: %v", err)
	}

	if !strings.HasPrefix(s.URL(), "rediss://") {
		t.Fatalf("URL() = %s, want rediss://", s.URL())
	}
	opt, err := redis.ParseURL(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	conf, err := files.Config()
	if err != nil {
		t.Fatal(err)
	}
	opt.TLSConfig = conf
	byURL := redis.NewClient(opt)
	defer byURL.Close()
	if got, err := byURL.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET through the URL with the client certificate = %q, %v", got, err)
	}

	// The certificate is for 127.0.0.1 as well as localhost.
	byIP := conf.Clone()
	byIP.ServerName = ""
	ipClient := redis.NewClient(&redis.Options{Addr: s.Addr(), TLSConfig: byIP})
	defer ipClient.Close()
	if err := ipClient.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING verifying the server by IP: %v", err)
	}

	plain := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer plain.Close()
	if err := plain.Ping(ctxTimeout(t, 2*time.Second)).Err(); err == nil {
		t.Fatal("a plain TCP client got an answer from the TLS port")
	}

	noCert := &tls.Config{RootCAs: conf.RootCAs, ServerName: files.ServerName}
	anon := redis.NewClient(&redis.Options{Addr: s.Addr(), TLSConfig: noCert, MaxRetries: -1})
	defer anon.Close()
	if err := anon.Ping(ctxTimeout(t, 2*time.Second)).Err(); err == nil {
		t.Fatal("a TLS client without a client certificate got an answer")
	}
}

func TestCluster(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, 3)
	if len(c.Nodes()) != 3 || len(c.Addrs()) != 3 {
		t.Fatalf("got %d nodes, %d addrs; want 3", len(c.Nodes()), len(c.Addrs()))
	}
	ctx := ctxTimeout(t, 10*time.Second)
	cc := c.Client()

	perNode := map[*Server]int{}
	for i := range 100 {
		key := "key-" + strconv.Itoa(i)
		if err := cc.Set(ctx, key, key, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", key, err)
		}
		n := c.NodeFor(key)
		perNode[n]++
		// The key is really stored on that node, whose plain client does
		// not follow redirections.
		if got, err := n.Client().Get(ctx, key).Result(); err != nil || got != key {
			t.Fatalf("GET %s on its node %s = %q, %v", key, n.Addr(), got, err)
		}
	}
	if len(perNode) != 3 {
		t.Fatalf("100 keys landed on %d nodes, want 3", len(perNode))
	}

	a, b := "{user:42}:name", "{user:42}:email"
	if c.NodeFor(a) != c.NodeFor(b) {
		t.Fatalf("%s and %s landed on different nodes", a, b)
	}
	sa, err := cc.ClusterKeySlot(ctx, a).Result()
	if err != nil {
		t.Fatal(err)
	}
	sb, err := cc.ClusterKeySlot(ctx, b).Result()
	if err != nil || sa != sb {
		t.Fatalf("slots of %s and %s: %d, %d (%v)", a, b, sa, sb, err)
	}
	// A multi-key command on the same tag works; it is what hash tags are for.
	if err := cc.MSet(ctx, a, "n", b, "e").Err(); err != nil {
		t.Fatalf("MSET with one hash tag: %v", err)
	}
}

func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	began := time.Now()
	st := StartSentinel(t)
	t.Logf("sentinel setup ready in %v", time.Since(began))
	if len(st.Addrs()) != 3 {
		t.Fatalf("got %d sentinels, want 3", len(st.Addrs()))
	}
	oldMaster, replica := st.Master(), st.Replica()
	if oldMaster == replica {
		t.Fatal("Master and Replica are the same server")
	}

	ctx := ctxTimeout(t, 60*time.Second)
	fc := st.FailoverClient()
	if err := fc.Set(ctx, "before", "1", 0).Err(); err != nil {
		t.Fatalf("SET before failover: %v", err)
	}
	// Replication is asynchronous: make sure the key reached the replica
	// before the master dies, or the check below would be racy.
	if n, err := fc.Do(ctx, "WAIT", 1, 5000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v", n, err)
	}

	oldMaster.Kill()
	began = time.Now()
	addr := st.WaitForFailover(t, 30*time.Second)
	t.Logf("failover took %v", time.Since(began))
	if addr != replica.Addr() {
		t.Fatalf("new master is %s, want the replica %s", addr, replica.Addr())
	}
	if st.Master() != replica || st.Replica() != oldMaster {
		t.Fatalf("after failover Master() = %s, Replica() = %s", st.Master().Addr(), st.Replica().Addr())
	}

	if err := fc.Set(ctx, "after", "1", 0).Err(); err != nil {
		t.Fatalf("SET after failover: %v", err)
	}
	if got, err := replica.Client().Get(ctx, "after").Result(); err != nil || got != "1" {
		t.Fatalf("GET after on the new master = %q, %v", got, err)
	}
	if got, err := fc.Get(ctx, "before").Result(); err != nil || got != "1" {
		t.Fatalf("GET before after failover = %q, %v", got, err)
	}
}
