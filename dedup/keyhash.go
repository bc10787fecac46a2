package dedup

import "hash/maphash"

// hashedKey is what the stores that live in the process (the memory store,
// the near cache) keep instead of a key string: its 128-bit seeded hash. It
// holds no pointer, so a million of them are nothing for the garbage
// collector to scan, where a million strings are a million objects in every
// collection. The key strings are blake2b-128 digests themselves, so two
// keys share a hash no more often than two observations share a key.
type hashedKey [2]uint64

// keyHasher makes hashedKeys with seeds of its own: keys cannot be chosen
// to collide in a process whose seeds nobody outside knows.
type keyHasher [2]maphash.Seed

func newKeyHasher() keyHasher { return keyHasher{maphash.MakeSeed(), maphash.MakeSeed()} }

// key hashes a key string.
func (h keyHasher) key(key string) hashedKey {
	return hashedKey{maphash.String(h[0], key), maphash.String(h[1], key)}
}

// seen hashes the entry of one seen ping: its seen set's key and its field
// in it (a field of a Redis hash, a key of its own here).
func (h keyHasher) seen(c *Claim) hashedKey {
	var k hashedKey
	field := seenField(c)
	for i, seed := range h {
		var mh maphash.Hash
		mh.SetSeed(seed)
		mh.WriteString(c.SeenKey)
		mh.WriteByte(0)
		mh.WriteString(field)
		k[i] = mh.Sum64()
	}
	return k
}
