package telemetrydedup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// A store error names the fix when Redis says what is wrong: a real Redis
// at maxmemory, one that wants a password, or one that refuses a script a
// command or key the user may not use, as the store's calls see it
// (wrapped on the way).
func TestStoreErrorsSayWhatToDo(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	ctx := context.Background()
	// Within a script Redis 7.0 refuses a command or key the user may not
	// use with ERR, not NOPERM (7.2 says "ERR ACL failure in script").
	srv.AddUser(t, "scripted", "pw")
	if err := client.Do(ctx, "ACL", "SETUSER", "scripted", "resetkeys", "~a*", "-@all", "+eval", "+get").Err(); err != nil {
		t.Fatal(err)
	}
	user := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "scripted", Password: "pw"})
	defer user.Close()
	scriptCommand := user.Eval(ctx, "return redis.call('TIME')", nil).Err()
	scriptKey := user.Eval(ctx, "return redis.call('GET', 'b')", nil).Err()
	if err := client.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := client.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	oom := client.Set(ctx, "k", "v", 0).Err()
	client.ConfigSet(ctx, "maxmemory", "0")
	if err := client.ConfigSet(ctx, "requirepass", "s3cret").Err(); err != nil {
		t.Fatal(err)
	}
	noauth := srv.Client().Set(ctx, "k", "v", 0).Err() // a new client, without the password
	for _, tt := range []struct {
		name string
		err  error
		want string
	}{
		// It named maxmemory-policy volatile-ttl, which the startup check
		// then warned of (it evicts claims in flight). (Helper 2's review,
		// stop 66.)
		{"out of memory", fmt.Errorf("%w: %w", dedup.ErrReleasesOwed, oom), "keep maxmemory-policy noeviction"},
		{"no password", noauth, "set password"},
		{"a command a script may not run", scriptCommand, "README's ACL rule"},
		{"a key a script may not use", scriptKey, "README's ACL rule"},
		{"Redis 7.2's refusal in a script", fmt.Errorf("decide: %w", replyError("ERR ACL failure in script: No permissions to run the 'time' command script: f826a6d8, on @user_script:50.")), "README's ACL rule"},
		{"a timeout", fmt.Errorf("decide: %w", context.DeadlineExceeded), "within the store's timeout"},
		{"a connection Redis closed", fmt.Errorf("decide: write tcp: %w", syscall.EPIPE), "Redis closed the connection"},
		{"anything else", errors.New("connection reset by peer"), ""},
	} {
		if fix := storeErrorFix(tt.err); (tt.want == "") != (fix == "") || !strings.Contains(fix, tt.want) {
			t.Errorf("%s (%v): fix %q, want one saying %q", tt.name, tt.err, fix, tt.want)
		}
	}
}

// replyError is an error reply of a Redis server the tests do not run.
type replyError string

func (e replyError) Error() string { return string(e) }

// RedisError marks replyError as a reply (redis.Error).
func (replyError) RedisError() {}

// The dead letters of a batch go to Redis in one call, bounded by one store
// timeout, and not at all while the breaker is open: each used to wait its
// own timeout, one after the other, past the breaker (40 invalid pings
// against a hung Redis took 2 s; a batch of 1,000, 50 s).
func TestABatchsDeadLettersWaitOneTimeoutAtMost(t *testing.T) {
	rdb := redistest.Start(t)
	const timeout = 50 * time.Millisecond
	tt := tableHandler(t, fmt.Sprintf(`{"key_prefix":"deadbatch:","on_invalid":"dead_letter","store":{"type":"redis","url":%q,"timeout":%d,"breaker_failures":1}}`,
		rdb.URL(), timeout.Nanoseconds()))
	at := time.Now().UTC().Add(-time.Hour).Format(time.RFC3339)
	if res := tt.post(fmt.Sprintf(`{"asset_id":"warm","occurred_at":%q,"lat":52.5,"lon":13.4}`, at), "application/json", nil); res.status != 201 {
		t.Fatalf("warm-up: %d %s", res.status, res.body)
	}
	var lines []string
	for i := range 40 {
		lines = append(lines, fmt.Sprintf(`{"asset_id":"phone-1","occurred_at":%q,"lat":0,"lon":0,"seq":%d}`, at, i))
	}
	batch := strings.Join(lines, "\n") + "\n"
	if res := tt.post(batch, "application/x-ndjson", nil); res.header.Get("X-Dedup") != "dead_lettered" {
		t.Fatalf("40 invalid pings, Redis up: %d %s, want all dead-lettered", res.status, res.header.Get("X-Dedup"))
	}

	rdb.Pause()
	defer rdb.Resume()
	for _, when := range []string{"breaker closed", "breaker open"} { // breaker_failures 1: the first call opens it
		start := time.Now()
		res := tt.post(batch, "application/x-ndjson", nil)
		if took := time.Since(start); took > 10*timeout || res.status != http.StatusServiceUnavailable {
			t.Fatalf("%s, Redis hung: 40 invalid pings answered %d after %v; want 503 (not kept: to be sent again) within about one timeout (%v)",
				when, res.status, took, timeout)
		}
	}
}

// Dead letters go through the breaker as claims do: once its wait is over
// a letter is its probe. They used to be skipped for as long as the
// breaker said open, and it said so until a claim probed it: after a
// Redis blip, a sender whose pings are all invalid (the case dead letters
// are for) had every one rejected with a 4xx long after Redis was back,
// which OwnTracks iOS answers by deleting the ping.
func TestDeadLettersProbeTheBreakerOnceRedisIsBack(t *testing.T) {
	rdb := redistest.Start(t)
	const timeout, cooldown = 100 * time.Millisecond, 200 * time.Millisecond
	tt := tableHandler(t, fmt.Sprintf(`{"key_prefix":"deadprobe:","on_invalid":"dead_letter","store":{"type":"redis","url":%q,"timeout":%d,"breaker_failures":1,"breaker_cooldown":%d}}`,
		rdb.URL(), timeout.Nanoseconds(), cooldown.Nanoseconds()))
	at := time.Now().UTC().Add(-time.Hour).Format(time.RFC3339)
	rdb.Pause()
	if res := tt.post(fmt.Sprintf(`{"asset_id":"veh-blip","occurred_at":%q,"lat":52.5,"lon":13.4}`, at), "application/json", nil); res.header.Get("X-Dedup") != "unchecked" {
		t.Fatalf("a claim on a hung Redis: %d %s, want unchecked (the breaker opens)", res.status, res.header.Get("X-Dedup"))
	}
	rdb.Resume()
	time.Sleep(3 * cooldown) // Redis answers again, and the breaker's wait is over
	invalid := `{"asset_id":"veh-naive","occurred_at":"2026-08-08T12:00:00","lat":52.5,"lon":13.4}`
	for i := range 3 {
		if res := tt.post(invalid, "application/json", nil); res.status != http.StatusAccepted || res.header.Get("X-Dedup") != "dead_lettered" {
			t.Fatalf("invalid ping %d, Redis back for %v: %d %s; want 202 dead_lettered", i, 3*cooldown, res.status, res.header.Get("X-Dedup"))
		}
	}
	if n := rdb.Client().XLen(context.Background(), "deadprobe:dead_letter").Val(); n != 3 {
		t.Fatalf("stream holds %d letters, want 3", n)
	}
}

