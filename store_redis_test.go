package telemetrydedup

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// Reloads that keep a Redis connection while its reconciler holds a claim
// (Redis is down) leave nothing behind each: the connection's reconciler
// is shared with the config that replaces the old one, which waits for it
// when it lets the connection go. The connection then stays open for the
// reconciler, which makes the release owed once Redis answers.
func TestReloadsDuringAnOutageLeaveNothingBehindEach(t *testing.T) {
	srv := redistest.Start(t)
	load := func() *RedisStore { return provisionRedisStore(t, srv.URL()) }
	current := load()
	srv.Kill()
	owed := &dedup.Claim{Observation: dedup.Observation{Key: "outage-reloads:k"}, Policy: &dedup.Policy{Shape: dedup.Tumbling, TTL: time.Hour},
		Token: 1, At: time.Now()}
	current.reconciler.Hand([]*dedup.Claim{owed}, true)

	settled := func() int { // the startup checks of the configs loaded end
		time.Sleep(time.Second)
		return runtime.NumGoroutine()
	}
	before := settled()
	const reloads = 20
	for range reloads {
		next := load()
		if err := current.Cleanup(); err != nil {
			t.Fatal(err)
		}
		current = next
	}
	// Leftovers stay; the configs' startup checks end within a second or
	// two on a busy machine.
	grown := settled() - before
	for deadline := time.Now().Add(10 * time.Second); grown >= reloads/2 && time.Now().Before(deadline); grown = settled() - before {
	}
	if grown >= reloads/2 {
		t.Errorf("%d reloads during an outage left %d goroutines more", reloads, grown)
	}
	if err := current.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if n, ok := stores.References(current.poolKey); !ok || n != 1 {
		t.Fatalf("the last config let go of a connection whose reconciler owes a release: held %d times (%v), want once, until it is done", n, ok)
	}
	srv.Restart()
	for deadline := time.Now().Add(10 * time.Second); current.reconciler.Unanswered() > 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the release owed was not made 10 s after Redis answered")
		}
	}
}

// A reload that replaces the Redis connection (a new timeout) while Redis
// is down leaves the release of a failed request's claim to the old
// connection's reconciler, which backs off, and which no request uses any
// more. The sender's retry comes through the new connection once Redis is
// back: its call makes the old reconciler's release first, as it would its
// own connection's, and the retry is accepted, not told to come back (and,
// past in_flight_timeout, that its ping was delivered) until the old
// reconciler's next try, seconds later.
func TestARetryThroughANewConnectionMakesTheReleaseTheReplacedOneOwes(t *testing.T) {
	srv := redistest.StartWith(t, "--appendonly", "yes", "--appendfsync", "always")
	// Timeouts long enough for a loaded machine: Redis is killed, not
	// hung, so the old reconciler's tries are refused at once either way.
	load := func(timeout time.Duration) *RedisStore {
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		t.Cleanup(cancel)
		r := &RedisStore{URL: srv.URL(), Timeout: caddy.Duration(timeout)}
		if err := r.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		return r
	}
	old := load(500 * time.Millisecond)
	failed := ownedClaim("replaced:failed", 1)
	if v, err := old.store.Decide(context.Background(), []*dedup.Claim{failed}); err != nil || v[0].Decision != dedup.Accepted {
		t.Fatalf("the first claim: %v %v", v, err)
	}
	srv.Kill()
	old.reconciler.Hand([]*dedup.Claim{failed}, true)
	time.Sleep(1600 * time.Millisecond) // the reconciler's tries, refused, back off to 1.6 s apart

	current := load(time.Second) // the reload
	if current.poolKey == old.poolKey {
		t.Fatal("the reload kept the connection; the test needs a new one")
	}
	if err := old.Cleanup(); err != nil {
		t.Fatal(err)
	}
	srv.Restart()
	retry := ownedClaim("replaced:failed", 2)
	v, err := current.store.Decide(context.Background(), []*dedup.Claim{retry})
	if err != nil {
		t.Fatal(err)
	}
	if v[0].Decision != dedup.Accepted {
		t.Errorf("the retry through the new connection: %v; want accepted: its first attempt failed, and the replaced connection owed the release", v[0].Decision)
	}
}

