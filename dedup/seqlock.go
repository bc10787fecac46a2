package dedup

import "sync/atomic"

// seqLock guards a slot of atomic words that readers read without taking a
// lock: the sequence is odd while a writer fills the slot, and a reader that
// sees it change discards what it read. Writers never wait for each other
// either: one that finds the slot being written gives up, which a cache may
// do (it forgets, and the store answers).
type seqLock struct{ seq atomic.Uint64 }

// readBegin returns the sequence a read starts at; ok is false while a
// writer is at work.
func (l *seqLock) readBegin() (seq uint64, ok bool) {
	seq = l.seq.Load()
	return seq, seq&1 == 0
}

// readValid reports that nothing was written since readBegin returned seq.
func (l *seqLock) readValid(seq uint64) bool { return l.seq.Load() == seq }

// tryLock starts a write, unless another writer is at work.
func (l *seqLock) tryLock() (seq uint64, ok bool) {
	seq = l.seq.Load()
	return seq, seq&1 == 0 && l.seq.CompareAndSwap(seq, seq+1)
}

// unlock ends the write that tryLock started at seq.
func (l *seqLock) unlock(seq uint64) { l.seq.Store(seq + 2) }
