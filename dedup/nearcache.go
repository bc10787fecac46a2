package dedup

import (
	"context"
	"time"

	"github.com/maypok86/otter/v2"
)

// DefaultNearCache is how many settled keys a near cache holds by default.
const DefaultNearCache = 100_000

// nearCacheMargin is taken off a cached key's life, so that clock skew
// between Caddy instances and Redis never lets the cache outlive the key.
const nearCacheMargin = time.Second

// NearCache answers, in process, tumbling claims whose key is already held
// by a settled claim: the repeat jitter of parked assets, which is most of a
// fleet's traffic, then costs no store round trip.
//
// Only a holder that was settled is cached (its request finished with its
// upstream's answer), and a settled claim is never released, so the cache
// never suppresses a ping whose key could still be given back. A claim that
// is merely older than the in-flight timeout is not cached: its request may
// still fail late and release it. An entry lives until the key's own expiry, minus a margin,
// and the cache is bounded. The sliding and session shapes pass through: their
// answers depend on the asset's state, which only the store holds.
type NearCache struct {
	next     Store
	cache    *otter.Cache[string, nearEntry]
	onLookup func(hit bool)
}

// nearEntry is a cached holder and when the key it holds expires, on the
// server clock of the claims (cachedAt is when it was cached).
type nearEntry struct {
	holder            record
	cachedAt, expires time.Time
}

// NewNearCache puts a cache of at most size keys in front of next. onLookup,
// if not nil, is told of every lookup, for metrics.
func NewNearCache(next Store, size int, onLookup func(hit bool)) *NearCache {
	n := &NearCache{next: next, onLookup: onLookup}
	n.cache = otter.Must(&otter.Options[string, nearEntry]{
		MaximumSize: size,
		ExpiryCalculator: otter.ExpiryCreatingFunc(func(e otter.Entry[string, nearEntry]) time.Duration {
			return e.Value.expires.Sub(e.Value.cachedAt)
		}),
	})
	return n
}

// Decide implements Store: the claims the cache can answer are answered
// here, the others go to the store in one batch.
func (n *NearCache) Decide(ctx context.Context, claims []*Claim) ([]Verdict, error) {
	verdicts := make([]Verdict, len(claims))
	var misses []*Claim
	var at []int
	for i, c := range claims {
		if held, ok := n.lookup(c); ok {
			verdicts[i] = judgeHeld(held, c)
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
		return nil, err
	}
	for j, c := range misses {
		verdicts[at[j]] = decided[j]
		if decided[j].Decision == Suppressed && c.held && c.holder.settled {
			n.remember(c, c.holder)
		}
	}
	return verdicts, nil
}

// Settle implements Store; a claim the store settled is cached.
func (n *NearCache) Settle(ctx context.Context, claims []*Claim) error {
	if err := n.next.Settle(ctx, claims); err != nil {
		return err
	}
	for _, c := range claims {
		if c.Policy.Shape == Tumbling {
			r := newRecord(c)
			r.settled = true
			n.remember(c, r)
		}
	}
	return nil
}

// Release implements Store. Nothing released is ever cached.
func (n *NearCache) Release(ctx context.Context, claims []*Claim) ([]bool, error) {
	return n.next.Release(ctx, claims)
}

// Len returns how many keys the cache holds.
func (n *NearCache) Len() int { return n.cache.EstimatedSize() }

func (n *NearCache) lookup(c *Claim) (record, bool) {
	if c.Policy.Shape != Tumbling {
		return record{}, false
	}
	e, ok := n.cache.GetIfPresent(c.Observation.Key)
	if ok && !c.At.Before(e.expires) {
		ok = false // expired, not yet swept
	}
	if n.onLookup != nil {
		n.onLookup(ok)
	}
	return e.holder, ok
}

// remember caches the holder of c's key until the key's expiry, minus the
// margin.
func (n *NearCache) remember(c *Claim, held record) {
	e := nearEntry{holder: held, cachedAt: c.At, expires: held.claimedAt.Add(c.Policy.TTL - nearCacheMargin)}
	if e.cachedAt.Before(e.expires) {
		n.cache.Set(c.Observation.Key, e)
	}
}
