package telemetrydedup

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/pipeline"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// heldLink stands for the network path of one connection only (its pool's
// sockets), the other connections on the same Redis going their own way:
// in refuse mode each call through it fails at once (a reset connection),
// in slow mode each reaches Redis late (a stalled path, a retransmitting
// socket), but it does reach it.
type heldLink struct {
	mode  atomic.Int32 // linkFine, linkRefuse or linkSlow
	delay time.Duration
}

const (
	linkFine int32 = iota
	linkRefuse
	linkSlow
)

var errLinkReset = errors.New("read tcp: connection reset by peer")

func (h *heldLink) wait(ctx context.Context) error {
	switch h.mode.Load() {
	case linkRefuse:
		return errLinkReset
	case linkSlow:
		select {
		case <-time.After(h.delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (h *heldLink) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *heldLink) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if err := h.wait(ctx); err != nil {
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

func (h *heldLink) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if err := h.wait(ctx); err != nil {
			for _, c := range cmds {
				c.SetErr(err)
			}
			return err
		}
		return next(ctx, cmds)
	}
}

// twoConnectionsOnOneKeyspace opens two connections on srv's data, first
// then second (so second joined the keyspace after first), with settings
// that differ (as two sites' store blocks do, or a reload's new timeout),
// each with a store timeout long enough for a loaded machine. second's
// path goes through a heldLink. first is held by a config (holders), as
// a live site's connection is.
func twoConnectionsOnOneKeyspace(t *testing.T, srv *redistest.Server, delay time.Duration) (first, second *redisConnection, link *heldLink) {
	t.Helper()
	open := func(r RedisStore) *redisConnection {
		opts, err := r.options()
		if err != nil {
			t.Fatal(err)
		}
		return newRedisConnection(opts, r, zap.NewNop())
	}
	first = open(RedisStore{URL: srv.URL(), Timeout: caddy.Duration(3 * time.Second)})
	first.holders.Add(1)
	t.Cleanup(func() { _ = first.Destruct() })
	second = open(RedisStore{URL: srv.URL(), Timeout: caddy.Duration(3 * time.Second), BreakerFailures: 7})
	if first.keyspace != second.keyspace {
		t.Fatal("the two connections are not on one keyspace; the test needs them to be")
	}
	link = &heldLink{delay: delay}
	second.client.AddHook(link)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, c := range []*redisConnection{first, second} {
		if err := c.client.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	return first, second, link
}

// owedThroughSecond writes key's claim through second (the request's
// store call), and leaves its release owed to second's reconciler: the
// request's upstream failed, and its release failed on second's path. The
// reconciler's tries fail too, and it backs off; then second's path turns
// slow: what it sends from now on reaches Redis, late.
func owedThroughSecond(t *testing.T, second *redisConnection, link *heldLink, key string) *dedup.Claim {
	t.Helper()
	failed := ownedClaim(key, 1)
	if v, err := second.store.Decide(context.Background(), []*dedup.Claim{failed}); err != nil || v[0].Decision != dedup.Accepted {
		t.Fatalf("the failed request's claim: %v %v", v, err)
	}
	link.mode.Store(linkRefuse)
	second.reconciler.Hand([]*dedup.Claim{failed}, true)
	time.Sleep(400 * time.Millisecond) // tried at 0, 0.1 and 0.3 s, refused; the next at 0.7 s
	link.mode.Store(linkSlow)
	return failed
}

// retryThroughFirst is the sender's retry of key, through first, once
// began reports that second's closing has begun, while second still
// owes the release (its pass on its way, slowed), which it logs if not.
func retryThroughFirst(t *testing.T, first, second *redisConnection, failed *dedup.Claim, began func() bool) (dedup.Decision, error) {
	t.Helper()
	claims := []*dedup.Claim{failed}
	for deadline := time.Now().Add(5 * time.Second); !began(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the connection did not begin closing")
		}
	}
	if !second.reconciler.OwesFor(claims) {
		// Handed over and made by another connection (then the retry must
		// be accepted), or the link was not slow enough for the test.
		t.Log("the closing connection no longer owed the release when the retry came")
	}
	v, err := first.store.Decide(context.Background(), []*dedup.Claim{ownedClaim(failed.Key(), 2)})
	if err != nil {
		return "", err
	}
	return v[0].Decision, nil
}

// after reports true from d after now on.
func after(d time.Duration) func() bool {
	at := time.Now().Add(d)
	return func() bool { return time.Now().After(at) }
}

// leftKeyspace reports whether c has left its keyspace.
func leftKeyspace(c *redisConnection) func() bool {
	return func() bool { return !slices.Contains(*c.keyspace.connections.Load(), c) }
}

// A call whose keys another connection on the same data owes releases on,
// while that connection closes (Caddy exits, or a reload retired it with
// no one to hand them to), does not go to Redis ahead of them: it fails
// (on_store_error decides), or is accepted once they are made. The
// closing connection's last pass makes them; Reconciler.TakeOver leaves
// them to it, and keyspace.releaseOwed used to give up after its rounds
// and let the call through: the sender's retry found the failed
// request's claim, was told to come back, and past in_flight_timeout that
// its ping was delivered, though the upstream never got it.
//
// Setup: two connections on one Redis; second's path is slowed (each call
// reaches Redis 1.5 s late); second owes the release; its reconciler
// closes while it is still in the keyspace; the retry comes through first.
// (Helper 2's review, stop 61: keyspace.releaseOwed returned nil after
// its rounds.)
func TestACallDoesNotOvertakeTheReleaseOfAClosingConnectionOnTheSameData(t *testing.T) {
	srv := redistest.Start(t)
	first, second, link := twoConnectionsOnOneKeyspace(t, srv, 1500*time.Millisecond)
	t.Cleanup(func() { _ = second.Destruct() })
	failed := owedThroughSecond(t, second, link, "closing-owed:veh")

	closed := make(chan struct{})
	go func() { // second stays in the keyspace meanwhile
		defer close(closed)
		second.reconciler.Close()
	}()
	got, err := retryThroughFirst(t, first, second, failed, after(100*time.Millisecond)) // Close marks it closed at once
	<-closed
	if err == nil && got != dedup.Accepted {
		t.Errorf("the retry through the live connection is %v: it went to Redis while the closing reconciler on the keyspace still "+
			"owed its ping's release (want it accepted after that release, or failed)", got)
	}
}

// A connection that closes with releases owed and no connection to hand
// them to (Caddy exits: no config holds any connection any more, and the
// requests still running finish on theirs) stays in the keyspace until its
// last pass is done: the calls through the other connections on those keys
// fail, and never go ahead of a release on its way. Destruct used to
// leave the keyspace before Close, and a retry through the other
// connection, during that close, was told to come back (then that its
// ping was delivered) while the release landed a moment later.
//
// Setup: as the test above, but second is closed by Destruct, and first is
// no config's either, as at an exit. (Helper 2's review, stop 61.)
func TestAConnectionClosingWithNoOneToHandItsJobsToKeepsTheOthersWaiting(t *testing.T) {
	srv := redistest.Start(t)
	first, second, link := twoConnectionsOnOneKeyspace(t, srv, 1500*time.Millisecond)
	failed := owedThroughSecond(t, second, link, "destruct-owed:veh")
	first.holders.Add(-1) // Caddy exits: second has no one to hand its jobs to

	destructed := make(chan struct{})
	left, closing := leftKeyspace(second), after(300*time.Millisecond)
	go func() {
		defer close(destructed)
		_ = second.Destruct()
	}()
	// Close comes right after it leaves the keyspace; one that stays
	// meanwhile has begun closing within 300 ms (a flush of nothing, a
	// hand-over to no one).
	got, err := retryThroughFirst(t, first, second, failed, func() bool { return left() || closing() })
	<-destructed
	if err == nil && got != dedup.Accepted {
		t.Errorf("the retry through the live connection is %v: it went to Redis while the closing connection on the same data "+
			"still owed its ping's release, which landed after it (want accepted after that release, or failed)", got)
	}
}

// A retired connection hands what its reconciler holds to an older
// connection on the same data that a config holds and that serves its
// key_prefix: one site's two routes with the same key_prefix and
// different store options (two connections), and a reload removes the
// newer route while its connection can no longer reach Redis (its own
// path broken: a client certificate of its config that expired, say). A
// failed request's claim of the removed route landed after its release
// found nothing, and the confirmation that releases it fails on the
// retired connection: the older route's connection makes it, and the
// sender's retry is accepted. Handed only to newer connections, the
// confirmations were kept and failed until the claims' TTL, and the retry
// was told to come back, then that its ping was delivered.
//
// Setup: store "older" loaded, then "retired" (another timeout: another
// connection), both serving the key_prefix "older:"; the retired one's
// release of a claim not yet landed is answered (not_held), leaving its
// confirmations; its path is refused from then on; the claim lands; the
// retired config is cleaned up. (Helper 2's review, stop 61.)
func TestARetiredConnectionHandsItsJobsToAnOlderOneOfItsSite(t *testing.T) {
	srv := redistest.Start(t)
	srv.AddUser(t, "svc", "p")
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	load := func(timeout time.Duration) *RedisStore {
		r := &RedisStore{URL: srv.URL(), Username: "svc", Password: "p", Timeout: caddy.Duration(timeout)}
		if err := r.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		r.servesPrefix("older:") // as the handler does
		connected(t, r)
		return r
	}
	older := load(time.Second)
	t.Cleanup(func() { _ = older.Cleanup() })
	retired := load(1100 * time.Millisecond)
	if older.dataID != retired.dataID || older.poolKey == retired.poolKey {
		t.Fatal("the two stores are not two connections on one keyspace; the test needs them to be")
	}
	late := confirmationOwed(t, retired, "older:late") // its upstream failed; the claim is still on its way
	link := &heldLink{}
	retired.client.AddHook(link)
	link.mode.Store(linkRefuse) // the retired connection's path is broken from now on
	if v, err := older.store.Decide(context.Background(), []*dedup.Claim{late}); err != nil || v[0].Decision != dedup.Accepted {
		t.Fatalf("the late landing: %v %v", v, err) // written here with its token, as the late write would
	}
	if err := retired.Cleanup(); err != nil {
		t.Fatal(err)
	}
	// Then its drain ends: the test's claims would hold it an hour.
	t.Cleanup(func() { retired.reconciler.Close() })
	// Well within in_flight_timeout (30 s): a hand-over is looked for
	// every second, and the confirmations due are a backoff (2 s) away.
	if got := retriedWhileInFlight(t, older.store, "older:late", time.Now().Add(6*time.Second)); got != dedup.Accepted {
		t.Errorf("the failed ping's retry through the older site is %v: the retired connection, refused, kept the confirmation "+
			"that would release the claim that landed late (it holds %d claims) rather than hand it to the older connection of its site",
			got, retired.reconciler.Len())
	}
}

// A retired connection hands what its reconciler holds to the one that
// replaced it while its own requests still run, not once they are done
// (up to in_flight_timeout + timeout + 1 s, 31 s by default): after a
// password rotation and a Redis restart, the old connection is refused,
// and the confirmation that releases a failed request's claim that landed
// late would be refused meanwhile, the retry through the new connection
// told to come back, and, once the claim is older than in_flight_timeout,
// that its ping was delivered. (The keyspace's takeover at call time,
// keyspace.releaseOwed, covers the releases Redis never answered, not the
// confirmations.)
//
// Setup: TestARetiredConnectionHandsWhatItsReconcilerHoldsToTheNewOne's,
// with one request of the old config still running (its upstream slow),
// and the old config's drain bound that of the default in_flight_timeout,
// as the handler sets it (drainWithin). (Helper 2's review, stop 61.)
func TestARetiredConnectionHandsOverWhileItsRequestsStillRun(t *testing.T) {
	srv := redistest.Start(t)
	srv.AddUser(t, "svc", "old")
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	old := loadServing(t, ctx, srv.URL(), "svc", "old", "draining:")
	old.drainWithin(dedup.DefaultInFlightTimeout)     // as the handler does
	late := confirmationOwed(t, old, "draining:late") // its upstream failed; the claim is still on its way
	srv.RotatePassword(t, "svc", "new")               // and Redis cut the old connection's pool

	current := loadServing(t, ctx, srv.URL(), "svc", "new", "draining:")
	t.Cleanup(func() { _ = current.Cleanup() })
	if v, err := current.store.Decide(context.Background(), []*dedup.Claim{late}); err != nil || v[0].Decision != dedup.Accepted {
		t.Fatalf("the late landing: %v %v", v, err) // written here with its token, as the late write would
	}
	old.users.Add(1) // a request of the old config, its upstream slow
	t.Cleanup(func() { old.users.Add(-1) })
	if err := old.Cleanup(); err != nil {
		t.Fatal(err)
	}
	// Then its drain ends: the test's claims would hold it an hour.
	t.Cleanup(func() { old.reconciler.Close() })
	// Well within in_flight_timeout (30 s), as in the test without a
	// request still running.
	if got := retriedWhileInFlight(t, current.store, "draining:late", time.Now().Add(6*time.Second)); got != dedup.Accepted {
		t.Errorf("the failed ping's retry through the new connection is %v: the old connection, refused, still holds the confirmation "+
			"that would release the claim that landed late (%d claims), and hands it over only once its requests are done",
			got, old.reconciler.Len())
	}
}

// Caddy's exit closes a connection no config uses any more even while a
// request of its config still counts as using it, one the exit does not
// cut (it still reads a slow sender's body): the releases the connection
// owes get its last pass, and what it gives up on is logged. The drain's
// wait for its requests used to ignore the exit: the exit hook gave up
// after a few store timeouts with the connection still open, and the
// process ended with those releases neither made nor counted nor logged,
// their pings' retries told to come back, then that they were delivered.
//
// Setup: TestAnExitClosesAConnectionNoConfigUsesAsItBegins's, with the
// config's drain bound set as the handler sets it (drainWithin) and one
// request of that config still running. (Helper 2's review, stop 61.)
func TestAnExitClosesARetiredConnectionWhileARequestItDoesNotCutRuns(t *testing.T) {
	if !inProcessOfItsOwn(t) {
		return
	}
	srv := redistest.Start(t)
	r := provisionRedisStore(t, srv.URL())
	r.drainWithin(dedup.DefaultInFlightTimeout) // as the handler does
	core, logs := observer.New(zap.WarnLevel)
	r.loggers.add(zap.New(core)) // the connection's lines go to the latest config's logger
	srv.Kill()
	r.reconciler.Hand([]*dedup.Claim{ownedClaim("exit-uncut:owed", 1)}, true)
	r.users.Add(1) // a request of the config still reading its sender's body
	if err := r.Cleanup(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the connection waits for its request and its reconciler
	if _, open := stores.References(r.poolKey); !open {
		t.Fatal("the connection closed while its reconciler owed a release")
	}

	began := time.Now()
	finishRedisAtExit(context.Background())
	took := time.Since(began)
	if _, open := stores.References(r.poolKey); open {
		t.Errorf("the exit hook returned after %v with the connection still open (it waits for a request the exit does not cut): "+
			"the process ends before its last pass", took)
	}
	if given := logs.FilterMessageSnippet("closing the Redis connection").All(); len(given) != 1 {
		t.Errorf("the warning of the release the closing gave up on: %v, want one", given)
	}
}

// Caddy exits while a request of a config a reload replaced still runs on
// that config's retired connection, waiting for its upstream: the exit
// cuts its upstream call (atExit), and the request then releases its claim
// through the connection, one store call. The retired connection's drain
// waits for it as the exit hook waits for the requests of the connections
// configs hold, a store timeout and a second more at most: the release is
// made, and the sender's retry, sent to the restarted Caddy, is accepted.
// Closed at once (46c9cf0, between helper 2's review and helper 3's), the
// connection failed the release (pipeline closed), the claim went to a
// reconciler that had closed and was dropped, and the retry was told to
// come back, then that its ping was delivered.
//
// Interleaving: a store with a 500 ms timeout; a request holds a claim
// (users 1) when its config is cleaned up (a reload; no other config on
// this Redis); Caddy exits (cutAtExit, then the hook runs); the request
// releases its claim 300 ms after the cut, well within the bound (1.5 s).
// (Helper 3's review, stop 61.)
func TestAnExitKeepsARetiredConnectionOpenForTheReleasesOfTheRequestsItCuts(t *testing.T) {
	if !inProcessOfItsOwn(t) {
		return
	}
	srv := redistest.Start(t)
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	r := &RedisStore{URL: srv.URL(), Timeout: caddy.Duration(500 * time.Millisecond)}
	if err := r.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	r.drainWithin(dedup.DefaultInFlightTimeout) // as the handler does
	connected(t, r)

	failed := ownedClaim("exit-cut:failed", 1)
	claims := []*dedup.Claim{failed}
	if v, err := r.store.Decide(context.Background(), claims); err != nil || v[0].Decision != dedup.Accepted {
		t.Fatalf("the request's claim: %v %v", v, err)
	}
	r.users.Add(1)                      // the request, waiting for its upstream
	if err := r.Cleanup(); err != nil { // a reload replaced its config
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the drain looks twice: the request still runs
	if _, open := stores.References(r.poolKey); !open {
		t.Fatal("the connection closed while a request still used it")
	}

	cutAtExit(context.DeadlineExceeded) // Caddy exits: the config's context ends, the upstream call is cut
	var releaseErr error
	requestDone := make(chan struct{})
	go func() { // the request, its upstream cut: it releases its claim, as Handler.finish does
		defer close(requestDone)
		defer r.users.Add(-1)
		time.Sleep(300 * time.Millisecond)
		if _, err := r.store.Release(context.Background(), claims); err != nil {
			releaseErr = err
			r.reconciler.Hand(claims, true) // h.reconcile
		}
	}()
	finishRedisAtExit(context.Background())
	<-requestDone

	// The sender's retry, through the restarted Caddy.
	fresh := dedup.NewRedisStore(pipeline.New(srv.Client()), time.Second)
	v, err := fresh.Decide(context.Background(), []*dedup.Claim{ownedClaim(failed.Key(), 2)})
	if err != nil {
		t.Fatal(err)
	}
	if v[0].Decision != dedup.Accepted {
		t.Errorf("the retry of the cut request's ping is %v (want accepted): the exit closed its retired connection before the "+
			"request released its claim 300 ms after the cut, within the exit hook's own bound (release error: %v)", v[0].Decision, releaseErr)
	}
}

// The README's ACL advice gives each store's user the key_prefix's keys
// only (`resetkeys ~dedup:*`): two sites on one Redis with key prefixes
// and users of their own cannot touch each other's keys. A retired
// connection does not hand its reconciler's jobs to another site's
// connection, older or newer: when a reload removes a site while its
// connection still owes a failed request's release (a blip around the
// reload), the retired connection makes the release itself once its path
// is back, and the sender's retry is accepted. Handed to the other site's
// connection, the release was refused there (NOPERM) at every try until
// the claim's TTL, and the retry was told to come back, then that its
// ping was delivered: to an older one at 46c9cf0 (helper 3's review, stop
// 61); to a newer one, as a reload that removes site A and adds site B
// makes B's connection the newest though it replaced nothing of A's, at
// 2edec42 (helper 5's review, stop 61).
//
// Setup: users own (~s1:*, the removed site's) and other (~s2:*); the
// two stores loaded in the case's order; the removed site's claim s1:veh
// is written, its release fails (its path refused a moment) and waits in
// its reconciler's backoff; the reload removes the site (its Cleanup);
// its path is fine again.
func TestARetiredConnectionDoesNotHandItsReleasesToAnotherSitesUserThatCannotTouchTheirKeys(t *testing.T) {
	for _, tt := range []struct {
		name       string
		otherFirst bool // the other site's connection is the older
	}{
		{"to an older connection", true},
		{"to a newer connection", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := redistest.Start(t)
			srv.AddUserOn(t, "own", "p", "~s1:*")
			srv.AddUserOn(t, "other", "p", "~s2:*")
			ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
			t.Cleanup(cancel)
			var other, retired *RedisStore
			if tt.otherFirst {
				other = loadServing(t, ctx, srv.URL(), "other", "p", "s2:")
			}
			retired = loadServing(t, ctx, srv.URL(), "own", "p", "s1:")
			if !tt.otherFirst {
				other = loadServing(t, ctx, srv.URL(), "other", "p", "s2:")
			}
			t.Cleanup(func() { other.reconciler.Close() }) // after its Cleanup: a doomed job would hold its drain an hour
			t.Cleanup(func() { _ = other.Cleanup() })
			if other.dataID != retired.dataID {
				t.Fatal("the two stores are not on one keyspace; the test needs them to be")
			}
			failed := ownedClaim("s1:veh", 1)
			claims := []*dedup.Claim{failed}
			if v, err := retired.store.Decide(context.Background(), claims); err != nil || v[0].Decision != dedup.Accepted {
				t.Fatalf("the removed site's claim: %v %v", v, err)
			}
			link := &heldLink{}
			retired.client.AddHook(link)
			link.mode.Store(linkRefuse) // the request's upstream failed, and its release failed on a blip
			retired.reconciler.Hand(claims, true)
			time.Sleep(200 * time.Millisecond) // tried and refused: it waits out its backoff
			if !retired.reconciler.OwesFor(claims) {
				t.Fatal("the release was made before the reload; the test needs it owed")
			}
			if err := retired.Cleanup(); err != nil { // the reload removes the site
				t.Fatal(err)
			}
			t.Cleanup(func() { retired.reconciler.Close() })
			link.mode.Store(linkFine) // the blip is over: own may touch s1:veh again

			fresh := dedup.NewRedisStore(pipeline.New(srv.Client()), time.Second) // a connection that may touch the key
			if got := retriedWhileInFlight(t, fresh, failed.Key(), time.Now().Add(6*time.Second)); got != dedup.Accepted {
				t.Errorf("the retry of the removed site's failed ping is %v (want accepted): its retired connection handed the release "+
					"to the other site's connection, whose user Redis refuses on that key (other holds %d claims, retired %d)",
					got, other.reconciler.Len(), retired.reconciler.Len())
			}
		})
	}
}

// A reload that rotates every site's ACL user at once (a blue/green
// rotation: svcA-blue becomes svcA-green, svcB-blue svcB-green) hands site
// A's retired connection's jobs to A's replacement, the connection that
// serves A's key_prefix, whichever site's store the new config provisions
// last. Handed to the newest connection that joined after it (2edec42),
// A's confirmations (a failed request's claim that landed late, whose
// release Redis answered not_held) went to site B's connection when B's
// store came last, whose user may not touch A's keys, while A's old user
// no longer logs in: the claim stood until its TTL, and A's sender's retry
// was told to come back, then that its ping was delivered. (The call-time
// takeover, keyspace.releaseOwed, covers releases Redis never answered,
// not confirmations.)
//
// Setup: users svcA-blue and svcA-green (~s1:*), svcB-green (~s2:*);
// store "retired" (svcA-blue, s1:) loaded; its release of a claim not yet
// landed is answered (not_held), leaving its confirmations; the reload's
// new config provisions "replacement" (svcA-green, s1:), then "siteB"
// (svcB-green, s2:); svcA-blue's password is rotated away; the claim
// lands; the old config is cleaned up. (Helper 5's review, stop 61.)
func TestARotationOfEveryUserHandsARetiredConnectionsJobsToItsReplacement(t *testing.T) {
	srv := redistest.Start(t)
	srv.AddUserOn(t, "svcA-blue", "p", "~s1:*")
	srv.AddUserOn(t, "svcA-green", "p", "~s1:*")
	srv.AddUserOn(t, "svcB-green", "p", "~s2:*")
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	retired := loadServing(t, ctx, srv.URL(), "svcA-blue", "p", "s1:")
	late := confirmationOwed(t, retired, "s1:late")                         // its upstream failed; the claim is still on its way
	replacement := loadServing(t, ctx, srv.URL(), "svcA-green", "p", "s1:") // the reload's new config: site A first,
	siteB := loadServing(t, ctx, srv.URL(), "svcB-green", "p", "s2:")       // then site B
	t.Cleanup(func() { siteB.reconciler.Close(); replacement.reconciler.Close() })
	t.Cleanup(func() { _ = siteB.Cleanup(); _ = replacement.Cleanup() })
	if retired.dataID != siteB.dataID || retired.dataID != replacement.dataID {
		t.Fatal("the stores are not on one keyspace; the test needs them to be")
	}
	srv.RotatePassword(t, "svcA-blue", "gone") // the old user no longer logs in
	if v, err := replacement.store.Decide(context.Background(), []*dedup.Claim{late}); err != nil || v[0].Decision != dedup.Accepted {
		t.Fatalf("the late landing: %v %v", v, err) // written here with its token, as the late write would
	}
	if err := retired.Cleanup(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { retired.reconciler.Close() })
	// Well within in_flight_timeout (30 s): a hand-over is looked for at
	// once, and the confirmations due are a backoff (2 s) away.
	if got := retriedWhileInFlight(t, replacement.store, "s1:late", time.Now().Add(6*time.Second)); got != dedup.Accepted {
		t.Errorf("the failed ping's retry through site A's replacement is %v (want accepted): the retired connection handed "+
			"the confirmation that would release the claim that landed late to site B's connection, whose user Redis refuses "+
			"on that key (siteB holds %d claims, replacement %d, retired %d)",
			got, siteB.reconciler.Len(), replacement.reconciler.Len(), retired.reconciler.Len())
	}
}

// A reload that moves site A onto the user and store settings of site B on
// the same Redis gives A's new config B's existing connection, older than
// A's retired one (the key_prefix is the handler's, not the store's: the
// two configs' stores are one connection). The retired connection hands
// its jobs to it, since a config of A's key_prefix now holds it, and its
// confirmation releases the failed request's claim that landed late: the
// sender's retry is accepted. Handed only to a connection of its own user
// or one that joined after it (2edec42), the jobs were kept, refused with
// the old user until the claim's TTL, and the retry was told to come back,
// then that its ping was delivered.
//
// Setup: users svcA-old (~s1:*) and svcShared (~s1:* ~s2:*); site B's
// store (svcShared, s2:) loaded, then site A's (svcA-old, s1:); A's
// release of a claim not yet landed is answered (not_held), leaving its
// confirmations; the reload gives site A svcShared (s1:, the pool of site
// B's store); svcA-old's password is rotated away; the claim lands; A's
// old config is cleaned up. (Helper 5's review, stop 61.)
func TestARetiredConnectionHandsItsJobsToTheOlderConnectionItsSiteWasMovedOnto(t *testing.T) {
	srv := redistest.Start(t)
	srv.AddUserOn(t, "svcA-old", "p", "~s1:*")
	srv.AddUserOn(t, "svcShared", "p", "~s1:*", "~s2:*")
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	siteB := loadServing(t, ctx, srv.URL(), "svcShared", "p", "s2:")
	retired := loadServing(t, ctx, srv.URL(), "svcA-old", "p", "s1:")
	late := confirmationOwed(t, retired, "s1:late")                        // its upstream failed; the claim is still on its way
	replacement := loadServing(t, ctx, srv.URL(), "svcShared", "p", "s1:") // site A's new config: the pool site B's store holds
	t.Cleanup(func() { siteB.reconciler.Close() })
	t.Cleanup(func() { _ = siteB.Cleanup(); _ = replacement.Cleanup() })
	if replacement.poolKey != siteB.poolKey || retired.dataID != siteB.dataID {
		t.Fatal("site A's new store does not share site B's connection on one keyspace; the test needs it to")
	}
	srv.RotatePassword(t, "svcA-old", "gone") // the old user no longer logs in
	if v, err := replacement.store.Decide(context.Background(), []*dedup.Claim{late}); err != nil || v[0].Decision != dedup.Accepted {
		t.Fatalf("the late landing: %v %v", v, err) // written here with its token, as the late write would
	}
	if err := retired.Cleanup(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { retired.reconciler.Close() })
	if got := retriedWhileInFlight(t, replacement.store, "s1:late", time.Now().Add(6*time.Second)); got != dedup.Accepted {
		t.Errorf("the failed ping's retry through the connection site A now uses is %v (want accepted): the retired connection, "+
			"refused, kept the confirmation that would release the claim that landed late (it holds %d claims) rather than hand "+
			"it to the older connection A's config adopted", got, retired.reconciler.Len())
	}
}

// loadServing provisions a Redis store on srv as a config's handler would: the
// store, then the handler's key_prefix (servesPrefix), then a first
// connection.
func loadServing(t *testing.T, ctx caddy.Context, url, user, password, prefix string) *RedisStore {
	t.Helper()
	r := &RedisStore{URL: url, Username: user, Password: password, Timeout: caddy.Duration(time.Second)}
	if err := r.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	r.servesPrefix(prefix) // as the handler does
	connected(t, r)
	return r
}

// confirmationOwed hands r's reconciler the release of a failed
// request's claim not yet landed, and waits until Redis answered it
// (not_held): its confirmations remain, to release the claim if it lands
// late.
func confirmationOwed(t *testing.T, r *RedisStore, key string) *dedup.Claim {
	t.Helper()
	late := ownedClaim(key, 1)
	r.reconciler.Hand([]*dedup.Claim{late}, true)
	for deadline := time.Now().Add(5 * time.Second); r.reconciler.Unanswered() > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the release was not answered")
		}
	}
	return late
}

// A connection whose site changed its key_prefix over a reload that kept
// the connection (v1: to v2:, the same store settings) hands its jobs, all
// on v2:, to the connection that replaces it at the next password
// rotation, which serves v2:. Requiring a connection that served every
// prefix the retiring one ever had (1ac3281), it handed nothing: no
// config serves v1: any more, the confirmation of a failed request's
// claim that landed late was refused on the old password until the
// claim's TTL, and the sender's retry was told to come back, then that its
// ping was delivered. The same held for a connection that once served a
// site since removed, or that a failed reload's config provisioned with
// another key_prefix.
//
// Setup: user svc; config 1 (svc/old, v1:); config 2 keeps the connection
// with v2:, config 1 is cleaned up; a claim of v2: has its release
// answered not_held (confirmations owed); config 3 has the new password (a
// new connection, v2:); the old password is rotated away; the claim lands;
// config 2 is cleaned up. (Helper 6's review, stop 61.)
func TestAConnectionWhoseSiteChangedItsKeyPrefixStillHandsItsJobsOver(t *testing.T) {
	srv := redistest.Start(t)
	srv.AddUser(t, "svc", "old")
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)

	first := loadServing(t, ctx, srv.URL(), "svc", "old", "v1:")
	second := loadServing(t, ctx, srv.URL(), "svc", "old", "v2:") // the reload changing key_prefix: same store settings
	if first.poolKey != second.poolKey {
		t.Fatal("the two configs do not share one connection; the test needs them to")
	}
	if err := first.Cleanup(); err != nil { // the old config is cleaned up
		t.Fatal(err)
	}
	t.Cleanup(func() { second.reconciler.Close() })

	late := confirmationOwed(t, second, "v2:late")

	// Later: the password rotation.
	if err := srv.Client().Do(context.Background(), "ACL", "SETUSER", "svc", ">new").Err(); err != nil {
		t.Fatal(err)
	}
	replacement := loadServing(t, ctx, srv.URL(), "svc", "new", "v2:")
	t.Cleanup(func() { replacement.reconciler.Close() })
	t.Cleanup(func() { _ = replacement.Cleanup() })
	if replacement.dataID != second.dataID || replacement.poolKey == second.poolKey {
		t.Fatal("the replacement is not another connection on the same keyspace; the test needs it to be")
	}
	srv.RotatePassword(t, "svc", "new") // the old password no longer logs in
	if v, err := replacement.store.Decide(context.Background(), []*dedup.Claim{late}); err != nil || v[0].Decision != dedup.Accepted {
		t.Fatalf("the late landing: %v %v", v, err) // written here with its token, as the late write would
	}
	if err := second.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if got := retriedWhileInFlight(t, replacement.store, "v2:late", time.Now().Add(6*time.Second)); got != dedup.Accepted {
		t.Errorf("the failed ping's retry through the new connection is %v (want accepted): the retired connection, refused, "+
			"kept the confirmation (it holds %d claims), though its jobs are on v2:, which the replacement serves",
			got, second.reconciler.Len())
	}
}

