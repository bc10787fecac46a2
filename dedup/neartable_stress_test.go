package dedup

import (
	"sync"
	"testing"
)

// Under concurrent writers and lock-free readers, many keys sharing their
// first word and a few sets, a reader gets the entry of the key it asked
// for, whole, or nothing: never another key's entry nor another entry's
// expiry. Run with -race.
func TestNearTableNeverAnswersWithAnotherKeysEntry(t *testing.T) {
	table := newNearTable(2 * nearWays)
	keyOf := func(i uint64) hashedKey { return hashedKey{(i % 4) << 62, i % 40} }
	entryOf := func(k hashedKey, gen uint64) nearEntry {
		return nearEntry{expires: int64(1<<40 + gen), holder: record{
			claimedMs: int64(k[1]), sighting: k[0] ^ k[1], token: uint32(gen), position: uint32(k[1]), settled: true}}
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range uint64(50_000) {
				k := keyOf(i*7 + uint64(w))
				if w%2 == 0 {
					table.put(k, entryOf(k, i))
					continue
				}
				if e, ok := table.get(k, 0); ok && e != entryOf(k, uint64(e.holder.token)) {
					t.Errorf("key %v answered with %+v", k, e)
					return
				}
			}
		})
	}
	wg.Wait()
}
