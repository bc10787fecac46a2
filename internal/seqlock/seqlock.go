// Package seqlock guards slots of atomic words that many goroutines read
// and write without waiting for each other: the caches in front of the
// parser, H3 and the store, which may forget but never answer wrongly.
package seqlock

import "sync/atomic"

// Lock guards a slot of atomic words that readers read without taking a
// lock: the sequence is odd while a writer fills the slot, and a reader that
// sees it change discards what it read. Writers never wait for each other
// either: one that finds the slot being written gives up, which a cache may
// do (it forgets, and whatever it stands in front of answers).
type Lock struct{ seq atomic.Uint64 }

// ReadBegin returns the sequence a read starts at; ok is false while a
// writer is at work.
func (l *Lock) ReadBegin() (seq uint64, ok bool) {
	seq = l.seq.Load()
	return seq, seq&1 == 0
}

// ReadValid reports that nothing was written since ReadBegin returned seq.
func (l *Lock) ReadValid(seq uint64) bool { return l.seq.Load() == seq }

// TryLock starts a write, unless another writer is at work.
func (l *Lock) TryLock() (seq uint64, ok bool) {
	seq = l.seq.Load()
	return seq, seq&1 == 0 && l.seq.CompareAndSwap(seq, seq+1)
}

// Unlock ends the write that TryLock started at seq.
func (l *Lock) Unlock(seq uint64) { l.seq.Store(seq + 2) }