// downStore fails every call, as a hung master does.
type downStore struct{}

func (downStore) Decide(context.Context, []*dedup.Claim) ([]dedup.Verdict, error) {
	return nil, context.DeadlineExceeded
}
func (downStore) Settle(_ []*dedup.Claim, done func(error)) { done(context.DeadlineExceeded) }
func (downStore) Release(context.Context, []*dedup.Claim) ([]bool, error) {
	return nil, context.DeadlineExceeded
}

// On a Cluster, dead letters are skipped while the zone of the stream's
// own master is open, not while any master's is: another master's outage
// must not drop the dead letters a healthy one can take.
func TestDeadLettersGoOnWhileAnotherMastersZoneIsOpen(t *testing.T) {
	srv := redistest.Start(t) // the stream's master, healthy
	client := srv.Client()
	b := dedup.NewBreaker(1, time.Second, nil)
	b.ZoneBy(func(key string) string {
		if key == "dead" {
			return srv.Addr()
		}
		return "10.0.0.9:6379" // every claim on another master, which hangs
	}, nil)
	claim := &dedup.Claim{Observation: dedup.Observation{Key: "k"}, Policy: &dedup.Policy{}}
	_, _ = b.Guard(downStore{}).Decide(context.Background(), []*dedup.Claim{claim})
	if b.State() != dedup.BreakerOpen {
		t.Fatal("setup: the other master's zone did not open")
	}
	d := redisDeadLetters{client: client, breaker: b, stream: "dead", maxLen: 100, timeout: time.Second}
	if errs := d.add(context.Background(), []deadLetter{{reason: "invalid", receivedAt: time.Now()}}); errs[0] != nil {
		t.Fatalf("a dead letter for a healthy stream master: %v", errs[0])
	}
	if n := client.XLen(context.Background(), "dead").Val(); n != 1 {
		t.Fatalf("stream length %d, want 1", n)
	}
}

// A dead letter on a connection Redis refuses in its handshake (a wrong
// password) is not written, and its ping must be rejected, not answered
// 202 as dead-lettered: go-redis leaves a Redis error of the handshake off
// the commands, and each XADD read as written.
func TestADeadLetterOnARefusedHandshakeFails(t *testing.T) {
	srv := redistest.Start(t)
	srv.AddUser(t, "alice", "right")
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "alice", Password: "wrong", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	d := redisDeadLetters{client: client, breaker: dedup.NewBreaker(5, time.Second, nil), stream: "dead", maxLen: 100, timeout: time.Second}
	errs := d.add(context.Background(), []deadLetter{{reason: "invalid", receivedAt: time.Now()}})
	if errs[0] == nil || !strings.HasPrefix(errs[0].Error(), "WRONGPASS") {
		t.Fatalf("a dead letter Redis refused the password of: %v, want WRONGPASS", errs[0])
	}
}

// The lines of a Redis connection that configs share (its breaker's, its
// reconciler's) go to the latest config's logger, and back to the one
// before when that config goes: a reload that changes the logs takes them
// over, and a config that is unloaded, or failed to load, leaves no lines
// to a log that may be closed.
func TestASharedRedisConnectionLogsToTheLatestConfig(t *testing.T) {
	firstCore, first := observer.New(zap.DebugLevel) // a probe and its failure are debug lines
	secondCore, second := observer.New(zap.InfoLevel)
	firstLogger, secondLogger := zap.New(firstCore), zap.New(secondCore)
	c := downConnection(t, firstLogger)
	defer c.Destruct()
	tt := tableHandler(t, `{"key_prefix":"connection-logs:"}`)
	d := *tt.h.deduper
	d.Store = c.store
	obs := d.Observe(ping.Ping{Asset: "veh-88", Time: time.Now().Add(-time.Minute), Lat: 52.52, Lon: 13.40})

	c.loggers.add(secondLogger) // a reload keeps the connection
	if _, _, err := d.Claim(context.Background(), obs); err == nil {
		t.Fatal("a claim on a Redis that is down succeeded")
	}
	if second.FilterMessageSnippet("circuit breaker opened").Len() != 1 || first.Len() != 0 {
		t.Fatalf("the breaker opening logged %d lines to the latest config, %d to the one it replaced; want 1 and 0",
			second.FilterMessageSnippet("circuit breaker opened").Len(), first.Len())
	}

	c.loggers.remove(secondLogger) // the latest config goes (a reload back, or it failed to load)
	time.Sleep(150 * time.Millisecond)
	d.Claim(context.Background(), obs) // the probe, which fails
	if first.FilterMessageSnippet("circuit breaker").Len() == 0 || second.Len() != 1 {
		t.Fatalf("the probe logged %d lines to the config left, %d more to the one gone; want some and none",
			first.FilterMessageSnippet("circuit breaker").Len(), second.Len()-1)
	}
}

// A connection that closes writes the reconciler's lines it held back: the
// claims given up on in its last seconds were told by no line, and the
// count of the one line written was all an operator saw.
func TestAClosingConnectionWritesTheReconcilersLinesHeldBack(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	c := downConnection(t, zap.New(core))
	for _, n := range []int{2, 5, 3} { // the reconciler's reports, a queue full three times within a line's period
		c.reports.report(dedup.ReconcileDropped, n)
	}
	lines := func() []observer.LoggedEntry { return logs.FilterMessageSnippet("could not be reconciled").All() }
	if n := len(lines()); n != 1 {
		t.Fatalf("%d lines of dropped claims before the close, want 1 (the others held back): %v", n, logs.All())
	}
	if err := c.Destruct(); err != nil {
		t.Fatal(err)
	}
	said := lines()
	if len(said) != 2 {
		t.Fatalf("%d lines of dropped claims after the close, want 2 (the held-back one told): %v", len(said), logs.All())
	}
	if fields := said[1].ContextMap(); fields["error"] != "3 claims dropped" || fields["similar_since_last_line"] != int64(1) {
		t.Errorf("the close's line says %v, want the last report (3 claims dropped) and 1 similar besides it", fields)
	}
}

// downConnection opens a connection, logging to logger, on a Redis that is
// down (nothing listens there), with a breaker that opens at the first
// failure. The connections one test opens are on one keyspace, of their
// own: on an address other tests use, a connection of theirs that a
// config still held would take what this test's hand over.
func downConnection(t *testing.T, logger *zap.Logger) *redisConnection {
	t.Helper()
	url, _ := downURLs.LoadOrStore(t, fmt.Sprintf("redis://127.0.0.%d:1/0", 2+downTests.Add(1)%250))
	r := RedisStore{URL: url.(string), BreakerFailures: 1, Timeout: caddy.Duration(20 * time.Millisecond)}
	opts, err := r.options()
	if err != nil {
		t.Fatal(err)
	}
	return newRedisConnection(opts, r, logger)
}

// downURLs is each test's address for downConnection, on 127.0.0.2 to
// 127.0.0.251 (all of 127/8 is loopback), which downTests counts out.
var (
	downURLs  sync.Map
	downTests atomic.Int32
)