// A reload that rotates the password replaces the connection: the old one,
// its pool cut (Redis restarted, or a network blip), can no longer log in,
// and the releases it owes fail however often it tries. The new
// connection's calls on their keys make those releases themselves (by
// token, as the old one would have): they are not refused for the old
// password, call after call until the claim's TTL ends, nor does the new
// connection's breaker open for it. The old connection then owes nothing,
// and closes.
func TestARetryThroughANewConnectionIsNotFailedByTheOldOnesRefusedPassword(t *testing.T) {
	srv := redistest.Start(t)
	srv.AddUser(t, "svc", "old")
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	old := &RedisStore{URL: srv.URL(), Username: "svc", Password: "old", Timeout: caddy.Duration(500 * time.Millisecond)}
	if err := old.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	connected(t, old)
	failed := ownedClaim("rotated:failed", 1)
	if v, err := old.store.Decide(context.Background(), []*dedup.Claim{failed}); err != nil || v[0].Decision != dedup.Accepted {
		t.Fatalf("the first claim: %v %v", v, err)
	}
	// The password is rotated, and the old connection's pool cut.
	srv.RotatePassword(t, "svc", "new")
	old.reconciler.Hand([]*dedup.Claim{failed}, true)
	time.Sleep(300 * time.Millisecond) // the old reconciler's tries, refused, back off

	current := &RedisStore{URL: srv.URL(), Username: "svc", Password: "new", Timeout: caddy.Duration(time.Second)} // a new connection; long enough for a loaded machine
	if err := current.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = current.Cleanup() })
	if err := old.Cleanup(); err != nil {
		t.Fatal(err)
	}
	retry := ownedClaim("rotated:failed", 2)
	v, err := current.store.Decide(context.Background(), []*dedup.Claim{retry})
	if err != nil {
		t.Fatalf("the retry through the new connection failed for the old one's refused password: %v", err)
	}
	if v[0].Decision != dedup.Accepted {
		t.Errorf("the retry through the new connection: %v; want accepted: its first attempt failed", v[0].Decision)
	}
	for i := range 2 * dedup.DefaultBreakerFailures {
		other := ownedClaim("rotated:failed", uint64(3+i))
		if _, err := current.store.Decide(context.Background(), []*dedup.Claim{other}); err != nil {
			t.Fatalf("call %d on the key: %v", i, err)
		}
	}
	if n := current.breaker.Open(); n != 0 {
		t.Errorf("the new connection's breaker: %d zones open", n)
	}
	deadline := time.Now().Add(5 * time.Second)
	for old.reconciler.Len() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the old reconciler still holds %d claims: it keeps trying what the new connection released", old.reconciler.Len())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A reload that rotates the password replaces the connection: once Redis