// A connection two sites' handlers share (one user for both key
// prefixes) hands each site's jobs to that site's new connection when a
// reload gives each site a connection and a user of its own, as the
// README's ACL advice has it (svcA ~a:*, svcB ~b:*), and the shared user
// is then deleted. Wanting one connection that served both prefixes
// (1ac3281), it handed nothing, and was refused with its deleted user
// until the claims' TTL: site A's sender's retry was told to come back,
// then that its ping was delivered. (Before that, on 2edec42, the job went
// to the newest connection, site B's, and was refused there, NOPERM.)
//
// Setup: users shared (~*), svcA (~a:*), svcB (~b:*); sites A (a:) and B
// (b:) on the shared user, one connection; a claim of a: has its release
// answered not_held (confirmations owed); the reload provisions A on svcA
// and B on svcB; the shared user is deleted; the claim lands; the old
// config is cleaned up. (Helper 6's review, stop 61.)
func TestASharedConnectionSplitBetweenTwoSitesHandsEachItsJobs(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client()
	srv.AddUserOn(t, "shared", "p", "~*")
	srv.AddUserOn(t, "svcA", "p", "~a:*")
	srv.AddUserOn(t, "svcB", "p", "~b:*")
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)

	siteA := loadServing(t, ctx, srv.URL(), "shared", "p", "a:")
	siteB := loadServing(t, ctx, srv.URL(), "shared", "p", "b:")
	if siteA.poolKey != siteB.poolKey {
		t.Fatal("the two sites do not share one connection; the test needs them to")
	}
	t.Cleanup(func() { siteA.reconciler.Close() })
	late := confirmationOwed(t, siteA, "a:late")

	newA := loadServing(t, ctx, srv.URL(), "svcA", "p", "a:") // the reload's new config
	newB := loadServing(t, ctx, srv.URL(), "svcB", "p", "b:")
	t.Cleanup(func() { newA.reconciler.Close(); newB.reconciler.Close() })
	t.Cleanup(func() { _ = newA.Cleanup(); _ = newB.Cleanup() })
	if newA.dataID != siteA.dataID || newB.dataID != siteA.dataID {
		t.Fatal("the stores are not on one keyspace; the test needs them to be")
	}
	if err := admin.Do(context.Background(), "ACL", "DELUSER", "shared").Err(); err != nil { // cuts its clients too
		t.Fatal(err)
	}
	if v, err := newA.store.Decide(context.Background(), []*dedup.Claim{late}); err != nil || v[0].Decision != dedup.Accepted {
		t.Fatalf("the late landing: %v %v", v, err)
	}
	if err := siteA.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if err := siteB.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if got := retriedWhileInFlight(t, newA.store, "a:late", time.Now().Add(6*time.Second)); got != dedup.Accepted {
		t.Errorf("site A's failed ping's retry through A's new connection is %v (want accepted): the retired shared connection "+
			"kept the confirmation on a: (it holds %d claims), though A's new connection serves a:, and its own user is gone",
			got, siteA.reconciler.Len())
	}
}

