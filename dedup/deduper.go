package dedup

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// DefaultInFlightTimeout is how long an unsettled claim may wait for its
// upstream before it counts as settled. It sits above any sane upstream
// timeout, so a live request is never overtaken.
const DefaultInFlightTimeout = 30 * time.Second

// Claim is one observation's claim on the store: what the store needs to
// decide it, and afterwards to settle or release it.
type Claim struct {
	// Observation is the ping being claimed, quantised and keyed.
	Observation
	// Policy is how the claim is judged.
	Policy *Policy
	// Token identifies the claiming request; settle and release only act
	// on what this token wrote.
	Token uint64
	// At is the server time of the claim.
	At time.Time
	// StateKey holds the asset's last accepted ping and SeenKey the pings
	// seen in the observation's minute (Sliding and Session only).
	StateKey, SeenKey string

	// holder is, after a tumbling claim lost (held), the claim that holds
	// its key, as the store returned it, and after a redelivery in the
	// track shapes found its ping settled, that ping's claim: what a near
	// cache remembers.
	holder record
	held   bool
	// undoable is, after a track shape suppressed the claim, whether its
	// seen entry is flagUndoable: its redeliveries must reach the store,
	// which may fold the ping into the track again, and a near cache must
	// not answer them.
	undoable bool
	// copied: in the track shapes, the claim repeats an observation
	// before it in its batch's decision order (sameObservation), so its
	// redelivery is no ping the track lost (see trackState.lost).
	copied bool
}

// Key is the key the decision was made on: the observation key in
// tumbling, the asset's state key in the other shapes.
func (c *Claim) Key() string {
	if c.Policy.Shape == Tumbling {
		return c.Observation.Key
	}
	return c.StateKey
}

// Deduper decides what each observation is, through one atomic call to its
// Store.
type Deduper struct {
	// Store holds the claims.
	Store Store
	// Keyer computes the asset keys of the sliding and session shapes.
	Keyer Keyer
	// Policy is how claims are judged.
	Policy Policy
	// Now is the server clock; nil means time.Now.
	Now func() time.Time
}

// Observe quantises a validated ping as the policy's shape decides it:
// tumbling claims its key, from the bucket and the H3 cell; sliding and
// session judge the asset's stay, not a cell, and read only the bucket (to
// name a re-report's reason), so the cell and the key, an H3 lookup and a
// hash a new position would cost, are left zero. Keyer.Observe computes
// them where they are shown.
func (d *Deduper) Observe(p ping.Ping) Observation {
	if d.Policy.Shape == Tumbling {
		return d.Keyer.Observe(p)
	}
	return Observation{Ping: p, Bucket: d.Keyer.Bucket(p.Time)}
}

// Claim decides obs. The returned claim is what Settle and Release need if
// the verdict is Accepted.
func (d *Deduper) Claim(ctx context.Context, obs Observation) (*Claim, Verdict, error) {
	claims, verdicts, err := d.ClaimAll(ctx, []Observation{obs})
	if err != nil {
		return claims[0], Verdict{}, err
	}
	return claims[0], verdicts[0], nil
}

// MaxClaims is the most observations one ClaimAll decides: the claims of
// one request share the upper 48 bits of their tokens and are told apart by
// the lower 16, their rank in device-time order, so a track knows a
// request's claims from another's, and which came first.
const MaxClaims = 1 << 16

// ClaimAll decides a batch of observations in one store round trip. They
// are judged in device-time order, whatever order they came in, as the
// devices observed them: a sender's offline backlog, shuffled, is then
// judged like the live stream it would have been. Observations of equal
// device time keep their order: one that repeats an earlier one of the
// batch is its duplicate. When the store answered some observations and
// failed the others, their verdicts come with a *DecideError naming the
// failed ones (DecideFailed).
func (d *Deduper) ClaimAll(ctx context.Context, batch []Observation) ([]*Claim, []Verdict, error) {
	if len(batch) > MaxClaims {
		return nil, nil, fmt.Errorf("a batch of %d observations: one ClaimAll decides at most %d", len(batch), MaxClaims)
	}
	at := d.now()
	claims, backing := newClaims(len(batch))
	// The request's tokens share their upper 48 bits, so that a track
	// knows the claims of one request apart (see trackState.accept).
	request := rand.Uint64() &^ 0xffff
	for i := range batch {
		c := &backing[i]
		*c = Claim{Observation: batch[i], Policy: &d.Policy, Token: request + uint64(i), At: at}
		if d.Policy.Shape != Tumbling {
			c.StateKey, c.SeenKey = d.Keyer.TrackKeys(c.Asset, c.Time)
		}
		claims[i] = c
	}
	order := deviceTimeOrder(claims)
	for rank, i := range order {
		// The lower 16 bits are the claim's rank in the order it is
		// decided in, so that a track knows which of a request's claims it
		// had judged when another request's acceptance came between (see
		// trackState.takeUndo).
		claims[i].Token = request + uint64(rank)
	}
	if d.Policy.Shape != Tumbling {
		markCopies(claims, order)
	}
	verdicts, err := d.decideInOrder(ctx, claims, order)
	suppressCopiesOfTheBatchsOwn(claims, verdicts)
	for i := range verdicts {
		// An event is what a backend most needs to hear of: say so.
		if v := &verdicts[i]; v.Decision == Accepted && claims[i].Event != "" {
			v.Reason = ReasonEvent
		}
	}
	return claims, verdicts, err
}

