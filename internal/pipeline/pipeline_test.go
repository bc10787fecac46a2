package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

func newPipeline(t *testing.T) *Pipeline {
	t.Helper()
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	p := New(c)
	t.Cleanup(func() {
		p.Close()
		_ = c.Close()
	})
	return p
}

// setNX queues SET key value NX GET: nil means this call won the key.
func setNX(key, value string) Cmd {
	return Cmd{Key: key, Queue: func(ctx context.Context, p redis.Pipeliner) redis.Cmder {
		return p.SetArgs(ctx, key, value, redis.SetArgs{Mode: "NX", Get: true})
	}}
}

func won(t *testing.T, c Cmd) bool {
	t.Helper()
	_, err := c.Result.(*redis.StatusCmd).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	return errors.Is(err, redis.Nil)
}

// Concurrent requests share round trips, and each command is answered as
// if it had gone alone: exactly one winner per key.
func TestConcurrentRequestsShareRoundTrips(t *testing.T) {
	const keys, copies = 200, 4
	p := newPipeline(t)
	wins := make([]int, keys)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for k := range keys {
		for c := range copies {
			wg.Go(func() {
				cmds := []Cmd{setNX(fmt.Sprintf("key-%d", k), fmt.Sprint(c))}
				if err := p.Do(context.Background(), time.Minute, cmds); err != nil {
					t.Error(err)
					return
				}
				if won(t, cmds[0]) {
					mu.Lock()
					wins[k]++
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	for k, n := range wins {
		if n != 1 {
			t.Fatalf("key-%d had %d winners, want 1", k, n)
		}
	}
	roundTrips, commands := p.RoundTrips()
	t.Logf("%d concurrent commands took %d round trips", commands, roundTrips)
	if commands != keys*copies || roundTrips >= commands {
		t.Fatalf("%d round trips for %d commands: concurrent requests should share them", roundTrips, commands)
	}
}

// A request alone goes at once: nobody waits for company.
func TestALoneRequestGoesAtOnce(t *testing.T) {
	p := newPipeline(t)
	for i := range 5 {
		err := p.Do(context.Background(), 10*time.Second, []Cmd{setNX(fmt.Sprintf("alone-%d", i), "x")}) // a wait for a batch to fill would time out
		if err != nil {
			t.Fatal(err)
		}
		if rt, n := p.RoundTrips(); rt != uint64(i+1) || n != uint64(i+1) {
			t.Fatalf("after %d lone requests: %d round trips, %d commands", i+1, rt, n)
		}
	}
}

// A script Redis does not know yet is loaded and run in the same call.
func TestScriptsAreLoadedOnFirstUse(t *testing.T) {
	p := newPipeline(t)
	script := redis.NewScript(`return ARGV[1] .. KEYS[1]`)
	for range 2 {
		cmds := []Cmd{EvalSha(script, []string{"k"}, "v")}
		if err := p.Do(context.Background(), time.Minute, cmds); err != nil {
			t.Fatal(err)
		}
		if got, _ := cmds[0].Result.(*redis.Cmd).Text(); got != "vk" {
			t.Fatalf("script answered %q, want vk", got)
		}
	}
}

// A command whose caller gave up while it waited in the queue is never
// sent, not even in the batch of a later caller who still waits: a claim
// written after its request was told the store failed would stand as an
// orphan.
func TestCommandsOfCallersThatGaveUpAreNeverSent(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	// Pipeline connections ready before the hang: a new one would wait in
	// its handshake, before any command is written.
	var warm sync.WaitGroup
	for range 4 {
		warm.Go(func() {
			c.Pipelined(context.Background(), func(p redis.Pipeliner) error { return p.Do(context.Background(), "BLPOP", "nothing", "0.05").Err() })
		})
	}
	warm.Wait()
	p := New(c)
	t.Cleanup(p.Close)
	do := func(key string, timeout time.Duration) error {
		return p.Do(context.Background(), timeout, []Cmd{setNX(key, "x")})
	}

	srv.Pause()
	var busy, waiting sync.WaitGroup
	busy.Go(func() { do("busy", time.Second) }) // the writer waits on the hung server
	waitUntil(t, func() bool { s := p.one; s.mu.Lock(); defer s.mu.Unlock(); return s.sending && len(s.queue) == 0 })
	if err := do("gave-up", 50*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a queued command behind a hung server: %v, want its deadline", err)
	}
	var stillWaits error
	waiting.Go(func() { stillWaits = do("still-waits", 10*time.Second) }) // queued behind the writer, with a later deadline
	waitUntil(t, func() bool { s := p.one; s.mu.Lock(); defer s.mu.Unlock(); return len(s.queue) == 2 })
	busy.Wait() // the writer gives up; still-waits goes, and is answered once the server is back
	srv.Resume()
	waiting.Wait()
	if stillWaits != nil {
		t.Fatalf("the command queued with a later deadline: %v", stillWaits)
	}

	inspect := srv.Client()
	for key, want := range map[string]int64{"busy": 1, "still-waits": 1, "gave-up": 0} {
		if n, err := inspect.Exists(context.Background(), key).Result(); err != nil || n != want {
			t.Errorf("EXISTS %s = %d, %v; want %d", key, n, err, want)
		}
	}
}

// Commands queued with Go are sent without their caller waiting, reach
// Redis ahead of everything queued after Go returned, and have their
// answer given to then.
func TestGoSendsAheadOfLaterCommands(t *testing.T) {
	p := newPipeline(t)
	for i := range 200 {
		key := fmt.Sprintf("go-%d", i)
		answered := make(chan error, 1)
		p.Go(time.Minute, []Cmd{setNX(key, "first")}, func(err error) { answered <- err })
		later := []Cmd{setNX(key, "later")}
		if err := p.Do(context.Background(), time.Minute, later); err != nil {
			t.Fatal(err)
		}
		if won(t, later[0]) {
			t.Fatalf("%s: a command queued after Go returned reached Redis first", key)
		}
		if err := <-answered; err != nil {
			t.Fatalf("%s: Go's command answered %v", key, err)
		}
	}
}

// Close sends what Go queued before it returns, and commands queued after
// it are answered ErrClosed, not lost in a queue nobody sends.
func TestCloseSendsWhatIsQueued(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	p := New(c)
	const queued = 500
	var answers sync.WaitGroup
	for i := range queued {
		answers.Add(1)
		p.Go(time.Minute, []Cmd{setNX(fmt.Sprintf("queued-%d", i), "x")}, func(err error) {
			if err != nil {
				t.Error(err)
			}
			answers.Done()
		})
	}
	p.Close()
	answers.Wait() // every then was called
	if n, err := srv.Client().DBSize(context.Background()).Result(); err != nil || n != queued {
		t.Fatalf("after Close: %d keys, %v; want all %d queued before it", n, err, queued)
	}

	closed := make(chan error, 1)
	p.Go(time.Minute, []Cmd{setNX("after-close", "x")}, func(err error) { closed <- err })
	if err := <-closed; !errors.Is(err, ErrClosed) {
		t.Fatalf("Go after Close answered %v, want ErrClosed", err)
	}
	if err := p.Do(context.Background(), time.Minute, []Cmd{setNX("after-close", "x")}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Do after Close: %v, want ErrClosed", err)
	}
	p.Close() // a second Close is harmless
}

// On a Cluster, a hung master holds up only the commands for its own
// slots: while a call for its key waits out its timeout, a call for a key on
// another master is answered at once. With one queue for every master, that
// call waited behind the hung master's batch and timed out too.
func TestAHungMasterHoldsUpOnlyItsOwnKeys(t *testing.T) {
	p, _, hung, healthy := withAHungMaster(t)

	const hungTimeout = time.Second
	start := time.Now()
	hungErr := make(chan error, 1)
	go func() { hungErr <- p.Do(context.Background(), hungTimeout, []Cmd{setNX(hung, "x")}) }()
	time.Sleep(50 * time.Millisecond) // its batch is on its way to the hung master

	cmds := []Cmd{setNX(healthy, "x"), get(healthy)}
	if err := p.Do(context.Background(), hungTimeout/2, cmds); err != nil { // behind the hung batch, it would time out
		t.Fatalf("a call for a healthy master's key while another master hangs: %v", err)
	}
	if got, _ := cmds[1].Result.(*redis.StringCmd).Result(); !won(t, cmds[0]) || got != "x" {
		t.Fatalf("SET NX then GET on a healthy master: won %v, got %q", won(t, cmds[0]), got)
	}
	select {
	case err := <-hungErr:
		t.Fatalf("the call for the hung master's key returned %v before its timeout", err)
	default:
	}
	if err := <-hungErr; err == nil || time.Since(start) < hungTimeout {
		t.Fatalf("the call for the hung master's key: %v after %v, want an error after %v", err, time.Since(start), hungTimeout)
	}
}

// A call spanning a hung master and a healthy one ends at its timeout
// with the healthy master's answers: a PartialError names the hung one's
// commands, and nothing is written into the call's commands after it.
func TestACallSpanningAHungMasterKeepsTheOthersAnswers(t *testing.T) {
	p, master, hung, healthy := withAHungMaster(t)

	cmds := []Cmd{setNX(hung, "x"), setNX(healthy, "x"), get(healthy)}
	err := p.Do(context.Background(), 300*time.Millisecond, cmds)
	partial, ok := errors.AsType[*PartialError](err)
	// The hung part fails by the caller's timeout, or by its connection's
	// write or read deadline, which is the same instant.
	if !ok || !slices.Equal(partial.Failed, []bool{true, false, false}) {
		t.Fatalf("a call on a hung and a healthy master: %v; want a PartialError naming the hung master's command", err)
	}
	if got, _ := cmds[2].Result.(*redis.StringCmd).Result(); !won(t, cmds[1]) || got != "x" {
		t.Fatalf("the healthy master's answers: SET NX won %v, GET %q", won(t, cmds[1]), got)
	}
	hungResult := cmds[0].Result
	master.Resume()
	p.Flush()
	if cmds[0].Result != hungResult {
		t.Fatal("the hung master's answer was written into the call after its caller gave up")
	}
}

// On a Cluster, a call whose commands live on several masters is split
// among their shards and gets every answer in its own slice, scripts loaded
// on each master included, and the first error if a command fails; a Go
// call's then runs once, after every part.
func TestACallSpanningMastersGetsEveryAnswer(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	p := New(cluster.Client())
	keys := keysOnDistinctMasters(t, cluster, 3)
	script := redis.NewScript(`return ARGV[1] .. KEYS[1]`)
	var cmds []Cmd
	for _, k := range keys {
		cmds = append(cmds, setNX(k, "v-"+k), EvalSha(script, []string{k}, "s-"), get(k))
	}
	if err := p.Do(context.Background(), time.Minute, cmds); err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		ran, _ := cmds[3*i+1].Result.(*redis.Cmd).Text()
		got, _ := cmds[3*i+2].Result.(*redis.StringCmd).Result()
		if !won(t, cmds[3*i]) || ran != "s-"+k || got != "v-"+k {
			t.Errorf("%s: SET NX won %v, script answered %q, GET %q", k, won(t, cmds[3*i]), ran, got)
		}
	}

	lpush := Cmd{Key: keys[1], Queue: func(ctx context.Context, p redis.Pipeliner) redis.Cmder { return p.LPush(ctx, keys[1], "x") }}
	cmds = []Cmd{get(keys[0]), lpush, get(keys[2])}
	err := p.Do(context.Background(), time.Minute, cmds)
	if partial, ok := errors.AsType[*PartialError](err); !ok || !strings.HasPrefix(err.Error(), "WRONGTYPE") || !slices.Equal(partial.Failed, []bool{false, true, false}) {
		t.Fatalf("LPUSH on a string among other masters' commands: %v, want WRONGTYPE, failed for its master's part alone", err)
	}
	for _, i := range []int{0, 2} {
		if got, _ := cmds[i].Result.(*redis.StringCmd).Result(); got != "v-"+keys[i] {
			t.Errorf("GET %s beside a failing command: %q", keys[i], got)
		}
	}

	var thens atomic.Int32
	p.Go(time.Minute, []Cmd{setNX(keys[0], "go"), setNX(keys[1], "go"), setNX(keys[2], "go")}, func(err error) {
		if err != nil {
			t.Error(err)
		}
		thens.Add(1)
	})
	p.Close()
	if n := thens.Load(); n != 1 {
		t.Fatalf("then ran %d times for one Go call", n)
	}
	if rt, _ := p.RoundTrips(); rt < 3 {
		t.Fatalf("%d round trips for calls on 3 masters, want one a master at least", rt)
	}
}

// withAHungMaster starts a Cluster of 3, pauses the master of hung, and
// returns a pipeline on it and a key, healthy, of another master.
func withAHungMaster(t *testing.T) (p *Pipeline, master *redistest.Server, hung, healthy string) {
	t.Helper()
	cluster := redistest.StartCluster(t, 3)
	p = New(cluster.Client())
	t.Cleanup(p.Close) // after Resume: cleanups run last first
	keys := keysOnDistinctMasters(t, cluster, 2)
	hung, healthy = keys[0], keys[1]
	master = cluster.NodeFor(hung)
	master.Pause()
	t.Cleanup(master.Resume)
	return p, master, hung, healthy
}

func get(key string) Cmd {
	return Cmd{Key: key, Queue: func(ctx context.Context, p redis.Pipeliner) redis.Cmder { return p.Get(ctx, key) }}
}

// keysOnDistinctMasters returns n keys whose slots n different masters
// serve.
func keysOnDistinctMasters(t *testing.T, cluster *redistest.Cluster, n int) []string {
	t.Helper()
	var keys []string
	seen := map[*redistest.Server]bool{}
	for i := 0; len(keys) < n; i++ {
		key := fmt.Sprintf("shard-%d", i)
		if node := cluster.NodeFor(key); !seen[node] {
			seen[node] = true
			keys = append(keys, key)
		}
	}
	return keys
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting")
		}
	}
}

// While a slot migrates, the Cluster client follows ASK for the keys
// already moved to the importing master, which answers NOSCRIPT if it
// never ran the script (a master just added to the Cluster): the script
// must be loaded there, not only on the shard's own master, which has it.
func TestAScriptOnAKeyMovedDuringAMigrationIsLoadedWhereItRuns(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), ContextTimeoutEnabled: true})
	p := New(client)
	t.Cleanup(func() { p.Close(); _ = client.Close() })
	ctx := context.Background()
	keys := keysOnDistinctMasters(t, cluster, 2)
	key := keys[0]
	from, to := cluster.NodeFor(key), cluster.NodeFor(keys[1])
	fc, tc := from.Client(), to.Client()
	defer fc.Close()
	defer tc.Close()
	if err := fc.Set(ctx, key, "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	slot, err := fc.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	s := strconv.FormatInt(slot, 10)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(tc.Do(ctx, "CLUSTER", "SETSLOT", s, "IMPORTING", nodeID(t, from)).Err())
	must(fc.Do(ctx, "CLUSTER", "SETSLOT", s, "MIGRATING", nodeID(t, to)).Err())
	host, port := "127.0.0.1", strconv.Itoa(portOf(to))
	must(fc.Do(ctx, "MIGRATE", host, port, key, 0, 5000).Err())

	script := redis.NewScript(`return redis.call('GET', KEYS[1])`)
	cmds := []Cmd{EvalSha(script, []string{key})}
	if err := p.Do(ctx, 5*time.Second, cmds); err != nil {
		t.Fatalf("a script on a key moved to the importing master, mid-migration: %v", err)
	}
	if got, _ := cmds[0].Result.(*redis.Cmd).Text(); got != "v" {
		t.Fatalf("script answered %q", got)
	}
}

