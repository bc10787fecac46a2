package dedup

import (
	"encoding/binary"
	"math"
	"strings"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/geo"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// The sliding and session shapes judge each ping against what the store
// remembers of its asset, in two keys:
//
//   - the track: where the asset stays (an anchor refined from the fixes
//     judged to be there), the last accepted ping at the stay (what the
//     backend last heard of it), an accepted ping outside the stay that may
//     yet prove an outlier, and what it takes to undo the last acceptance;
//   - the seen set of the ping's minute: every ping seen, accepted or
//     suppressed, by exact device time, coordinates and event. A
//     redelivery of any ping is found here for the whole TTL, even after
//     the asset moved on.
//
// judgeTrack is the decision. MemoryStore runs it in Go; RedisStore runs the
// same rules in Lua (track_decide.lua), and a property test holds the two to
// identical verdicts. To keep them identical to the bit, every
// transcendental function is computed here in Go and handed to Lua as a
// number (a ping's metres per degree of longitude); the rules themselves
// use only +, -, * and / on doubles.

// The physics behind the stay.
const (
	// DefaultRadius is how far from the stay's anchor a fix still counts as
	// the same place: above the jitter of consumer GPS (σ of 3 to 5 m per
	// axis, multipath outliers at four σ), below the moves a backend needs.
	DefaultRadius = 25.0
	// LagFactor bounds, as a multiple of the radius, how far a suppressed
	// fix may lie from the last accepted ping at the stay: the backend's
	// last known position never lags the asset by more than that, however
	// its anchor drifts.
	LagFactor = 1.5
	// outlierFactor bounds, as a multiple of the radius, the outliers a
	// receiver throws: a fix farther than that that a vehicle could have
	// reached is a real excursion, and a return from it a real move.
	outlierFactor = 4.0
	// maxAccel and maxSpeed bound how far an asset at rest can get in a
	// given time: a fix beyond that is an outlier wherever it lies.
	maxAccel = 4.0  // m/s², harder than any car accelerates
	maxSpeed = 70.0 // m/s
	// movingSpeed is a reported speed no parked receiver shows (their
	// noise stays under 2 m/s): a fix reporting it has left the stay.
	movingSpeed = 2.5 // m/s
	// restSpeed is a reported speed below that of any vehicle under way: a
	// fix reporting it outside a settled stay is no evidence of a move. It
	// is no licence to lag either: an asset creeping slower still is
	// reported every LagFactor radii like any other.
	restSpeed = 1.0 // m/s
	// stillSpeed is a reported speed of an asset standing still, below a
	// slow walker's however a client rounds it (OwnTracks Android sends
	// whole km/h, truncated: 1.1 m/s is sent as 3 km/h).
	stillSpeed = 0.5 // m/s
	// restMargin caps the margin a fix standing still adds to its accuracy
	// (see uncertainty), and what it may lie beyond that from the last
	// accepted fix (see lag2).
	restMargin = 50.0 // m
	// satelliteAccuracy is the worst accuracy a satellite fix reports, even
	// indoors: a worse one is a Wi-Fi or cell fix, and a speed of 0 with it
	// often no reading at all.
	satelliteAccuracy = 100.0 // m
	// maxAccuracy is the coarsest accuracy a location provider reports (a
	// cell fix reports 1 to 3 km, iOS's coarsest accuracy to ask for is
	// 3 km): a larger one is a sentinel (99999, 65535) or another unit, no
	// uncertainty, and counts as not reported. Trusted, it let a fix lag
	// by as much: session suppressed a 54 km drive reporting 99999.
	maxAccuracy = 10000.0 // m
	// anchorMemory is how many fixes the anchor averages at most, so that
	// it follows a receiver's slow drift.
	anchorMemory = 64
	// noiseFactor2 widens the radius to the jitter the stay itself shows:
	// it is 3.2², for 3.2 times the root mean square distance of the stay's
	// fixes from its anchor, about 4.5 σ per axis, which Gaussian jitter
	// leaves once in some 25,000 fixes. The radius never grows past the lag
	// bound. (Written out, not as 3.2*3.2, so that Go and Lua hold the same
	// double.)
	noiseFactor2 = 10.24
	// outlierMargin2 widens the radius to hold the outliers the stay has
	// thrown: a receiver that threw one that far throws the next about as
	// far, so the radius grows to 1.25 times the farthest known (the margin
	// analyze puts on a receiver's p99 jitter), up to the lag bound. It is
	// 1.25², exact in a double.
	outlierMargin2 = 1.5625
	// settledFixes is how many fixes a stay needs before a reported speed
	// counts as a departure from it.
	settledFixes = 3
	// pastStays is how many stays an asset left are remembered, so that a
	// backlog uploaded late, one ping a request and shuffled, is judged at
	// the stay its device time fell in.
	pastStays = 3
	// metresPerDegree is the length of a degree of latitude on H3's sphere.
	metresPerDegree = math.Pi / 180 * geo.EarthRadiusM
)

// trackPoint is one ping as the track shapes remember it.
type trackPoint struct {
	t        int64 // device time in µs: exact in a Lua number, unlike ns
	lat, lon float64
	bucket   int64
	token    uint64
}

// fix is a ping being judged: its point and what the stream says of it.
type fix struct {
	trackPoint
	kx       float64 // metres per degree of longitude at the fix
	accuracy float64 // metres, 0 when unknown
	moving   bool    // it reports a speed of travel
	atRest   bool    // it reports a speed no asset under way has
	// still: it reports standing still, with a satellite fix's accuracy
	// (see lag2)
	still bool
	event bool
	state uint64 // fingerprint of the state fields, 0 when none
	// copied: it repeats a ping before it in its batch (see Claim.copied)
	copied bool
}

func fixOf(c *Claim) fix {
	return fix{
		trackPoint: trackPoint{t: c.Time.UnixMicro(), lat: c.Lat, lon: c.Lon, bucket: c.Bucket, token: c.Token},
		kx:         float64(math.Cos(c.Lat*math.Pi/180)) * metresPerDegree,
		accuracy:   uncertainty(c),
		moving:     c.HasSpeed && c.Speed >= movingSpeed,
		atRest:     c.HasSpeed && c.Speed < restSpeed,
		still:      c.HasSpeed && c.Speed < stillSpeed && c.Accuracy > 0 && c.Accuracy <= satelliteAccuracy,
		event:      c.Event != "",
		state:      statePrint(c.State, c.StateFields),
		copied:     c.copied,
	}
}

// uncertainty is how far from where it says a fix may lie, in metres, 0
// when unknown: the accuracy it reports, a 68% radius (as Android documents
// it), so a third of a receiver's fixes lie outside it. A fix that says it
// is still gets a margin of as much again, up to restMargin, about its 99%
// radius: lying outside its 68% radius is no evidence of a move, and a
// phone indoors reports 50 to 100 m and scatters as far. The margin is
// capped because a speed of 0 is often no reading at all (OwnTracks
// Android and Traccar Client send 0 when the fix has no speed, Traccar's
// positions from cell towers carry 0), and a Wi-Fi or cell fix of a phone
// in a moving car reports hundreds of metres: twice that would hide
// kilometres of travel. A fix under way keeps the radius it reports. One
// beyond maxAccuracy reports none.
func uncertainty(c *Claim) float64 {
	if c.Accuracy <= 0 || c.Accuracy > maxAccuracy {
		return 0
	}
	if c.HasSpeed && c.Speed < stillSpeed {
		return c.Accuracy + min(c.Accuracy, restMargin)
	}
	return c.Accuracy
}

// changesState reports whether f reports a state other than st. The
// print has slots of its own for each state field (see statePrint), and
// a fix says nothing of a field it does not carry: most messages of a
// tracker that sends its ignition only in status reports, a driver's card
// read once.
func (f fix) changesState(st uint64) bool {
	for _, slot := range stateSlots {
		if seen := f.state & slot; seen != 0 && seen != st&slot {
			return true
		}
	}
	return false
}

// forgetState clears the halves of the state, and of the undo record,
// that still hold what a released ping reported: the backend never heard
// it, so its retry must count as a change, not be judged against it. A
// ping accepted after it, carrying another field only, kept those halves,
// and so did that ping's undo record, which undoing it would put back.
func (st *trackState) forgetState(reported uint64) {
	st.state = forgotten(st.state, reported)
	if st.undo == undoPrev {
		st.prev.state = forgotten(st.prev.state, reported)
	}
}

// forgotten is state without the slots that equal reported's.
func forgotten(state, reported uint64) uint64 {
	for _, slot := range stateSlots {
		if mine := reported & slot; mine != 0 && state&slot == mine {
			state &^= slot
		}
	}
	return state
}

// mergeState is st with the slots f carries replaced by f's.
func (f fix) mergeState(st uint64) uint64 {
	for _, slot := range stateSlots {
		if seen := f.state & slot; seen != 0 {
			st = st&^slot | seen
		}
	}
	return st
}

// stay is where an asset is judged to be.
type stay struct {
	lat, lon float64 // the anchor
	spread2  float64 // mean squared distance of its fixes from the anchor, m²
	outlier2 float64 // squared distance from the anchor of the farthest outlier it threw, m²
	n        int64   // fixes averaged into them, at most anchorMemory
	startT   int64   // device time the asset arrived there, µs
	lastT    int64   // device time of the latest fix judged there, µs
}

// pastStay is a stay the asset left: where, how wide, and when.
type pastStay struct {
	lat, lon, radius2 float64
	startT, endT      int64 // arrival, and the departure's device time, µs
}

// track is an asset's memory, apart from its undo record.
type track struct {
	stay stay
	// past are the settled stays the asset left, latest first.
	past [pastStays]pastStay
	// ref is the last accepted ping at the stay.
	ref trackPoint
	// last is the last accepted ping: what the backend last heard of the
	// asset. With hasCand it lies outside the stay and is either a
	// departure or, if the next fix is back at the stay and outlier says it
	// could be one, an outlier.
	last             trackPoint
	hasCand, outlier bool
	// lastAccuracy is last's uncertainty, m (0 when unknown). It has the
	// place of a session start a track once kept and never read: read as a
	// number of metres, that is 0. refAccuracy is ref's: a late ping is
	// judged against ref, which is not last while a departure is pending or
	// after an outlier (see judgeLate).
	lastAccuracy, refAccuracy float64
	state                     uint64
}

// trackState is what the store keeps of an asset: its track, what undoing
// the request of the last acceptance does (so that a failed request can be
// undone) with, for undoPrev, the track and the latest device time seen as
// they were before that request, the latest device time seen, and the
// latest device time a release forgot (held). The request is last's
// token's: a late acceptance's, or a spending release's (see takeUndo and
// release).
type trackState struct {
	track
	prev        track
	prevSeenMax int64
	undo        undoKind
	seenMax     int64
	// held is the latest device time of the pings seen after a released
	// one, which its release took out of seenMax so that the released
	// ping's retry finds the silence before it again (session). Negative
	// until a ping no later than it is accepted again (the retry, as a
	// rule): only then does a ping after it count its silence from it. A
	// ping that never comes back leaves the backend without the session
	// it opened, and the next ping after the silence opens one again. 0
	// when nothing is held, and again once a ping later than it is judged.
	held int64
}

// undoKind says what releasing the last accepted ping does to the track.
// The values are the byte the Lua scripts keep after the track.
type undoKind byte

const (
	// undoNone: the last accepted ping began the track; releasing it
	// deletes it.
	undoNone undoKind = iota
	// undoPrev: releasing it puts prev back, the track from before its
	// request's first acceptance of the asset.
	undoPrev
	// undoSpent: a release put prev back already, and left its token in
	// last; releasing what is now the last accepted ping keeps the track
	// (see release).
	undoSpent
	// undoDelete: its request began the track; releasing it deletes it.
	undoDelete
	// undoShared: its request had an acceptance before another request's
	// came between (two instances on one Redis, each pipelining a batch of
	// the asset): the record the other request kept, and this request
	// took back, holds that acceptance, and the track from before the
	// request is gone. Releasing it leaves the track as it is, as a
	// release of an older acceptance does (see release): put back, the
	// record kept the earlier acceptance's state, its release forgot
	// nothing, and the retry took a reported ignition for no change and
	// suppressed it.
	undoShared
)

// flagUndoable marks, in the seen set, a ping suppressed after an
// acceptance of its own request: a release of that request puts back the
// track from before it, without what the ping added (see refold). Any
// other suppressed ping is flagSuppressed.
const flagUndoable byte = 'u'

// flagReleased marks, in the seen set, an accepted ping whose release
// could not undo it: another request's acceptance came after it, or
// another request's release spent the undo record (see release). The track
// still holds it, and its retry, judged against it, was judged against
// itself: Traccar forwarding two positions of a device at once, both
// failed, had the retry of the first, 90 m off, suppressed as a
// reobservation of the stay it began, and a fix accepted 30 m off,
// learnt as the stay's outlier when the second came back to the stay,
// suppressed as jitter. Its retry is accepted, as the first attempt was,
// and changes nothing in the track, not even the undo record: the backend
// never had it, and the track holds it already. A release of the retry
// finds it still not undoable, and marks it so again.
const flagReleased byte = 'r'

// seenValue is what the seen set holds for one ping.
type seenValue struct {
	flag byte // flagPending, flagSettled, flagSuppressed, flagUndoable or flagReleased
	// retried: a flagPending or flagSettled entry of a flagReleased ping's
	// retry, which left the track as it was (the trailing 'r' of the Redis
	// value): its release marks it flagReleased again, whatever its
	// request's other releases did to the track.
	retried   bool
	waitMs    uint32 // the in_flight_timeout of a pending entry's request, ms (wait)
	token     uint64
	claimedMs int64
}

// wait is how long a pending seen entry counts as in flight, as
// record.wait: its request's in_flight_timeout, or pol's for an entry
// stored without it (an earlier version's).
func (v seenValue) wait(pol *Policy) time.Duration {
	if v.waitMs == 0 {
		return pol.InFlightTimeout
	}
	return time.Duration(v.waitMs) * time.Millisecond
}

// pendingSeen is the seen value of c's ping once c is accepted.
func pendingSeen(c *Claim) *seenValue {
	return &seenValue{flag: flagPending, token: c.Token, claimedMs: c.At.UnixMilli(), waitMs: waitMsOf(c.Policy)}
}

// holdSettledSeen makes a settled seen entry, found by a redelivery, the
// holder of c (as the Redis store does), so that a near cache may answer
// the next redeliveries until the entry expires.
func holdSettledSeen(c *Claim, seen seenValue) {
	if seen.flag == flagSettled {
		c.held, c.holder = true, record{claimedMs: seen.claimedMs, settled: true}
	}
}

// judgeTrack decides c against the asset's state st (nil if none) and the
// ping's seen entry (nil if new). It returns the verdict, the state to store
// and the seen value to record; nil means leave it as it is.
func judgeTrack(st *trackState, seen *seenValue, c *Claim) (Verdict, *trackState, *seenValue) {
	if seen != nil {
		if seen.flag == flagPending && seen.token == c.Token {
			// This claim's own entry: a retried call whose first attempt
			// ran (the Redis store's client resends after a lost reply).
			return accepted, nil, nil
		}
		if inFlight(seen.flag == flagPending, seen.claimedMs, seen.wait(c.Policy), c.At) {
			return Verdict{Decision: InFlight, Reason: Redelivery}, nil, nil
		}
		if seen.flag == flagUndoable && st != nil {
			return suppressed(Redelivery), st.refold(fixOf(c), c.Policy), nil
		}
		if seen.flag != flagReleased {
			return suppressed(Redelivery), nil, nil
		}
		if st != nil {
			retry := pendingSeen(c)
			retry.retried = true
			return accepted, nil, retry
		}
	}
	f := fixOf(c)
	if st == nil {
		return accepted, newTrackState(f), pendingSeen(c)
	}
	v, next := st.next(f, c.Policy)
	switch {
	case v.Decision == Accepted:
		return v, next, pendingSeen(c)
	case sameRequest(next.last.token, f.token):
		return v, next, &seenValue{flag: flagUndoable}
	default:
		return v, next, &seenValue{flag: flagSuppressed}
	}
}

// next judges f and returns the verdict and the state that follows.
func (st *trackState) next(f fix, pol *Policy) (Verdict, *trackState) {
	next := *st
	next.seenMax = max(st.seenMax, f.t)
	v := next.judge(st, f, pol)
	switch {
	case f.t > max(st.held, -st.held):
		next.held = 0 // seenMax is past it
	case st.held < 0 && v.Decision == Accepted && f.t >= st.last.t:
		next.held = -st.held // the released ping's retry, or what replaced it
	}
	return v, &next
}

// refold judges again a redelivery of a ping suppressed after an
// acceptance of its own request (flagUndoable), when the track no longer
// holds it: a release put back the track from before the request, and
// the track has lost it since (see lost). It returns the state
// to store, nil to leave it. A failed batch's retry finds its suppressed
// pings as redeliveries; judged again in their place, among the retried
// pings the batch accepted, they add to the stay what they added the
// first time, and the retry is judged as the batch was. Without them a
// stay begun in the batch held only the fixes the retry accepted: the
// retried drive of a car at 5 m/s, a fix a second, lost three of the five
// fixes its first attempt accepted, each judged jitter of a stay of one
// fix, and a departure by speed from where the batch parked was
// suppressed. The ping is not judged again while a released ping's
// retry is awaited, that is while the release's undo record is spent
// (nothing accepted since), however the batch ended: the ping, found
// before the acceptance that preceded it in the batch, would be judged
// without it, and could hide the idle gap or the move its retry must find
// (an outlier at rest of the stay before, learnt, widened the stay to
// hold the retried departure). Only a suppression counts: the ping was
// told it is a redelivery whatever the track says now.
func (st *trackState) refold(f fix, pol *Policy) *trackState {
	if st.undo == undoSpent || !st.lost(f) {
		return nil
	}
	if v, next := st.next(f, pol); v.Decision == Suppressed {
		return next
	}
	return nil
}

// lost reports whether the track no longer holds f, a ping it judged
// once: nothing it has seen since reached f's device time, or only the
// pings of f's own request at that very time, which its retry judged
// again just before f. Overland writes a fix's time to the second, and a
// car's receiver now and then puts two fixes in one: taken for held, the
// second was folded in no more, and a retried drive lost a fix its first
// attempt accepted and left the backend 45 m behind the car. A copy of a
// ping of its batch (copied) is held: the ping was judged just before it,
// and a fix counted twice settles a stay a fix early. So is f when the
// track its request found (prev) had seen f's time already: a delivered
// batch sent again with an older message it had queued since, admitted
// late, folded the second fix of its last second in again.
func (st *trackState) lost(f fix) bool {
	if f.t == st.seenMax {
		return !f.copied && sameRequest(st.last.token, f.token) && (st.undo != undoPrev || st.prevSeenMax < f.t)
	}
	return f.t > st.seenMax
}

func newTrackState(f fix) *trackState {
	st := &trackState{seenMax: f.t}
	st.stay = stay{lat: f.lat, lon: f.lon, n: 1, startT: f.t, lastT: f.t}
	st.ref, st.last, st.lastAccuracy, st.refAccuracy, st.state = f.trackPoint, f.trackPoint, f.accuracy, f.accuracy, f.state
	return st
}

// judge decides f and updates st (a copy of old) to what follows from it.
func (st *trackState) judge(old *trackState, f fix, pol *Policy) Verdict {
	if f.t < st.last.t {
		v := st.judgeLate(f, pol)
		if v.Decision == Accepted {
			st.takeUndo(old, f)
		}
		return v
	}
	newSession := pol.Shape == Session && f.t-old.silenceFrom(f) > pol.SessionIdle.Microseconds()
	// A fix identical to the last accepted one reached here only because
	// its seen entry is gone: its claim was released (after a later one of
	// another request, so the undo found it no longer last) or expired.
	// The backend may never have had it.
	forced := f.event || f.changesState(st.state) || newSession || f.samePlaceAndTime(st.last)
	held := st.holds(f, pol, st.last, st.lastAccuracy)
	switch {
	case held || st.returns(f, pol):
		// Back from an excursion too far to be an outlier (a real move),
		// or back from an outlier past the lag bound from it: the backend
		// must hear that the asset is at its stay.
		returned := st.hasCand && (!st.outlier || !held)
		if st.hasCand && st.outlier {
			// The accepted ping outside the stay was an outlier.
			st.learnOutlier(f.separation2(st.last.lat, st.last.lon, st.stay.lat, st.stay.lon))
		}
		st.settle(f)
		if !forced && !returned && st.withinWindow(f, pol) {
			return suppressed(trackReason(f.trackPoint, st.ref, pol.Shape))
		}
		st.accept(old, f, func(t *track) {
			t.ref, t.refAccuracy, t.last, t.hasCand = f.trackPoint, f.accuracy, f.trackPoint, false
		})
	case st.hasCand:
		// The asset is neither at its stay nor back: it left for where the
		// last accepted ping was. Judge f at that new stay.
		st.leave(pol, st.last.t)
		st.stay = stay{lat: st.last.lat, lon: st.last.lon, n: 1, startT: st.last.t, lastT: st.last.t}
		st.ref, st.refAccuracy, st.hasCand = st.last, st.lastAccuracy, false
		return st.judge(old, f, pol)
	case !forced && st.outlierAtRest(f, pol):
		st.learnOutlier(f.distance2(st.stay.lat, st.stay.lon))
		return suppressed(trackReason(f.trackPoint, st.ref, pol.Shape))
	default:
		outlier := st.couldBeOutlier(f, pol)
		st.accept(old, f, func(t *track) { t.last, t.hasCand, t.outlier = f.trackPoint, true, outlier })
	}
	return accepted
}

// judgeLate decides a ping older than the last accepted one, which never
// moves the stay: it is suppressed only if it lies at a settled stay the
// asset was at by its device time, the current one or one it left, in
// every shape. Any other late ping may fill a gap of the backend's track
// (an offline backlog uploaded late and shuffled): admitting it costs a
// duplicate where suppressing it could cost an observation.
func (st *trackState) judgeLate(f fix, pol *Policy) Verdict {
	if f.event || f.changesState(st.state) {
		return accepted
	}
	if !f.moving {
		inPast, edge := st.inPastStay(f)
		if edge {
			// The ping that began or ended a stay the asset left, judged
			// again: its claim was released (or its seen entry expired),
			// so the backend may never have had it. A release puts back
			// the stay a late ping ended (below) only while its request
			// has the undo record (takeUndo): after another request's
			// acceptance the track keeps the stay it ended.
			return accepted
		}
		// Against the stay's last accepted ping, its place and its
		// accuracy, not the last accepted one's: that is later than f,
		// and may be a departure kilometres off (a live ping that
		// overtook an offline queue). Judged against it, a queued ping at
		// the stay was taken for one from away and ended the stay at its
		// time, and each next queued ping, just past that end, ended it
		// again: a parked backlog was admitted one ping at a time. With
		// the departure's accuracy (a satellite fix under way, 5 m) a
		// still fix of a phone parked indoors lost the margin of the
		// stay's fix as uncertain as itself, and was admitted, and the
		// next queued fix as the return.
		atStay := st.stay.n >= settledFixes && st.holds(f, pol, st.ref, st.refAccuracy)
		if atStay && f.t > st.stay.startT || inPast {
			return suppressed(trackReason(f.trackPoint, st.ref, pol.Shape))
		}
		if atStay {
			// The asset was here earlier than the stay knew: the backend
			// hears of it now, and later pings back to then are jitter. A
			// ping at the very start is the retry of the one that set it,
			// released after another request's acceptance: the backend
			// never heard of it.
			st.stay.startT = f.t
			return accepted
		}
	}
	if f.t > st.stay.startT {
		// The asset was away while the stay says it was there: it left
		// after the stay's start, at f or before, and came back at a time
		// the backend has not heard of. The stay until f is remembered as
		// one it left, and the current one starts at its latest fix: the
		// earliest late ping back after f is admitted as the return. With
		// a departure pending (hasCand), the stay's latest fix may be
		// earlier than f: nothing places the asset at the stay after f, up
		// to the departure, and a stay started before f took the late
		// ping back, after f, for jitter.
		st.leave(pol, f.t)
		st.stay.startT = st.stay.lastT
		if st.stay.lastT <= f.t {
			st.stay.startT = st.last.t
		}
	}
	return accepted
}

// silenceFrom is the device time a silence before f starts from (session):
// the latest seen, or a later one a release forgot once the released ping
// was accepted again (see held), when f is after it.
func (st *trackState) silenceFrom(f fix) int64 {
	if st.held > 0 && f.t > st.held {
		return max(st.seenMax, st.held)
	}
	return st.seenMax
}

// leave remembers the stay the asset is leaving, if it was settled, from
// its start until the departure at endT.
func (st *trackState) leave(pol *Policy, endT int64) {
	if st.stay.n < settledFixes {
		return
	}
	copy(st.past[1:], st.past[:pastStays-1])
	st.past[0] = pastStay{lat: st.stay.lat, lon: st.stay.lon, radius2: st.stayRadius2(pol),
		startT: st.stay.startT, endT: endT}
}

// inPastStay reports whether f lies in a stay the asset left, by place and
// device time, and whether it is at the very time the asset arrived there
// or left it (an accepted ping's time either way).
func (st *trackState) inPastStay(f fix) (in, edge bool) {
	for _, p := range st.past {
		if p.startT <= f.t && f.t <= p.endT && f.distance2(p.lat, p.lon) <= max(p.radius2, f.accuracy*f.accuracy) {
			return true, f.t == p.startT || f.t == p.endT
		}
	}
	return false, false
}

// accept records an accepted fix, keeping the track as it was before the
// fix's request for undo (takeUndo).
func (st *trackState) accept(old *trackState, f fix, change func(*track)) {
	st.takeUndo(old, f)
	change(&st.track)
	st.lastAccuracy = f.accuracy
	st.state = f.mergeState(st.state)
}

// takeUndo makes the request of f, accepted, the one a release undoes:
// its first acceptance keeps the track as it was before it (old), and a
// failed batch's claims on one asset, released newest first, then put back
// the track from before the batch, and its retry is judged as the batch
// was. The claims of one request have tokens that share their upper 48
// bits (sameRequest), and the request of last's token is the one the undo
// record is for. A late fix takes that token and moves nothing else of
// last: a backlog batch's late fixes come first, and the record kept at
// the batch's first normal acceptance held what the batch had done before
// it (the stay's start a late fix moved, the batch's later fixes folded
// into a stay they settled): the retried late fixes were judged against
// it, and a car's approach that its phone queued underground, admitted the
// first time, was suppressed as jitter of the car park. The acceptance
// that takes the record keeps its rank in the request (the lower 16 bits)
// in the record's last token, whose request is all that is read of it:
// the request's claims ranked before it are in the track the record holds
// (see release).
func (st *trackState) takeUndo(old *trackState, f fix) {
	switch {
	case old.undo == undoPrev && !sameRequest(old.last.token, f.token) && sameRequest(old.prev.last.token, f.token):
		st.undo = undoShared // another request took the record from this one
	case !sameRequest(old.last.token, f.token) || old.undo == undoSpent:
		st.prev, st.prevSeenMax, st.undo = old.track, old.seenMax, undoPrev
		st.prev.last.token = withRank(st.prev.last.token, f.token)
	case old.undo == undoNone:
		st.undo = undoDelete // the request's first fix of the asset began the track
	}
	st.last.token = f.token
}

// holds reports whether f is at the stay: within the radius of the anchor
// (or of the fix's own uncertainty, which is no evidence of a move), not
// reporting a speed of travel away from a settled stay (a speed at the
// very place of last is none: see at), and close enough to
// last, the accepted ping the backend last heard of before f (the last
// accepted ping, whatever it was; for a late ping, the stay's), whose
// uncertainty is lastAccuracy, that the backend's picture stays true: a
// suppressed fix of an asset under way never lies farther than LagFactor
// radii from it.
func (st *trackState) holds(f fix, pol *Policy, last trackPoint, lastAccuracy float64) bool {
	if f.moving && st.stay.n >= settledFixes && !f.at(last) {
		return false
	}
	if f.distance2(st.stay.lat, st.stay.lon) > st.radius2(f, pol) {
		return false
	}
	return f.distance2(last.lat, last.lon) <= lag2(f, pol, lastAccuracy)
}

// returns reports f back inside the stay after an accepted ping outside
// it, however far from that ping: judged at a new stay where that ping
// was, a fix back on the far side of the stay threw the stay away, its
// spread and the outliers it had learnt.
func (st *trackState) returns(f fix, pol *Policy) bool {
	if !st.hasCand || f.moving && st.stay.n >= settledFixes && !f.at(st.last) {
		return false
	}
	return f.distance2(st.stay.lat, st.stay.lon) <= st.radius2(f, pol)
}

// radius2 is the square of the stay's radius for f: the stay's own
// (stayRadius2), widened to the fix's uncertainty.
func (st *trackState) radius2(f fix, pol *Policy) float64 {
	return max(st.stayRadius2(pol), f.accuracy*f.accuracy)
}

// stayRadius2 is the square of the stay's radius: the configured radius,
// widened to the jitter the stay shows and to the outliers it has thrown,
// up to the lag bound.
func (st *trackState) stayRadius2(pol *Policy) float64 {
	lag := LagFactor * pol.Radius
	r2 := min(max(noiseFactor2*st.stay.spread2, outlierMargin2*st.stay.outlier2), lag*lag)
	return max(r2, pol.Radius*pol.Radius)
}

// lag2 is the square of how far from the last accepted ping, whose
// uncertainty is lastAccuracy, a suppressed fix may lie: LagFactor radii,
// or the fix's own uncertainty. A satellite fix standing still may also
// lie as far as two fixes as uncertain as it, or as the last accepted one
// if that was better, together (in quadrature, as independent errors
// add), up to restMargin beyond its own: at most √2 times its own
// uncertainty. Two fixes of a phone parked indoors lie
// farther apart than either's radius about one time in ten, far more than
// once a window (a rule on this fix's uncertainty alone admitted 6 a
// window at a 10 s cadence, σ 30 m). A poor last fix (a network fix)
// widens nothing. The price: a fix creeping under 0.5 m/s, or moving with
// a speed of 0 that is no reading, may lag √2 times its uncertainty. A
// creeping fix over 0.5 m/s and a network fix (worse than 100 m) keep the
// bound they had. The squares are rounded apart, as Lua rounds them: a
// fused multiply-add would round once, and disagree by an ulp.
func lag2(f fix, pol *Policy, lastAccuracy float64) float64 {
	lag := max(LagFactor*pol.Radius, f.accuracy)
	lag2 := lag * lag
	if f.still {
		other := min(lastAccuracy, f.accuracy)
		both2 := float64(f.accuracy*f.accuracy) + float64(other*other)
		capped := f.accuracy + restMargin
		lag2 = max(lag2, min(both2, capped*capped))
	}
	return lag2
}

// AccuracyLagM is how far from the last accepted ping a suppressed fix of
// p may lie by its reported accuracy alone, beside a last accepted fix as
// uncertain as itself (lag2 with no radius): 0 when it reports none the
// stay trusts. analyze notes fixes whose bound passes the radius's.
func AccuracyLagM(p ping.Ping) float64 {
	f := fixOf(&Claim{Observation: Observation{Ping: p}})
	return math.Sqrt(lag2(f, &Policy{}, f.accuracy))
}

// outlierAtRest reports a fix outside a settled stay that is no evidence
// of a move: it says the asset is at rest, or it lies farther than the
// asset could have got since it was last seen at the stay (a vehicle at
// rest is not 40 m away a second later). It must also lie close enough to
// the last accepted ping that suppressing it keeps the backend's picture
// true. Such a fix is jitter: a receiver's outlier.
func (st *trackState) outlierAtRest(f fix, pol *Policy) bool {
	if f.moving || st.stay.n < settledFixes || f.distance2(st.last.lat, st.last.lon) > lag2(f, pol, st.lastAccuracy) {
		return false
	}
	if f.atRest {
		return true
	}
	reach := st.reach(f, pol)
	return f.distance2(st.stay.lat, st.stay.lon) > reach*reach
}

// reach is how far from the anchor an asset at rest at the stay can be by
// f's time: the stay's radius, and what it can travel since it was last seen
// there at maxAccel, up to maxSpeed.
func (st *trackState) reach(f fix, pol *Policy) float64 {
	dt := float64(f.t-st.stay.lastT) / 1e6
	return math.Sqrt(st.radius2(f, pol)) + min(float64(0.5*maxAccel)*float64(dt*dt), float64(maxSpeed*dt))
}

// withinWindow reports whether the shape suppresses a fix at the stay: in
// sliding, less than a window after the last accepted ping there; in
// session, whenever no idle gap opened a new one, unless the backend was
// last told of a place off the stay a window ago or more (offStay).
func (st *trackState) withinWindow(f fix, pol *Policy) bool {
	if pol.Shape == Sliding {
		return f.t-st.ref.t < pol.Window.Microseconds()
	}
	return f.t-st.last.t < pol.Window.Microseconds() || !st.offStay(f, pol)
}

// offStay reports whether the backend was last told of a place off the
// settled stay f was judged at: the last accepted ping lies outside the
// stay's radius (and either fix's uncertainty) from both the anchor and
// f. The lag bound lets a parked asset's fixes be jitter of an accepted
// ping up to 1.5 radii away: a car that braked to a stop 30 m past its
// last accepted fix had its parked fixes judged jitter of it. In sliding
// the next window put the backend right; in session nothing at the stay
// was admitted again until the sender fell silent, and a tracker
// reporting every 10 s showed the car 30 m short of the customer's yard
// until it left. An outlier the stay threw and learnt (learnOutlier) is
// inside its radius: a single outlier costs one admission, as the design
// has it, and stays the backend's last position in session. f must be off
// the last accepted ping too: an anchor that has folded in a phone's
// network fixes (at the stay by their accuracy) wanders tens of metres,
// and a satellite fix where the backend already has the asset tells it
// nothing.
func (st *trackState) offStay(f fix, pol *Policy) bool {
	if st.stay.n < settledFixes {
		return false
	}
	r2 := max(st.radius2(f, pol), st.lastAccuracy*st.lastAccuracy)
	return f.separation2(st.last.lat, st.last.lon, st.stay.lat, st.stay.lon) > r2 && f.distance2(st.last.lat, st.last.lon) > r2
}

// settle refines the stay with a fix judged to be there: the anchor is the
// mean of its latest fixes, so one outlier moves it little and a receiver's
// slow drift is followed. An accepted ping outside the stay is no longer a
// departure: the asset is back.
func (st *trackState) settle(f fix) {
	d2 := f.distance2(st.stay.lat, st.stay.lon)
	st.stay.n = min(st.stay.n+1, anchorMemory)
	n := float64(st.stay.n)
	st.stay.lat += (f.lat - st.stay.lat) / n
	st.stay.lon = geo.WrapLongitude(st.stay.lon + lonDelta(f.lon, st.stay.lon)/n)
	st.stay.spread2 += (d2 - st.stay.spread2) / n
	st.stay.lastT = max(st.stay.lastT, f.t)
	st.hasCand = false
}

// couldBeOutlier reports whether a fix outside the stay may be a receiver's
// outlier rather than a move: close enough to be one, or farther than the
// asset could have got since it was last seen at the stay.
func (st *trackState) couldBeOutlier(f fix, pol *Policy) bool {
	d2 := f.distance2(st.stay.lat, st.stay.lon)
	far := outlierFactor * math.Sqrt(st.radius2(f, pol))
	reach := st.reach(f, pol)
	return d2 <= far*far || d2 > reach*reach
}

// learnOutlier widens the stay to hold an outlier it threw, d2 square
// metres from its anchor (see outlierMargin2).
func (st *trackState) learnOutlier(d2 float64) {
	st.stay.outlier2 = max(st.stay.outlier2, d2)
}

// at reports f at the very place of p, to the bit: a receiver without a
// fix repeats its last one, speed and all (Traccar's OutdatedHandler
// copies it into every status message that has none), and a fix that has
// not moved by a centimetre is no departure, whatever speed it reports.
// Taken for one, every third repeat of a fix taken under way began a stay
// anew and was admitted, for as long as the tracker was without a fix.
func (f fix) at(p trackPoint) bool { return f.lat == p.lat && f.lon == p.lon }

// distance2 is the squared distance in metres from f to a position.
func (f fix) distance2(lat, lon float64) float64 {
	return f.separation2(f.lat, f.lon, lat, lon)
}

// separation2 is the squared distance in metres between two positions near
// f, on the plane tangent at f: at the scales of jitter and stays it is
// within a fraction of a percent of the great-circle distance. Within
// polarCap degrees of a pole it is not: meridians converge there, and a
// point across the pole measured up to a fifth short, so a fix farther
// than the lag bound from the last accepted one was suppressed; there
// polarSeparation2 measures. The explicit conversions keep every
// operation rounded as Lua rounds it.
func (f fix) separation2(lat1, lon1, lat2, lon2 float64) float64 {
	if math.Abs(lat1) > 90-polarCap || math.Abs(lat2) > 90-polarCap {
		return polarSeparation2(lat1, lon1, lat2, lon2)
	}
	dy := float64(lat1-lat2) * float64(metresPerDegree)
	dx := lonDelta(lon1, lon2) * f.kx
	return float64(dx*dx) + float64(dy*dy)
}

// polarCap is how many degrees from a pole separation2 measures in polar
// coordinates: there the plane tangent at a fix measures a point d metres
// away about d / (its distance from the pole) short, more than the polar
// measure's own error (a part in 20,000 at a degree) for any d past 40 m.
const polarCap = 1.0

// halfRadian is half a degree's radians (π / 360), written as Lua reads it.
const halfRadian = 0.008726646259971648

// sineTerms are the coefficients of sin x's Taylor series to x¹⁷, the
// highest first, written as both Go and Lua read them to the same doubles.
var sineTerms = [...]float64{
	2.8114572543455206e-15, -7.647163731819816e-13, 1.6059043836821613e-10, -2.505210838544172e-08,
	2.7557319223985893e-06, -0.0001984126984126984, 0.008333333333333333, -0.16666666666666666, 1,
}

// sine is sin x for |x| ≤ π/2, within a part in 10¹³, by Horner's rule
// with every product rounded, as the Lua script computes it: Go's math.Sin
// and the C library's sin Redis's Lua calls differ in the last bit for
// about one argument in six, and the stores' verdicts on a fix at the lag
// bound with them (helper 7's review, stop 66).
func sine(x float64) float64 {
	x2 := float64(x * x)
	s := 0.0
	for _, term := range sineTerms {
		s = float64(s*x2) + term
	}
	return float64(s * x)
}

// polarSeparation2 is the squared distance in metres between two positions
// near a pole, each at its distance from the pole along its meridian (the
// azimuthal equidistant projection, within a part in 20,000 of the
// great-circle distance inside polarCap): by the law of cosines, in the
// form that does not cancel for close points. Positions in opposite
// hemispheres measure as if mirrored into one, and are thousands of
// kilometres apart either way.
func polarSeparation2(lat1, lon1, lat2, lon2 float64) float64 {
	r1 := float64(90-math.Abs(lat1)) * float64(metresPerDegree)
	r2 := float64(90-math.Abs(lat2)) * float64(metresPerDegree)
	if (lat1 < 0) != (lat2 < 0) {
		r2 = float64(90+math.Abs(lat2)) * float64(metresPerDegree)
	}
	half := sine(float64(lonDelta(lon1, lon2) * halfRadian))
	dr := r1 - r2
	return float64(dr*dr) + float64(float64(float64(4*r1)*r2)*float64(half*half))
}

// lonDelta is lon1 - lon2 the short way round, in [-180, 180]: two fixes
// a metre either side of the antimeridian are a metre apart, not 360
// degrees. Lua computes it with the same operations.
func lonDelta(lon1, lon2 float64) float64 {
	return geo.WrapLongitude(lon1 - lon2)
}

// release reverts the last acceptance, if it was the claim with token, to
// the track from before its request. It reports false when the state
// should be deleted (the request began the track), and holds when the
// track still holds the claim's ping: its seen entry is then kept as
// flagReleased, so that its retry is accepted. A claim accepted before
// the last one cannot be undone; the state fields it reported (reported,
// its statePrint) are forgotten instead (forgetState). So is the last
// accepted one once a release has spent the undo record: of two failed
// requests on one asset, released newest first, the older finds the track
// from before it gone. The track is kept as it is, not taken for the
// asset's first and deleted with its stay, its past stays and its state:
// the ping's retry, the last accepted fix again, is admitted
// (samePlaceAndTime). The release that spends the record leaves its token
// in last (see takeUndo): the other claims of its request find the track
// from before the request, which holds nothing they reported. They forgot
// from it what the backend had heard before the batch: a tracker that
// reports the driver's card in some messages only, its batch retried, had
// the fix after the batch's first acceptance judged a change of driver
// and not folded into the stay, and a fix its first attempt admitted was
// suppressed. A flagReleased ping's retry (retried) left the track as it
// was, which holds the ping from before the request: put back by its
// request's release, the track holds it still, and the retry is marked
// flagReleased again. Its seen entry deleted, a batch of the retry and a
// new fix, failed again, had the retry judged against itself and
// suppressed as jitter on the next retry. The spending release leaves in
// last the rank of the acceptance that took the record (see takeUndo): a
// claim of its request ranked before that one was accepted before another
// request's came between, and the track put back holds it, so it is
// released as an older acceptance is. A batch [ignition, departure] with
// two other instances' claims landing between its own, all failed, had
// its ignition's entry deleted, and the retry, judged against a track
// holding the ignition, suppressed.
func (st *trackState) release(token, reported uint64, retried bool) (keep, holds bool) {
	switch {
	case st.undo == undoSpent && sameRequest(st.last.token, token) && token >= st.last.token && !retried:
		return true, false
	case st.last.token != token || st.undo == undoSpent || st.undo == undoShared:
		st.forgetState(reported)
		return true, true
	case st.undo != undoPrev:
		return false, false
	}
	// The latest device time seen goes back too: the released ping raised
	// it to its own, and its retry must find the idle gap the first
	// attempt found (session). It is the one from before the request, not
	// the one the track tells: a fix suppressed as an outlier outside the
	// stay was seen too, and ended no session's silence. What was seen
	// after the released ping is held, for the pings after it once the
	// retry is back: a failed batch's suppressed pings come back as
	// redeliveries, which judge nothing, and the next upload found a
	// silence since the retried ping and opened a new session.
	held := max(st.held, -st.held)
	if st.seenMax > st.last.t {
		held = max(held, st.seenMax)
	}
	st.track, st.undo = st.prev, undoSpent
	st.last.token = withRank(token, st.prev.last.token)
	st.seenMax, st.held = st.prevSeenMax, -held
	return true, false
}

// sameRequest reports whether two claim tokens are of one request (see
// Deduper.ClaimAll).
func sameRequest(a, b uint64) bool {
	return a>>16 == b>>16
}

// withRank is token with the rank of ranked, the lower 16 bits (see
// Deduper.ClaimAll).
func withRank(token, ranked uint64) uint64 {
	return token&^0xffff | ranked&0xffff
}

// samePlaceAndTime reports whether p and q are the same fix.
func (p trackPoint) samePlaceAndTime(q trackPoint) bool {
	return p.t == q.t && p.lat == q.lat && p.lon == q.lon
}

// trackReason names a suppression: the classic reasons when tumbling would
// have suppressed it too (same bucket as the last accepted ping at the
// stay), the shape's name when only the shape did.
func trackReason(p, ref trackPoint, shape Shape) Reason {
	switch {
	case p.bucket != ref.bucket:
		return Reason(shape)
	case p.lat == ref.lat && p.lon == ref.lon:
		return Reobservation
	default:
		return Jitter
	}
}

// seenField identifies a ping within its seen set: exact device time,
// coordinates, event and state, so that an event or a state change reported
// at the very fix of another ping is not taken for its redelivery. The
// state follows a NUL, which no event or state holds (their values are
// query-escaped), and only when there is one: a ping without a state has
// the field it always had.
func seenField(c *Claim) string {
	b := make([]byte, 24, 25+len(c.Event)+len(c.State))
	binary.BigEndian.PutUint64(b[0:], uint64(c.Time.UnixNano()))
	binary.BigEndian.PutUint64(b[8:], math.Float64bits(c.Lat))
	binary.BigEndian.PutUint64(b[16:], math.Float64bits(c.Lon))
	b = append(b, c.Event...)
	if c.State != "" {
		b = append(append(b, 0), c.State...)
	}
	return string(b)
}

// encodeFix lays a fix and the radius out as the Lua script reads them with
// struct.unpack('>i8ddi8c8dddBBBBBc8d'): device time µs, lat, lon, bucket,
// token, metres per degree of longitude and of latitude, accuracy, moving,
// at rest, still, event, copied, state print, radius. Doubles travel as
// their bits, so Lua computes with exactly the numbers Go does.
func encodeFix(f fix, radius float64) string {
	b := make([]byte, 0, 92)
	b = binary.BigEndian.AppendUint64(b, uint64(f.t))
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(f.lat))
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(f.lon))
	b = binary.BigEndian.AppendUint64(b, uint64(f.bucket))
	b = binary.BigEndian.AppendUint64(b, f.token)
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(f.kx))
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(metresPerDegree))
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(f.accuracy))
	b = append(b, boolByte(f.moving), boolByte(f.atRest), boolByte(f.still), boolByte(f.event), boolByte(f.copied))
	b = binary.BigEndian.AppendUint64(b, f.state)
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(radius))
	return string(b)
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// stateSlots are the eight one-byte slots of a state print, most
// significant first.
var stateSlots = [8]uint64{0xff << 56, 0xff << 48, 0xff << 40, 0xff << 32, 0xff << 24, 0xff << 16, 0xff << 8, 0xff}

