package dedup

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// record is what a tumbling claim stores under its key: the request that
// holds the claim, whether that request has finished, and fingerprints of
// the first sighting the key was claimed for. They are what lets a lost
// claim be classified (redelivery, re-observation, jitter) without a second
// round trip; the first sighting itself is not needed, only whether another
// ping equals it, and fingerprints keep a Redis key at 120 bytes (136 with
// a key_prefix over 12 bytes).
type record struct {
	claimedMs int64  // server time, Unix ms: no time.Time, so a record holds no pointer for the GC to follow
	sighting  uint64 // fingerprint of the first sighting: device time and coordinates
	token     uint32 // the claiming request's token, folded (recordToken)
	position  uint32 // fingerprint of its coordinates alone
	ttlS      uint32 // the TTL the claim was written with, seconds (claimTTL)
	waitCode  uint16 // the claiming request's in_flight_timeout (waitCodeOf)
	settled   bool
}

func newRecord(c *Claim) record {
	// ms precision, as in Redis, so both stores time out in-flight claims alike
	return record{
		token:     recordToken(c.Token),
		claimedMs: c.At.UnixMilli(),
		sighting:  sightingPrint(c.Ping),
		position:  positionPrint(c.Ping),
		waitCode:  waitCodeOf(c.Policy),
		ttlS:      ttlSOf(c.Policy),
	}
}

// waitMsOf is pol's in_flight_timeout as a seen entry stores it, in ms:
// at least 1, as 0 marks an entry stored without it, and at most 49 days,
// which is all the same (no forward runs so long).
func waitMsOf(pol *Policy) uint32 {
	return uint32(min(max(pol.InFlightTimeout.Milliseconds(), 1), math.MaxUint32))
}

// wait is how long r counts as in flight: the in_flight_timeout of the
// request that made it, stored with the claim (as a seen entry stores it
// too: seenValue.wait), since that is what bounds its forward (a handler
// cuts the forward before it). Judged by the reader's own (pol's), a
// handler with a shorter one (a reload that shortened it, another
// instance on the key space) told a redelivery it was delivered while the
// first could still fail, and the ping was lost. A claim stored without it
// (an earlier version's) waits the reader's.
func (r record) wait(pol *Policy) time.Duration {
	if r.waitCode == 0 {
		return pol.InFlightTimeout
	}
	return r.storedWait()
}

// storedWait is the in_flight_timeout r stores; 0 when it stores none.
func (r record) storedWait() time.Duration {
	if r.waitCode&waitInSeconds != 0 {
		return time.Duration(r.waitCode&^waitInSeconds) * time.Second
	}
	return time.Duration(r.waitCode) * 100 * time.Millisecond
}

// claimTTL is the TTL r was written with, which dates its landing
// (waitFromLanding): a judge with another TTL (another instance, a reload
// that changed ttl, retry_ladder or outage_margin) dated a claim that
// landed late an hour off, or not at all, and told a redelivery it was
// delivered before the claim's reconciler released it. A record stored
// without it is dated by the judge's, as before.
func (r record) claimTTL(pol *Policy) time.Duration {
	if r.ttlS == 0 {
		return pol.TTL
	}
	return time.Duration(r.ttlS) * time.Second
}

// waitCodeOf and ttlSOf are pol's in_flight_timeout and TTL as a
// tumbling record stores them, in 2 and 3 bytes, so that the record keeps
// the size at which Redis stores a key in 120 bytes. The timeout is in
// tenths of a second up to 54 minutes, and beyond in seconds
// (waitInSeconds) up to 9 hours, rounded up: a claim waits a little
// longer, never shorter. The TTL is in seconds. 0, for a longer timeout,
// or a TTL over 194 days or not whole seconds, leaves the judge's own, as
// for records stored before they were.
func waitCodeOf(pol *Policy) uint16 {
	if ds := ceilDiv(pol.InFlightTimeout, 100*time.Millisecond); ds < waitInSeconds {
		return uint16(max(ds, 1))
	}
	if s := ceilDiv(pol.InFlightTimeout, time.Second); s < waitInSeconds {
		return waitInSeconds | uint16(s)
	}
	return 0
}

