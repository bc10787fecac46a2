package dedup

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// nearCached is a near cache in front of a real Redis, with its lookups
// counted.
type nearCached struct {
	*NearCache
	redis      *RedisStore
	hits, miss int
}

func newNearCached(t *testing.T) *nearCached {
	n := &nearCached{redis: newRedisStore(t, redistest.Start(t))}
	n.NearCache = NewNearCache(n.redis, 1000, func(hit bool) {
		if hit {
			n.hits++
		} else {
			n.miss++
		}
	})
	return n
}

func (n *nearCached) roundTrips() uint64 {
	rt, _ := n.redis.pipeline.RoundTrips()
	return rt
}

// A settled key answers its duplicates from the process: no round trip.
func TestNearCacheAnswersSettledKeysLocally(t *testing.T) {
	n := newNearCached(t)
	ctx := context.Background()
	pol := testPolicy(Tumbling)
	first := claimOf(pol, parked, 1, articleBase)
	decide(t, n, first)
	if err := settleOne(ctx, n, first); err != nil {
		t.Fatal(err)
	}
	before := n.roundTrips()
	for i, p := range []ping.Ping{parked, at(20*time.Second, 52.5200087, 13.4049547), at(40*time.Second, 52.5200410, 13.4049920)} {
		want := []Verdict{suppressed(Redelivery), suppressed(Reobservation), suppressed(Jitter)}[i]
		if v := decide(t, n, claimOf(pol, p, uint64(i+2), articleBase)); v != want {
			t.Fatalf("ping %d: %+v, want %+v", i, v, want)
		}
	}
	if rt := n.roundTrips() - before; rt != 0 || n.hits != 3 {
		t.Fatalf("%d round trips and %d hits for three duplicates of a settled key; want 0 and 3", rt, n.hits)
	}
}

// Another instance's settled claim is cached when the store reports it.
func TestNearCacheLearnsSettledHoldersFromTheStore(t *testing.T) {
	n := newNearCached(t)
	ctx := context.Background()
	pol := testPolicy(Tumbling)
	elsewhere := claimOf(pol, parked, 1, articleBase) // decided straight in Redis, as another Caddy would
	decideOne(ctx, n.redis, elsewhere)
	settleOne(ctx, n.redis, elsewhere)
	decide(t, n, claimOf(pol, at(10*time.Second, 52.5200410, 13.4049920), 2, articleBase)) // a miss, then cached
	before := n.roundTrips()
	decide(t, n, claimOf(pol, at(20*time.Second, 52.5200410, 13.4049920), 3, articleBase))
	if rt := n.roundTrips() - before; rt != 0 {
		t.Fatalf("%d round trips after the holder was seen settled", rt)
	}
}

// The cache never answers for a claim that could still be given back: not
// while it is in flight, and not after it was released.
func TestNearCacheNeverHoldsAReleasableClaim(t *testing.T) {
	n := newNearCached(t)
	ctx := context.Background()
	pol := testPolicy(Tumbling)
	first := claimOf(pol, parked, 1, articleBase)
	decide(t, n, first)
	if v := decide(t, n, claimOf(pol, parked, 2, articleBase)); v.Decision != InFlight {
		t.Fatalf("redelivery while in flight: %+v", v)
	}
	if v := decide(t, n, claimOf(pol, at(time.Second, 52.5200410, 13.4049920), 3, articleBase)); v != suppressed(Jitter) {
		t.Fatalf("jitter while in flight: %+v", v)
	}
	if n.hits != 0 || n.Len() != 0 {
		t.Fatalf("%d hits, %d cached while the claim was in flight", n.hits, n.Len())
	}
	if ok, err := releaseOne(ctx, n, first); err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
	if v := decide(t, n, claimOf(pol, parked, 4, articleBase)); v.Decision != Accepted {
		t.Fatalf("retry after the release: %+v, want accepted", v)
	}
}

func TestNearCacheEntriesEndBeforeTheirKeys(t *testing.T) {
	n := newNearCached(t)
	pol := testPolicy(Tumbling)
	pol.TTL = time.Hour
	first := claimOf(pol, parked, 1, articleBase)
	decide(t, n, first)
	settleOne(context.Background(), n, first)
	if _, ok := n.lookup(claimOf(pol, parked, 2, articleBase.Add(time.Hour-nearCacheMargin-time.Millisecond))); !ok {
		t.Fatal("not cached for the key's life")
	}
	if _, ok := n.lookup(claimOf(pol, parked, 3, articleBase.Add(time.Hour-nearCacheMargin))); ok {
		t.Fatal("a cached key outlived its TTL minus the margin")
	}
}

