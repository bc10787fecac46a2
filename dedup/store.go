package dedup

import (
	"context"
	"time"
)

// Store holds claims. Implementations must make Claim atomic across every
// process that shares the store, and must set the expiry in the same step as
// the value: a key without an expiry is how dedup stores grow without bound.
//
// MemoryStore and RedisStore give the same answers for the same sequence of
// calls; one test suite runs against both.
type Store interface {
	// Claim stores rec under key for ttl if the key is free, and reports
	// whether it did. When the key is already held, held is the record that
	// holds it and nothing is written.
	Claim(ctx context.Context, key string, rec Record, ttl time.Duration) (held Record, won bool, err error)

	// Settle marks the claim rec made on key as settled: its request has
	// its upstream answer and the observation stands. The expiry is kept.
	// It does nothing if rec no longer holds the key.
	Settle(ctx context.Context, key string, rec Record) error

	// Release deletes key if rec still holds it, so that the sender's retry
	// can claim it again, and reports whether it did. It never deletes a
	// claim made by another request.
	Release(ctx context.Context, key string, rec Record) (bool, error)
}
