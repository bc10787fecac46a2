package dedup

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"
)

// Record is what a claim stores under its key: the request that holds the
// claim, whether that request has finished, and the first sighting the key
// was claimed for. Keeping the first sighting in the value is what lets a
// lost claim be classified (redelivery, re-observation, jitter) without a
// second round trip.
type Record struct {
	// Token identifies the claiming request; release and settle only act
	// on a key that still holds it.
	Token uint64
	// ClaimedAt is the server time of the claim, in milliseconds.
	ClaimedAt time.Time
	// Settled is set once the claiming request has its upstream answer.
	Settled bool
	// Time is the device time of the first sighting.
	Time time.Time
	// Lat and Lon are the position of the first sighting.
	Lat, Lon float64
}

// recordSize is the encoded length: small enough for Redis to store the
// value inline with its object header (embstr, at most 44 bytes).
const recordSize = 1 + 8 + 8 + 8 + 8 + 8

// Record flags, the first byte of the encoding.
const (
	flagPending byte = 'p'
	flagSettled byte = 's'
)

// encode lays the record out as fixed-width big-endian fields: flag, token,
// claim time (Unix ms), device time (Unix ns), lat and lon (IEEE 754 bits).
// Exact float bits keep the redelivery comparison exact.
func (r Record) encode() string {
	var b [recordSize]byte
	b[0] = flagPending
	if r.Settled {
		b[0] = flagSettled
	}
	binary.BigEndian.PutUint64(b[1:], r.Token)
	binary.BigEndian.PutUint64(b[9:], uint64(r.ClaimedAt.UnixMilli()))
	binary.BigEndian.PutUint64(b[17:], uint64(r.Time.UnixNano()))
	binary.BigEndian.PutUint64(b[25:], math.Float64bits(r.Lat))
	binary.BigEndian.PutUint64(b[33:], math.Float64bits(r.Lon))
	return string(b[:])
}

func decodeRecord(s string) (Record, error) {
	if len(s) != recordSize || (s[0] != flagPending && s[0] != flagSettled) {
		return Record{}, fmt.Errorf("stored value of %d bytes is not a telemetry_dedup claim; is another application writing under the same key_prefix?", len(s))
	}
	b := []byte(s)
	return Record{
		Settled:   b[0] == flagSettled,
		Token:     binary.BigEndian.Uint64(b[1:]),
		ClaimedAt: time.UnixMilli(int64(binary.BigEndian.Uint64(b[9:]))),
		Time:      time.Unix(0, int64(binary.BigEndian.Uint64(b[17:]))).UTC(),
		Lat:       math.Float64frombits(binary.BigEndian.Uint64(b[25:])),
		Lon:       math.Float64frombits(binary.BigEndian.Uint64(b[33:])),
	}, nil
}

// sameObservation reports whether p is exactly the first sighting: same
// device time, same coordinates. That is a redelivery.
func (r Record) sameObservation(p Ping) bool {
	return r.Time.Equal(p.Time) && r.samePosition(p)
}

func (r Record) samePosition(p Ping) bool {
	return r.Lat == p.Lat && r.Lon == p.Lon
}

// inFlight reports whether the claiming request may still be waiting for
// its upstream. A claim older than timeout counts as settled even if its
// request vanished (a killed process never settles).
func (r Record) inFlight(now time.Time, timeout time.Duration) bool {
	return !r.Settled && now.Sub(r.ClaimedAt) < timeout
}
