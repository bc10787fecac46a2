package dedup

import (
	"container/heap"
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
type MemoryStore struct {
	maxKeys int
	now     func() time.Time

	mu        sync.Mutex
	entries   map[string]*memoryEntry
	byExpiry  expiryHeap
	evictions uint64
}

// memoryEntry holds one key's value: a record (tumbling), a *trackState, or
// one seen ping's seenValue (sliding and session). Each seen ping is an
// entry of its own, under its seen set's key and field, so that max_keys
// bounds them like any key: Redis keeps them as fields of one hash per
// asset-minute, which cannot be counted or evicted one by one.
type memoryEntry struct {
	key     string
	value   any
	expires time.Time
	index   int // position in byExpiry
}

// NewMemoryStore returns an empty store holding at most maxKeys keys
// (DefaultMaxKeys if maxKeys <= 0).
func NewMemoryStore(maxKeys int) *MemoryStore {
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	return &MemoryStore{maxKeys: maxKeys, now: time.Now, entries: make(map[string]*memoryEntry)}
}

// Decide implements Store.
func (m *MemoryStore) Decide(_ context.Context, claims []*Claim) ([]Verdict, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	verdicts := make([]Verdict, len(claims))
	for i, c := range claims {
		if c.Policy.Shape == Tumbling {
			verdicts[i] = m.decideTumbling(c)
		} else {
			verdicts[i] = m.decideTrack(c)
		}
	}
	return verdicts, nil
}

func (m *MemoryStore) decideTumbling(c *Claim) Verdict {
	if e := m.live(c.Observation.Key); e != nil {
		return judgeHeld(e.value.(record), c)
	}
	m.put(c.Observation.Key, newRecord(c), c.Policy.TTL)
	return accepted
}

func (m *MemoryStore) decideTrack(c *Claim) Verdict {
	var st *trackState
	if e := m.live(c.StateKey); e != nil {
		st = e.value.(*trackState)
	}
	seenKey := memorySeenKey(c)
	var prior *seenValue
	if e := m.live(seenKey); e != nil {
		v := e.value.(seenValue)
		prior = &v
	}

	v, next, record := judgeTrack(st, prior, c)
	if next != nil {
		m.put(c.StateKey, next, c.Policy.TTL)
	}
	if record != nil {
		m.put(seenKey, *record, c.Policy.TTL)
	}
	return v
}

// memorySeenKey is the entry of one seen ping: its seen set's key and its
// field in it.
func memorySeenKey(c *Claim) string {
	return c.SeenKey + "\x00" + seenField(c)
}

// Settle implements Store.
func (m *MemoryStore) Settle(_ context.Context, claims []*Claim) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range claims {
		if c.Policy.Shape == Tumbling {
			m.settleTumbling(c)
		} else {
			m.settleTrack(c)
		}
	}
	return nil
}

// settleTumbling marks the key settled, whichever claim it holds, as Redis
// does (see settleCmd).
func (m *MemoryStore) settleTumbling(c *Claim) {
	if e := m.live(c.Observation.Key); e != nil {
		e.value = settledRecord(c)
	}
}

func (m *MemoryStore) settleTrack(c *Claim) {
	if e := m.live(memorySeenKey(c)); e != nil {
		if v := e.value.(seenValue); v.flag == flagPending && v.token == c.Token {
			v.flag = flagSettled
			e.value = v
		}
	}
}

// Release implements Store.
func (m *MemoryStore) Release(_ context.Context, claims []*Claim) ([]bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	released := make([]bool, len(claims))
	for i, c := range claims {
		if c.Policy.Shape == Tumbling {
			released[i] = m.releaseTumbling(c)
		} else {
			released[i] = m.releaseTrack(c)
		}
	}
	return released, nil
}

func (m *MemoryStore) releaseTumbling(c *Claim) bool {
	e := m.live(c.Observation.Key)
	if e == nil || e.value.(record).token != uint32(c.Token) {
		return false
	}
	m.remove(e)
	return true
}

func (m *MemoryStore) releaseTrack(c *Claim) bool {
	released := false
	if e := m.live(memorySeenKey(c)); e != nil {
		if v := e.value.(seenValue); v.flag != flagSuppressed && v.token == c.Token {
			m.remove(e)
			released = true
		}
	}
	if e := m.live(c.StateKey); e != nil {
		if st := e.value.(*trackState); !st.undo(c.Token) {
			m.remove(e)
		}
	}
	return released
}

// Len returns the number of live keys.
func (m *MemoryStore) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dropExpired(m.now())
	return len(m.entries)
}

// Evictions returns how many unexpired keys were dropped to stay within
// max_keys since the store was created.
func (m *MemoryStore) Evictions() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.evictions
}

// live returns the unexpired entry for key, removing it if it has expired.
func (m *MemoryStore) live(key string) *memoryEntry {
	e := m.entries[key]
	if e == nil {
		return nil
	}
	if !m.now().Before(e.expires) {
		m.remove(e)
		return nil
	}
	return e
}

// put stores value under key with a fresh expiry, making room first if the
// key is new and the store is full.
func (m *MemoryStore) put(key string, value any, ttl time.Duration) {
	now := m.now()
	if e := m.entries[key]; e != nil {
		e.value, e.expires = value, now.Add(ttl)
		heap.Fix(&m.byExpiry, e.index)
		return
	}
	m.makeRoom(now)
	e := &memoryEntry{key: key, value: value, expires: now.Add(ttl)}
	m.entries[key] = e
	heap.Push(&m.byExpiry, e)
}

// makeRoom drops expired keys, then, if the store is still full, the key
// closest to expiry.
func (m *MemoryStore) makeRoom(now time.Time) {
	m.dropExpired(now)
	if len(m.entries) >= m.maxKeys {
		m.remove(m.byExpiry[0])
		m.evictions++
	}
}

func (m *MemoryStore) dropExpired(now time.Time) {
	for len(m.byExpiry) > 0 && !now.Before(m.byExpiry[0].expires) {
		m.remove(m.byExpiry[0])
	}
}

func (m *MemoryStore) remove(e *memoryEntry) {
	heap.Remove(&m.byExpiry, e.index)
	delete(m.entries, e.key)
}

// expiryHeap orders entries by expiry, soonest first.
type expiryHeap []*memoryEntry

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].expires.Before(h[j].expires) }
func (h expiryHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}

func (h *expiryHeap) Push(x any) {
	e := x.(*memoryEntry)
	e.index = len(*h)
	*h = append(*h, e)
}

func (h *expiryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}