// waitInSeconds marks a stored timeout counted in seconds.
const waitInSeconds = 1 << 15

// ceilDiv is d/unit, rounded up.
func ceilDiv(d, unit time.Duration) time.Duration { return (d + unit - 1) / unit }

func ttlSOf(pol *Policy) uint32 {
	if pol.TTL >= 1<<24*time.Second || pol.TTL%time.Second != 0 {
		return 0
	}
	return uint32(pol.TTL / time.Second)
}

// recordToken is the 32 bits of a claim's token a record keeps: its two
// halves folded. The claims of one request share the upper 48 bits of
// their tokens and differ in the lower 16 (ClaimAll), so the low half
// alone held only 16 random bits: one pair of requests in 65,536 had the
// same, and a redelivery took the first request's claim for its own
// (accepted, forwarded twice), or a release made again after the retry
// got through deleted the retry's settled claim. Folded, they have 32
// random bits, and the claims of one request still differ.
func recordToken(token uint64) uint32 { return uint32(token>>32) ^ uint32(token) }

// settledRecord is the record of c's claim once its request settled it.
func settledRecord(c *Claim) record {
	r := newRecord(c)
	r.settled = true
	return r
}

// sightingPrint and positionPrint fingerprint a ping with FNV-1a, the same
// in every process: an equal fingerprint is an equal observation but for a
// 2^-64 (2^-32 for the position) chance, which could only mislabel the
// reason of a ping that is suppressed anyway. A ping's event is part of
// its sighting; a plain ping's fingerprint is what it always was, so
// records already stored keep matching.
func sightingPrint(p ping.Ping) uint64 {
	h := fnv.New64a()
	var b [24]byte
	binary.BigEndian.PutUint64(b[0:], uint64(p.Time.UnixNano()))
	binary.BigEndian.PutUint64(b[8:], math.Float64bits(p.Lat))
	binary.BigEndian.PutUint64(b[16:], math.Float64bits(p.Lon))
	h.Write(b[:])
	if p.Event != "" {
		h.Write([]byte(p.Event))
	}
	return h.Sum64()
}

func positionPrint(p ping.Ping) uint32 {
	h := fnv.New32a()
	var b [16]byte
	binary.BigEndian.PutUint64(b[0:], math.Float64bits(p.Lat))
	binary.BigEndian.PutUint64(b[8:], math.Float64bits(p.Lon))
	h.Write(b[:])
	return h.Sum32()
}

// recordSize is the encoded length: small enough for Redis to keep the
// value inline with its object header in a 48-byte allocation. Records
// written before the claim's in_flight_timeout and TTL were stored are the
// first recordSizeBefore bytes of it, and are read as well; so are longer
// ones, a later version's, by the fields this one knows, so that instances
// of both can share a store during an upgrade or a rollback.
const (
	recordSize       = recordSizeBefore + 2 + 3
	recordSizeBefore = 1 + 4 + 6 + 8 + 4
	recordSizeMax    = 44 // the longest value Redis embeds in its object
)

// Claim states, the first byte of an encoded record and of a seen value.
const (
	flagPending    byte = 'p' // accepted, its request still waits for the upstream
	flagSettled    byte = 'a' // accepted, settled
	flagSuppressed byte = 's' // seen and suppressed (seen values only)
)

// encode lays the record out as fixed-width big-endian fields: state,
// token (4 bytes), claim time (Unix ms, 6 bytes), the sighting's fingerprint
// (8), the position's (4), and the claim's in_flight_timeout (2) and TTL
// (3: waitCodeOf, ttlSOf).
func (r record) encode() string {
	var b [recordSize]byte
	b[0] = flagPending
	if r.settled {
		b[0] = flagSettled
	}
	binary.BigEndian.PutUint32(b[1:], r.token)
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(r.claimedMs))
	copy(b[5:11], ms[2:])
	binary.BigEndian.PutUint64(b[11:], r.sighting)
	binary.BigEndian.PutUint32(b[19:], r.position)
	binary.BigEndian.PutUint16(b[23:], r.waitCode)
	var ttl [4]byte
	binary.BigEndian.PutUint32(ttl[:], r.ttlS)
	copy(b[25:28], ttl[1:])
	return string(b[:])
}