func nodeID(t *testing.T, s *redistest.Server) string {
	t.Helper()
	c := s.Client()
	defer c.Close()
	id, err := c.Do(context.Background(), "CLUSTER", "MYID").Text()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func portOf(s *redistest.Server) int {
	var port int
	fmt.Sscanf(s.Addr()[strings.LastIndex(s.Addr(), ":")+1:], "%d", &port)
	return port
}

// A connection Redis refuses in its handshake (a wrong password, a user
// without SELECT) fails every command of the batch with Redis's reply:
// go-redis leaves a Redis error of the handshake off the commands, which
// then read as empty answers (a tumbling claim "is not a telemetry_dedup
// claim", a settlement done), and the log line said another application
// was writing under the key_prefix instead of how to fix the password.
func TestARefusedHandshakeFailsEveryCommand(t *testing.T) {
	srv := redistest.Start(t)
	srv.AddUser(t, "alice", "right")
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "alice", Password: "wrong", ContextTimeoutEnabled: true})
	p := New(c)
	t.Cleanup(func() {
		p.Close()
		_ = c.Close()
	})
	cmds := []Cmd{setNX("refused-1", "x"), setNX("refused-2", "x")}
	err := p.Do(context.Background(), 10*time.Second, cmds)
	if err == nil || !strings.HasPrefix(err.Error(), "WRONGPASS") {
		t.Fatalf("a batch on a connection Redis refused the password of: Do = %v, want WRONGPASS", err)
	}
	for i, cmd := range cmds {
		if err := cmd.Result.Err(); err == nil || !strings.HasPrefix(err.Error(), "WRONGPASS") {
			t.Errorf("command %d: error %v, want WRONGPASS", i, err)
		}
	}
}