// With the cache or without, the verdicts are the same, in every shape.
func TestNearCacheChangesNoVerdict(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	for _, shape := range Shapes {
		for seed := range uint64(10) {
			t.Run(fmt.Sprint(shape, "/", seed), func(t *testing.T) {
				client.FlushAll(context.Background())
				compareStreams(t, newStream(seed), testPolicy(shape), NewMemoryStore(0), NewNearCache(newRedisStore(t, srv), 1000, nil))
			})
		}
	}
}

// In the track shapes, exact redeliveries of a settled ping and of a
// suppressed one are answered from the process; a jitter fix, which
// depends on the asset's state, is not.
func TestNearCacheAnswersFinalRedeliveriesOfTheTrackShapes(t *testing.T) {
	for _, shape := range []Shape{Sliding, Session} {
		t.Run(string(shape), func(t *testing.T) {
			n := newNearCached(t)
			ctx := context.Background()
			pol := testPolicy(shape)
			first := claimOf(pol, parked, 1<<16, articleBase)
			decide(t, n, first)
			if err := settleOne(ctx, n, first); err != nil {
				t.Fatal(err)
			}
			jitter := at(20*time.Second, 52.5200410, 13.4049920)
			if v := decide(t, n, claimOf(pol, jitter, 2<<16, articleBase)); v.Decision != Suppressed { // another request
				t.Fatalf("jitter: %+v", v)
			}
			before, hits := n.roundTrips(), n.hits
			for i, p := range []ping.Ping{parked, jitter} {
				if v := decide(t, n, claimOf(pol, p, uint64(i+3), articleBase)); v != suppressed(Redelivery) {
					t.Fatalf("redelivery %d: %+v", i, v)
				}
			}
			if rt := n.roundTrips() - before; rt != 0 || n.hits-hits != 2 {
				t.Fatalf("%d round trips, %d hits for two final redeliveries; want 0 and 2", rt, n.hits-hits)
			}
			decide(t, n, claimOf(pol, at(30*time.Second, 52.5200300, 13.4049800), 5, articleBase))
			if n.roundTrips() == before {
				t.Fatal("new jitter was answered without the store")
			}
		})
	}
}

// In the track shapes, a redelivery of a ping settled out of the cache's
// sight (by another instance, or before newer pings pushed its entry out)
// is cached from the store's answer, for as long as that ping's seen entry
// lives; a redelivery that met a ping merely pending past the in-flight
// timeout is not: its request may still fail and release it.
func TestNearCacheLearnsSettledPingsOfTheTrackShapesFromTheStore(t *testing.T) {
	for _, shape := range []Shape{Sliding, Session} {
		t.Run(string(shape), func(t *testing.T) {
			n := newNearCached(t)
			ctx := context.Background()
			pol := testPolicy(shape)
			pol.InFlightTimeout = 50 * time.Millisecond
			elsewhere := claimOf(pol, parked, 1, articleBase) // decided straight in Redis, as another Caddy would
			decide(t, n.redis, elsewhere)
			if err := settleOne(ctx, n.redis, elsewhere); err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				if v := decide(t, n, claimOf(pol, parked, uint64(i+2), articleBase.Add(time.Minute))); v != suppressed(Redelivery) {
					t.Fatalf("redelivery %d: %+v", i, v)
				}
			}
			if n.miss != 1 || n.hits != 2 {
				t.Fatalf("%d misses and %d hits for three redeliveries of a settled ping; want the first a miss, then hits", n.miss, n.hits)
			}
			if _, ok := n.lookup(claimOf(pol, parked, 5, articleBase.Add(pol.TTL-nearCacheMargin-time.Millisecond))); !ok {
				t.Fatal("not cached for the settled ping's life")
			}
			if _, ok := n.lookup(claimOf(pol, parked, 6, articleBase.Add(pol.TTL-nearCacheMargin))); ok {
				t.Fatal("cached past the settled ping's own expiry (dated by the redelivery, not by the ping)")
			}

			other := parked
			other.Asset = "veh-99"
			decide(t, n.redis, claimOf(pol, other, 7, time.Now())) // pending: its request never finishes
			time.Sleep(2 * pol.InFlightTimeout)
			hits := n.hits
			for i := range 2 {
				if v := decide(t, n, claimOf(pol, other, uint64(i+8), time.Now())); v != suppressed(Redelivery) {
					t.Fatalf("redelivery %d of a ping pending past the in-flight timeout: %+v", i, v)
				}
			}
			if n.hits != hits {
				t.Fatal("a redelivery that met a pending ping was answered from the cache")
			}
		})
	}
}