// The breaker's line is the connection's, and the handlers that share the
// connection may differ: enforce or shadow mode, failing open or closed,
// dead-lettering or not. It says what each does while Redis is skipped; it
// said "applying on_store_error", which shadow mode only records: its
// senders get the upstream's answer.
func TestTheBreakerLineSaysWhatShadowModeDoes(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	c := downConnection(t, zap.New(core))
	defer c.Destruct()
	tt := tableHandler(t, `{"key_prefix":"breaker-line:"}`)
	d := *tt.h.deduper
	d.Store = c.store
	if _, _, err := d.Claim(context.Background(), d.Observe(ping.Ping{Asset: "veh-89", Time: time.Now().Add(-time.Minute), Lat: 52.52, Lon: 13.40})); err == nil {
		t.Fatal("a claim on a Redis that is down succeeded")
	}
	opened := logs.FilterMessageSnippet("circuit breaker opened").All()
	if len(opened) != 1 {
		t.Fatalf("%d lines saying the breaker opened, want 1", len(opened))
	}
	for _, want := range []string{"on_store_error", "503", "shadow mode forwards"} {
		if !strings.Contains(opened[0].Message, want) {
			t.Errorf("the breaker's line %q; want it to say %q", opened[0].Message, want)
		}
	}
}

// What the load says becomes of the pings while Redis fails or the
// dead-letter stream cannot be written is what their senders get, in
// shadow mode too, where every ping is forwarded: the load's lines said
// they were answered 503 (a stream that can never be written, or that was
// not checked) or handled as on_store_error says (Redis down at start, a
// timeout below a round trip), which shadow mode only records. The
// handler's line knows its mode; a store's, which handlers of both modes
// may share, says what each does.
func TestTheLoadsLinesSayWhatShadowModeDoes(t *testing.T) {
	srv := redistest.Start(t)
	srv.Client().Set(context.Background(), "dlq:load-taken", "x", 0)
	for _, tt := range []struct {
		mode      string
		says, not string
	}{
		{"enforce", "answered 503", "shadow mode"},
		{"shadow", "shadow mode forwards", "answered 503"},
	} {
		h := tableHandler(t, fmt.Sprintf(`{"key_prefix":"load-lines:","mode":%q,"on_invalid":"dead_letter","store":{"type":"redis","url":%q}}`,
			tt.mode, srv.URL())).h
		core, logs := observer.New(zap.ErrorLevel)
		h.logger = zap.New(core)
		h.reportUnwritableStream(context.Background(), provisionRedisStore(t, srv.URL()), "dlq:load-taken")
		if logs.Len() != 1 {
			t.Fatalf("%s: %d lines for a stream that can never be written, want 1", tt.mode, logs.Len())
		}
		said := logs.All()[0].Message + "; " + fmt.Sprint(logs.All()[0].ContextMap()["error"])
		if !strings.Contains(said, tt.says) || strings.Contains(said, tt.not) {
			t.Errorf("%s: the load says %q; want it to say %q, and not %q", tt.mode, said, tt.says, tt.not)
		}
	}

	store := provisionRedisStore(t, "redis://127.0.0.1:1/0") // nothing listens there
	core, logs := observer.New(zap.WarnLevel)
	store.logger = zap.New(core)
	warnIfUnreachable(context.Background(), store.client, "127.0.0.1:1", store.logger)
	if err := store.checkDeadLetterStream(context.Background(), "dlq:load-down"); err != nil {
		t.Fatal(err)
	}
	said := []string{checkTimeoutFloor("timeout", time.Microsecond).Error()}
	for _, e := range logs.All() {
		said = append(said, e.Message)
	}
	if len(said) != 3 {
		t.Fatalf("said %q; want the timeout's error, the startup warning and the stream's", said)
	}
	for _, line := range said {
		if !strings.Contains(line, "shadow mode forwards") {
			t.Errorf("the load says %q; want it to say what shadow mode does too: %q", line, "shadow mode forwards")
		}
	}
}

// Commands reach Redis in the order they were queued, also the first time
// a script runs on a Redis that does not know it yet (a fresh one, or one
// restarted or failed over, which forgets its scripts). A script's first
// call used to fail NOSCRIPT and go again after loading it, behind the
// commands queued after it: a settlement overtaken by its redelivery's
// claim, and the redelivery was told in_flight instead of suppressed.
func TestAScriptRedisForgotKeepsCommandsInOrder(t *testing.T) {
	for _, shape := range []string{"sliding", "session", "tumbling"} {
		t.Run(shape, func(t *testing.T) {
			rdb := redistest.Start(t)
			tt := tableHandler(t, fmt.Sprintf(`{"key_prefix":"order:","shape":%q,"near_cache":0,"store":{"type":"redis","url":%q,"timeout":1000000000}}`,
				shape, rdb.URL()))
			at := time.Now().UTC().Add(-time.Hour)
			for i, when := range []string{"on a fresh Redis", "after a restart"} {
				if i > 0 {
					rdb.Restart()
				}
				body := fmt.Sprintf(`{"asset_id":"veh-%d","occurred_at":%q,"lat":52.5,"lon":13.4}`, i, at.Format(time.RFC3339))
				if res := tt.post(body, "application/json", nil); res.status != http.StatusCreated {
					t.Fatalf("%s: a new ping: %d %s %s", when, res.status, res.header.Get("X-Dedup"), res.body)
				}
				// Its settlement rides with the next batch: the redelivery's.
				if res := tt.post(body, "application/json", nil); res.status != http.StatusOK || res.header.Get("X-Dedup") != "suppressed" {
					t.Errorf("%s: its redelivery at once: %d %s; want 200 suppressed (its settlement queued first)", when, res.status, res.header.Get("X-Dedup"))
				}
			}
		})
	}
}

// A Redis that answers the startup check with an error did answer: the
// warning says what it refused and the fix, not that it does not answer.
func TestTheStartupWarningSaysWhatRedisRefused(t *testing.T) {
	srv := redistest.Start(t)
	if err := srv.Client().ConfigSet(context.Background(), "requirepass", "s3cret").Err(); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.WarnLevel)
	warnIfUnreachable(context.Background(), srv.Client(), srv.Addr(), zap.New(core)) // a new client, without the password
	entries := logs.All()
	if len(entries) != 1 {
		t.Fatalf("%d warnings, want 1", len(entries))
	}
	fix, _ := entries[0].ContextMap()["fix"].(string)
	if strings.Contains(entries[0].Message, "does not answer") || !strings.Contains(fix, "set password") {
		t.Fatalf("warning %q, fix %q; want what Redis refused and the fix naming password", entries[0].Message, fix)
	}
}

