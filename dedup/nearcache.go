package dedup

import (
	"context"
	"time"
)

// DefaultNearCache is how many settled keys a near cache holds by default.
const DefaultNearCache = 100_000

// nearCacheMargin is taken off a cached key's life, so that clock skew
// between Caddy instances and Redis never lets the cache outlive the key.
const nearCacheMargin = time.Second

// NearCache answers, in process, what the store has answered for good: in
// tumbling, claims whose key is held by a settled claim (the repeat jitter
// of parked assets, which is most of a fleet's traffic); in sliding and
// session, exact redeliveries of pings whose seen entry is final. They then
// cost no store round trip.
//
// Only a holder that was settled is cached (its request finished with its
// upstream's answer), and a settled claim is never released, so the cache
// never suppresses a ping whose key could still be given back. A claim that
// is merely older than the in-flight timeout is not cached: its request may
// still fail late and release it. In the track shapes, a seen ping is final
// once settled, or once suppressed unless the asset's last accepted ping
// was one of its own request's (Claim.undoable: a release of that request
// takes it out of the track, and the store folds it in again when the
// retry redelivers it); any other ping there depends on the asset's state,
// which only the store holds, and passes through. An entry
// lives until the key's own expiry, minus a margin, and the cache is
// bounded: it takes 64 bytes a key, allocated at once, and holds nothing
// the garbage collector scans (see nearTable).
type NearCache struct {
	next     Store
	keys     keyHasher
	table    *nearTable
	onLookup func(hit bool)
}

// nearEntry is a cached holder and when the key it holds expires, on the
// server clock of the claims, in Unix ns.
type nearEntry struct {
	holder  record
	expires int64
}

// NearCacheEntryBytes is what each key of a near cache takes, allocated
// with the cache; MaxNearCache bounds its size at 3.2 GB, far beyond the
// parked keys of any fleet a window touches.
const (
	NearCacheEntryBytes = 64
	MaxNearCache        = 50_000_000
)

// NewNearCache puts a cache of size keys (rounded up to a multiple of 8) in
// front of next. onLookup, if not nil, is told of every lookup, for
// metrics.
func NewNearCache(next Store, size int, onLookup func(hit bool)) *NearCache {
	return &NearCache{next: next, onLookup: onLookup, keys: newKeyHasher(), table: newNearTable(size)}
}

// Decide implements Store: the claims the cache can answer are answered
// here, the others go to the store in one batch.
func (n *NearCache) Decide(ctx context.Context, claims []*Claim) ([]Verdict, error) {
	verdicts := make([]Verdict, len(claims))
	var misses []*Claim
	var at []int
	for i, c := range claims {
		if held, ok := n.lookup(c); ok {
			verdicts[i] = n.cachedVerdict(held, c)
			continue
		}
		misses = append(misses, c)
		at = append(at, i)
	}
	if len(misses) == 0 {
		return verdicts, nil
	}
	decided, err := n.next.Decide(ctx, misses)
	if err != nil {
		if decided == nil {
			err = failedWhole(err)
			if len(misses) == len(claims) {
				return nil, err
			}
		}
		err = spreadFailure(err, len(claims), at) // the cache's own answers stand
	}
	for j, c := range misses {
		if DecideFailed(err, at[j]) {
			continue
		}
		v := decided[j]
		verdicts[at[j]] = v
		switch {
		case v.Decision != Suppressed:
		case c.held && c.holder.settled:
			// A settled holder (tumbling), or the settled ping a track
			// shape's redelivery found: cached as long as its key lives.
			n.remember(c, c.holder)
		case c.Policy.Shape != Tumbling && v.Reason != Redelivery && !c.undoable:
			// A fresh suppression is final, unless a release of its own
			// request may take it out of the track: the store then folds
			// it in again when the retry redelivers it. A redelivery that
			// found no settled ping may have met a pending one merely past
			// the in-flight timeout, or a suppressed one of unknown age.
			n.remember(c, newRecord(c))
		}
	}
	return verdicts, err
}

// cachedVerdict is the verdict on c of a cached holder: in tumbling judged
// like the store's; in the track shapes, c is a redelivery of a final ping.
func (n *NearCache) cachedVerdict(held record, c *Claim) Verdict {
	if c.Policy.Shape != Tumbling {
		return suppressed(Redelivery)
	}
	return judgeHeld(held, c)
}

// Settle implements Store; a claim the store settled is cached.
func (n *NearCache) Settle(claims []*Claim, done func(error)) {
	n.next.Settle(claims, func(err error) {
		if err == nil {
			for _, c := range claims {
				n.remember(c, settledRecord(c))
			}
		}
		done(err)
	})
}

// Release implements Store. Nothing released is ever cached.
func (n *NearCache) Release(ctx context.Context, claims []*Claim) ([]bool, error) {
	return n.next.Release(ctx, claims)
}

// Len returns how many keys the cache holds, expired ones that nothing
// has replaced yet included. It counts them one by one: for tests and
// occasional looks, not for every request.
func (n *NearCache) Len() int { return n.table.len() }

func (n *NearCache) lookup(c *Claim) (record, bool) {
	e, ok := n.table.get(n.key(c), c.At.UnixNano())
	if n.onLookup != nil {
		n.onLookup(ok)
	}
	return e.holder, ok
}

// remember caches the holder of c's key until the key's expiry, minus the
// margin.
func (n *NearCache) remember(c *Claim, held record) {
	e := nearEntry{holder: held, expires: held.claimedMs*int64(time.Millisecond) + int64(c.Policy.TTL-nearCacheMargin)}
	if c.At.UnixNano() < e.expires {
		n.table.put(n.key(c), e)
	}
}

// key is what the cache knows c by: its tumbling key, or its seen entry in
// the track shapes.
func (n *NearCache) key(c *Claim) hashedKey {
	if c.Policy.Shape == Tumbling {
		return n.keys.key(c.Observation.Key)
	}
	return n.keys.seen(c)
}