// MaxStateFields is the most state fields a print holds each in slots of
// its own.
const MaxStateFields = len(stateSlots)

// statePrint fingerprints the state fields' values, path=value joined by
// &, so that only whether each changed matters: each field of the
// parser's (fields, in order) has slots of its own (fieldSlots), which
// hold the FNV-1a of its path=value, folded to their width, none of them
// 0, and are 0 when the ping does not carry it. A field that shared its
// slots with another changed whenever a ping carried only the other:
// OsmAnd's alarm, carried by every request, beside an ignition sent in
// some, admitted every request of a parked tracker. A path fields does
// not list (a ping made by hand) takes the half of the print its path's
// hash picks.
func statePrint(state, fields string) uint64 {
	n := 0
	if fields != "" {
		n = strings.Count(fields, "&") + 1
	}
	// Each group of slots, by its first: the FNV-1a of its fields, and
	// how many slots it has; fields that share one (more than
	// MaxStateFields, which a handler refuses) are hashed together.
	var groups [MaxStateFields]struct {
		h     uint32
		count int
	}
	for field := range strings.SplitSeq(state, "&") {
		if field == "" {
			continue
		}
		path, _, _ := strings.Cut(field, "=")
		first, count := fieldSlots(fieldIndex(fields, path), n, path)
		g := &groups[first]
		if g.count == 0 {
			g.h, g.count = fnvOffset32, count
		} else {
			g.h = fnv1a(g.h, "&")
		}
		g.h = fnv1a(g.h, field)
	}
	var print uint64
	for first, g := range groups {
		if g.count > 0 {
			shift := 64 - 8*(first+g.count)
			print |= slotValue(g.h, g.count) << shift
		}
	}
	return print
}