// A new connection whose loading of the scripts times out (a Redis slower
// than read_timeout, set below the store's timeout) is not used: the
// replies to SCRIPT LOAD still on their way were read as the answers to the
// commands sent after them on it, each command given another's answer (a
// claim's SET NX GET told another key's value).
func TestALateScriptLoadLeavesNoReplyBehind(t *testing.T) {
	rdb := redistest.Start(t)
	relay, held := startScriptReplyHolder(t, rdb.Addr())
	opts, err := (RedisStore{URL: "redis://" + relay, ReadTimeout: caddy.Duration(500 * time.Millisecond)}).options()
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewUniversalClient(opts)
	defer client.Close()
	ctx := context.Background()
	// The connection's own wait may fail the call that made it; another
	// command's reply must not answer it, as a value or as a reply of the
	// wrong type (SCRIPT EXISTS's array).
	var timeout net.Error
	if got, err := client.Set(ctx, "late-load:key", "v", 0).Result(); err == nil && got != "OK" || err != nil && !(errors.As(err, &timeout) && timeout.Timeout()) {
		t.Errorf("SET on a new connection whose scripts' loading timed out answered %q, %v; want OK or the timeout", got, err)
	}
	if got, err := client.Set(ctx, "late-load:key", "v", 0).Result(); err != nil || got != "OK" {
		t.Errorf("SET again: %q, %v; want OK", got, err)
	}
	if got, err := client.Get(ctx, "late-load:key").Result(); err != nil || got != "v" {
		t.Errorf("GET after it: %q, %v; want \"v\"", got, err)
	}
	if held.Load() == 0 {
		t.Fatal("the relay held no reply to SCRIPT LOAD: nothing was tested")
	}
}

// startScriptReplyHolder relays to a Redis, holding the reply to the first
// SCRIPT command it sees (a new connection's SCRIPT EXISTS) until the
// client sends its next command that is no SCRIPT command on that
// connection, as a Redis slower than read_timeout would; held counts the
// replies it held (one at most).
func startScriptReplyHolder(t *testing.T, to string) (addr string, held *atomic.Int32) {
	held = new(atomic.Int32)
	addr = redistest.StartRelay(t, to, func(client, server net.Conn) (up, down func()) {
		var loading atomic.Bool
		next, done := make(chan struct{}), make(chan struct{})
		up = func() { // note SCRIPT LOAD, then the command after it
			defer close(done)
			defer server.Close()
			released := false
			copyChunks(client, server, func(chunk []byte) {
				if strings.Contains(strings.ToUpper(string(chunk)), "SCRIPT") {
					loading.Store(true)
				} else if loading.Load() && !released {
					released = true
					close(next)
				}
			})
		}
		down = func() {
			defer client.Close()
			copyChunks(server, client, func([]byte) {
				if loading.Load() && held.CompareAndSwap(0, 1) {
					select {
					case <-next:
					case <-done:
					}
				}
			})
		}
		return up, down
	})
	return addr, held
}

// copyChunks copies from src to dst as it comes, calling before with each
// chunk read before it is written, until either side fails.
func copyChunks(src, dst net.Conn, before func(chunk []byte)) {
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			before(buf[:n])
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// A link slow enough that the scripts (17 KB) take longer than the store's
// timeout to reach Redis, while a claim (a few hundred bytes) takes a
// fraction of it: pings are decided, not unchecked. Every new connection
// used to load all four scripts, within the call that made it, and was
// dropped when they were late: every new connection failed, and so did
// every ping, while Redis was fine.
func TestASlowLinkStillGetsDecisions(t *testing.T) {
	rdb := redistest.Start(t)
	// 10 KB/s towards Redis: the scripts take 1.7 s, a claim some 50 ms of
	// the store's 500 (wide, for a loaded machine running -race).
	relay := startSlowLink(t, rdb.Addr(), 10<<10)
	tt := tableHandler(t, fmt.Sprintf(`{"key_prefix":"slowlink:","shape":"sliding","store":{"type":"redis","url":"redis://%s","timeout":500000000}}`, relay))
	at := time.Now().UTC().Add(-time.Hour).Format(time.RFC3339)
	var got []string
	for i := range 12 {
		body := fmt.Sprintf(`{"asset_id":"veh-%d","occurred_at":%q,"lat":52.5,"lon":13.4}`, i, at)
		start := time.Now()
		res := tt.post(body, "application/json", nil)
		if took := time.Since(start); took > 2*time.Second {
			t.Fatalf("ping %d took %v", i, took)
		}
		got = append(got, res.header.Get("X-Dedup"))
		time.Sleep(400 * time.Millisecond)
	}
	if decided := slices.Index(got, "accepted"); decided < 0 || slices.Contains(got[decided:], "unchecked") {
		t.Fatalf("pings over a slow link to a healthy Redis: %v; want accepted, after at most the first few", got)
	}
}

// startSlowLink relays to addr, passing what clients send at bytesPerSecond
// (replies go at once), and returns where to connect.
func startSlowLink(t *testing.T, addr string, bytesPerSecond int) string {
	return redistest.StartRelay(t, addr, func(client, server net.Conn) (up, down func()) {
		up = func() {
			defer server.Close()
			copyChunks(client, server, func(chunk []byte) {
				time.Sleep(time.Duration(len(chunk)) * time.Second / time.Duration(bytesPerSecond))
			})
		}
		down = func() {
			defer client.Close()
			_, _ = io.Copy(client, server)
		}
		return up, down
	})
}

// hungRedis is the address of a Redis that takes connections and never
// answers: a host paused or swapping, a server stuck in a script.
func hungRedis(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { conn.Close() }) // held open, never answered
		}
	}()
	return ln.Addr().String()
}

// With several sites, each on its own Redis and key_prefix, a store
// failure's line says which store, key_prefix and mode it is about: a hung
// Redis's line was a bare "context deadline exceeded", where the breaker's
// lines and the stuck warning name theirs. (Helper 3's review, stop 64.)
func TestAStoreUnavailableLineNamesTheStoreItIsAbout(t *testing.T) {
	addr := hungRedis(t)
	tt := tableHandler(t, fmt.Sprintf(`{"key_prefix":"site-north:","store":{"type":"redis","url":"redis://%s/0","timeout":50000000,"breaker_failures":1000}}`, addr))
	at := time.Now().UTC().Add(-time.Minute).Format(time.RFC3339)
	stderr := captureFD2(t, func() {
		tt.post(fmt.Sprintf(`{"asset_id":"veh-1","occurred_at":%q,"lat":52.52,"lon":13.40}`, at), "application/json", nil)
		tt.h.claimErrors.flush()
	})
	var line string
	for _, l := range strings.Split(stderr, "\n") {
		if strings.Contains(l, "dedup store unavailable") {
			line = l
		}
	}
	if line == "" {
		t.Fatalf("no store-unavailable line in the log:\n%s", stderr)
	}
	for _, want := range []string{addr, `"key_prefix": "site-north:"`, `"mode": "enforce"`} {
		if !strings.Contains(line, want) {
			t.Errorf("the store-unavailable line does not name %s, so with several sites the operator cannot tell which store is down:\n%s", want, line)
		}
	}
}

// A Redis that takes the connection and never answers (a host that is
// paused, swapping or stuck in a script; a proxy in front of a dead one) is
// the plainest case of one that does not answer, and is warned about at
// start like one that refuses the connection. The check's own deadline
// ending the PING is no reason for silence: with the store's client the
// PING's read deadline and the check's timer fire at the same instant, and
// either may win; here the PING always ends after the timer.
func TestTheStartupWarningSaysRedisDoesNotAnswerWhenItHangs(t *testing.T) {
	addr := hungRedis(t)
	client := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 3 * time.Second, MaxRetries: -1})
	defer client.Close()
	core, logs := observer.New(zap.WarnLevel)
	warnIfUnreachable(context.Background(), client, addr, zap.New(core))
	entries := logs.All()
	if len(entries) != 1 || !strings.Contains(entries[0].Message, "does not answer") {
		t.Fatalf("warnings %v; want one saying the store does not answer", entries)
	}
	// The check's own bound, not the store's timeout, which it does not use.
	if fix, _ := entries[0].ContextMap()["fix"].(string); !strings.Contains(fix, startupCheckTimeout.String()) {
		t.Fatalf("fix %q; want it to name the check's %s", fix, startupCheckTimeout)
	}
}

