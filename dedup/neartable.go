package dedup

import (
	"math/bits"
	"sync/atomic"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/seqlock"
)

// nearWays is how many slots a set of the near cache's table has: a key
// may sit in any slot of its set, so keys that share a set displace each
// other only once it is full.
const nearWays = 8

// nearTable is the near cache's storage: a fixed array of slots, every
// field of them a number, allocated once. The garbage collector never
// scans it and nothing in it is allocated per entry, where a cache
// library's entries are objects (a node each, with the pointers of its
// eviction policy): at the default 100,000 entries those were 100,000
// objects for every collection of the whole process to mark, and a node to
// allocate for every accepted ping. Reads take no lock (see seqlock.Lock). When
// a key's set is full, the entry that expires soonest gives way, which, as
// the entries of one store share a TTL, is the one claimed longest ago.
type nearTable struct {
	sets []nearSet
}

type nearSet [nearWays]nearSlot

// nearSlot is one cached entry: 64 bytes, the size of a cache line.
type nearSlot struct {
	lock       seqlock.Lock
	key0, key1 atomic.Uint64
	// expires is when the entry ends, in Unix ns on the claims' clock; 0
	// for a slot never filled.
	expires atomic.Int64
	// The holder record, in numbers.
	claimedMs     atomic.Int64
	sighting      atomic.Uint64
	tokenPosition atomic.Uint64 // token, then position in the upper half
	settled       atomic.Bool
}

// newNearTable returns a table of at least size slots.
func newNearTable(size int) *nearTable {
	return &nearTable{sets: make([]nearSet, (max(size, 1)+nearWays-1)/nearWays)}
}

// set is the set key belongs in: the key is a seeded hash already, so its
// first word spreads keys over the sets by itself.
func (t *nearTable) set(key hashedKey) *nearSet {
	i, _ := bits.Mul64(key[0], uint64(len(t.sets)))
	return &t.sets[i]
}

// get returns the entry of key, if one lives at now.
func (t *nearTable) get(key hashedKey, now int64) (nearEntry, bool) {
	set := t.set(key)
	for i := range set {
		if s := &set[i]; s.key0.Load() == key[0] {
			if e, ok := s.read(key, now); ok {
				return e, true
			}
		}
	}
	return nearEntry{}, false
}

// put stores e under key: in the key's own slot if its set holds one,
// else in a slot that is empty or expired, else in the one that expires
// soonest. A slot another writer is filling is left alone: the cache
// forgets e, and the store answers for its key.
func (t *nearTable) put(key hashedKey, e nearEntry) {
	set := t.set(key)
	victim := &set[0]
	for i := range set {
		s := &set[i]
		if s.key0.Load() == key[0] && s.key1.Load() == key[1] {
			victim = s
			break
		}
		if s.expires.Load() < victim.expires.Load() { // an empty or expired slot first: its expiry is the earliest
			victim = s
		}
	}
	victim.write(key, e)
}

// len counts the slots holding an entry, expired or not.
func (t *nearTable) len() int {
	n := 0
	for i := range t.sets {
		for j := range t.sets[i] {
			if t.sets[i][j].expires.Load() != 0 {
				n++
			}
		}
	}
	return n
}

func (s *nearSlot) read(key hashedKey, now int64) (nearEntry, bool) {
	seq, ok := s.lock.ReadBegin()
	if !ok {
		return nearEntry{}, false
	}
	tp := s.tokenPosition.Load()
	e := nearEntry{
		expires: s.expires.Load(),
		holder: record{
			claimedMs: s.claimedMs.Load(),
			sighting:  s.sighting.Load(),
			token:     uint32(tp),
			position:  uint32(tp >> 32),
			settled:   s.settled.Load(),
		},
	}
	same := s.key0.Load() == key[0] && s.key1.Load() == key[1]
	return e, same && now < e.expires && s.lock.ReadValid(seq)
}

func (s *nearSlot) write(key hashedKey, e nearEntry) {
	seq, ok := s.lock.TryLock()
	if !ok {
		return
	}
	s.key0.Store(key[0])
	s.key1.Store(key[1])
	s.expires.Store(e.expires)
	s.claimedMs.Store(e.holder.claimedMs)
	s.sighting.Store(e.holder.sighting)
	s.tokenPosition.Store(uint64(e.holder.token) | uint64(e.holder.position)<<32)
	s.settled.Store(e.holder.settled)
	s.lock.Unlock(seq)
}