// A retired connection that hands claims over says so, with how many it
// handed and how many it kept, counted as the heirs took them: whatever
// its requests still running hand it while an offer waits for its pass on
// its way does not cancel out the claims that went. Counted as its
// reconciler's Len before the offers less its Len after, a claim handed
// meanwhile cancelled out one that went, and no line was written (or the
// claims it finished itself meanwhile were logged as handed).
//
// Setup: one Redis; site A's new store (s1:) is held; the old config's
// connection (no holder any more) has a release on s1: in flight on a path
// slowed 800 ms; its drain calls handOver; 300 ms later, while the offer
// waits for that pass, one of its requests hands it a release on s3:,
// which no connection serves. (Helper 7's review, stop 61.)
func TestARetiredConnectionLogsTheClaimsItHandedOverWhileItsRequestsHandItMore(t *testing.T) {
	heir, retired, logs := anHeirAndARetiredConnection(t)
	pingCtx, pingCancel := context.WithTimeout(context.Background(), time.Second)
	defer pingCancel()
	if err := retired.client.Ping(pingCtx).Err(); err != nil {
		t.Fatal(err)
	}
	link := &heldLink{delay: 800 * time.Millisecond}
	retired.client.AddHook(link)
	link.mode.Store(linkSlow)
	t.Cleanup(func() { link.mode.Store(linkFine) }) // before the Destruct: its last pass need not crawl

	retired.reconciler.Hand([]*dedup.Claim{ownedClaim("s1:failed", 1)}, true) // its upstream failed: the reconciler releases it now
	time.Sleep(200 * time.Millisecond)                                        // its pass is on its way, slowed
	go func() {
		time.Sleep(300 * time.Millisecond) // while the offer waits for the pass
		retired.reconciler.Hand([]*dedup.Claim{ownedClaim("s3:failed", 2)}, true)
	}()
	retired.handOver()

	took, kept := heir.reconciler.Len(), retired.reconciler.Len()
	if took != 1 || kept != 1 {
		t.Fatalf("the heir took %d claims and the retired connection kept %d; the test needs 1 and 1", took, kept)
	}
	lines := logs.FilterMessageSnippet("handed the claims").All()
	if len(lines) == 0 {
		t.Fatalf("the heir took 1 claim and nothing said so: handOver counted Len before (1) less Len after (1), " +
			"the claim a request handed meanwhile cancelling out the one that went")
	}
	if got := lines[0].ContextMap(); lines[0].Level != zapcore.InfoLevel || got["claims"] != int64(1) || got["kept"] != int64(1) {
		t.Errorf("the hand-over line: %s %v; want info with claims=1 kept=1", lines[0].Level, got)
	}
}

