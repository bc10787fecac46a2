package dedup

import (
	"math"
	"sync/atomic"

	"github.com/uber/h3-go/v4"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/seqlock"
)

// A CellCache remembers 2^cellCacheBits coordinates: far more than the
// pings that arrive between an observation and its redeliveries on one
// instance. It also holds 2^areaCacheBits hexagons, one for each of as
// many small areas where pings were keyed lately.
const (
	cellCacheBits  = 12
	cellCacheSlots = 1 << cellCacheBits
	areaCacheBits  = 11
	areaCacheSlots = 1 << areaCacheBits
)

// CellCache remembers the H3 cells of recent coordinates, so that most
// pings are not quantised by H3 again: a cell costs a cgo call of about
// 1.5 µs, a look-up here some nanoseconds. Exactly repeated coordinates (a
// sender's redelivery, a tracker repeating a cached fix) find the cell H3
// gave them; other coordinates near recent ones (a parked asset's jitter,
// the next fix of a slow one) find it when they lie inside a cell the
// cache holds as a hexagon, learnt once two pings of an area fell in it.
// It never changes a key: a hit is the cell H3 computes for these
// coordinates at this resolution (see hexagon for why). The zero value is
// ready; it is safe for concurrent use, and it allocates only when it
// learns a hexagon.
type CellCache struct {
	slots [cellCacheSlots]cellSlot
	areas [areaCacheSlots]areaSlot
}

// cellSlot holds the last coordinates that hashed to it.
type cellSlot struct {
	lock     seqlock.Lock
	lat, lon atomic.Uint64 // the float64 bits
	cell     atomic.Uint64
}

// areaSlot holds the hexagon last learnt in the areas that hash to it.
type areaSlot struct {
	lock  seqlock.Lock
	cell  atomic.Uint64
	edges [6][4]atomic.Uint64 // each edge's normal (x, y, z) and inside, as float64 bits
	// seen is the cell H3 gave the last miss here: a second miss in it
	// makes it the slot's hexagon, so one passing ping does not.
	seen atomic.Uint64
	// refused is the last cell here that is no hexagon (a pentagon, or a
	// cell across an icosahedron edge), not to be tried again at once.
	refused atomic.Uint64
}

// Cell returns the cell of ll at resolution res (0 to 15), from the cache
// when it can.
func (c *CellCache) Cell(ll h3.LatLng, res int) h3.Cell {
	lat, lon := math.Float64bits(ll.Lat), math.Float64bits(ll.Lng)
	s := &c.slots[slotOf(lat, lon)]
	if cell, ok := s.lookup(lat, lon, res); ok {
		return cell
	}
	area := &c.areas[areaOf(ll, res)]
	cell, ok := area.lookup(ll, res)
	if !ok {
		cell = h3.LatLngToCell(ll, res)
		area.learn(cell)
	}
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

// areaSteps are the sides, in degrees, of the squares of latitude and
// longitude that pick an area's slot, by resolution: a cell's average edge,
// so that a square meets a few cells and a parked asset's jitter mostly
// stays in one.
var areaSteps = func() (steps [16]float64) {
	const kmPerDegree = 111.195
	for res := range steps {
		steps[res] = h3.HexagonEdgeLengthAvgKm(res) / kmPerDegree
	}
	return steps
}()

// areaOf is the slot of the area around ll at resolution res.
func areaOf(ll h3.LatLng, res int) uint64 {
	step := areaSteps[res]
	row, column := int64(math.Floor(ll.Lat/step)), int64(math.Floor(ll.Lng/step))
	h := (uint64(row)*0x9e3779b97f4a7c15 + uint64(column) + uint64(res)<<56) * 0xbf58476d1ce4e5b9
	return h >> (64 - areaCacheBits)
}

// lookup finds ll in the slot's hexagon, if it holds one at res: only then
// is ll put on the sphere.
func (s *areaSlot) lookup(ll h3.LatLng, res int) (h3.Cell, bool) {
	seq, ok := s.lock.ReadBegin()
	if !ok {
		return 0, false
	}
	cell := h3.Cell(s.cell.Load())
	if cell == 0 || cellResolution(cell) != res {
		return 0, false
	}
	if hex := s.hexagon(); !hex.holds(unitVector(ll)) {
		return 0, false
	}
	return cell, s.lock.ReadValid(seq)
}

// hexagon reads the slot's hexagon, as learn stored it.
func (s *areaSlot) hexagon() (hex hexagon) {
	for i := range s.edges {
		e := &s.edges[i]
		hex.edges[i] = edgePlane{normal: vec3{bitsFloat(&e[0]), bitsFloat(&e[1]), bitsFloat(&e[2])}, inside: bitsFloat(&e[3])}
	}
	return hex
}

// learn is told the cell H3 gave a point of the slot's areas that the slot
// did not hold, and makes it the slot's hexagon the second time in a row.
func (s *areaSlot) learn(cell h3.Cell) {
	if h3.Cell(s.seen.Swap(uint64(cell))) != cell || h3.Cell(s.refused.Load()) == cell || h3.Cell(s.cell.Load()) == cell {
		return // new here, no hexagon, or held already (the point was near an edge)
	}
	hex, ok := newHexagon(cell)
	if !ok {
		s.refused.Store(uint64(cell))
		return
	}
	seq, ok := s.lock.TryLock()
	if !ok {
		return
	}
	s.cell.Store(uint64(cell))
	for i, e := range hex.edges {
		for j, v := range [4]float64{e.normal.x, e.normal.y, e.normal.z, e.inside} {
			s.edges[i][j].Store(math.Float64bits(v))
		}
	}
	s.lock.Unlock(seq)
}

func bitsFloat(b *atomic.Uint64) float64 { return math.Float64frombits(b.Load()) }

// cellResolution reads the resolution an H3 index carries in bits 52-55,
// without a cgo call.
func cellResolution(c h3.Cell) int { return int(uint64(c) >> 52 & 0xf) }
