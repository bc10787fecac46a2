package dedup

import (
	"context"
	"sync"
	"time"
)

// DefaultMaxKeys bounds the memory store when max_keys is not set.
const DefaultMaxKeys = 1_000_000

// MemoryStore is the embedded Store: one process, bounded, with an expiry per
// key. Every decision runs in one critical section. At its max_keys bound it
// evicts the key closest to expiry, which for keys of one TTL is the oldest:
// the one least likely to meet another redelivery.
//
// General-purpose caches evict by recency or frequency and may refuse to
// admit a new entry at all (TinyLFU); for a dedup store that would drop the
// newest claims, exactly the ones redeliveries are about to hit. Hence this
// small map ordered by expiry instead of a cache library.
//
// Nothing it holds per key is a pointer: keys are kept as hashedKeys,
// values and expiries as plain numbers, and the expiry order as a heap of
// such numbers. The garbage collector then never scans the store, however
// many keys it holds: a million claims held as strings, boxed values and a
// heap of pointers made every collection of the whole Caddy process walk
// three million objects.
type MemoryStore struct {
	maxKeys int
	// elapsed is the store's clock: the time since it was made, on the
	// monotonic clock. Its expiries, and so the age of a claim (how long
	// ago it landed, which keeps a redelivery in flight), do not jump with
	// the wall clock when NTP steps it or a VM resumes, as Redis's PTTL
	// does not.
	elapsed func() time.Duration
	keys    keyHasher

	mu sync.Mutex
	// One map per kind of value: a tumbling claim's record, a seen ping's
	// seenValue (sliding and session), an asset's trackState.
	claims    map[hashedKey]memorySlot[record]
	seen      map[hashedKey]memorySlot[seenValue]
	tracks    map[hashedKey]memorySlot[trackState]
	byExpiry  expiryHeap
	evictions uint64
}

// memorySlot is one key's value and expiry (on the store's clock, ns).
type memorySlot[V any] struct {
	value   V
	expires int64
}

// Which map a key of the expiry heap is in.
type memoryKind uint8

const (
	kindClaim memoryKind = iota
	kindSeen
	kindTrack
)

// NewMemoryStore returns an empty store holding at most maxKeys keys
// (DefaultMaxKeys if maxKeys <= 0).
func NewMemoryStore(maxKeys int) *MemoryStore {
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	return &MemoryStore{
		maxKeys: maxKeys, elapsed: sinceNow(),
		keys:   newKeyHasher(),
		claims: make(map[hashedKey]memorySlot[record]),
		seen:   make(map[hashedKey]memorySlot[seenValue]),
		tracks: make(map[hashedKey]memorySlot[trackState]),
	}
}

// sinceNow is the monotonic time elapsed since it was called.
func sinceNow() func() time.Duration {
	start := time.Now()
	return func() time.Duration { return time.Since(start) }
}

// clock is the store's time in ns (see elapsed).
func (m *MemoryStore) clock() int64 { return int64(m.elapsed()) }

// Decide implements Store.
func (m *MemoryStore) Decide(_ context.Context, claims []*Claim) ([]Verdict, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock()
	verdicts := make([]Verdict, len(claims))
	for i, c := range claims {
		if c.Policy.Shape == Tumbling {
			verdicts[i] = m.decideTumbling(c, now)
		} else {
			verdicts[i] = m.decideTrack(c, now)
		}
	}
	return verdicts, nil
}

func (m *MemoryStore) decideTumbling(c *Claim, now int64) Verdict {
	k := m.keys.key(c.Observation.Key)
	if slot, ok := liveSlot(m.claims, k, now); ok {
		return waitFromLanding(judgeHeld(slot.value, c), !slot.value.settled, slot.left(now), slot.value.wait(c.Policy), slot.value.claimTTL(c.Policy))
	}
	put(m, m.claims, kindClaim, k, newRecord(c), c.Policy.TTL, now)
	return accepted
}