// A batch holding a ping whose dead letter cannot be written (here an ACL
// that refuses XADD, which claims do not use, taken away after the load,
// which refuses one from the start) is sent back whole, as one
// holding a ping the store could not judge: none of it goes upstream, its
// new pings' claims are given back, and the invalid ping is answered as it
// is alone, unavailable. Its new pings went upstream and the invalid one
// was dropped with them: Overland deletes a batch its backend took.
func TestABatchWithALetterThatCannotBeWrittenComesBackWhole(t *testing.T) {
	redisURL, takeXADD := urlWithoutXADD(t)
	tt := tableHandler(t, fmt.Sprintf(`{"key_prefix":"deadacl:","on_invalid":"dead_letter","store":{"type":"redis","url":%q}}`,
		redisURL))
	takeXADD()
	at := time.Now().UTC().Add(-time.Hour).Format(time.RFC3339)
	valid := fmt.Sprintf(`{"asset_id":"veh-acl","occurred_at":%q,"lat":52.5,"lon":13.4}`, at)
	naive := `{"asset_id":"veh-acl","occurred_at":"2026-08-08T12:00:00","lat":52.5,"lon":13.4}`

	res := tt.post(valid+"\n"+naive+"\n", "application/x-ndjson", nil)
	if res.status != http.StatusServiceUnavailable || res.header.Get("X-Dedup") != "unavailable" || res.header.Get("Retry-After") != "5" {
		t.Fatalf("a batch whose letter failed: %d %s Retry-After %q %s; want 503 unavailable, Retry-After: 5",
			res.status, res.header.Get("X-Dedup"), res.header.Get("Retry-After"), res.body)
	}
	if len(tt.upstream) != 0 {
		t.Fatalf("the upstream got %q; want nothing until the batch comes back", tt.upstream)
	}
	var answer batchAnswer
	if err := json.Unmarshal([]byte(res.body), &answer); err != nil || len(answer.Elements) != 2 {
		t.Fatalf("answer %s: %v", res.body, err)
	}
	if e := answer.Elements; e[0].Decision != decisionUnavailable || e[0].Reason != reasonSentBack ||
		e[1].Decision != decisionUnavailable || e[1].Rule != "timezone" {
		t.Fatalf("elements %+v; want the new ping sent back, the naive one unavailable naming its rule", e)
	}
	// The new ping's claim was given back: alone, it is new.
	if res := tt.post(valid, "application/json", nil); res.status != http.StatusCreated || res.header.Get("X-Dedup") != "accepted" {
		t.Fatalf("the batch's new ping alone afterwards: %d %s; want 201 accepted", res.status, res.header.Get("X-Dedup"))
	}
}

// With the store down and failing open, a batch's valid pings would go
// upstream unchecked; beside an invalid one whose dead letter cannot be
// written either, the batch is sent back whole and they are sent back
// with it, labelled so, not counted unchecked for a forward that never
// happened.
func TestAnOutageSendsBackABatchWithAnInvalidPingWhole(t *testing.T) {
	rdb := redistest.Start(t)
	tt := tableHandler(t, fmt.Sprintf(`{"key_prefix":"deadopen:","on_invalid":"dead_letter","store":{"type":"redis","url":%q,"timeout":%d}}`,
		rdb.URL(), (50*time.Millisecond).Nanoseconds()))
	at := time.Now().UTC().Add(-time.Hour).Format(time.RFC3339)
	valid := fmt.Sprintf(`{"asset_id":"veh-open","occurred_at":%q,"lat":52.5,"lon":13.4}`, at)
	naive := `{"asset_id":"veh-open","occurred_at":"2026-08-08T12:00:00","lat":52.5,"lon":13.4}`
	rdb.Pause()
	res := tt.post(valid+"\n"+naive+"\n", "application/x-ndjson", nil)
	rdb.Resume()
	if res.status != http.StatusServiceUnavailable || res.header.Get("X-Dedup") != "unavailable" || len(tt.upstream) != 0 {
		t.Fatalf("Redis hung, failing open: %d %s, upstream got %d; want 503 unavailable and nothing upstream",
			res.status, res.header.Get("X-Dedup"), len(tt.upstream))
	}
	var answer batchAnswer
	if err := json.Unmarshal([]byte(res.body), &answer); err != nil || len(answer.Elements) != 2 {
		t.Fatalf("answer %s: %v", res.body, err)
	}
	if e := answer.Elements; e[0].Decision != decisionUnavailable || e[0].Reason != reasonSentBack || e[1].Rule != "timezone" {
		t.Fatalf("elements %+v; want the valid ping sent back, the naive one naming its rule", e)
	}
}

// Shadow mode counts and places a ping whose dead letter cannot be written
// as enforce answers it, unavailable with reason store_error, and a batch
// holding one as enforce sends it back, its new ping unavailable with
// reason sent_back; it forwards them all the same, the lone ping still
// saying would_reject. It counted them rejected and accepted, so an
// operator trying shadow mode before enforcing saw no 503 coming.
func TestShadowRecordsALetterThatCannotBeWrittenAsEnforceWould(t *testing.T) {
	redisURL, takeXADD := urlWithoutXADD(t)
	at := time.Now().UTC().Add(-time.Hour).Format(time.RFC3339)
	naive := `{"asset_id":"veh-shl","occurred_at":"2026-08-08T12:00:00","lat":52.5,"lon":13.4}`
	counts := map[string]string{}
	handlers := map[string]*tableTester{}
	for _, mode := range []string{"enforce", "shadow"} {
		handlers[mode] = tableHandler(t, fmt.Sprintf(`{"key_prefix":"shadowletter:%s:","mode":%q,"on_invalid":"dead_letter","store":{"type":"redis","url":%q}}`,
			mode, mode, redisURL))
	}
	takeXADD()
	for _, mode := range []string{"enforce", "shadow"} {
		tt := handlers[mode]
		valid := fmt.Sprintf(`{"asset_id":"veh-shl-%s","occurred_at":%q,"lat":52.5,"lon":13.4}`, mode, at)

		before := decisionCountsNow()
		one := tt.post(naive, "application/json", nil)
		batch := tt.post(valid+"\n"+naive+"\n", "application/x-ndjson", nil)
		counts[mode] = fmt.Sprintf("%v, batch X-Dedup-Accepted %s", decisionCountsNow().since(before).asEnforce(), batch.header.Get("X-Dedup-Accepted"))
		if mode == "enforce" {
			continue
		}
		if len(tt.upstream) != 2 || one.header.Get("X-Dedup") != "would_reject" || one.header.Get("X-Dedup-Reason") != "timezone" {
			t.Fatalf("shadow: %d requests forwarded, the lone ping's X-Dedup %q (%q); want both forwarded, would_reject (timezone)",
				len(tt.upstream), one.header.Get("X-Dedup"), one.header.Get("X-Dedup-Reason"))
		}
	}
	if want := `{"unavailable/sent_back":1,"unavailable/store_error":2}, batch X-Dedup-Accepted 0`; counts["enforce"] != want {
		t.Fatalf("enforce counted %s; want %s", counts["enforce"], want)
	}
	if counts["shadow"] != counts["enforce"] {
		t.Errorf("shadow counted %s; enforce %s", counts["shadow"], counts["enforce"])
	}
}