// cut the old one's pool, the old password is refused, and what the old
// connection's reconciler holds would fail try after try until the claims'
// TTL, the connection kept open as long. As it lets go, it hands all of
// it to the new connection's, which makes it through its own: a
// confirmation finds the claim of a failed request that landed late and
// releases it, and the sender's retry is accepted, not told to come back
// and then that its ping was delivered; a settlement is made, and a
// redelivery is suppressed, not told to come back. The old connection
// closes at once.
func TestARetiredConnectionHandsWhatItsReconcilerHoldsToTheNewOne(t *testing.T) {
	srv := redistest.Start(t)
	srv.AddUser(t, "svc", "old")
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	old := loadServing(t, ctx, srv.URL(), "svc", "old", "retired:")
	delivered := ownedClaim("retired:delivered", 1)
	if v, err := old.store.Decide(context.Background(), []*dedup.Claim{delivered}); err != nil || v[0].Decision != dedup.Accepted {
		t.Fatalf("the delivered ping's claim: %v %v", v, err)
	}
	// The failed request's claim is still on its way when the release
	// finds nothing: the reconciler confirms it later.
	late := confirmationOwed(t, old, "retired:late")
	// The password is rotated, and the old connection's pool cut.
	srv.RotatePassword(t, "svc", "new")
	old.reconciler.Hand([]*dedup.Claim{delivered}, false) // its settlement failed

	current := loadServing(t, ctx, srv.URL(), "svc", "new", "retired:")
	t.Cleanup(func() { _ = current.Cleanup() })
	// The failed request's claim lands (written here through the new
	// connection, with its token).
	if v, err := current.store.Decide(context.Background(), []*dedup.Claim{late}); err != nil || v[0].Decision != dedup.Accepted {
		t.Fatalf("the late landing: %v %v", v, err)
	}
	if err := old.Cleanup(); err != nil {
		t.Fatal(err)
	}

	// Well within in_flight_timeout (30 s): the confirmations due are at
	// most a backoff (2 s) away.
	deadline := time.Now().Add(5 * time.Second)
	if got := retriedWhileInFlight(t, current.store, "retired:late", deadline); got != dedup.Accepted {
		t.Fatalf("the failed ping's retry is %v: the claim that landed late was not released", got)
	}
	// The settlement is a job of its own, perhaps due a backoff later.
	if got := retriedWhileInFlight(t, current.store, "retired:delivered", deadline); got != dedup.Suppressed {
		t.Errorf("the delivered ping's redelivery is %v; want suppressed: its claim was settled", got)
	}
	for ; ; time.Sleep(20 * time.Millisecond) {
		if _, ok := stores.References(old.poolKey); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the old connection is still open, its reconciler holding %d claims", old.reconciler.Len())
		}
	}
}

// The connection hands over too what its reconciler was given as it
// closes (a settlement the pipeline's last flush failed, a release handed
// over meanwhile): its own last pass would be refused the old password,
// and count them dropped, the failed ping's retry told to come back and
// then that it was delivered.
func TestAClosingRetiredConnectionHandsOverWhatItWasGivenLast(t *testing.T) {
	srv := redistest.Start(t)
	srv.AddUser(t, "svc", "old")
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	settings := func(password string) RedisStore {
		return RedisStore{URL: srv.URL(), Username: "svc", Password: password, Timeout: caddy.Duration(time.Second)}
	}
	oldSettings := settings("old")
	opts, err := oldSettings.options()
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.WarnLevel)
	old := newRedisConnection(opts, oldSettings, zap.New(core))
	current := settings("new")
	srv.RotatePassword(t, "svc", "new")
	if err := current.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	current.servesPrefix("retired-last:") // as the handler does
	t.Cleanup(func() { _ = current.Cleanup() })
	failed := ownedClaim("retired-last:failed", 1)
	if v, err := current.store.Decide(context.Background(), []*dedup.Claim{failed}); err != nil || v[0].Decision != dedup.Accepted {
		t.Fatalf("the failed ping's claim: %v %v", v, err)
	}
	old.reconciler.Hand([]*dedup.Claim{failed}, true) // its upstream failed
	if err := old.Destruct(); err != nil {
		t.Fatal(err)
	}
	if said := logs.FilterMessageSnippet("could not be released or settled").All(); len(said) > 0 {
		t.Errorf("the closing connection gave up on claims: %v", said[0].ContextMap())
	}
	deadline := time.Now().Add(5 * time.Second) // well within in_flight_timeout (30 s)
	if got := retriedWhileInFlight(t, current.store, "retired-last:failed", deadline); got != dedup.Accepted {
		t.Fatalf("the failed ping's retry is %v: the release the closing connection was given was not made", got)
	}
}

