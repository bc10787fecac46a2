package dedup

import (
	"context"
	"math/rand/v2"
	"time"
)

// Decision is what happens to one ping. The values are sent to senders in
// the X-Dedup header and are part of the public interface.
type Decision string

// Decisions made by a claim. The handler adds its own for pings that never
// reach the store (rejected) or find it unreachable (unchecked, unavailable).
const (
	// Accepted: the first sighting; it goes upstream.
	Accepted Decision = "accepted"
	// Suppressed: a duplicate of a settled observation; answered 200 at once.
	Suppressed Decision = "suppressed"
	// InFlight: an exact redelivery while the first request still waits for
	// its upstream; the sender must come back, because the first may fail.
	InFlight Decision = "in_flight"
)

// Reason says which of the three duplicates a suppressed ping is. Sent in
// X-Dedup-Reason and counted, so the ratio of jitter to redelivery is
// observed rather than inferred.
type Reason string

// Reasons for suppression.
const (
	// Redelivery: the same device time and coordinates as the first sighting
	// (a sender retry, a timeout after commit, a broker rebalance).
	Redelivery Reason = "redelivery"
	// Reobservation: the same coordinates at another time in the bucket (the
	// device reporting again on schedule).
	Reobservation Reason = "reobservation"
	// Jitter: other coordinates in the same cell (GPS noise of a parked
	// asset).
	Jitter Reason = "jitter"
)

// DefaultInFlightTimeout is how long an unsettled claim may wait for its
// upstream before it counts as settled. It sits above any sane upstream
// timeout, so a live request is never overtaken.
const DefaultInFlightTimeout = 30 * time.Second

// Deduper decides what one observation is, through one claim on its Store.
type Deduper struct {
	// Store holds the claims.
	Store Store
	// TTL is how long a claimed key lives (see TTLPolicy).
	TTL time.Duration
	// InFlightTimeout is how long an unsettled claim counts as in flight.
	InFlightTimeout time.Duration
	// Now is the server clock; nil means time.Now.
	Now func() time.Time
}

// Claim is the outcome of one claim: the decision, and for an accepted
// observation what Settle or Release need to finish it.
type Claim struct {
	// Decision is Accepted, Suppressed or InFlight.
	Decision Decision
	// Reason classifies a Suppressed or InFlight ping; empty when Accepted.
	Reason Reason

	key    string
	record Record
}

// Claim claims obs.Key. Winning makes obs the first sighting; losing
// compares obs with the first sighting stored in the key, so the reason
// costs no second round trip.
func (d *Deduper) Claim(ctx context.Context, obs Observation) (Claim, error) {
	now := d.now()
	rec := Record{
		Token:     rand.Uint64(),
		ClaimedAt: now,
		Time:      obs.Time,
		Lat:       obs.Lat,
		Lon:       obs.Lon,
	}
	held, won, err := d.Store.Claim(ctx, obs.Key, rec, d.TTL)
	if err != nil {
		return Claim{}, err
	}
	if won {
		return Claim{Decision: Accepted, key: obs.Key, record: rec}, nil
	}
	return d.judge(held, obs.Ping, now), nil
}

// judge classifies a ping whose key is held by another request.
func (d *Deduper) judge(held Record, p Ping, now time.Time) Claim {
	switch {
	case held.sameObservation(p) && held.inFlight(now, d.InFlightTimeout):
		return Claim{Decision: InFlight, Reason: Redelivery}
	case held.sameObservation(p):
		return Claim{Decision: Suppressed, Reason: Redelivery}
	case held.samePosition(p):
		return Claim{Decision: Suppressed, Reason: Reobservation}
	default:
		return Claim{Decision: Suppressed, Reason: Jitter}
	}
}

// Settle marks an accepted claim as settled: redeliveries from now on are
// suppressed with 200 instead of asked to come back.
func (d *Deduper) Settle(ctx context.Context, c Claim) error {
	return d.Store.Settle(ctx, c.key, c.record)
}

// Release gives an accepted claim back, so that the sender's retry of an
// observation the upstream did not take is accepted. It reports whether the
// key was still this claim's to release.
func (d *Deduper) Release(ctx context.Context, c Claim) (bool, error) {
	return d.Store.Release(ctx, c.key, c.record)
}

func (d *Deduper) now() time.Time {
	if d.Now != nil {
		return d.Now()
	}
	return time.Now()
}