// A retired connection's drain offers its jobs at the next look (50 ms)
// after its requests hand it one, even when, at that same look, a job it
// kept has gone (one no connection serves reached its claims' TTL, or a
// call through another connection took it over). Telling "handed more" by
// the reconciler's Len (cec3e81), a job that went and one handed of the
// same size left Len as it was, and the new job was offered only once a
// second had passed since the last offer: a settlement or a confirmation
// waited that second out on a connection Redis refuses after a password
// rotation.
//
// Setup: site A's new connection serves s1: (the heir); the old config's
// connection, refused (heldLink), keeps a release on s3:, which no
// connection serves, whose claim's TTL ends 1.5 s in; a request of the old
// config still runs (users 1). At 1.2 s a request hands it a release on
// s1: (handed at the next look: the drain's last offer is now); right
// after the s3: claim's TTL ends another request hands a release on s1:,
// Len 1 again. Checked 400 ms later, short of a second after the last
// offer. (Helper 8's review, stop 61.)
func TestARetiredConnectionOffersAJobHandedAsAKeptOneWent(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	heir := loadServing(t, ctx, srv.URL(), "", "", "s1:")
	t.Cleanup(func() { _ = heir.Cleanup() })

	old := &RedisStore{URL: srv.URL(), Timeout: caddy.Duration(2 * time.Second)} // the old config's: another timeout
	if err := old.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	old.drainWithin(dedup.DefaultInFlightTimeout) // as the handler does
	connected(t, old)
	if old.dataID != heir.dataID {
		t.Fatal("the two connections are not on one keyspace; the test needs them to be")
	}
	link := &heldLink{}
	old.client.AddHook(link)
	link.mode.Store(linkRefuse) // a rotated password, and Redis cut the old pool

	began := time.Now()
	gone := ownedClaim("s3:gone", 1)
	gone.At = began.Add(-gone.Policy.TTL + 1500*time.Millisecond) // its TTL ends 1.5 s in
	if !old.reconciler.Hand([]*dedup.Claim{gone}, true) {
		t.Fatal("handing the s3: release")
	}
	old.users.Add(1) // a request of the old config, its upstream slow
	t.Cleanup(func() { old.users.Add(-1) })
	if err := old.Cleanup(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { old.reconciler.Close() }) // then its drain ends

	time.Sleep(time.Until(began.Add(1200 * time.Millisecond)))
	first := ownedClaim("s1:first", 2)
	old.reconciler.Hand([]*dedup.Claim{first}, true)
	for deadline := time.Now().Add(3 * time.Second); old.reconciler.OwesFor([]*dedup.Claim{first}); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first s1: release was never handed to the heir")
		}
	}
	offered := time.Now() // the drain's last offer, within a millisecond or two

	time.Sleep(time.Until(began.Add(1510 * time.Millisecond))) // the s3: claim's TTL has ended
	old.reconciler.Wake()                                      // its next retry, now: the reconciler finishes it
	for deadline := time.Now().Add(3 * time.Second); old.reconciler.Len() > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the expired s3: release was never finished")
		}
	}
	failed := ownedClaim("s1:failed", 3)
	old.reconciler.Hand([]*dedup.Claim{failed}, true) // Len 1, as kept after the last offer

	time.Sleep(400 * time.Millisecond) // eight looks
	stillOwed := old.reconciler.OwesFor([]*dedup.Claim{failed})
	since := time.Since(offered)
	if since >= 950*time.Millisecond {
		t.Skipf("the machine was too slow to tell (%v since the last offer): the drain's second-long offer may have come", since)
	}
	if stillOwed {
		t.Errorf("400 ms after a request handed the retired, refused connection a release on s1: (%v after the drain's last offer), "+
			"it still holds it: the drain saw Len %d, what it kept after the last offer, and waits for the second to pass; "+
			"the heir serving s1: holds %d claims", since.Round(time.Millisecond), old.reconciler.Len(), heir.reconciler.Len())
	}
}

