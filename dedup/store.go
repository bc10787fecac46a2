package dedup

import (
	"context"
	"slices"
)

// Store decides claims. Everything a decision reads and writes happens in one
// atomic step: one critical section in MemoryStore, one command or Lua
// script in RedisStore. Expiries are set in the same step as the values: a
// key without an expiry is how dedup stores grow without bound.
//
// Every method takes a batch, decided in order as if one claim after the
// other (a later claim of the batch sees what an earlier one wrote), in one
// round trip: a single ping is a batch of one, an array of pings is one
// batch. MemoryStore and RedisStore give the same verdicts for the same
// sequence of claims; one test suite runs against both.
type Store interface {
	// Decide claims each claim's observation and returns one verdict per
	// claim. Only an Accepted claim may be settled or released afterwards.
	// A store that answered some claims and failed the others returns their
	// verdicts with a *DecideError naming the failed ones.
	Decide(ctx context.Context, claims []*Claim) ([]Verdict, error)

	// Settle marks accepted claims as settled: their requests have their
	// upstream's answer and the observations stand. Expiries are kept, and
	// a key that is gone is not made again. In the track shapes a claim
	// that no longer holds its key is left alone; in the tumbling shape the
	// key is settled whichever claim holds it, since its observation was
	// delivered either way.
	//
	// Settle need not wait for the store's answer: it calls done with it,
	// once, on any goroutine, before or after it returns; done must not
	// block. A settlement reaches the store ahead of every claim decided
	// after Settle returns, so the redelivery a sender makes once it has
	// its answer finds its claim settled however late the answer to the
	// settlement comes. WaitSettled waits for it.
	Settle(claims []*Claim, done func(error))

	// Release undoes accepted claims, so that the sender's retry is judged
	// as if the failed request had never come, and reports per claim
	// whether there was still something of it to undo. It never undoes
	// another request's claim. It undoes them newest device time first
	// (releaseOrder): a track keeps one undo record, for its last
	// acceptance, and a batch is accepted in device-time order.
	Release(ctx context.Context, claims []*Claim) ([]bool, error)
}

// WaitSettled settles claims in store and waits for the store's answer, or
// for ctx to end.
func WaitSettled(ctx context.Context, store Store, claims []*Claim) error {
	answered := make(chan error, 1)
	store.Settle(claims, func(err error) { answered <- err })
	select {
	case err := <-answered:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// releaseOrder is the order a store undoes claims in: newest device time
// first, and among equal times the last given first. A track keeps one
// undo record, for its last acceptance, and a batch's claims on one asset
// were accepted oldest first: undone newest first, the newest puts back
// the track from before the request, and each older one finds itself no
// longer the last (see trackState.release).
func releaseOrder(claims []*Claim) []int {
	order := make([]int, len(claims))
	for i := range order {
		order[i] = len(claims) - 1 - i
	}
	slices.SortStableFunc(order, func(a, b int) int { return claims[b].Time.Compare(claims[a].Time) })
	return order
}