func (m *MemoryStore) decideTrack(c *Claim, now int64) Verdict {
	stateKey, seenKey := m.keys.key(c.StateKey), m.keys.seen(c)
	seen, ok := liveSlot(m.seen, seenKey, now)
	st, prior := optional(live(m.tracks, stateKey, now)), optional(seen.value, ok)
	v, next, record := judgeTrack(st, prior, c)
	if ok {
		v = waitFromLanding(v, seen.value.flag == flagPending, seen.left(now), seen.value.wait(c.Policy), c.Policy.TTL)
		holdSettledSeen(c, seen.value)
	}
	if next != nil {
		put(m, m.tracks, kindTrack, stateKey, *next, c.Policy.TTL, now)
	}
	if record != nil {
		c.undoable = record.flag == flagUndoable
		put(m, m.seen, kindSeen, seenKey, *record, c.Policy.TTL, now)
	}
	return v
}

// optional is a pointer to v if there is one.
func optional[V any](v V, ok bool) *V {
	if !ok {
		return nil
	}
	return &v
}

// Settle implements Store; it settles the claims before it returns.
func (m *MemoryStore) Settle(claims []*Claim, done func(error)) {
	m.mu.Lock()
	now := m.clock()
	for _, c := range claims {
		if c.Policy.Shape == Tumbling {
			m.settleTumbling(c, now)
		} else {
			m.settleTrack(c, now)
		}
	}
	m.mu.Unlock()
	done(nil)
}

// settleTumbling marks the key settled, whichever claim it holds, as Redis
// does (see settleCmd).
func (m *MemoryStore) settleTumbling(c *Claim, now int64) {
	k := m.keys.key(c.Observation.Key)
	if _, ok := live(m.claims, k, now); ok {
		replace(m.claims, k, settledRecord(c))
	}
}

func (m *MemoryStore) settleTrack(c *Claim, now int64) {
	k := m.keys.seen(c)
	if v, ok := live(m.seen, k, now); ok && v.flag == flagPending && v.token == c.Token {
		v.flag = flagSettled
		replace(m.seen, k, v)
	}
}

// Release implements Store.
func (m *MemoryStore) Release(_ context.Context, claims []*Claim) ([]bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock()
	released := make([]bool, len(claims))
	for _, i := range releaseOrder(claims) {
		c := claims[i]
		if c.Policy.Shape == Tumbling {
			released[i] = m.releaseTumbling(c, now)
		} else {
			released[i] = m.releaseTrack(c, now)
		}
	}
	return released, nil
}

func (m *MemoryStore) releaseTumbling(c *Claim, now int64) bool {
	k := m.keys.key(c.Observation.Key)
	if held, ok := live(m.claims, k, now); !ok || held.token != recordToken(c.Token) {
		return false
	}
	delete(m.claims, k)
	return true
}

func (m *MemoryStore) releaseTrack(c *Claim, now int64) bool {
	seenKey := m.keys.seen(c)
	v, released := live(m.seen, seenKey, now)
	released = released && (v.flag == flagPending || v.flag == flagSettled) && v.token == c.Token
	holds := false // the track still holds the ping: its retry is accepted (flagReleased)
	stateKey := m.keys.key(c.StateKey)
	if st, ok := live(m.tracks, stateKey, now); ok {
		var reported uint64 // what the track may still hold of it: nothing, if the ping was not this claim's any more
		if released {
			reported = statePrint(c.State, c.StateFields)
		}
		var keep bool
		if keep, holds = st.release(c.Token, reported, released && v.retried); keep {
			replace(m.tracks, stateKey, st)
		} else {
			delete(m.tracks, stateKey)
		}
	}
	switch {
	case released && holds:
		replace(m.seen, seenKey, seenValue{flag: flagReleased})
	case released:
		delete(m.seen, seenKey)
	}
	return released
}

// SetMaxKeys changes how many keys the store holds at most. Lowering it
// drops expired keys, then the keys closest to expiry until the store
// fits, counted as evictions.
func (m *MemoryStore) SetMaxKeys(maxKeys int) {
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.maxKeys = maxKeys
	m.dropExpired(m.clock())
	for m.len() > m.maxKeys && len(m.byExpiry) > 0 {
		m.evictOne()
	}
}

