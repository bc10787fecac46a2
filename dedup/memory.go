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
// key. At its max_keys bound it evicts the key closest to expiry, which for claims of
// one TTL is the oldest: the one least likely to see another redelivery.
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

type memoryEntry struct {
	key     string
	rec     Record
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

// Claim implements Store.
func (m *MemoryStore) Claim(_ context.Context, key string, rec Record, ttl time.Duration) (Record, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	if e := m.live(key, now); e != nil {
		return e.rec, false, nil
	}
	m.makeRoom(now)
	e := &memoryEntry{key: key, rec: rec, expires: now.Add(ttl)}
	m.entries[key] = e
	heap.Push(&m.byExpiry, e)
	return Record{}, true, nil
}

// Settle implements Store.
func (m *MemoryStore) Settle(_ context.Context, key string, rec Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.live(key, m.now()); e != nil && e.rec.Token == rec.Token {
		e.rec.Settled = true
	}
	return nil
}

// Release implements Store.
func (m *MemoryStore) Release(_ context.Context, key string, rec Record) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.live(key, m.now())
	if e == nil || e.rec.Token != rec.Token {
		return false, nil
	}
	m.remove(e)
	return true, nil
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
func (m *MemoryStore) live(key string, now time.Time) *memoryEntry {
	e := m.entries[key]
	if e == nil {
		return nil
	}
	if !now.Before(e.expires) {
		m.remove(e)
		return nil
	}
	return e
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