// retriedWhileInFlight retries the ping of key on store, a new request's
// token each time, every 100 ms while it is told in_flight and deadline
// has not passed, and returns the last decision.
func retriedWhileInFlight(t *testing.T, store dedup.Store, key string, deadline time.Time) dedup.Decision {
	t.Helper()
	for token := uint64(2); ; token++ {
		v, err := store.Decide(context.Background(), []*dedup.Claim{ownedClaim(key, token)})
		if err != nil {
			t.Fatal(err)
		}
		if v[0].Decision != dedup.InFlight || time.Now().After(deadline) {
			return v[0].Decision
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A retired connection hands its jobs only to a connection a config
// holds: one that a later reload retired too may be about to make its last
// pass, and would drop them where this one keeps trying. When it
// hands them over, it says how many: nothing else tells an operator where
// they went.
func TestARetiredConnectionHandsNothingToOneNoConfigHolds(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	old := downConnection(t, zap.New(core))
	defer old.Destruct()
	newer := downConnection(t, zap.NewNop()) // no config holds it yet: it was retired
	defer newer.Destruct()
	old.reconciler.Hand([]*dedup.Claim{ownedClaim("retired-unheld:failed", 1)}, true)
	handed := func() []observer.LoggedEntry { return logs.FilterMessageSnippet("handed the claims").All() }
	if old.handOver() || old.reconciler.Len() != 1 || len(handed()) != 0 {
		t.Fatalf("the old connection handed its release to one no config holds (it keeps %d claims; lines %v)", old.reconciler.Len(), logs.All())
	}
	newer.holders.Add(1) // a config holds it, for the key_prefix of the release
	newer.prefixes.hold("retired-unheld:")
	if !old.handOver() || newer.reconciler.Len() != 1 {
		t.Fatalf("the old connection kept its release from the newer one a config holds (it took %d claims)", newer.reconciler.Len())
	}
	if said := handed(); len(said) != 1 || said[0].ContextMap()["claims"] != int64(1) {
		t.Errorf("the hand-over's lines: %v, want one saying 1 claim", logs.All())
	}
	if old.handOver(); len(handed()) != 1 {
		t.Errorf("a hand-over of nothing said so: %v", logs.All())
	}
}

// A config that lets go of a connection another still holds leaves its
// requests' drain to that one, with its own bound: the requests of a
// config with a longer in_flight_timeout (a reload lowered it) keep the
// connection until they are done, however short the last config's bound.
func TestTheLastHolderDrainsForTheLongestInFlight(t *testing.T) {
	srv := redistest.Start(t)
	load := func(inFlight time.Duration) *RedisStore {
		r := provisionRedisStore(t, srv.URL())
		r.drainWithin(inFlight)
		return r
	}
	old := load(time.Minute)
	old.users.Add(1) // a request of the old config, which may run a minute
	current := load(0)
	if err := old.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if err := current.Cleanup(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // past the last config's own bound, its timeout + 1 s
	if _, ok := stores.References(current.poolKey); !ok {
		t.Fatal("the connection closed while a request of the config with the longer in_flight_timeout still ran")
	}
	old.users.Add(-1)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, ok := stores.References(current.poolKey); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the connection is still open 5 s after its last request ended")
		}
	}
}

// Closing a Redis connection (Caddy's exit, or the last config using it
// unloaded) gives its reconciler one last try. A Redis that came back
// (restarted with its data) has the release owed made, through the
// pipeline the connection closes only after it: the sender's retry after
// the restart is accepted, not told to come back and then that its ping
// was delivered. A Redis still hung holds the close a few store timeouts,
// and the log says how many releases and settlements were given up on and
// what their senders will meet.
func TestClosingARedisConnectionTriesWhatItOwesOnce(t *testing.T) {
	for _, tt := range []struct {
		name     string
		timeout  time.Duration
		comeBack bool
		warned   map[string]int64 // the warning's counts, nil for none
	}{
		{name: "Redis came back", timeout: 500 * time.Millisecond, comeBack: true},
		{name: "Redis still hung", timeout: 500 * time.Millisecond, warned: map[string]int64{"releases": 1, "settlements": 1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := redistest.StartWith(t, "--appendonly", "yes", "--appendfsync", "always")
			core, logs := observer.New(zap.WarnLevel)
			r := RedisStore{URL: srv.URL(), Timeout: caddy.Duration(tt.timeout)}
			opts, err := r.options()
			if err != nil {
				t.Fatal(err)
			}
			c := newRedisConnection(opts, r, zap.New(core))
			failed, delivered := ownedClaim("closing:failed", 1), ownedClaim("closing:delivered", 2)
			if v, err := c.store.Decide(context.Background(), []*dedup.Claim{failed, delivered}); err != nil || v[0].Decision != dedup.Accepted || v[1].Decision != dedup.Accepted {
				t.Fatalf("the claims: %v %v", v, err)
			}

			if tt.comeBack {
				srv.Kill()
			} else {
				srv.Pause()
			}
			c.reconciler.Hand([]*dedup.Claim{failed}, true)
			c.reconciler.Hand([]*dedup.Claim{delivered}, false)
			if tt.comeBack {
				time.Sleep(1600 * time.Millisecond) // the reconciler's tries, refused, back off to 1.6 s apart
				srv.Restart()
			}
			began := time.Now()
			if err := c.Destruct(); err != nil {
				t.Fatal(err)
			}
			// A few store timeouts (a pass on its way, the last pass's
			// release and settlement, the drain's bound), not the claims'
			// in_flight_timeout or TTL: measured 2 s to 3.5 s, in steps of
			// the timeout, as the reconciler's backoff and the close meet;
			// the bound was 3 s, and failed a CI run at 3.005 s.
			if took := time.Since(began); took > 10*tt.timeout+time.Second {
				t.Errorf("closing took %v, with a store timeout of %v", took, tt.timeout)
			}
			warnings := logs.FilterMessageSnippet("closing the Redis connection").All()
			if len(warnings) != min(len(tt.warned), 1) || logs.Len() != len(warnings) {
				t.Fatalf("%d warnings, %d of them of the claims given up on; want %d", logs.Len(), len(warnings), min(len(tt.warned), 1))
			}
			for field, want := range tt.warned {
				if got := warnings[0].ContextMap()[field]; got != want {
					t.Errorf("the warning says %s=%v, want %d", field, got, want)
				}
			}
			if !tt.comeBack {
				srv.Kill()
				return
			}
			if n := srv.Client().Exists(context.Background(), failed.Key()).Val(); n != 0 {
				t.Errorf("the failed request's claim is still in Redis: its retry would be told to come back, then that it was delivered")
			}
		})
	}
}

// ownedClaim is a tumbling claim on key, made now with token.
func ownedClaim(key string, token uint64) *dedup.Claim {
	return &dedup.Claim{Observation: dedup.Observation{Key: key}, Token: token, At: time.Now(),
		Policy: &dedup.Policy{Shape: dedup.Tumbling, TTL: time.Hour, InFlightTimeout: dedup.DefaultInFlightTimeout}}
}

// connected opens a connection of r's pool (logged in, scripts loaded)
// within a second: a test's first claim, with a store timeout of 50 ms,
// otherwise times out now and then under -race.
func connected(t *testing.T, r *RedisStore) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := r.client.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
}

// provisionRedisStore loads a Redis store on url as a config would, with
// a store timeout of 50 ms, its config's context cancelled when the test
// ends.
func provisionRedisStore(t *testing.T, url string) *RedisStore {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	r := &RedisStore{URL: url, Timeout: caddy.Duration(50 * time.Millisecond)}
	if err := r.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	return r
}

// A claim handed to the reconciler while the connection closes (the
// release of a request that ended as Caddy exits, failed on a hung Redis)
// is dropped: it stands until in_flight_timeout, and the retry of its
// observation is told to come back, then that it was delivered. The log
// says so, as it says of the claims the closing itself gave up on, and
// reconciled_total counts both.
func TestAClaimHandedWhileTheConnectionClosesIsLogged(t *testing.T) {
	srv := redistest.Start(t)
	core, logs := observer.New(zap.WarnLevel)
	r := RedisStore{URL: srv.URL(), Timeout: caddy.Duration(500 * time.Millisecond)}
	opts, err := r.options()
	if err != nil {
		t.Fatal(err)
	}
	c := newRedisConnection(opts, r, zap.New(core))
	droppedBefore := reconciledNow(t, dedup.ReconcileDropped)
	srv.Pause()
	c.reconciler.Hand([]*dedup.Claim{ownedClaim("closing:held", 1)}, true) // the closing's last pass waits a timeout for it
	closed := make(chan error, 1)
	go func() { closed <- c.Destruct() }()
	held := 1 // the claims the closing gives up on: those taken before it closes the reconciler too
	for token := uint64(2); c.reconciler.Hand([]*dedup.Claim{ownedClaim("closing:handed", token)}, true); token++ {
		held++
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case <-closed:
		t.Fatal("the connection closed before a claim was handed over; the test needs a longer store timeout")
	default:
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	srv.Kill()

	given := logs.FilterMessageSnippet("closing the Redis connection").All()
	if len(given) != 1 || given[0].ContextMap()["releases"] != int64(held) {
		t.Fatalf("the warnings of the claims the closing gave up on: %v, want one, of %d releases", given, held)
	}
	handed := logs.FilterMessageSnippet("could not be reconciled").All()
	if len(handed) != 1 || handed[0].ContextMap()["error"] != "1 claims dropped" {
		t.Errorf("the claim handed over while the connection closed is in no log line (lines: %d, of them %v)", logs.Len(), handed)
	}
	if got := reconciledNow(t, dedup.ReconcileDropped) - droppedBefore; got != float64(held+1) {
		t.Errorf("reconciled_total{outcome=dropped} grew by %v, want %d: the claims given up on and the one handed over", got, held+1)
	}
}

// reconciledNow reads reconciled_total{outcome}.
func reconciledNow(t *testing.T, outcome dedup.ReconcileOutcome) float64 {
	t.Helper()
	metricsOnce.Do(initMetrics)
	var m dto.Metric
	if err := metrics.reconciled.WithLabelValues(string(outcome)).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// Caddy's exit closes a Redis connection no config uses any more (a reload
// replaced it while its reconciler held claims) as it begins, and the exit
// hook waits for that: the reconciler's last pass is made, and what it
// gave up on logged, before the process ends. The connection looked once a
// second whether Caddy was exiting, so the hook waited up to a second
// more than the closing took, and gave up at its cap, the connection
// still open and its line never written, when the closing took the rest.
// (A test cannot make caddy.Exiting true without ending its process: in
// it the connection never saw the exit that way, and the hook waited out
// its whole cap.) The hook cuts every request of the process for good, so
// the test runs in a process of its own.
func TestAnExitClosesAConnectionNoConfigUsesAsItBegins(t *testing.T) {
	if !inProcessOfItsOwn(t) {
		return
	}
	srv := redistest.Start(t)
	r := provisionRedisStore(t, srv.URL())
	core, logs := observer.New(zap.WarnLevel)
	r.loggers.add(zap.New(core)) // the connection's lines go to the latest config's logger
	srv.Kill()
	r.reconciler.Hand([]*dedup.Claim{ownedClaim("exit:owed", 1)}, true)
	if err := r.Cleanup(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the connection waits for its reconciler
	if _, open := stores.References(r.poolKey); !open {
		t.Fatal("the connection closed while its reconciler owed a release")
	}

	began := time.Now()
	finishRedisAtExit(context.Background())
	took := time.Since(began)
	t.Logf("the exit hook took %v", took)
	if _, open := stores.References(r.poolKey); open {
		t.Fatalf("the exit hook returned after %v with the connection still open: the process ends before its last pass", took)
	}
	if given := logs.FilterMessageSnippet("closing the Redis connection").All(); len(given) != 1 || given[0].ContextMap()["releases"] != int64(1) {
		t.Errorf("the warning of the release the closing gave up on: %v, want one, of 1 release", given)
	}
}

// inProcessOfItsOwn reports whether the test runs in a process of its own.
// If not, it runs the test again in one, and fails if that does.
func inProcessOfItsOwn(t *testing.T) bool {
	t.Helper()
	const child = "TELEMETRY_DEDUP_TEST_PROCESS"
	if os.Getenv(child) == t.Name() {
		return true
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), child+"="+t.Name())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("in a process of its own: %v\n%s", err, out)
	}
	t.Logf("in a process of its own:\n%s", out)
	return false
}

// The startup check tells the operator of a Redis whose config can lose
// claims, with the fix, and only then. Nothing keeps a Redis that runs
// maxmemory with an eviction policy from evicting claims (managed Redis
// often runs volatile-lru, and every key this module writes has a TTL):
// under memory pressure a claim whose request still waits for its
// upstream goes (volatile-ttl: a short-TTL site's first), and the
// redelivery of its ping is forwarded again; in sliding and session an
// evicted pending seen entry loses what its release must forget. A Redis
// that keeps its data by snapshots alone (RDB, the save schedule of
// redis.conf's defaults) brings back, when it restarts, a claim its last
// snapshot caught in flight and that was released since: the sender, told
// its upstream failed, retries, is answered 409 until in_flight_timeout
// and then 200 suppressed, and the backend never gets the ping; an
// append-only file keeps the release across the same restart
// (TestAnAppendOnlyFileKeepsAReleaseAcrossARestart; helper 2's review,
// stop 66).
func TestTheStartupWarningsSayHowRedisCouldLoseClaims(t *testing.T) {
	const evicting, snapshotting = "evict", "snapshots"
	for _, tt := range []struct {
		name  string
		args  []string
		saved bool   // a snapshot was taken since Redis started
		warn  string // what the one warning names, "" for none
		fix   string
	}{
		{"volatile-ttl under maxmemory", []string{"--maxmemory", "100mb", "--maxmemory-policy", "volatile-ttl"}, false, evicting, "noeviction"},
		{"allkeys-lru under maxmemory", []string{"--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"}, false, evicting, "noeviction"},
		{"noeviction under maxmemory", []string{"--maxmemory", "100mb", "--maxmemory-policy", "noeviction"}, false, "", ""},
		{"an eviction policy without maxmemory", []string{"--maxmemory-policy", "volatile-lru"}, false, "", ""},
		{"snapshots on a schedule", []string{"--save", "3600 1 300 100"}, true, snapshotting, "appendonly yes"},
		// save "" stops the schedule only: Redis still loads the dump a
		// backup job's SAVE wrote (helper 5's review, stop 66).
		{"a snapshot taken by hand (a backup job's BGSAVE), no schedule", nil, true, snapshotting, "no dump.rdb"},
		// Only CONFIG GET save tells a schedule that has not run yet,
		// which the README's ACL rule does not grant: not judged.
		{"a snapshot schedule that has not run yet", []string{"--save", "3600 1 300 100"}, false, "", ""},
		{"snapshots and an append-only file", []string{"--save", "3600 1", "--appendonly", "yes"}, true, "", ""},
		{"an append-only file alone", []string{"--appendonly", "yes"}, false, "", ""},
		{"nothing kept", nil, false, "", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := redistest.StartWith(t, tt.args...)
			if tt.saved {
				if err := srv.Client().Save(context.Background()).Err(); err != nil {
					t.Fatal(err)
				}
			}
			core, logs := observer.New(zap.WarnLevel)
			warnIfUnreachable(context.Background(), srv.Client(), srv.Addr(), zap.New(core))
			entries := logs.All()
			if tt.warn == "" {
				if len(entries) != 0 {
					t.Fatalf("warned %q; want nothing", entries[0].Message)
				}
				return
			}
			if len(entries) != 1 {
				t.Fatalf("%d warnings, want 1 naming %q", len(entries), tt.warn)
			}
			fix, _ := entries[0].ContextMap()["fix"].(string)
			if !strings.Contains(entries[0].Message, tt.warn) || !strings.Contains(fix, tt.fix) {
				t.Errorf("startup warning %q, fix %q; want it to name %q and the fix %q", entries[0].Message, fix, tt.warn, tt.fix)
			}
		})
	}
}

// The warning's fix holds: a ping whose upstream failed while Redis took a
// snapshot, then killed and restarted with its data, is accepted on retry
// and reaches the backend, in every shape, with an append-only file (the
// release is in it); with snapshots alone the claim came back and the
// retry was told 409, then that it was delivered. (Helper 2's review, stop
// 66.)
func TestAnAppendOnlyFileKeepsAReleaseAcrossARestart(t *testing.T) {
	for _, shape := range []string{"tumbling", "sliding", "session"} {
		t.Run(shape, func(t *testing.T) {
			rdb := redistest.StartWith(t, "--save", "3600 1", "--appendonly", "yes")
			tt := tableHandler(t, fmt.Sprintf(`{"key_prefix":"aof:","shape":%q,"in_flight_timeout":%d,"store":{"type":"redis","url":%q,"timeout":%d}}`,
				shape, (2*time.Second).Nanoseconds(), rdb.URL(), (200*time.Millisecond).Nanoseconds()))
			admin := rdb.Client()
			p := fmt.Sprintf(`{"asset_id":"veh-aof","occurred_at":%q,"lat":52.52,"lon":13.40}`, time.Now().UTC().Add(-time.Minute).Format(time.RFC3339))
			tt.upstreamStatus = func([]byte) int { // fails, after a snapshot that holds the claim in flight
				if err := admin.Save(context.Background()).Err(); err != nil {
					t.Errorf("SAVE: %v", err)
				}
				return http.StatusBadGateway
			}
			if res := tt.post(p, "application/json", nil); res.status != http.StatusBadGateway {
				t.Fatalf("the first delivery, its upstream failing: %d %s", res.status, res.header.Get("X-Dedup"))
			}
			tt.upstreamStatus, tt.upstream = nil, nil
			rdb.Restart() // killed, and back with its data
			var answers []string
			for deadline := time.Now().Add(8 * time.Second); ; time.Sleep(250 * time.Millisecond) {
				res := tt.post(p, "application/json", nil)
				answers = append(answers, fmt.Sprintf("%d %s", res.status, res.header.Get("X-Dedup")))
				if res.status < 500 && res.status != http.StatusConflict || time.Now().After(deadline) {
					break
				}
			}
			if len(tt.upstream) != 1 {
				t.Errorf("retried after the restart, answered %v: the upstream got the ping %d times, want once", answers, len(tt.upstream))
			}
		})
	}
}

// On a Cluster, CONFIG GET or INFO has no key: go-redis sends it to one master
// (its shard picker's next), and the check judges the whole Cluster by
// that node's config. Each master has a config of its own (a node
// restarted from another config file, one resized under memory pressure,
// a managed cluster's shards of different node types), and claims on any
// master can be evicted: with one master of three running an eviction
// policy, whether Caddy warns depends on which node answered. Here each
// master in turn is the one that evicts, with a fresh client as each
// start makes; the check warns for at most one of them.
func TestTheStartupWarningJudgesEveryClusterMaster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	ctx := context.Background()
	for i, evicting := range c.Nodes() {
		for _, n := range c.Nodes() {
			policy := "noeviction"
			if n == evicting {
				policy = "volatile-ttl"
			}
			if err := n.Client().ConfigSet(ctx, "maxmemory", "100mb").Err(); err != nil {
				t.Fatal(err)
			}
			if err := n.Client().ConfigSet(ctx, "maxmemory-policy", policy).Err(); err != nil {
				t.Fatal(err)
			}
		}
		opts, err := RedisStore{Addresses: c.Addrs(), Cluster: true}.options()
		if err != nil {
			t.Fatal(err)
		}
		opts.OnConnect = nil
		client := redis.NewUniversalClient(opts)
		core, logs := observer.New(zap.WarnLevel)
		warnIfUnreachable(ctx, client, "cluster", zap.New(core))
		_ = client.Close()
		if logs.Len() != 1 {
			t.Errorf("master %d of 3 (%s) runs maxmemory 100mb with volatile-ttl, the others noeviction: %d warnings at start, want 1 "+
				"(the check asked one master only)", i+1, evicting.Addr(), logs.Len())
		}
	}
}

// An address that is a unix socket's absolute path loads: go-redis dials
// it over the socket. The host:port check refused it, and a config that
// worked no longer started. (Helper 6's review, stop 63.)
func TestAUnixSocketAddressLoads(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "redis.sock")
	redistest.StartWith(t, "--unixsocket", sock, "--unixsocketperm", "700")
	r := RedisStore{Addresses: []string{sock}}
	opts, err := r.options()
	if err != nil {
		t.Fatalf("addresses %s: %v", sock, err)
	}
	c := redis.NewUniversalClient(opts)
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Errorf("the store's options do not reach Redis on its socket: %v", err)
	}
}