// Len returns the number of live keys.
func (m *MemoryStore) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dropExpired(m.clock())
	return m.len()
}

func (m *MemoryStore) len() int { return len(m.claims) + len(m.seen) + len(m.tracks) }

// ExpiresIn returns how long until every key the store holds now has
// expired (0 when it holds none).
func (m *MemoryStore) ExpiresIn() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	now, last := m.clock(), int64(0)
	for _, it := range m.byExpiry { // items of keys stored again since expire earlier: harmless
		last = max(last, it.expires)
	}
	return time.Duration(max(last-now, 0))
}

// Evictions returns how many unexpired keys were dropped to stay within
// max_keys since the store was created.
func (m *MemoryStore) Evictions() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.evictions
}

// live returns key's value in entries if it is unexpired at now, and
// removes it if it has expired.
func live[V any](entries map[hashedKey]memorySlot[V], key hashedKey, now int64) (V, bool) {
	slot, ok := liveSlot(entries, key, now)
	return slot.value, ok
}

// liveSlot is live's slot, expiry and all.
func liveSlot[V any](entries map[hashedKey]memorySlot[V], key hashedKey, now int64) (memorySlot[V], bool) {
	slot, ok := entries[key]
	if ok && now >= slot.expires {
		delete(entries, key)
		ok = false
	}
	return slot, ok
}

// left is how long the slot has to live, as Redis's PTTL says it: the
// slot was stored with a fresh TTL when its claim reached the store, and
// kept its expiry since, so it dates the landing the same way.
func (s memorySlot[V]) left(now int64) time.Duration {
	return time.Duration(s.expires - now)
}

// replace changes the value of a live key, keeping its expiry.
func replace[V any](entries map[hashedKey]memorySlot[V], key hashedKey, value V) {
	slot := entries[key]
	slot.value = value
	entries[key] = slot
}

// put stores value under key with a fresh expiry, making room first if the
// key is new and the store is full.
func put[V any](m *MemoryStore, entries map[hashedKey]memorySlot[V], kind memoryKind, key hashedKey, value V, ttl time.Duration, now int64) {
	if _, ok := entries[key]; !ok {
		m.makeRoom(now)
	}
	slot := memorySlot[V]{value: value, expires: now + int64(ttl)}
	entries[key] = slot
	m.byExpiry.push(expiryItem{expires: slot.expires, key: key, kind: kind})
	if len(m.byExpiry) > 2*m.len()+1024 {
		m.rebuildExpiry()
	}
}

// makeRoom drops expired keys, then, if the store is still full, evicts
// one (evictOne).
func (m *MemoryStore) makeRoom(now int64) {
	m.dropExpired(now)
	if m.len() >= m.maxKeys {
		m.evictOne()
	}
}

// evictOne evicts the key closest to expiry that holds no claim in
// flight. Evicted, such a claim's redelivery was forwarded beside its
// first request instead of told to come back, and a track shape's
// release, finding no seen entry, left the state its ping reported in the
// track, where the retry was then judged no change and suppressed: the
// backend never got it. Another site of the process with a shorter TTL
// made its claims in flight the first to go. It passes over
// maxPendingSkips of them at most, and then evicts the next key even if
// in flight, so that max_keys bounds the store whatever is in flight.
func (m *MemoryStore) evictOne() {
	var skipped [maxPendingSkips]expiryItem
	n, now := 0, time.Now()
	evicted := false
	for len(m.byExpiry) > 0 && !evicted {
		it := m.byExpiry.pop()
		if n < len(skipped) && m.holdsInFlight(it, now) {
			skipped[n] = it
			n++
			continue
		}
		evicted = m.removeIfCurrent(it)
	}
	kept := skipped[:n]
	if !evicted && n > 0 { // every key left is in flight: the closest to expiry goes
		evicted, kept = m.removeIfCurrent(kept[0]), kept[1:]
	}
	if evicted {
		m.evictions++
	}
	for _, it := range kept {
		m.byExpiry.push(it)
	}
}