// A full near cache is nothing for the collector to scan: no object an
// entry and no pointer, where a cache library's node made 100,000 entries
// 100,000 objects (127-134 scannable bytes each) for every collection of
// the whole process to mark.
func TestFullNearCacheIsNothingForTheCollectorToScan(t *testing.T) {
	const size = 100_000
	n := NewNearCache(NewMemoryStore(0), size, nil)
	scanned, objects := heapAfterGC(scannableBytes), heapAfterGC(liveObjects)
	k := defaultKeyer()
	cell := k.Observe(parked).Cell
	pol, now := testPolicy(Tumbling), time.Now()
	for i := range size + size/2 {
		c := &Claim{Observation: Observation{Ping: parked, Key: k.Key(parked.Asset, int64(i), cell)}, Policy: pol, At: now}
		n.remember(c, settledRecord(c))
	}
	scanned, objects = heapAfterGC(scannableBytes)-scanned, heapAfterGC(liveObjects)-objects
	t.Logf("%d entries: %d objects and %d scannable bytes more", n.Len(), objects, scanned)
	if n.Len() < size*9/10 || n.Len() > size+nearWays {
		t.Fatalf("%d entries after %d puts into a cache of %d", n.Len(), size+size/2, size)
	}
	if objects > size/100 || scanned > size {
		t.Errorf("a full near cache added %d heap objects and %d scannable bytes for the collector; want none", objects, scanned)
	}
	runtime.KeepAlive(n)
}

// A set that is full gives way to a new key by its entry that expires
// soonest; expired entries are never answered, and a key put again is
// updated in place, not held twice.
func TestNearTableEvictsTheEntryThatExpiresSoonest(t *testing.T) {
	table := newNearTable(nearWays) // one set
	key := func(i int) hashedKey { return hashedKey{uint64(i), uint64(i) * 7} }
	entry := func(expires int64) nearEntry {
		return nearEntry{holder: record{claimedMs: expires, settled: true}, expires: expires}
	}
	const now = 1000
	for i := range nearWays {
		table.put(key(i), entry(now+int64(10*(nearWays-i)))) // key 0 lives longest, the last key shortest
	}
	table.put(key(3), entry(now+500)) // refreshed in place
	table.put(key(100), entry(now+200))
	if _, ok := table.get(key(nearWays-1), now); ok {
		t.Errorf("the entry that expired soonest is still there")
	}
	for _, i := range []int{0, 3, 100} {
		if e, ok := table.get(key(i), now); !ok || e.holder.claimedMs != e.expires {
			t.Errorf("key %d: %+v, %v", i, e, ok)
		}
	}
	if n := table.len(); n != nearWays {
		t.Errorf("%d entries in a set of %d", n, nearWays)
	}
	if _, ok := table.get(key(0), now+10*nearWays); ok {
		t.Errorf("an entry was answered at its expiry")
	}
	table.put(key(101), entry(now+300)) // takes the slot of an entry expired by then
	if _, ok := table.get(key(101), now+10*nearWays); !ok {
		t.Errorf("a new key found no room beside expired entries")
	}
}

// Under concurrent reads and writes a reader gets an entry whole, as one
// writer wrote it, or nothing.
func TestNearTableReadsAreNeverTorn(t *testing.T) {
	table := newNearTable(4 * nearWays)
	entryOf := func(i uint64) nearEntry {
		return nearEntry{expires: int64(1<<40 + i), holder: record{claimedMs: int64(i), sighting: i * 3, token: uint32(i), position: uint32(i >> 3), settled: i%2 == 0}}
	}
	keyOf := func(i uint64) hashedKey { return hashedKey{i % 64 << 58, i % 64} } // 64 keys over few sets: constant eviction
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range uint64(20_000) {
				v := i*4 + uint64(w)
				if w%2 == 0 {
					table.put(keyOf(v), entryOf(v))
					continue
				}
				if e, ok := table.get(keyOf(v), 0); ok && e != entryOf(uint64(e.holder.claimedMs)) {
					t.Errorf("torn entry: %+v", e)
					return
				}
			}
		})
	}
	wg.Wait()
}
