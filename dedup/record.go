package dedup

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"
)

// record is what a tumbling claim stores under its key: the request that
// holds the claim, whether that request has finished, and the first
// sighting the key was claimed for. Keeping the first sighting in the value
// is what lets a lost claim be classified (redelivery, re-observation,
// jitter) without a second round trip.
type record struct {
	token     uint64
	claimedAt time.Time // server time, ms precision
	settled   bool
	time      time.Time // device time of the first sighting
	lat, lon  float64
}

func newRecord(c *Claim) record {
	// ms precision, as in Redis, so both stores time out in-flight claims alike
	return record{token: c.Token, claimedAt: time.UnixMilli(c.At.UnixMilli()), time: c.Time, lat: c.Lat, lon: c.Lon}
}

// recordSize is the encoded length: small enough for Redis to store the
// value inline with its object header (embstr, at most 44 bytes).
const recordSize = 1 + 8 + 8 + 8 + 8 + 8

// Claim states, the first byte of an encoded record and of a seen value.
const (
	flagPending    byte = 'p' // accepted, its request still waits for the upstream
	flagSettled    byte = 'a' // accepted, settled
	flagSuppressed byte = 's' // seen and suppressed (seen values only)
)

// encode lays the record out as fixed-width big-endian fields: state,
// token, claim time (Unix ms), device time (Unix ns), lat and lon (IEEE 754
// bits). Exact float bits keep the redelivery comparison exact.
func (r record) encode() string {
	var b [recordSize]byte
	b[0] = flagPending
	if r.settled {
		b[0] = flagSettled
	}
	binary.BigEndian.PutUint64(b[1:], r.token)
	binary.BigEndian.PutUint64(b[9:], uint64(r.claimedAt.UnixMilli()))
	binary.BigEndian.PutUint64(b[17:], uint64(r.time.UnixNano()))
	binary.BigEndian.PutUint64(b[25:], math.Float64bits(r.lat))
	binary.BigEndian.PutUint64(b[33:], math.Float64bits(r.lon))
	return string(b[:])
}

func decodeRecord(s string) (record, error) {
	if len(s) != recordSize || (s[0] != flagPending && s[0] != flagSettled) {
		return record{}, fmt.Errorf("stored value of %d bytes is not a telemetry_dedup claim; is another application writing under the same key_prefix?", len(s))
	}
	b := []byte(s)
	return record{
		settled:   b[0] == flagSettled,
		token:     binary.BigEndian.Uint64(b[1:]),
		claimedAt: time.UnixMilli(int64(binary.BigEndian.Uint64(b[9:]))),
		time:      time.Unix(0, int64(binary.BigEndian.Uint64(b[17:]))).UTC(),
		lat:       math.Float64frombits(binary.BigEndian.Uint64(b[25:])),
		lon:       math.Float64frombits(binary.BigEndian.Uint64(b[33:])),
	}, nil
}

// judgeHeld classifies a tumbling claim that found its key held: the same
// observation is a redelivery (asked to come back while the first is in
// flight), the same coordinates a re-observation, anything else jitter.
func judgeHeld(held record, c *Claim) Verdict {
	c.holder = &held
	sameCoords := held.lat == c.Lat && held.lon == c.Lon
	switch {
	case sameCoords && held.time.Equal(c.Time) && inFlight(!held.settled, held.claimedAt, c):
		return Verdict{Decision: InFlight, Reason: Redelivery}
	case sameCoords && held.time.Equal(c.Time):
		return suppressed(Redelivery)
	case sameCoords:
		return suppressed(Reobservation)
	default:
		return suppressed(Jitter)
	}
}

// inFlight reports whether a pending claim made at claimedAt may still be
// waiting for its upstream. A claim older than the in-flight timeout counts
// as settled even if its request vanished (a killed process never settles).
func inFlight(pending bool, claimedAt time.Time, c *Claim) bool {
	return pending && c.At.Sub(claimedAt) < c.Policy.InFlightTimeout
}
