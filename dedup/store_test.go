package dedup

import (
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/pipeline"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// eachStore runs one test against both stores. Both must give the same
// answers; the Redis one talks to a real redis-server started for the test.
func eachStore(t *testing.T, test func(t *testing.T, s Store)) {
	t.Run("memory", func(t *testing.T) { test(t, NewMemoryStore(0)) })
	t.Run("redis", func(t *testing.T) { test(t, newRedisStore(t, redistest.Start(t))) })
}

// eachStoreAndShape runs one test for every shape against both stores.
func eachStoreAndShape(t *testing.T, test func(t *testing.T, s Store, pol *Policy)) {
	for _, shape := range Shapes {
		t.Run(string(shape), func(t *testing.T) {
			eachStore(t, func(t *testing.T, s Store) { test(t, s, testPolicy(shape)) })
		})
	}
}

func newRedisStore(t testing.TB, srv *redistest.Server) *RedisStore {
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	return newRedisStoreOn(t, c)
}

// newRedisStoreOn returns a store on client, with its own pipeline; both
// are closed when the test ends.
func newRedisStoreOn(t testing.TB, client redis.UniversalClient) *RedisStore {
	pipe := pipeline.New(client)
	t.Cleanup(func() {
		pipe.Close()
		_ = client.Close()
	})
	return NewRedisStore(pipe, time.Second)
}

// decideOne, settleOne and releaseOne run one claim as a batch of one.
func decideOne(ctx context.Context, s Store, c *Claim) (Verdict, error) {
	v, err := s.Decide(ctx, []*Claim{c})
	if err != nil {
		return Verdict{}, err
	}
	return v[0], nil
}

func settleOne(ctx context.Context, s Store, c *Claim) error { return WaitSettled(ctx, s, []*Claim{c}) }

func releaseOne(ctx context.Context, s Store, c *Claim) (bool, error) {
	r, err := s.Release(ctx, []*Claim{c})
	if err != nil {
		return false, err
	}
	return r[0], nil
}

func testPolicy(shape Shape) *Policy {
	return &Policy{Shape: shape, Window: DefaultWindow, SessionIdle: DefaultSessionIdle, Radius: DefaultRadius, TTL: time.Hour, InFlightTimeout: DefaultInFlightTimeout}
}

// claimOf builds the claim a Deduper would make for p.
func claimOf(pol *Policy, p ping.Ping, token uint64, at time.Time) *Claim {
	k := defaultKeyer()
	k.Window = pol.Window
	c := &Claim{Observation: k.Observe(p), Policy: pol, Token: token, At: at}
	if pol.Shape != Tumbling {
		c.StateKey, c.SeenKey = k.TrackKeys(p.Asset, p.Time)
	}
	return c
}

var parked = ping.Ping{Asset: "veh-88", Time: articleBase, Lat: 52.5200087, Lon: 13.4049547}

func decide(t *testing.T, s Store, c *Claim) Verdict {
	t.Helper()
	v, err := decideOne(context.Background(), s, c)
	if err != nil {
		t.Fatalf("decide %+v: %v", c.Ping, err)
	}
	return v
}

func TestStoreFirstClaimWins(t *testing.T) {
	eachStoreAndShape(t, func(t *testing.T, s Store, pol *Policy) {
		if v := decide(t, s, claimOf(pol, parked, 1, articleBase)); v.Decision != Accepted {
			t.Fatalf("first claim: %+v", v)
		}
		if v := decide(t, s, claimOf(pol, parked, 2, articleBase)); v.Decision != InFlight || v.Reason != Redelivery {
			t.Fatalf("second claim of the same observation: %+v, want in_flight/redelivery", v)
		}
		other := parked
		other.Asset = "veh-91"
		if v := decide(t, s, claimOf(pol, other, 3, articleBase)); v.Decision != Accepted {
			t.Fatalf("another asset's claim: %+v", v)
		}
	})
}

func TestStoreRaceHasExactlyOneWinner(t *testing.T) {
	eachStoreAndShape(t, func(t *testing.T, s Store, pol *Policy) {
		verdicts := make(chan Verdict, 50)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 50 {
			wg.Go(func() {
				<-start
				v, err := decideOne(context.Background(), s, claimOf(pol, parked, uint64(i+1), articleBase))
				if err != nil {
					t.Errorf("claim %d: %v", i, err)
				}
				verdicts <- v
			})
		}
		close(start)
		wg.Wait()
		close(verdicts)
		count := map[Decision]int{}
		for v := range verdicts {
			count[v.Decision]++
		}
		if count[Accepted] != 1 || count[InFlight] != 49 {
			t.Fatalf("verdicts %v, want 1 accepted and 49 in flight", count)
		}
	})
}

// A redelivery is suppressed for the whole TTL it was accepted under, even
// where a handler of a shorter TTL on the same prefix (a rolling deploy
// that lengthens the retry ladder, or outage_margin) judges another fix of
// the asset in the same minute: the seen set's expiry was set to every
// call's TTL, shortened too, and the redelivery admitted again once the
// shorter one ran out. Tumbling keys keep their own TTLs, and so do the
// memory store's entries. (Helper 6's review, stop 66.)
func TestAShorterTTLOnThePrefixKeepsTheLongerOnesRedeliveries(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	for _, store := range []string{"memory", "redis"} {
		for _, shape := range Shapes {
			t.Run(store+"/"+string(shape), func(t *testing.T) {
				srv.Client().FlushAll(ctx)
				long, short := testPolicy(shape), testPolicy(shape)
				long.TTL, short.TTL = 4*time.Second, 2*time.Second
				mem := NewMemoryStore(0)
				a, b := Store(mem), Store(mem) // two handlers in one process share it
				if store == "redis" {
					a, b = newRedisStore(t, srv), newRedisStore(t, srv)
				}
				first := claimOf(long, parked, 1<<16, time.Now())
				if v := decide(t, a, first); v.Decision != Accepted {
					t.Fatalf("first: %+v", v)
				}
				if err := settleOne(ctx, a, first); err != nil {
					t.Fatal(err)
				}
				// the other handler judges a jitter fix of the asset, 10 s later in the same minute
				if v := decide(t, b, claimOf(short, at(10*time.Second, 52.5200410, 13.4049920), 2<<16, time.Now())); v.Decision != Suppressed {
					t.Fatalf("jitter: %+v", v)
				}
				time.Sleep(short.TTL + 500*time.Millisecond) // within the first ping's TTL
				if v := decide(t, a, claimOf(long, parked, 3<<16, time.Now())); v != suppressed(Redelivery) {
					t.Fatalf("a redelivery %v after its ping was accepted under a TTL of %v: %+v (the other handler's %v cut it short)",
						short.TTL+500*time.Millisecond, long.TTL, v, short.TTL)
				}
			})
		}
	}
}

func TestStoreHonoursExpiry(t *testing.T) {
	eachStoreAndShape(t, func(t *testing.T, s Store, pol *Policy) {
		pol.TTL = 300 * time.Millisecond
		decide(t, s, claimOf(pol, parked, 1, articleBase))
		if v := decide(t, s, claimOf(pol, parked, 2, articleBase.Add(time.Minute))); v.Decision == Accepted {
			t.Fatal("redelivery before expiry accepted")
		}
		time.Sleep(450 * time.Millisecond)
		if v := decide(t, s, claimOf(pol, parked, 3, articleBase.Add(time.Minute))); v.Decision != Accepted {
			t.Fatalf("redelivery after expiry: %+v, want accepted", v)
		}
	})
}

func TestStoreReleasesOnlyWithTheRightToken(t *testing.T) {
	eachStoreAndShape(t, func(t *testing.T, s Store, pol *Policy) {
		ctx := context.Background()
		mine := claimOf(pol, parked, 1, articleBase)
		decide(t, s, mine)
		if ok, err := releaseOne(ctx, s, claimOf(pol, parked, 2, articleBase)); err != nil || ok {
			t.Fatalf("release with another token: released=%v err=%v", ok, err)
		}
		if v := decide(t, s, claimOf(pol, parked, 3, articleBase)); v.Decision != InFlight {
			t.Fatalf("after a foreign release: %+v, want the claim still held", v)
		}
		if ok, err := releaseOne(ctx, s, mine); err != nil || !ok {
			t.Fatalf("release with the right token: released=%v err=%v", ok, err)
		}
		if ok, _ := releaseOne(ctx, s, mine); ok {
			t.Fatal("released twice")
		}
		retry := claimOf(pol, parked, 4, articleBase)
		if v := decide(t, s, retry); v.Decision != Accepted {
			t.Fatalf("retry after release: %+v, want accepted", v)
		}
		if ok, _ := releaseOne(ctx, s, mine); ok {
			t.Fatal("the failed request released its retry's claim")
		}
	})
}

// Two requests' tokens as ClaimAll makes them: a random request id in the
// upper 48 bits, the claim's index in the lower 16. These two single-ping
// requests differ only above bit 31, as one pair of requests in 65,536
// does. Each must still tell the other's claim from its own.
const (
	firstRequestToken  = 0x1111_2222_3333_0000
	secondRequestToken = 0x4444_5555_3333_0000
)

// A claim of another request is never taken for the request's own: its
// redelivery is told to come back, not accepted and forwarded a second
// time.
func TestAnotherRequestsClaimIsNotTakenForOwn(t *testing.T) {
	eachStoreAndShape(t, func(t *testing.T, s Store, pol *Policy) {
		if v := decide(t, s, claimOf(pol, parked, firstRequestToken, articleBase)); v.Decision != Accepted {
			t.Fatalf("first claim: %+v", v)
		}
		if v := decide(t, s, claimOf(pol, parked, secondRequestToken, articleBase)); v.Decision != InFlight {
			t.Fatalf("the redelivery, by another request: %+v, want in_flight (accepted forwards the observation twice)", v)
		}
	})
}

// A release of a failed request made again after its retry got through
// (the reconciler's confirmations, a Confirm after a failover) leaves the
// retry's settled claim alone: the next redelivery is suppressed.
func TestAReleaseMadeAgainLeavesTheRetrysClaim(t *testing.T) {
	eachStoreAndShape(t, func(t *testing.T, s Store, pol *Policy) {
		ctx := context.Background()
		failed := claimOf(pol, parked, firstRequestToken, articleBase)
		decide(t, s, failed)
		if ok, err := releaseOne(ctx, s, failed); err != nil || !ok {
			t.Fatalf("release of the failed request: released=%v err=%v", ok, err)
		}
		retry := claimOf(pol, parked, secondRequestToken, articleBase.Add(time.Second))
		if v := decide(t, s, retry); v.Decision != Accepted {
			t.Fatalf("the retry: %+v, want accepted", v)
		}
		if err := settleOne(ctx, s, retry); err != nil {
			t.Fatal(err)
		}
		if ok, err := releaseOne(ctx, s, failed); err != nil || ok {
			t.Fatalf("the failed request's release made again: released=%v err=%v, want nothing of it left to release", ok, err)
		}
		if v := decide(t, s, claimOf(pol, parked, 7<<16, articleBase.Add(2*time.Second))); v != suppressed(Redelivery) {
			t.Fatalf("a redelivery after the retry was delivered: %+v, want suppressed/redelivery", v)
		}
	})
}

func TestStoreSettlesATrackClaimOnlyWithItsToken(t *testing.T) {
	for _, shape := range []Shape{Sliding, Session} { // tumbling: TestTumblingSettlementMarksTheObservationDelivered
		t.Run(string(shape), func(t *testing.T) {
			eachStore(t, func(t *testing.T, s Store) { settlesOnlyWithItsToken(t, s, testPolicy(shape)) })
		})
	}
}

func settlesOnlyWithItsToken(t *testing.T, s Store, pol *Policy) {
	ctx := context.Background()
	mine := claimOf(pol, parked, 1, articleBase)
	decide(t, s, mine)
	if err := settleOne(ctx, s, claimOf(pol, parked, 2, articleBase)); err != nil {
		t.Fatal(err)
	}
	if v := decide(t, s, claimOf(pol, parked, 3, articleBase)); v.Decision != InFlight {
		t.Fatalf("another token settled the claim: %+v", v)
	}
	if err := settleOne(ctx, s, mine); err != nil {
		t.Fatal(err)
	}
	if v := decide(t, s, claimOf(pol, parked, 4, articleBase)); v.Decision != Suppressed || v.Reason != Redelivery {
		t.Fatalf("after settling: %+v, want suppressed/redelivery", v)
	}
}

// A tumbling settlement is one plain SET: it says the key's observation
// was delivered, whichever request's claim the key holds, and a release by
// that request then leaves it settled.
func TestTumblingSettlementMarksTheObservationDelivered(t *testing.T) {
	eachStore(t, func(t *testing.T, s Store) {
		ctx, pol := context.Background(), testPolicy(Tumbling)
		held := claimOf(pol, parked, 1, articleBase)
		decide(t, s, held)
		if err := settleOne(ctx, s, claimOf(pol, parked, 2, articleBase)); err != nil {
			t.Fatal(err)
		}
		if v := decide(t, s, claimOf(pol, parked, 3, articleBase)); v.Decision != Suppressed || v.Reason != Redelivery {
			t.Fatalf("after a settlement: %+v, want suppressed/redelivery", v)
		}
		if ok, err := releaseOne(ctx, s, held); err != nil || ok {
			t.Fatalf("releasing the claim a settlement replaced: released=%v err=%v, want nothing released", ok, err)
		}
		if v := decide(t, s, claimOf(pol, parked, 4, articleBase)); v.Decision != Suppressed {
			t.Fatalf("after the release: %+v, want it still settled", v)
		}
	})
}

func TestStoreSettlingAMissingClaimCreatesNothing(t *testing.T) {
	eachStoreAndShape(t, func(t *testing.T, s Store, pol *Policy) {
		gone := claimOf(pol, ping.Ping{Asset: "never-claimed", Time: articleBase, Lat: 1, Lon: 2}, 5, articleBase)
		if err := settleOne(context.Background(), s, gone); err != nil {
			t.Fatalf("settling a claim that is not there: %v", err)
		}
		if v := decide(t, s, gone); v.Decision != Accepted {
			t.Fatalf("settling a missing claim created it: %+v", v)
		}
	})
}

// Redis-specific: the expiry is set in the same step as every value, so no
// key ever exists without one, and settling keeps it.
func TestRedisKeysAlwaysCarryTheTTL(t *testing.T) {
	for _, shape := range Shapes {
		t.Run(string(shape), func(t *testing.T) {
			srv := redistest.Start(t)
			s, c := newRedisStore(t, srv), srv.Client()
			ctx := context.Background()
			pol := testPolicy(shape)
			pol.TTL = 6*time.Hour + 30*time.Minute
			for i := range 20 {
				p := parked
				p.Time = articleBase.Add(time.Duration(i) * 40 * time.Second)
				p.Lat += float64(i%4) * 0.0003 // some moves, some jitter
				claim := claimOf(pol, p, uint64(i+1), articleBase)
				if v := decide(t, s, claim); v.Decision == Accepted && i%2 == 0 {
					settleOne(ctx, s, claim)
				}
			}
			keys, err := c.Keys(ctx, "*").Result()
			if err != nil || len(keys) == 0 {
				t.Fatalf("keys %v, %v", keys, err)
			}
			for _, k := range keys {
				pttl := c.PTTL(ctx, k).Val()
				if d := pol.TTL - pttl; pttl <= 0 || d < 0 || d > time.Second {
					t.Fatalf("%q has PTTL %v, want %v within a second", k, pttl, pol.TTL)
				}
			}
		})
	}
}

// Redis-specific: a track without an undo record (an asset's first fix, or
// one whose last acceptance was released) ends at its flag, where earlier
// versions wrote a zeroed copy of the track after it. Both layouts must
// give the same decisions, so that instances of either version can share a
// Redis while they are upgraded.
func TestRedisTracksWithoutAnUndoRecordReadTheSameInEitherLayout(t *testing.T) {
	const trackLayoutSize = 273 // CORE in lua/track_decide.lua
	for _, shape := range []Shape{Sliding, Session} {
		t.Run(string(shape), func(t *testing.T) {
			ctx, pol := context.Background(), testPolicy(shape)
			srv := redistest.Start(t)
			s, c := newRedisStore(t, srv), srv.Client()
			first := claimOf(pol, parked, 1, articleBase)
			decide(t, s, first)
			short := c.Get(ctx, first.StateKey).Val()
			if want := 8 + trackLayoutSize + 1; len(short) != want {
				t.Fatalf("a first fix's track is %d bytes, want %d (no undo record)", len(short), want)
			}
			// The same track as an earlier version wrote it, for another asset.
			other := parked
			other.Asset = "veh-89"
			zeroed := claimOf(pol, other, 1, articleBase)
			decide(t, s, zeroed)
			c.Append(ctx, zeroed.StateKey, strings.Repeat("\x00", trackLayoutSize))

			// A jitter fix is suppressed; then the first fix's forward fails,
			// which leaves nothing to go back to: both tracks are gone.
			jitter := parked
			jitter.Time, jitter.Lat = articleBase.Add(10*time.Second), parked.Lat+0.00002
			otherJitter := jitter
			otherJitter.Asset = other.Asset
			for _, cl := range []*Claim{claimOf(pol, jitter, 7, articleBase), claimOf(pol, otherJitter, 7, articleBase)} {
				if v := decide(t, s, cl); v.Decision != Suppressed {
					t.Fatalf("jitter after the first fix: %+v", v)
				}
			}
			for _, cl := range []*Claim{first, zeroed} {
				if ok, err := releaseOne(ctx, s, cl); err != nil || !ok {
					t.Fatalf("releasing the first fix: %v %v", ok, err)
				}
				if n := c.Exists(ctx, cl.StateKey).Val(); n != 0 {
					t.Fatalf("releasing an asset's only acceptance left its track")
				}
			}
			decide(t, s, first)
			decide(t, s, zeroed)
			c.Append(ctx, zeroed.StateKey, strings.Repeat("\x00", trackLayoutSize))

			for i := 1; i <= 12; i++ {
				p := parked
				p.Time = articleBase.Add(time.Duration(i) * 20 * time.Second)
				p.Lat += float64(i%3) * 0.00002 // parked jitter,
				if i >= 8 {
					p.Lat += 0.01 // then a move
				}
				q := p
				q.Asset = other.Asset
				mine, theirs := claimOf(pol, p, uint64(i+1), articleBase), claimOf(pol, q, uint64(i+1), articleBase)
				if a, b := decide(t, s, mine), decide(t, s, theirs); a != b {
					t.Fatalf("fix %d: %+v with the short layout, %+v with the zeroed one", i, a, b)
				}
				if i == 8 { // the move's forward fails: both tracks go back
					a, errA := releaseOne(ctx, s, mine)
					b, errB := releaseOne(ctx, s, theirs)
					if errA != nil || errB != nil || !a || !b {
						t.Fatalf("releasing the move: %v %v, %v %v", a, errA, b, errB)
					}
				}
			}
		})
	}
}

// Redis-specific: an accepted ping's seen value carries the time it
// reached Redis and its request's in_flight_timeout, which earlier versions
// did not write. A value without them (17 bytes, or 25 without the
// timeout) must be judged by its claim time alone and the judging
// request's timeout, and settle and release as before, so that instances
// of either version can share a Redis while they are upgraded.
func TestRedisSeenValuesOfEarlierVersionsReadAsBefore(t *testing.T) {
	const now = 1 + 8 + 8 + 8 + 1 + 8 // flag, token, claim time, landing, retried, in-flight timeout
	for _, shape := range []Shape{Sliding, Session} {
		for _, earlier := range []int{1 + 8 + 8, 1 + 8 + 8 + 8} {
			t.Run(fmt.Sprintf("%s/%d bytes", shape, earlier), func(t *testing.T) {
				testSeenValuesOfAnEarlierVersion(t, shape, now, earlier)
			})
		}
	}
}

func testSeenValuesOfAnEarlierVersion(t *testing.T, shape Shape, now, earlier int) {
	ctx, pol := context.Background(), testPolicy(shape)
	srv := redistest.Start(t)
	s, rdb := newRedisStore(t, srv), srv.Client()
	asEarlierVersions := func(c *Claim) {
		t.Helper()
		v := rdb.HGet(ctx, c.SeenKey, seenField(c)).Val()
		if len(v) != now {
			t.Fatalf("an accepted ping's seen value is %d bytes, want %d", len(v), now)
		}
		rdb.HSet(ctx, c.SeenKey, seenField(c), v[:earlier])
	}

	claimant, judge := shorterJudge(pol)
	old := claimOf(claimant, parked, 1, time.Now())
	decide(t, s, old)
	asEarlierVersions(old)
	judgedByItsOwnTimeout(t, s, judge, parked)

	settlesAndReleasesAsBefore(t, s, pol, asEarlierVersions)
}

// Redis-specific: a tumbling record carries its request's
// in_flight_timeout, which earlier versions did not write. A record of 23
// bytes, without it, must be judged by the judging request's timeout, and
// settle and release as before.
func TestRedisClaimsOfEarlierVersionsReadAsBefore(t *testing.T) {
	ctx, pol := context.Background(), testPolicy(Tumbling)
	srv := redistest.Start(t)
	s, rdb := newRedisStore(t, srv), srv.Client()
	asEarlierVersions := func(c *Claim) {
		t.Helper()
		v := rdb.Get(ctx, c.Key()).Val()
		if len(v) != recordSize {
			t.Fatalf("a claim's record is %d bytes, want %d", len(v), recordSize)
		}
		rdb.SetArgs(ctx, c.Key(), v[:recordSizeBefore], redis.SetArgs{KeepTTL: true})
	}

	claimant, judge := shorterJudge(pol)
	old := claimOf(claimant, parked, 1, time.Now())
	decide(t, s, old)
	asEarlierVersions(old)
	judgedByItsOwnTimeout(t, s, judge, parked)

	settlesAndReleasesAsBefore(t, s, pol, asEarlierVersions)
}

// settlesAndReleasesAsBefore checks that claims rewritten by asEarlier,
// as an earlier version stored them, settle and release as before.
func settlesAndReleasesAsBefore(t *testing.T, s Store, pol *Policy, asEarlier func(*Claim)) {
	t.Helper()
	ctx := context.Background()
	other := parked
	other.Asset = "veh-89"
	settled, released := claimOf(pol, other, 4, articleBase), claimOf(pol, ping.Ping{Asset: "veh-90", Time: articleBase, Lat: 1, Lon: 1}, 5, articleBase)
	for _, c := range []*Claim{settled, released} {
		decide(t, s, c)
		asEarlier(c)
	}
	if err := settleOne(ctx, s, settled); err != nil {
		t.Fatal(err)
	}
	if v := decide(t, s, claimOf(pol, other, 6, articleBase.Add(time.Second))); v != suppressed(Redelivery) {
		t.Fatalf("a redelivery after settling: %+v, want suppressed", v)
	}
	if ok, err := releaseOne(ctx, s, released); err != nil || !ok {
		t.Fatalf("releasing: %v %v", ok, err)
	}
}

// shorterJudge is two copies of pol: one a claim is made under, with a
// long in_flight_timeout, and one its redeliveries are judged under, with
// a short one.
func shorterJudge(pol *Policy) (claimant, judge *Policy) {
	c, j := *pol, *pol
	c.InFlightTimeout, j.InFlightTimeout = 5*time.Second, 400*time.Millisecond
	return &c, &j
}

// judgedByItsOwnTimeout checks that a pending claim of p that carries no
// in_flight_timeout of its own, as earlier versions wrote them, waits the
// judging request's: in flight while young, delivered after it.
func judgedByItsOwnTimeout(t *testing.T, s Store, judge *Policy, p ping.Ping) {
	t.Helper()
	if v := decide(t, s, claimOf(judge, p, 2, time.Now())); v.Decision != InFlight {
		t.Fatalf("a redelivery while the claim is young: %+v, want in flight", v)
	}
	time.Sleep(judge.InFlightTimeout + 200*time.Millisecond)
	if v := decide(t, s, claimOf(judge, p, 3, time.Now())); v != suppressed(Redelivery) {
		t.Fatalf("a redelivery the judge's in_flight_timeout after a claim that carries none: %+v, want suppressed (the judge's timeout stands for the claim's)", v)
	}
}

// A claim waits in flight for the in_flight_timeout of the request that
// made it, which bounds that request's forward, not for the timeout of the
// handler judging its redelivery. After a reload that shortened it, or on
// another instance configured otherwise, a redelivery told it was
// delivered while the first forward could still fail was a ping lost. A
// claim made under a shorter timeout than the judge's counts as settled
// after its own: its forward is over.
func TestAClaimWaitsTheInFlightTimeoutOfItsOwnRequest(t *testing.T) {
	eachStoreAndShape(t, func(t *testing.T, s Store, pol *Policy) {
		long, short := shorterJudge(pol)
		other := parked
		other.Asset = "veh-89"
		at := time.Now()
		decide(t, s, claimOf(long, parked, 1, at))
		decide(t, s, claimOf(short, other, 2, at))
		time.Sleep(short.InFlightTimeout + 200*time.Millisecond)
		if v := decide(t, s, claimOf(short, parked, 3, time.Now())); v != (Verdict{Decision: InFlight, Reason: Redelivery}) {
			t.Fatalf("a redelivery judged under a shorter in_flight_timeout than its claim's, while the claim's forward may still run: %+v, want in_flight (told it was delivered, the ping is lost if that forward fails)", v)
		}
		if v := decide(t, s, claimOf(long, other, 4, time.Now())); v != suppressed(Redelivery) {
			t.Fatalf("a redelivery judged under a longer in_flight_timeout than its claim's, after the claim's: %+v, want suppressed (its forward is over)", v)
		}
	})
}

func TestRedisStoreReportsAnUnreachableServer(t *testing.T) {
	srv := redistest.Start(t)
	s := newRedisStore(t, srv)
	pol := testPolicy(Tumbling)
	srv.Kill()
	if _, err := decideOne(context.Background(), s, claimOf(pol, parked, 1, articleBase)); err == nil {
		t.Fatal("claim against a dead server reported no error")
	}
	srv.Restart()
	if v := decide(t, s, claimOf(pol, parked, 1, articleBase)); v.Decision != Accepted {
		t.Fatalf("claim after restart: %+v", v)
	}
}

func TestRedisStoreRejectsForeignValues(t *testing.T) {
	srv := redistest.Start(t)
	s, c := newRedisStore(t, srv), srv.Client()
	claim := claimOf(testPolicy(Tumbling), parked, 1, articleBase)
	c.Set(context.Background(), claim.Observation.Key, "hello", time.Hour)
	if _, err := decideOne(context.Background(), s, claim); err == nil {
		t.Fatal("a value written by someone else was read as a claim")
	}
}

func TestMemoryStoreEvictsClosestToExpiryWhenFull(t *testing.T) {
	m := NewMemoryStore(3)
	claimWithTTL := func(asset string, ttl time.Duration) *Claim {
		pol := testPolicy(Tumbling)
		pol.TTL = ttl
		p := parked
		p.Asset = asset
		return claimOf(pol, p, 1, articleBase)
	}
	for asset, ttl := range map[string]time.Duration{"long": 3 * time.Hour, "short": time.Hour, "middle": 2 * time.Hour} {
		decide(t, m, claimWithTTL(asset, ttl))
	}
	decide(t, m, claimWithTTL("new", 3*time.Hour))
	if m.Len() != 3 || m.Evictions() != 1 {
		t.Fatalf("len %d evictions %d, want 3 and 1", m.Len(), m.Evictions())
	}
	// The evicted one last: claiming it again inserts, and evicts in turn.
	for _, tt := range []struct {
		asset string
		held  bool
	}{{"long", true}, {"middle", true}, {"new", true}, {"short", false}} {
		asset, held := tt.asset, tt.held
		c := claimWithTTL(asset, time.Hour)
		c.Token = 9
		if v := decide(t, m, c); (v.Decision != Accepted) != held {
			t.Errorf("%s: %+v after eviction, want held=%v", asset, v, held)
		}
	}
}

func TestMemoryStoreDropsExpiredKeysBeforeEvicting(t *testing.T) {
	m := NewMemoryStore(2)
	now := articleBase
	m.elapsed = func() time.Duration { return now.Sub(articleBase) }
	pol := testPolicy(Tumbling)
	for i, ttl := range []time.Duration{time.Minute, time.Hour} {
		pol := *pol
		pol.TTL = ttl
		decide(t, m, claimOf(&pol, ping.Ping{Asset: fmt.Sprint(i), Time: articleBase, Lat: 1, Lon: 1}, 1, articleBase))
	}
	now = now.Add(2 * time.Minute)
	decide(t, m, claimOf(pol, ping.Ping{Asset: "c", Time: articleBase, Lat: 1, Lon: 1}, 1, articleBase))
	if m.Evictions() != 0 || m.Len() != 2 {
		t.Fatalf("evictions %d len %d: an expired key should make room without evicting", m.Evictions(), m.Len())
	}
}

// Every entry of the memory store counts toward max_keys, in every shape:
// the seen pings of sliding and session too. A million distinct pings
// leave it at its bound, and the heap with it.
func TestMemoryStoreHoldsItsBoundInEveryShape(t *testing.T) {
	const maxKeys, pings = 1000, 1_000_000
	for _, shape := range Shapes {
		t.Run(string(shape), func(t *testing.T) {
			m := NewMemoryStore(maxKeys)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			fillMemoryStore(t, m, shape, pings)
			runtime.GC()
			runtime.ReadMemStats(&after)
			grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
			t.Logf("%d pings: %d keys, %d evictions, heap %+d KiB", pings, m.Len(), m.Evictions(), grown/1024)
			if m.Len() > maxKeys {
				t.Errorf("%d keys held, max_keys is %d", m.Len(), maxKeys)
			}
			if grown > 16<<20 {
				t.Errorf("heap grew %d MiB for %d keys", grown>>20, maxKeys)
			}
			runtime.KeepAlive(m)
		})
	}
}

// A full memory store is work for the garbage collector only in its track
// states (one per asset): its claims and seen pings hold no pointer, so no
// collection of the process scans them, however many there are.
func TestMemoryStoreKeysAreNothingForTheCollectorToScan(t *testing.T) {
	const keys = 200_000
	for _, shape := range Shapes {
		t.Run(string(shape), func(t *testing.T) {
			m := NewMemoryStore(keys)
			before := heapAfterGC(scannableBytes)
			fillMemoryStore(t, m, shape, keys)
			grown := heapAfterGC(scannableBytes) - before
			t.Logf("%d keys: scannable heap %+d KiB", m.Len(), grown/1024)
			if m.Len() < keys/2 {
				t.Fatalf("only %d keys held", m.Len())
			}
			if grown > 1<<20 { // the 50 assets' track states, and the test's own garbage
				t.Errorf("the collector must scan %d KiB more with %d keys in the store", grown/1024, m.Len())
			}
			runtime.KeepAlive(m)
		})
	}
}

// Heap figures of runtime/metrics, read by heapAfterGC.
const (
	scannableBytes = "/gc/scan/heap:bytes"      // the live heap a collection scans for pointers
	liveObjects    = "/gc/heap/objects:objects" // the objects in the live heap
)

// heapAfterGC reads a heap figure right after a collection.
func heapAfterGC(name string) int64 {
	runtime.GC()
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

// fillMemoryStore claims pings distinct pings of 50 assets, each under a key
// of its own.
func fillMemoryStore(t *testing.T, m *MemoryStore, shape Shape, pings int) {
	t.Helper()
	pol := testPolicy(shape)
	k := defaultKeyer()
	ctx := context.Background()
	batch := make([]*Claim, 0, 100)
	assets := make([]string, 50)
	for i := range assets {
		assets[i] = fmt.Sprintf("veh-%d", i)
	}
	cell := k.Observe(parked).Cell
	for i := range pings {
		p := parked
		p.Asset = assets[i%len(assets)]
		p.Time = articleBase.Add(time.Duration(i) * time.Second)
		p.Lat += float64(i%97) * 1e-6
		obs := Observation{Ping: p, Bucket: k.Bucket(p.Time), Cell: cell}
		obs.Key = k.Key(p.Asset, int64(i), cell) // distinct: a claim per ping
		c := &Claim{Observation: obs, Policy: pol, Token: uint64(i + 1), At: articleBase}
		if shape != Tumbling {
			c.StateKey, c.SeenKey = k.TrackKeys(p.Asset, p.Time)
		}
		if batch = append(batch, c); len(batch) == cap(batch) || i == pings-1 {
			if _, err := m.Decide(ctx, batch); err != nil {
				t.Fatal(err)
			}
			batch = batch[:0]
		}
	}
}

// go-redis sends a command again when the reply of one that ran is lost (a
// reset connection, a failover). The retried claim finds its own entry and
// must be accepted: answered in flight, its ping never went upstream, its
// claim was never settled nor released, and after in_flight_timeout the
// sender's retry was suppressed as a redelivery, the observation lost.
func TestAClaimSentAgainAfterALostReplyIsAccepted(t *testing.T) {
	srv := redistest.Start(t)
	for _, shape := range Shapes {
		t.Run(string(shape), func(t *testing.T) {
			relay := redistest.StartReplyLoser(t, srv.Addr())
			s := newRedisStoreOn(t, redis.NewClient(&redis.Options{Addr: relay.Addr(), ContextTimeoutEnabled: true}))
			pol := testPolicy(shape)
			warm := parked
			warm.Asset = "warm-" + string(shape)
			decide(t, s, claimOf(pol, warm, 1, time.Now())) // connected, scripts loaded

			p := parked
			p.Asset = "lost-reply-" + string(shape)
			relay.LoseNextReply()
			v, err := decideOne(context.Background(), s, claimOf(pol, p, 42, time.Now()))
			if relay.Lost() != 1 || err != nil {
				t.Fatalf("%d replies lost, err %v; want one lost and the command sent again", relay.Lost(), err)
			}
			if v.Decision != Accepted {
				t.Fatalf("a new ping whose claim was sent again after its reply was lost: %+v, want accepted", v)
			}
		})
	}
}

// The memory store dates a claim on the monotonic clock, as Redis dates it
// by PTTL: when the wall clock steps forward while a request waits for its
// upstream (NTP, a VM resumed), the redelivery's claim time says the first
// claim is past in_flight_timeout, but it landed a second ago, and its
// request may still fail: the redelivery must come back, not be told 200.
func TestMemoryStoreKeepsAClaimInFlightAcrossAWallClockStep(t *testing.T) {
	m := NewMemoryStore(0)
	elapsed := time.Duration(0)
	m.elapsed = func() time.Duration { return elapsed }
	pol := testPolicy(Tumbling)
	start := time.Now()
	if v := decide(t, m, claimOf(pol, parked, 1, start)); v.Decision != Accepted {
		t.Fatalf("first: %+v", v)
	}
	elapsed = time.Second
	stepped := start.Add(time.Second + pol.InFlightTimeout) // the wall clock stepped 30 s
	if v := decide(t, m, claimOf(pol, parked, 2, stepped)); v.Decision != InFlight {
		t.Fatalf("the redelivery a second after the claim, the wall clock stepped since: %+v, want in_flight", v)
	}
}

// Redis-specific: the retry's seen value as earlier versions wrote it, 26
// bytes ('p', token, claim time, landing, 'r'), carries no
// in_flight_timeout: it waits the judge's, and its release still marks it
// 'r' (the 'r' stays at byte 26).
func TestRedisRetriedSeenValuesOfEarlierVersionsReadAsBefore(t *testing.T) {
	for _, shape := range []Shape{Sliding, Session} {
		t.Run(string(shape), func(t *testing.T) {
			ctx := context.Background()
			srv := redistest.Start(t)
			rdb := srv.Client()
			d := newTestDeduper(newRedisStore(t, srv), shape)
			retried := retriedPending(t, d)
			v := rdb.HGet(ctx, retried.SeenKey, seenField(retried)).Val()
			if len(v) != 34 || v[25] != 'r' {
				t.Fatalf("the retry's seen value: %d bytes %q, want 34 with the 'r' at byte 26", len(v), v)
			}
			rdb.HSet(ctx, retried.SeenKey, seenField(retried), v[:26])
			d.Policy.InFlightTimeout = 400 * time.Millisecond
			if v := d.verdict(t, retried.Ping); v.Decision != InFlight {
				t.Fatalf("a redelivery while the retry is young: %+v, want in flight", v)
			}
			time.Sleep(600 * time.Millisecond)
			d.clock = d.clock.Add(600 * time.Millisecond)
			if v := d.verdict(t, retried.Ping); v != suppressed(Redelivery) {
				t.Fatalf("a redelivery the judge's in_flight_timeout after a retry that carries none: %+v, want suppressed", v)
			}
			if n, err := d.Release(t.Context(), retried); err != nil || n != 1 {
				t.Fatalf("releasing the retry: %d %v", n, err)
			}
			if got := rdb.HGet(ctx, retried.SeenKey, seenField(retried)).Val(); got != "r" {
				t.Fatalf("the released retry's seen value: %q, want \"r\" (its next retry accepted)", got)
			}
		})
	}
}

// The memory store's seen entry (one per ping seen, in sliding and
// session: most of its keys) was 24 bytes; the claim's in_flight_timeout,
// put after the two int64s, made it 32 (its slot 40, with the 16-byte key
// 56 a map slot), though 4 bytes fit in the padding after flag and
// retried: 8 bytes more a key for nothing, on a store sized by max_keys.
func TestASeenEntryOfTheMemoryStoreKeepsItsSize(t *testing.T) {
	if n := unsafe.Sizeof(seenValue{}); n > 24 {
		t.Fatalf("a seen entry takes %d bytes, 24 before it carried its claim's in_flight_timeout (a uint32 fits the padding after flag and retried)", n)
	}
}

// Redis-specific: the upgrade to longer records had instances of the
// version before, sharing the Redis, fail every claim whose key a new
// instance wrote ("stored value of 28 bytes is not a telemetry_dedup
// claim"): the batch forwarded unchecked (or 503), and five in a row
// opened their breaker. A record longer than this version's, written by a
// later one that appends a field as this one did, is read by the fields
// this one knows, as the Lua scripts read longer seen values, so that the
// next such change, and a rollback to this version, cost no errors.
func TestRedisClaimsOfLaterVersionsAreRead(t *testing.T) {
	ctx, pol := context.Background(), testPolicy(Tumbling)
	srv := redistest.Start(t)
	s, rdb := newRedisStore(t, srv), srv.Client()
	first := claimOf(pol, parked, 1, time.Now())
	decide(t, s, first)
	v := rdb.Get(ctx, first.Key()).Val()
	rdb.Set(ctx, first.Key(), v+"\x00\x00\x00\x00", time.Hour) // a field a later version appends
	if v, err := decideOne(ctx, s, claimOf(pol, parked, 2, time.Now())); err != nil || v.Decision != InFlight {
		t.Fatalf("a redelivery of a ping whose claim a later version wrote: %+v %v, want in_flight "+
			"(an error fails the whole batch: unchecked or 503, and the breaker counts it)", v, err)
	}
}

// The memory store passes over claims in flight when it evicts, but
// max_keys still bounds it. Two sites of one process share the store; the
// one with the shorter ttl has its claims first in line, and one Overland
// batch of 100 points waiting for its upstream is 100 claims in flight.
// A first version passed over 64 and then evicted nothing: every key of
// the other site was added on top, and the excess was never given back
// (each put then evicted one key and added one), so every upstream stall
// ratcheted the store further above max_keys.
func TestAFullMemoryStoreStaysNearMaxKeysWhileClaimsAreInFlight(t *testing.T) {
	const maxKeys, batch, otherPings = 200, 100, 2000
	m := NewMemoryStore(maxKeys)
	short, long := testPolicy(Tumbling), testPolicy(Tumbling)
	short.TTL, long.TTL = 10*time.Minute, 6*time.Hour+30*time.Minute
	now := time.Now() // claims in flight are dated by the wall clock
	claimAt := func(pol *Policy, asset string, token uint64) *Claim {
		c := claimOf(pol, ping.Ping{Asset: asset, Time: articleBase, Lat: 52.52, Lon: 13.40}, token, now)
		if v := decide(t, m, c); v.Decision != Accepted {
			t.Fatalf("%s: %+v, want accepted", asset, v)
		}
		return c
	}
	settle := func(c *Claim) {
		if err := settleOne(context.Background(), m, c); err != nil {
			t.Fatal(err)
		}
	}
	// The long-ttl site has filled the store with settled keys.
	for i := range maxKeys {
		settle(claimAt(long, fmt.Sprintf("long-%d", i), uint64(i)))
	}
	// The short-ttl site's batch waits for its upstream: its claims are
	// the closest to expiry, all in flight.
	var inFlight []*Claim
	for i := range batch {
		inFlight = append(inFlight, claimAt(short, fmt.Sprintf("batch-%d", i), uint64(10_000+i)))
	}
	// Meanwhile the long-ttl site goes on.
	for i := range otherPings {
		settle(claimAt(long, fmt.Sprintf("during-%d", i), uint64(20_000+i)))
	}
	during := m.Len()
	t.Logf("max_keys %d, %d claims in flight: %d keys after %d other pings", maxKeys, batch, during, otherPings)
	if during > maxKeys+batch {
		t.Errorf("%d keys held while %d claims were in flight, max_keys %d: each of the other site's %d keys was added without an eviction "+
			"(the store gave up evicting after 64 claims in flight); want at most max_keys plus the claims it passes over (%d)",
			during, batch, maxKeys, otherPings, maxKeys+batch)
	}
	// The batch is answered; the store is full and goes on evicting.
	for _, c := range inFlight {
		settle(c)
	}
	for i := range otherPings {
		settle(claimAt(long, fmt.Sprintf("after-%d", i), uint64(40_000+i)))
	}
	if n := m.Len(); n > maxKeys {
		t.Errorf("%d keys held after the claims in flight settled and %d more pings, max_keys %d: the excess is never given back "+
			"(each put evicts one key and adds one), so every stall ratchets the store further above max_keys",
			n, otherPings, maxKeys)
	}
}

// The same with one site and one ttl: an Overland batch of more than 64
// points whose upstream is slow, on a store whose oldest keys are younger
// than in_flight_timeout.
func TestAMemoryStoreAboveThePingsInFlightHoldsMaxKeys(t *testing.T) {
	const maxKeys, batch = 300, 65
	m := NewMemoryStore(maxKeys)
	pol := testPolicy(Tumbling)
	now := time.Now()
	token := uint64(0)
	claim := func(asset string) *Claim {
		token++
		c := claimOf(pol, ping.Ping{Asset: asset, Time: articleBase, Lat: 52.52, Lon: 13.40}, token, now)
		if v := decide(t, m, c); v.Decision != Accepted {
			t.Fatalf("%s: %+v, want accepted", asset, v)
		}
		return c
	}
	for i := range batch { // the oldest keys: a batch still in flight
		claim(fmt.Sprintf("batch-%d", i))
	}
	for i := range 3 * maxKeys { // the next pings, answered at once
		if err := settleOne(context.Background(), m, claim(fmt.Sprintf("veh-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if n := m.Len(); n > maxKeys+1 {
		t.Errorf("%d keys with max_keys %d (above the %d pings in flight): want at most a key more", n, maxKeys, batch)
	}
}

// A reload that lowers max_keys (SetMaxKeys, once the old config is gone)
// passes over claims in flight as a put does: the redelivery of a ping
// whose request is still waiting for its upstream is told to come back.
func TestLoweringMaxKeysPassesOverClaimsInFlight(t *testing.T) {
	m := NewMemoryStore(10)
	short, long := testPolicy(Tumbling), testPolicy(Tumbling)
	short.TTL, long.TTL = 10*time.Minute, 6*time.Hour
	now := time.Now()
	pingOf := func(asset string) ping.Ping {
		return ping.Ping{Asset: asset, Time: articleBase, Lat: 52.52, Lon: 13.40}
	}
	if v := decide(t, m, claimOf(short, pingOf("in-flight"), 1, now)); v.Decision != Accepted {
		t.Fatalf("first claim: %+v", v)
	}
	for i := range 9 {
		c := claimOf(long, pingOf(fmt.Sprintf("settled-%d", i)), uint64(100+i), now)
		decide(t, m, c)
		if err := settleOne(context.Background(), m, c); err != nil {
			t.Fatal(err)
		}
	}
	m.SetMaxKeys(5)
	if v := decide(t, m, claimOf(short, pingOf("in-flight"), 2, now)); v.Decision != InFlight {
		t.Errorf("the redelivery of a ping still in flight after a reload lowered max_keys to 5: %+v (forwarded a second time); want in_flight", v)
	}
}
