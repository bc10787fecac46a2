package dedup

import (
	"encoding/binary"
	"math"
	"time"

	"github.com/uber/h3-go/v4"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/geo"
)

// The sliding and session shapes judge each ping against what the store
// remembers of its asset, in two keys:
//
//   - the state: the last accepted ping (and the one before it, so that a
//     failed request can be undone), the latest device time seen, and where
//     the current session started;
//   - the seen set of the ping's minute: every ping seen, accepted or
//     suppressed, by exact device time and coordinates. A redelivery of any
//     ping is found here for the whole TTL, even after the asset moved on.
//
// judgeTrack is the decision. MemoryStore runs it in Go; RedisStore runs the
// same rules in Lua (track_decide.lua), and a property test holds the two to
// identical verdicts.

// trackPoint is one ping as the track shapes remember it.
type trackPoint struct {
	t        int64 // device time in µs: exact in a Lua number, unlike ns
	lat, lon float64
	cell     h3.Cell
	bucket   int64
	token    uint64
}

func pointOf(c *Claim) trackPoint {
	return trackPoint{t: c.Time.UnixMicro(), lat: c.Lat, lon: c.Lon, cell: c.Cell, bucket: c.Bucket, token: c.Token}
}

// trackState is an asset's memory.
type trackState struct {
	last, prev       trackPoint
	hasPrev          bool
	seenMax          int64 // latest device time seen, µs
	sessionStart     int64 // device time that opened the current session, µs
	prevSessionStart int64 // sessionStart before last was accepted
}

// seenValue is what the seen set holds for one ping.
type seenValue struct {
	flag      byte // flagPending, flagSettled or flagSuppressed
	token     uint64
	claimedMs int64
}

// judgeTrack decides c against the asset's state st (nil if none) and the
// ping's seen entry (nil if new). It returns the verdict, the state to store
// and the seen value to record; nil means leave it as it is.
func judgeTrack(st *trackState, seen *seenValue, c *Claim) (Verdict, *trackState, *seenValue) {
	if seen != nil {
		if inFlight(seen.flag == flagPending, time.UnixMilli(seen.claimedMs), c) {
			return Verdict{Decision: InFlight, Reason: Redelivery}, nil, nil
		}
		return suppressed(Redelivery), nil, nil
	}
	p := pointOf(c)
	pending := &seenValue{flag: flagPending, token: c.Token, claimedMs: c.At.UnixMilli()}
	if st == nil {
		return accepted, &trackState{last: p, seenMax: p.t, sessionStart: p.t}, pending
	}

	pol := c.Policy
	newSession := pol.Shape == Session && p.t-st.seenMax > pol.SessionIdle.Microseconds()
	var suppress bool
	if samePlace(p, st.last, pol.Hysteresis) {
		switch pol.Shape {
		case Sliding:
			suppress = abs(p.t-st.last.t) < pol.Window.Microseconds()
		case Session:
			// A ping from before the current session started belongs to a
			// session this state no longer describes: admit rather than risk
			// losing it.
			suppress = !newSession && p.t >= st.sessionStart
		}
	}

	next := *st
	next.seenMax = max(st.seenMax, p.t)
	if suppress {
		return suppressed(trackReason(p, st.last, pol.Shape)), &next, &seenValue{flag: flagSuppressed}
	}
	// An out-of-order ping is admitted without moving the state backwards.
	if p.t >= st.last.t {
		next.prev, next.hasPrev, next.prevSessionStart = st.last, true, st.sessionStart
		next.last = p
		if newSession {
			next.sessionStart = p.t
		}
	}
	return accepted, &next, pending
}

// undo reverts the state change an accepted claim with token made, if it is
// still the last accepted ping. It reports false when the state should be
// deleted (the claim was the asset's first).
func (st *trackState) undo(token uint64) (keep bool) {
	if st.last.token != token {
		return true
	}
	if !st.hasPrev {
		return false
	}
	st.last, st.hasPrev, st.sessionStart = st.prev, false, st.prevSessionStart
	return true
}

// trackReason names a suppression: the classic reasons when tumbling would
// have suppressed it too (same bucket), the shape's name when only the shape
// did.
func trackReason(p, last trackPoint, shape Shape) Reason {
	switch {
	case p.bucket != last.bucket:
		return Reason(shape)
	case p.lat == last.lat && p.lon == last.lon:
		return Reobservation
	default:
		return Jitter
	}
}

// samePlace: the same cell, or within the hysteresis distance.
func samePlace(a, b trackPoint, hysteresis float64) bool {
	return a.cell == b.cell || (hysteresis > 0 && geo.DistanceM(a.lat, a.lon, b.lat, b.lon) <= hysteresis)
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// seenField identifies a ping within its seen set: exact device time and
// coordinates, 24 bytes.
func seenField(c *Claim) string {
	var b [24]byte
	binary.BigEndian.PutUint64(b[0:], uint64(c.Time.UnixNano()))
	binary.BigEndian.PutUint64(b[8:], math.Float64bits(c.Lat))
	binary.BigEndian.PutUint64(b[16:], math.Float64bits(c.Lon))
	return string(b[:])
}

// encodePoint lays a point out as the Lua scripts read it with
// struct.unpack('>i8ddc8i8c8'): time µs, lat, lon, cell, bucket, token.
func encodePoint(p trackPoint) string {
	var b [48]byte
	binary.BigEndian.PutUint64(b[0:], uint64(p.t))
	binary.BigEndian.PutUint64(b[8:], math.Float64bits(p.lat))
	binary.BigEndian.PutUint64(b[16:], math.Float64bits(p.lon))
	binary.BigEndian.PutUint64(b[24:], uint64(p.cell))
	binary.BigEndian.PutUint64(b[32:], uint64(p.bucket))
	binary.BigEndian.PutUint64(b[40:], p.token)
	return string(b[:])
}

func tokenBytes(token uint64) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], token)
	return string(b[:])
}