// newClaims returns n claims and the pointers to them, in one allocation
// for a single ping's claim (most requests carry one) and two otherwise.
func newClaims(n int) ([]*Claim, []Claim) {
	if n == 1 {
		one := new(struct {
			ptr   [1]*Claim
			claim [1]Claim
		})
		return one.ptr[:], one.claim[:]
	}
	return make([]*Claim, n), make([]Claim, n)
}

// suppressCopiesOfTheBatchsOwn answers an exact copy of an element the
// same batch claimed as that element's redelivery. The store, deciding the
// copy after the element, finds the batch's own claim still in flight and
// says "come back later"; but the batch's retry would carry the same copy
// and meet the same claim, and the sender would never get the batch
// through. The copy is delivered exactly when the element is. Nothing is
// written for an in-flight verdict, so the store needs no change.
func suppressCopiesOfTheBatchsOwn(claims []*Claim, verdicts []Verdict) {
	for i, v := range verdicts {
		if v.Decision != InFlight {
			continue
		}
		for j := range i {
			if verdicts[j].Decision == Accepted && claims[j].sameObservation(claims[i]) {
				verdicts[i] = suppressed(Redelivery)
				break
			}
		}
	}
}

// markCopies marks the claims that repeat an observation before them in
// decision order (order, as deviceTimeOrder gives it; nil: as they are).
// A copy has its original's device time, so only the claims of one
// device time are compared: a batch of distinct times costs no seenField.
func markCopies(claims []*Claim, order []int) {
	at := func(i int) *Claim {
		if order == nil {
			return claims[i]
		}
		return claims[order[i]]
	}
	first := 0 // of the claims at the current claim's device time
	for i := 1; i < len(claims); i++ {
		c := at(i)
		if !c.Time.Equal(at(first).Time) {
			first = i
			continue
		}
		for j := first; j < i && !c.copied; j++ {
			c.copied = at(j).sameObservation(c)
		}
	}
}

// sameObservation reports whether c and o are the same observation of one
// asset, by the identity the seen set finds an exact redelivery by (device
// time, coordinates, event and state; tumbling's key and sighting hold no
// more).
func (c *Claim) sameObservation(o *Claim) bool {
	return c.Asset == o.Asset && seenField(c) == seenField(o)
}

// decideInOrder decides claims in one store call, in the given order (nil:
// as they are), and returns the verdicts in the claims' order.
func (d *Deduper) decideInOrder(ctx context.Context, claims []*Claim, order []int) ([]Verdict, error) {
	if order == nil {
		return d.Store.Decide(ctx, claims)
	}
	sorted := make([]*Claim, len(claims))
	for i, j := range order {
		sorted[i] = claims[j]
	}
	decided, err := d.Store.Decide(ctx, sorted)
	if decided == nil {
		return nil, failedWhole(err)
	}
	verdicts := make([]Verdict, len(claims))
	for i, j := range order {
		verdicts[j] = decided[i]
	}
	if err != nil {
		err = spreadFailure(err, len(claims), order)
	}
	return verdicts, err
}

// deviceTimeOrder returns the indices of claims in device-time order, or
// nil when they are in that order already (a single ping, a live batch).
func deviceTimeOrder(claims []*Claim) []int {
	if slices.IsSortedFunc(claims, func(a, b *Claim) int { return a.Time.Compare(b.Time) }) {
		return nil
	}
	order := make([]int, len(claims))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return claims[a].Time.Compare(claims[b].Time) })
	return order
}

// Settle marks accepted claims as settled: redeliveries from now on are
// suppressed with 200 instead of asked to come back. It waits for the
// store's answer; SettleLater does not.
func (d *Deduper) Settle(ctx context.Context, claims ...*Claim) error {
	return WaitSettled(ctx, d.Store, claims)
}

// SettleLater marks accepted claims as settled without waiting for the
// store, which tells done its answer (see Store.Settle). A request settles
// its claims this way once its upstream has answered: its own answer does
// not depend on the settlement, and need not wait a round trip for it.
func (d *Deduper) SettleLater(claims []*Claim, done func(error)) {
	d.Store.Settle(claims, done)
}

// Release undoes accepted claims, so that the sender's retry of an
// observation the upstream did not take is accepted. It reports how many
// claims still had something to undo.
func (d *Deduper) Release(ctx context.Context, claims ...*Claim) (int, error) {
	released, err := d.Store.Release(ctx, claims)
	n := 0
	for _, r := range released {
		if r {
			n++
		}
	}
	return n, err
}

func (d *Deduper) now() time.Time {
	if d.Now != nil {
		return d.Now()
	}
	return time.Now()
}