// A round trip is one Redis answered: attempts on a connection that never
// reaches it (a Redis that is gone, as a stopped test's or one down in an
// outage) count none, nor do their commands. A Redis error reply is an
// answer.
func TestRoundTripsCountOnlyWhatRedisAnswered(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	p := New(c)
	t.Cleanup(func() {
		p.Close()
		_ = c.Close()
	})
	wrongType := Cmd{Key: "a-string", Queue: func(ctx context.Context, p redis.Pipeliner) redis.Cmder {
		return p.LPush(ctx, "a-string", "x")
	}}
	if err := p.Do(context.Background(), 10*time.Second, []Cmd{setNX("a-string", "v")}); err != nil {
		t.Fatal(err)
	}
	if err := p.Do(context.Background(), 10*time.Second, []Cmd{wrongType}); err == nil {
		t.Fatal("LPUSH on a string succeeded")
	}
	if rt, n := p.RoundTrips(); rt != 2 || n != 2 {
		t.Fatalf("two calls Redis answered, one with an error: %d round trips, %d commands; want 2, 2", rt, n)
	}
	srv.Kill()
	for i := range 3 {
		if err := p.Do(context.Background(), 10*time.Second, []Cmd{setNX(fmt.Sprintf("gone-%d", i), "v")}); err == nil {
			t.Fatal("a call to a Redis that is gone succeeded")
		}
	}
	if rt, n := p.RoundTrips(); rt != 2 || n != 2 {
		t.Fatalf("after three calls to a Redis that is gone: %d round trips, %d commands; want still 2, 2", rt, n)
	}
}