// maxPendingSkips is how many claims in flight evictOne passes over to
// find a key to evict.
const maxPendingSkips = 64

// holdsInFlight reports whether the heap item is its key's current expiry
// and the key holds a claim in flight at now (the wall clock claims are
// dated by): pending, a tumbling record or a seen entry, and younger than
// its request's in_flight_timeout, which bounds that request. One older
// is a claim its request left (a test's, or a clock stepped), and goes as
// any key does; one that stores no timeout counts as in flight while
// pending.
func (m *MemoryStore) holdsInFlight(it expiryItem, now time.Time) bool {
	switch it.kind {
	case kindClaim:
		slot, ok := m.claims[it.key]
		r := slot.value
		return ok && slot.expires == it.expires && !r.settled && (r.waitCode == 0 || inFlight(true, r.claimedMs, r.storedWait(), now))
	case kindSeen:
		slot, ok := m.seen[it.key]
		v := slot.value
		return ok && slot.expires == it.expires && inFlight(v.flag == flagPending, v.claimedMs, time.Duration(v.waitMs)*time.Millisecond, now)
	default:
		return false
	}
}

func (m *MemoryStore) dropExpired(now int64) {
	for len(m.byExpiry) > 0 && now >= m.byExpiry[0].expires {
		m.removeIfCurrent(m.byExpiry.pop())
	}
}

// removeIfCurrent removes the key of a heap item if the item is its current
// expiry. The heap keeps the items of keys since released or stored again
// (with a later expiry) until they come up: finding and removing them
// early would mean keeping each key's heap position, a pointer or an index
// to update on every move of the heap.
func (m *MemoryStore) removeIfCurrent(it expiryItem) bool {
	switch it.kind {
	case kindClaim:
		return removeIfExpires(m.claims, it)
	case kindSeen:
		return removeIfExpires(m.seen, it)
	default:
		return removeIfExpires(m.tracks, it)
	}
}

func removeIfExpires[V any](entries map[hashedKey]memorySlot[V], it expiryItem) bool {
	if slot, ok := entries[it.key]; ok && slot.expires == it.expires {
		delete(entries, it.key)
		return true
	}
	return false
}

// rebuildExpiry rebuilds the heap from the live keys, once the items of
// released and re-stored keys outnumber them: amortised over the puts that
// made those items, and it bounds the heap by the keys the store holds.
func (m *MemoryStore) rebuildExpiry() {
	h := m.byExpiry[:0]
	h = appendExpiries(h, m.claims, kindClaim)
	h = appendExpiries(h, m.seen, kindSeen)
	h = appendExpiries(h, m.tracks, kindTrack)
	h.init()
	m.byExpiry = h
}

func appendExpiries[V any](h expiryHeap, entries map[hashedKey]memorySlot[V], kind memoryKind) expiryHeap {
	for key, slot := range entries {
		h = append(h, expiryItem{expires: slot.expires, key: key, kind: kind})
	}
	return h
}

// expiryItem is one key's expiry in the heap.
type expiryItem struct {
	expires int64
	key     hashedKey
	kind    memoryKind
}

// expiryHeap is a min-heap of expiries, soonest first. It is typed rather
// than a container/heap, whose interface would allocate every item it
// pushes.
type expiryHeap []expiryItem

func (h *expiryHeap) push(it expiryItem) {
	*h = append(*h, it)
	h.up(len(*h) - 1)
}

func (h *expiryHeap) pop() expiryItem {
	old := *h
	top, n := old[0], len(old)-1
	old[0] = old[n]
	*h = old[:n]
	h.down(0)
	return top
}

func (h expiryHeap) init() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h expiryHeap) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if h[parent].expires <= h[i].expires {
			return
		}
		h[parent], h[i] = h[i], h[parent]
		i = parent
	}
}

func (h expiryHeap) down(i int) {
	for {
		least := i
		for _, child := range [2]int{2*i + 1, 2*i + 2} {
			if child < len(h) && h[child].expires < h[least].expires {
				least = child
			}
		}
		if least == i {
			return
		}
		h[i], h[least] = h[least], h[i]
		i = least
	}
}
