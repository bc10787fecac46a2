package dedup

import (
	"math/rand/v2"
	"sync"
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
	points := []h3.LatLng{{Lat: 0, Lng: 0}, {Lat: -0.0, Lng: 0}, {Lat: 90, Lng: 180}, {Lat: -90, Lng: -180}}
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