// A call spanning a hung master and a healthy one whose part Redis answered
// with one command refused (an error reply, as a migrating slot's TRYAGAIN)
// fails only the hung master's commands and the refused one: the healthy
// part's other commands ran and hold their answers. The call was a plain
// timeout when the hung master's part came first, and a release the
// healthy master made was counted failed and made again by the reconciler.
func TestARefusedCommandBesideAHungMasterFailsOnlyItself(t *testing.T) {
	p, _, hung, healthy := withAHungMaster(t)
	lpush := Cmd{Key: healthy, Queue: func(ctx context.Context, p redis.Pipeliner) redis.Cmder { return p.LPush(ctx, healthy, "x") }}
	cmds := []Cmd{setNX(hung, "x"), setNX(healthy, "x"), lpush} // LPUSH on the string SET NX wrote: WRONGTYPE
	err := p.Do(context.Background(), 300*time.Millisecond, cmds)
	partial, ok := errors.AsType[*PartialError](err)
	if !ok || !slices.Equal(partial.Failed, []bool{true, false, true}) {
		t.Fatalf("a call on a hung master and a healthy one that refused one command: %v; want a PartialError naming the hung master's command and the refused one", err)
	}
	if !won(t, cmds[1]) {
		t.Fatal("the healthy master's SET NX has no answer beside its refused LPUSH")
	}
}