// urlWithoutXADD starts a Redis server and returns the URL of a user that
// may run every command, and takeXADD, which takes XADD from it: claims
// work, dead letters cannot be written, as behind an ACL that forgot the
// stream. It is taken after the load, as an operator changing the ACL
// while Caddy runs does: at load it would be reported already
// (TestAUserThatMayNotXADDToTheStreamIsReportedAtLoad).
func urlWithoutXADD(t *testing.T) (url string, takeXADD func()) {
	t.Helper()
	srv := redistest.Start(t)
	srv.AddUser(t, "noxadd", "pw")
	return "redis://noxadd:pw@" + srv.Addr() + "/0", func() {
		if err := srv.Client().Do(context.Background(), "ACL", "SETUSER", "noxadd", "-xadd").Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// An operator who points the store at a Redis that requires a password
// and gives none (forgot it, or the {env.REDIS_PASSWORD} inside the URL is
// unset, which leaves a URL that is not empty) must be told so at start:
// the README promises the startup warning names the fix "when Redis answers
// with an error instead: a password, an ACL rule", and
// TestTheStartupWarningSaysWhatRedisRefused checks it with a plain
// go-redis client. The store's own client loads its scripts on every new
// connection (OnConnect), before the PING: unauthenticated, Redis closes
// the connection on them, and the operator reads "redis store does not
// answer" with error EOF, no fix, while every ping goes upstream
// unchecked; each store error line then blames the timeout ("is it
// reachable, paused or overloaded?").
func TestTheStoresStartupWarningNamesAMissingPassword(t *testing.T) {
	srv := redistest.StartWith(t, "--requirepass", "s3cret")
	store := provisionRedisStore(t, "redis://"+srv.Addr()+"/0") // no password, as with redis://:{env.UNSET}@host
	core, logs := observer.New(zap.WarnLevel)
	warnIfUnreachable(context.Background(), store.client, srv.Addr(), zap.New(core))
	entries := logs.All()
	if len(entries) != 1 {
		t.Fatalf("%d warnings, want 1", len(entries))
	}
	fix, _ := entries[0].ContextMap()["fix"].(string)
	if strings.Contains(entries[0].Message, "does not answer") || !strings.Contains(fix, "password") {
		t.Errorf("startup warning %q (error %v), fix %q; want what Redis refused and a fix naming the password",
			entries[0].Message, entries[0].ContextMap()["error"], fix)
	}

	err := store.client.Set(context.Background(), "k", "v", 0).Err() // a store call, as the pings make them
	if fix := storeErrorFix(err); !strings.Contains(fix, "password") {
		t.Errorf("a store call fails with %v, fix %q; want a fix naming the password", err, fix)
	}
}

// One broken sender must not turn dedup off for the others (helper 2's
// finding). A letter kept the whole body, up to max_body, so a sender
// posting 200 KB bodies that are no JSON filled a Redis run as the README
// advises (maxmemory, noeviction) within 80 posts, and every claim of
// every other sender failed after that: their pings went upstream
// unchecked, duplicates and all. A letter keeps the body's first 8 KiB
// and its length.
func TestOneSendersDeadLettersDoNotTurnOffDedupForTheOthers(t *testing.T) {
	srv := redistest.StartWith(t, "--maxmemory", "16mb", "--maxmemory-policy", "noeviction")
	h := tableHandler(t, fmt.Sprintf(`{"key_prefix":"letters-bounded:","on_invalid":"dead_letter","near_cache":0,`+
		`"dead_letter_stream":"letters-bounded:dlq","store":{"type":"redis","url":%q,"timeout":1000000000}}`, srv.URL()))
	bad := `{"asset_id":"broken-1","pad":"` + strings.Repeat("A", 200_000)
	for i := range 1000 {
		if res := h.post(bad+fmt.Sprint(i), "application/json", nil); res.status != http.StatusAccepted {
			t.Fatalf("the broken sender's post %d was answered %d %s, want 202 dead_lettered", i, res.status, res.body)
		}
	}
	at := time.Now().UTC().Add(-time.Minute).Format(time.RFC3339)
	unjudged := map[string]int{}
	for i := range 2000 {
		good := fmt.Sprintf(`{"asset_id":"veh-good-%d","occurred_at":%q,"lat":52.52,"lon":13.40}`, i, at)
		if d := h.post(good, "application/json", nil).header.Get("X-Dedup"); d != "accepted" {
			unjudged[d]++
		}
	}
	if len(unjudged) > 0 {
		t.Fatalf("after another sender's 1000 malformed posts, of 2000 new pings these were not judged: %v", unjudged)
	}
	last, err := srv.Client().XRevRangeN(context.Background(), "letters-bounded:dlq", "+", "-", 1).Result()
	if err != nil || len(last) != 1 {
		t.Fatalf("reading the stream: %v, %d entries", err, len(last))
	}
	if body := last[0].Values["body"].(string); body != (bad + "999")[:8<<10] || last[0].Values["body_bytes"] != fmt.Sprint(len(bad)+3) {
		t.Fatalf("the last letter kept %d bytes, body_bytes %v; want the body's first 8192 and its length %d",
			len(body), last[0].Values["body_bytes"], len(bad)+3)
	}
}

// A Redis outage is told by one line that the breaker opened, at warn,
// and one that it closed, at info, however long it lasts: the probes in
// between, every breaker_cooldown, and their failures go to debug. Each
// wrote a line, a warn with its paragraph of advice and an info, two a
// second per connection (per master on a Cluster), 3,600 warnings an hour
// where the outage's store errors are held to one line per 10 s. (Helper
// 6's review, stop 62.)
//
// Setup: a real Redis, killed for 4 s under claims, as traffic makes
// them, then started again; the connection's logger observed at info.
func TestARedisOutageIsToldByOneBreakerLineAtItsStartAndOneAtItsEnd(t *testing.T) {
	srv := redistest.Start(t)
	core, logs := observer.New(zap.InfoLevel)
	r := RedisStore{URL: srv.URL(), BreakerFailures: 1, Timeout: caddy.Duration(50 * time.Millisecond)}
	opts, err := r.options()
	if err != nil {
		t.Fatal(err)
	}
	c := newRedisConnection(opts, r, zap.New(core))
	defer c.Destruct()
	tt := tableHandler(t, `{"key_prefix":"breaker-lines:"}`)
	d := *tt.h.deduper
	d.Store = c.store
	claim := func(i int) error {
		_, _, err := d.Claim(context.Background(), d.Observe(ping.Ping{Asset: fmt.Sprintf("veh-%d", i%50), Time: time.Now().Add(-time.Minute), Lat: 52.52, Lon: 13.40}))
		return err
	}
	srv.Kill()
	for i, start := 0, time.Now(); time.Since(start) < 4*time.Second; i++ {
		_ = claim(i)
		time.Sleep(5 * time.Millisecond)
	}
	srv.Restart()
	for deadline := time.Now().Add(10 * time.Second); claim(0) != nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the store never answered again")
		}
	}
	opened := logs.FilterMessageSnippet("circuit breaker opened").FilterLevelExact(zap.WarnLevel).Len()
	closed := logs.FilterMessageSnippet("circuit breaker closed").Len()
	probes := logs.FilterMessageSnippet("circuit breaker half_open").Len()
	if opened != 1 || closed != 1 || probes != 0 {
		t.Errorf("a 4 s Redis outage wrote %d lines that the breaker opened (want 1, at warn), %d that it closed (want 1), "+
			"%d of its probes at info or above (want 0)", opened, closed, probes)
	}
}

