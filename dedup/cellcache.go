package dedup

import (
	"math"
	"sync/atomic"

	"github.com/uber/h3-go/v4"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/seqlock"
)

// A CellCache remembers 2^cellCacheBits coordinates: far more than the
// pings that arrive between an observation and its redeliveries on one
// instance.
const (
	cellCacheBits  = 12
	cellCacheSlots = 1 << cellCacheBits
)

// CellCache remembers the H3 cells of recently quantised coordinates, so
// that exactly repeated coordinates (a sender's redelivery, a tracker
// repeating a cached fix) are not quantised again: a cell costs a cgo call
// of about 2 µs, a look-up here some nanoseconds. It never changes a key:
// a hit is the cell H3 computed for exactly these coordinates and this
// resolution. The zero value is ready; it is safe for concurrent use and
// never allocates.
type CellCache struct {
	slots [cellCacheSlots]cellSlot
}

// cellSlot holds the last coordinates that hashed to it.
type cellSlot struct {
	lock     seqlock.Lock
	lat, lon atomic.Uint64 // the float64 bits
	cell     atomic.Uint64
}

// Cell returns the cell of ll at resolution res, from the cache when it
// was computed before.
func (c *CellCache) Cell(ll h3.LatLng, res int) h3.Cell {
	lat, lon := math.Float64bits(ll.Lat), math.Float64bits(ll.Lng)
	s := &c.slots[slotOf(lat, lon)]
	if cell, ok := s.lookup(lat, lon, res); ok {
		return cell
	}
	cell := h3.LatLngToCell(ll, res)
	s.store(lat, lon, cell)
	return cell
}

// slotOf spreads coordinates over the slots: a multiplicative hash of both,
// so that neighbouring fixes, which share most bits, land apart.
func slotOf(lat, lon uint64) uint64 {
	h := (lat ^ lon*0x9e3779b97f4a7c15) * 0xbf58476d1ce4e5b9
	return h >> (64 - cellCacheBits)
}

func (s *cellSlot) lookup(lat, lon uint64, res int) (h3.Cell, bool) {
	seq, ok := s.lock.ReadBegin()
	if !ok {
		return 0, false
	}
	hit := s.lat.Load() == lat && s.lon.Load() == lon
	cell := h3.Cell(s.cell.Load())
	if !hit || !s.lock.ReadValid(seq) || cell == 0 || cellResolution(cell) != res {
		return 0, false
	}
	return cell, true
}

// store fills the slot, unless another writer is filling it: a cache may
// forget.
func (s *cellSlot) store(lat, lon uint64, cell h3.Cell) {
	seq, ok := s.lock.TryLock()
	if !ok {
		return
	}
	s.lat.Store(lat)
	s.lon.Store(lon)
	s.cell.Store(uint64(cell))
	s.lock.Unlock(seq)
}

// cellResolution reads the resolution an H3 index carries in bits 52-55,
// without a cgo call.
func cellResolution(c h3.Cell) int { return int(uint64(c) >> 52 & 0xf) }
