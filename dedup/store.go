package dedup

import "context"

// Store decides claims. Everything a decision reads and writes happens in one
// atomic step: one critical section in MemoryStore, one command or Lua
// script (one round trip) in RedisStore. Expiries are set in the same step as
// the values: a key without an expiry is how dedup stores grow without
// bound.
//
// MemoryStore and RedisStore give the same verdicts for the same sequence of
// claims; one test suite runs against both.
type Store interface {
	// Decide claims c's observation and returns the verdict. Only an
	// Accepted claim may be settled or released afterwards.
	Decide(ctx context.Context, c *Claim) (Verdict, error)

	// Settle marks an accepted claim as settled: its request has its
	// upstream answer and the observation stands. Expiries are kept. It
	// does nothing if the claim no longer holds its key.
	Settle(ctx context.Context, c *Claim) error

	// Release undoes an accepted claim, so that the sender's retry is
	// judged as if the failed request had never come, and reports whether
	// it did. It never undoes another request's claim.
	Release(ctx context.Context, c *Claim) (bool, error)
}