// A retired connection's drain offers its jobs again each time its
// requests hand it more: the first hand-over is said at info, with what
// went and what stayed; the later ones only at debug, so that a drain of
// thirty seconds under a stream of failed requests writes one line at info,
// not one a look.
//
// Setup: site A's new connection serves s1: (the heir); the old config's
// connection, refused (heldLink), is handed a release on s1: and offers it
// (handOver), then is handed another and offers again.
func TestARetiredConnectionSaysItsFirstHandOverAtInfoAndTheLaterOnesAtDebug(t *testing.T) {
	_, retired, logs := anHeirAndARetiredConnection(t)
	link := &heldLink{}
	retired.client.AddHook(link)
	link.mode.Store(linkRefuse) // a rotated password: its own releases are refused
	t.Cleanup(func() { link.mode.Store(linkFine) })

	for i, key := range []string{"s1:first", "s1:second"} {
		failed := []*dedup.Claim{ownedClaim(key, uint64(i+1))}
		retired.reconciler.Hand(failed, true)
		retired.handOver()
		if retired.reconciler.OwesFor(failed) {
			t.Fatalf("%s: the retired connection still owes the release; the test needs it handed over", key)
		}
	}
	lines := logs.FilterMessageSnippet("handed the claims").All()
	if len(lines) != 2 {
		t.Fatalf("%d hand-over lines for two hand-overs; want 2", len(lines))
	}
	if lines[0].Level != zapcore.InfoLevel || lines[1].Level != zapcore.DebugLevel {
		t.Errorf("the hand-overs were said at %s, then %s; want info once, then debug", lines[0].Level, lines[1].Level)
	}
	for _, l := range lines {
		if got := l.ContextMap(); got["claims"] != int64(1) || got["kept"] != int64(0) {
			t.Errorf("a hand-over line says %v; want claims=1 kept=0", got)
		}
	}
}

// anHeirAndARetiredConnection starts a Redis with site A's new store on it,
// serving s1: (the heir), and the old config's connection, which no config
// holds any more, logging to logs.
func anHeirAndARetiredConnection(t *testing.T) (heir *RedisStore, retired *redisConnection, logs *observer.ObservedLogs) {
	t.Helper()
	srv := redistest.Start(t)
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	heir = loadServing(t, ctx, srv.URL(), "", "", "s1:")
	t.Cleanup(func() { heir.reconciler.Close() })
	t.Cleanup(func() { _ = heir.Cleanup() })

	settings := RedisStore{URL: srv.URL(), Timeout: caddy.Duration(3 * time.Second)}
	opts, err := settings.options()
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	retired = newRedisConnection(opts, settings, zap.New(core))
	t.Cleanup(func() { _ = retired.Destruct() })
	if retired.keyspaceID != heir.dataID {
		t.Fatal("the two connections are not on one keyspace; the test needs them to be")
	}
	return heir, retired, logs
}