// slotValue spreads h over count one-byte slots, none of them 0, which
// means a field not carried: one made 0 by the hash is 1.
func slotValue(h uint32, count int) uint64 {
	var v uint64
	switch count {
	case 1:
		v = uint64((h ^ h>>8 ^ h>>16 ^ h>>24) & 0xff)
	case 2:
		v = uint64((h ^ h>>16) & 0xffff)
	case 4:
		v = uint64(h)
	default:
		v = uint64(h)<<32 | uint64(fnv1a(h, "\x00"))
	}
	for s := range count {
		if v>>(8*s)&0xff == 0 {
			v |= 1 << (8 * s)
		}
	}
	return v
}

// fieldIndex is the place of path among fields (paths joined by &), or -1.
func fieldIndex(fields, path string) int {
	i := 0
	for f := range strings.SplitSeq(fields, "&") {
		if f == path {
			return i
		}
		i++
	}
	return -1
}

// fieldSlots returns the first of the slots of field i of n listed, and
// how many they are: all eight for one field, four each for two, four for
// the first of three and two for each other, two each for four, one each
// for five to eight; past MaxStateFields a field shares the slot of the
// one eight before it. An unlisted field (i < 0) takes a half by its
// path's hash.
func fieldSlots(i, n int, path string) (first, count int) {
	switch {
	case i < 0:
		return 4 * int(fnv1a(fnvOffset32, path)&1), 4
	case n == 1:
		return 0, 8
	case n == 2:
		return 4 * i, 4
	case n == 3 && i == 0:
		return 0, 4
	case n == 3:
		return 4 + 2*(i-1), 2
	case n == 4:
		return 2 * i, 2
	}
	return i % MaxStateFields, 1
}

// FNV-1a, 32 bits, as hash/fnv computes it: fnv1a continues h over s
// without the allocations of a hash.Hash32 (statePrint runs for every
// sliding and session ping that carries a state).
const (
	fnvOffset32 = 2166136261
	fnvPrime32  = 16777619
)

func fnv1a(h uint32, s string) uint32 {
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= fnvPrime32
	}
	return h
}

// uint64Bytes is n as the 8 big-endian bytes the scripts read (a token,
// a state print).
func uint64Bytes(n uint64) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], n)
	return string(b[:])
}
