package dedup

import (
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/uber/h3-go/v4"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// A cached cell is always the cell H3 computes: for coordinates seen
// before, for ones that collide in a slot, at every resolution, and under
// concurrent use.
func TestCellCacheAnswersWhatH3Computes(t *testing.T) {
	var cache CellCache
	rng := rand.New(rand.NewPCG(1, 2))
	points := []h3.LatLng{{Lat: 0, Lng: 0}, {Lat: math.Copysign(0, -1), Lng: 0}, {Lat: 90, Lng: 180}, {Lat: -90, Lng: -180}}
	for range 3 * cellCacheSlots { // more points than slots: every slot is overwritten
		points = append(points, h3.NewLatLng(rng.Float64()*180-90, rng.Float64()*360-180))
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for round := range 3 {
				for i, ll := range points {
					res := (i + w + round) % 16
					if got, want := cache.Cell(ll, res), h3.LatLngToCell(ll, res); got != want {
						t.Errorf("%v at resolution %d: cached %v, H3 says %v", ll, res, got, want)
						return
					}
				}
			}
		})
	}
	wg.Wait()
}

// Keys do not depend on whether a Keyer has a cache.
func TestCellCacheNeverChangesAKey(t *testing.T) {
	plain := defaultKeyer()
	cached := plain
	cached.Cells = new(CellCache)
	for _, p := range []ping.Ping{parked, at(time.Minute, 52.5203, 13.4061), at(0, 0, 0)} {
		for range 2 { // a miss, then a hit
			if got, want := cached.Observe(p).Key, plain.Observe(p).Key; got != want {
				t.Fatalf("%+v: key %s with a cell cache, %s without", p, got, want)
			}
		}
	}
}

// Coordinates near recent ones (a parked asset's jitter, a slow asset's
// next fixes) are answered from the cache's hexagons, and every answer is
// still the cell H3 computes: at every resolution, beside the icosahedron's
// corners, edges and face centres, and under concurrent use.
func TestCellCacheAnswersNearbyCoordinatesFromItsHexagons(t *testing.T) {
	var cache CellCache
	rng := rand.New(rand.NewPCG(5, 6))
	ordinary := []h3.LatLng{h3.NewLatLng(52.52, 13.40), h3.NewLatLng(-33.87, 151.21), h3.NewLatLng(0, 179.9999)}
	for range 40 {
		ordinary = append(ordinary, latLngOf(randomDirection(rng)))
	}
	places := append(ordinary, icosahedronLandmarks()...)
	var wg sync.WaitGroup
	var fromHexagons atomic.Int64
	for w := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(7, uint64(w)))
			for res := range 16 {
				for i, place := range places {
					jitter := areaSteps[res] / 3
					for range 20 {
						ll := h3.NewLatLng(place.Lat+(rng.Float64()-0.5)*jitter, place.Lng+(rng.Float64()-0.5)*jitter)
						if _, ok := cache.areas[areaOf(ll, res)].lookup(ll, res); ok && i < len(ordinary) {
							fromHexagons.Add(1)
						}
						if got, want := cache.Cell(ll, res), h3.LatLngToCell(ll, res); got != want {
							t.Errorf("%v at resolution %d: cached %v, H3 says %v", ll, res, got, want)
							return
						}
					}
				}
			}
		})
	}
	wg.Wait()
	// Away from the icosahedron's corners and edges, where cells are no
	// hexagons of one face, most jitter lands in a cell already learnt.
	if total := int64(4 * 16 * len(ordinary) * 20); fromHexagons.Load() < total*3/4 {
		t.Errorf("%d of %d jittered coordinates at ordinary places found their cell's hexagon: want most", fromHexagons.Load(), total)
	}
}