// A dead letter says where its request came: the host and the URI, path
// and query, and the asset the template resolved (from {http.auth.user.id}
// it is nowhere else in the letter). With preset overland and the asset taken from the receiver
// URL, as the README advises (asset {http.request.uri.query.device}), an
// invalid fix is dead-lettered and the app told {"result":"ok"}, so it
// deletes it; the letter held the Feature alone, and the operator could
// not tell whose fix to replay. (Helper 4's review, stop 63.)
func TestADeadLetterSaysWhereItsRequestCame(t *testing.T) {
	at := time.Now().UTC().Add(-time.Hour).Truncate(time.Minute).Format(time.RFC3339)
	feature := func(lat float64) string {
		return fmt.Sprintf(`{"type":"Feature","geometry":{"type":"Point","coordinates":[13.4,%v]},"properties":{"timestamp":%q,"speed":3}}`, lat, at)
	}
	late := strings.Replace(feature(52.6), at, "yesterday", 1) // no time read: the template still names the asset
	letters := overlandLettersWith(t, `"asset":["{http.request.uri.query.device}"],`, "https://fleet.example/overland?device=jane-phone",
		`{"locations":[`+feature(52.5)+`,`+feature(91)+`,`+late+`]}`, nil)
	if len(letters) != 2 {
		t.Fatalf("letters: %v", letters)
	}
	for _, v := range letters {
		if v["host"] != "fleet.example" || v["uri"] != "/overland?device=jane-phone" || v["asset"] != "jane-phone" {
			t.Errorf("the letter of %s says host %q, uri %q, asset %q; want fleet.example, /overland?device=jane-phone and jane-phone",
				v["field"], v["host"], v["uri"], v["asset"])
		}
	}
}

// A dead letter's uri is the one the sender requested, before a rewrite:
// under handle_path /overland/* the handler sees /?device=phone1, and a
// replay to that went to another route, or none. (Helper 6's review, stop
// 63.)
func TestADeadLettersURIIsTheOneTheSenderRequested(t *testing.T) {
	sent := httptest.NewRequest(http.MethodPost, "http://track.example/overland/?device=phone1", strings.NewReader("{}"))
	r := sent.Clone(context.WithValue(sent.Context(), caddyhttp.OriginalRequestCtxKey, *sent))
	r.URL.Path = "/" // handle_path /overland/* stripped its prefix
	if l := newDeadLetter(r, []byte("{}"), "", &rejection{status: http.StatusUnprocessableEntity}); l.uri != "/overland/?device=phone1" {
		t.Errorf("the letter's uri is %q; the sender requested /overland/?device=phone1", l.uri)
	}
}

// overlandLetters posts body to an overland handler with on_invalid dead_letter
// and returns the letters written.
func overlandLetters(t *testing.T, extra, body string) []map[string]any {
	t.Helper()
	return overlandLettersWith(t, extra, "https://fleet.example/overland", body, nil)
}

// overlandLettersWith posts body to url with header as well.
func overlandLettersWith(t *testing.T, extra, url, body string, header http.Header) []map[string]any {
	t.Helper()
	srv := redistest.Start(t)
	h := tableHandler(t, fmt.Sprintf(`{"preset":"overland","key_prefix":"letters-overland:",%s"on_invalid":"dead_letter","dead_letter_stream":"letters-overland:dlq",`+
		`"store":{"type":"redis","url":%q,"timeout":1000000000}}`, extra, srv.URL())).h
	r := httptest.NewRequest(http.MethodPost, url, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		r.Header[k] = v
	}
	r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, caddyhttp.NewTestReplacer(r)))
	w := httptest.NewRecorder()
	if err := h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Content-Type", "application/json")
		_, err := w.Write([]byte(`{"result":"ok"}`))
		return err
	})); err != nil || w.Code != http.StatusOK && w.Code != http.StatusAccepted {
		t.Fatalf("the batch: %d %v %s", w.Code, err, w.Body)
	}
	entries, err := srv.Client().XRange(context.Background(), "letters-overland:dlq", "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, e := range entries {
		out = append(out, e.Values)
	}
	return out
}

// A dead letter keeps at most 8 KiB of its body, and the README sizes the
// stream by it (about 10 KiB an entry, dead_letter_maxlen × 10 KiB in
// all). The new asset field is copied whole: a Feature refused because its
// device_id is longer than MaxAssetBytes keeps all of that id again
// beside the capped body, so one broken sender's letters take many times
// the memory the README budgets (the Redis with noeviction that the
// body cap was made for).
// (Helper 6's review, stop 64.)
func TestADeadLetterOfAnOverlongAssetStaysWithinTheLetterCap(t *testing.T) {
	at := time.Now().UTC().Add(-time.Hour).Format(time.RFC3339)
	id := strings.Repeat("x", 200<<10) // 200 KiB, well inside max_body 1 MiB
	feature := fmt.Sprintf(`{"type":"Feature","geometry":{"type":"Point","coordinates":[13.4,52.5]},"properties":{"timestamp":%q,"device_id":%q}}`, at, id)
	letters := overlandLetters(t, "", `{"locations":[`+feature+`]}`)
	if len(letters) != 1 {
		t.Fatalf("letters: %d; want 1", len(letters))
	}
	body, _ := letters[0]["body"].(string)
	asset, _ := letters[0]["asset"].(string)
	if len(body)+len(asset) > maxLetterBody+ping.MaxAssetBytes {
		t.Errorf("the letter of a Feature with a 200 KiB device_id holds a %d-byte body and a %d-byte asset: "+
			"the 8 KiB cap on a letter no longer holds", len(body), len(asset))
	}
}

