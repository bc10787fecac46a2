package dedup

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

// Reason says why a ping was suppressed. Sent in X-Dedup-Reason and
// counted, so the ratio of jitter to redelivery is observed rather than
// inferred.
type Reason string

// Reasons for suppression.
const (
	// Redelivery: the same device time and coordinates as a ping already
	// seen (a sender retry, a timeout after commit, a broker rebalance).
	Redelivery Reason = "redelivery"
	// Reobservation: the same coordinates as the first sighting, at another
	// time in its bucket (the device reporting again on schedule).
	Reobservation Reason = "reobservation"
	// Jitter: other coordinates in the same place (GPS noise of a parked
	// asset): in tumbling the same cell, in sliding and session the asset's
	// stay, within the radius of its anchor.
	Jitter Reason = "jitter"
	// ReasonSliding: the same place as the last accepted ping less than a
	// window ago, in a bucket tumbling would have admitted.
	ReasonSliding Reason = "sliding"
	// ReasonSession: the same place as the last accepted ping inside the
	// same session, in a bucket tumbling would have admitted.
	ReasonSession Reason = "session"
)

// Reasons for an admission that a plain position would not have had.
const (
	// ReasonEvent: the ping carries an event (an alarm, a manual publish,
	// a region transition), which only its own exact redeliveries
	// suppress.
	ReasonEvent Reason = "event"
)

// Verdict is the decision on one ping and, unless it was accepted, why.
type Verdict struct {
	// Decision is Accepted, Suppressed or InFlight.
	Decision Decision
	// Reason classifies a Suppressed or InFlight ping. An Accepted ping has
	// none, unless it was admitted for what it carries: ReasonEvent.
	Reason Reason
}

var accepted = Verdict{Decision: Accepted}

func suppressed(r Reason) Verdict { return Verdict{Decision: Suppressed, Reason: r} }