func decodeRecord(s string) (record, error) {
	if len(s) < recordSizeBefore || len(s) > recordSizeMax || (s[0] != flagPending && s[0] != flagSettled) {
		return record{}, fmt.Errorf("stored value of %d bytes is not a telemetry_dedup claim; is another application writing under the same key_prefix?", len(s))
	}
	var ms [8]byte
	copy(ms[2:], s[5:11])
	r := record{
		settled:   s[0] == flagSettled,
		token:     binary.BigEndian.Uint32([]byte(s[1:5])),
		claimedMs: int64(binary.BigEndian.Uint64(ms[:])),
		sighting:  binary.BigEndian.Uint64([]byte(s[11:19])),
		position:  binary.BigEndian.Uint32([]byte(s[19:23])),
	}
	if len(s) >= recordSize {
		r.waitCode = binary.BigEndian.Uint16([]byte(s[23:25]))
		var ttl [4]byte
		copy(ttl[1:], s[25:28])
		r.ttlS = binary.BigEndian.Uint32(ttl[:])
	}
	return r, nil
}

// judgeHeld classifies a tumbling claim that found its key held: the same
// observation is a redelivery (asked to come back while the first is in
// flight), the same coordinates a re-observation, anything else jitter.
func judgeHeld(held record, c *Claim) Verdict {
	c.holder, c.held = held, true
	sameObservation := held.sighting == sightingPrint(c.Ping)
	switch {
	case sameObservation && inFlight(!held.settled, held.claimedMs, held.wait(c.Policy), c.At):
		return Verdict{Decision: InFlight, Reason: Redelivery}
	case sameObservation:
		return suppressed(Redelivery)
	case held.position == positionPrint(c.Ping):
		return suppressed(Reobservation)
	default:
		return suppressed(Jitter)
	}
}

// inFlight reports whether a pending claim made at claimedMs, waiting
// wait (record.wait), may still be waiting for its upstream at time at. A
// claim older than that counts as settled even if its request vanished (a
// killed process never settles), unless waitFromLanding finds it reached
// the store later.
func inFlight(pending bool, claimedMs int64, wait time.Duration, at time.Time) bool {
	return pending && at.Sub(time.UnixMilli(claimedMs)) < wait
}

// waitFromLanding is v, or in_flight if v suppresses a redelivery that
// found a pending claim (older than its wait by its claim time, or v would
// say in_flight already) which reached the store less than wait ago. The
// two differ for a claim a hung Redis ran from its socket buffer on
// resuming, long after its request gave up: by its claim time it would
// count as settled at once, and a redelivery told 200 before the
// reconciler released it would be lost. left is the claim's remaining
// time to live of ttl, the one it was written with, which dates its
// landing on the store's own clock; a negative one (the key gone since, or
// unreadable) counts as just landed, and one over the TTL cannot be dated,
// so the claim time stands.
func waitFromLanding(v Verdict, pending bool, left, wait, ttl time.Duration) Verdict {
	landedLately := left < 0 || (left <= ttl && ttl-left < wait)
	if settledByClaimTime(v, pending) && landedLately {
		return Verdict{Decision: InFlight, Reason: Redelivery}
	}
	return v
}

// settledByClaimTime reports whether v suppresses a redelivery of a pending
// claim, which only its claim time made count as settled: the one verdict
// waitFromLanding may change, and so the only one worth dating a claim for.
func settledByClaimTime(v Verdict, pending bool) bool {
	return pending && v == suppressed(Redelivery)
}