// The README: a letter's asset is "always one an asset template resolved,
// such as {http.auth.user.id}, which is nowhere else in the letter". A
// body refused whole (not split: Overland in its OwnTracks logging mode,
// GLManager.m sendQueueNow posting locationUpdates[0]; a truncated or
// non-UTF-8 batch) is lettered with no asset, though the template, the
// README's {http.request.header.X-User} behind forward_auth, resolves
// from the request alone: the one letter an operator must trace to a
// phone names none, and X-User is in no other field.
// (Helper 6's review, stop 64.)
func TestADeadLetterOfABodyRefusedWholeNamesItsTemplateAsset(t *testing.T) {
	body := fmt.Sprintf(`{"_type":"location","lat":52.5,"lon":13.4,"tst":%d,"acc":5,"batt":80}`, time.Now().Unix()-60)
	letters := overlandLettersWith(t, `"asset":["{http.request.header.X-User}"],`, "https://fleet.example/overland", body, http.Header{"X-User": {"jane"}})
	if len(letters) != 1 {
		t.Fatalf("letters: %d; want 1", len(letters))
	}
	if letters[0]["asset"] != "jane" {
		t.Errorf("the letter of jane's refused body (reason %v) names asset %q; the template {http.request.header.X-User} resolves to jane",
			letters[0]["reason"], letters[0]["asset"])
	}
}

// An asset id with a control character is refused because it "would
// break the log lines and headers it is written to" (ping.checkAsset).
// The letter's new asset field now writes that very id, decoded: the
// body keeps the JSON escape \u001b as six printable bytes, the asset
// field a raw ESC, so `redis-cli --raw XRANGE` (or any tool printing the
// stream) runs the sender's terminal sequence on the operator's screen.
// A letter should name only an asset that passed checkAsset (or quote
// one that did not).
// (Helper 6's review, stop 64.)
func TestADeadLetterDoesNotWriteARefusedAssetsControlCharacters(t *testing.T) {
	at := time.Now().UTC().Add(-time.Hour).Format(time.RFC3339)
	feature := fmt.Sprintf(`{"type":"Feature","geometry":{"type":"Point","coordinates":[13.4,52.5]},"properties":{"timestamp":%q,"device_id":"\u001b]0;owned\u0007\u001b[2Jjane"}}`, at)
	letters := overlandLetters(t, "", `{"locations":[`+feature+`]}`)
	if len(letters) != 1 {
		t.Fatalf("letters: %d; want 1", len(letters))
	}
	if body, _ := letters[0]["body"].(string); strings.ContainsRune(body, 0x1b) {
		t.Fatalf("setup: the body itself holds a raw ESC: %q", body)
	}
	if asset, _ := letters[0]["asset"].(string); strings.ContainsAny(asset, "\x1b\x07") {
		t.Errorf("the letter of a Feature refused for a control character in its device_id writes it raw in its asset field: %q (error %v)",
			asset, letters[0]["error"])
	}
}

// A Redis user that may run EVALSHA but not SCRIPT LOAD (the README's ACL
// rule with SCRIPT|LOAD left out, or a managed role that allows EVALSHA
// only): the scripts never load, every sliding or session claim fails
// NOSCRIPT, and in tumbling a release can never be made, so the retry of
// a ping whose upstream failed fails with it. The store-error line named
// no fix; Redis refused the user a command, and the line says so as it
// does for NOPERM. (Helper 2's review, stop 66.)
func TestAUserWithoutScriptLoadIsToldTheACLFix(t *testing.T) {
	rdb := redistest.Start(t)
	ctx := context.Background()
	if err := rdb.Client().Do(ctx, "ACL", "SETUSER", "noload", "on", ">pw", "resetkeys", "~noload:*", "-@all",
		"+ping", "+set", "+get", "+del", "+pttl", "+pexpire", "+hget", "+hset", "+hdel", "+time", "+evalsha",
		"+script|exists", "+xadd", "+type", "+info").Err(); err != nil {
		t.Fatal(err)
	}
	url := "redis://noload:pw@" + rdb.Addr() + "/0"
	for _, shape := range []string{"sliding", "session", "tumbling"} {
		t.Run(shape, func(t *testing.T) {
			tt := tableHandler(t, fmt.Sprintf(`{"key_prefix":"noload:","shape":%q,"on_store_error":"closed","store":{"type":"redis","url":%q,"timeout":%d}}`,
				shape, url, (500*time.Millisecond).Nanoseconds()))
			core, logs := observer.New(zap.WarnLevel)
			tt.h.claimErrors.logger = zap.New(core)
			p := fmt.Sprintf(`{"asset_id":"veh-%s","occurred_at":%q,"lat":52.52,"lon":13.40}`, shape, time.Now().UTC().Add(-time.Minute).Format(time.RFC3339))
			if shape == "tumbling" { // its claim needs no script, its release does
				tt.upstreamStatus = func([]byte) int { return http.StatusBadGateway }
				if res := tt.post(p, "application/json", nil); res.status != http.StatusBadGateway {
					t.Fatalf("the first delivery, its upstream failing: %d %s", res.status, res.header.Get("X-Dedup"))
				}
				tt.upstreamStatus = nil
			}
			if fix := refusedClaimsFix(t, tt, logs, p); !strings.Contains(fix, "README's ACL rule") {
				t.Errorf("the claims' line for a user Redis refuses SCRIPT LOAD: fix %q; want one naming the README's ACL rule", fix)
			}
		})
	}
}

// A Redis at maxclients (another service took the connections, or every
// Caddy instance's pool_size adds up past it) accepts a new connection,
// answers its handshake "ERR max number of clients reached", which
// go-redis does not report, and closes it: every claim that needs a new
// connection fails, as a timeout (the default 50 ms) or a broken pipe. The
// line named neither maxclients nor how to tell, with a fix that asked
// whether Redis was reachable, or none. (Helper 2's review, stop 66.)
func TestAStoreErrorAtMaxclientsNamesIt(t *testing.T) {
	for _, timeout := range []time.Duration{0, 3 * time.Second} { // the default, and one the refusal comes well within
		t.Run(fmt.Sprint(timeout), func(t *testing.T) {
			rdb := redistest.StartWith(t, "--maxclients", "1")
			if err := rdb.Client().Ping(context.Background()).Err(); err != nil { // the one connection Redis takes
				t.Fatal(err)
			}
			tt := tableHandler(t, fmt.Sprintf(`{"key_prefix":"maxclients:","on_store_error":"closed","store":{"type":"redis","url":%q,"timeout":%d}}`,
				rdb.URL(), timeout.Nanoseconds()))
			core, logs := observer.New(zap.WarnLevel)
			tt.h.claimErrors.logger = zap.New(core)
			p := fmt.Sprintf(`{"asset_id":"veh-max","occurred_at":%q,"lat":52.52,"lon":13.40}`, time.Now().UTC().Add(-time.Minute).Format(time.RFC3339))
			if fix := refusedClaimsFix(t, tt, logs, p); !strings.Contains(fix, "maxclients") {
				t.Errorf("the claims' line on a Redis at maxclients: fix %q; want one naming maxclients", fix)
			}
		})
	}
}

// refusedClaimsFix posts ping p to a handler failing closed whose store
// refuses it, and returns the fix its claims' store-error line gives.
func refusedClaimsFix(t *testing.T, tt *tableTester, logs *observer.ObservedLogs, p string) string {
	t.Helper()
	if res := tt.post(p, "application/json", nil); res.status != http.StatusServiceUnavailable {
		t.Fatalf("a claim the store refuses, failing closed: %d %s, want 503", res.status, res.header.Get("X-Dedup"))
	}
	if logs.Len() == 0 {
		t.Fatal("no store-error line")
	}
	fix, _ := logs.All()[0].ContextMap()["fix"].(string)
	return fix
}
