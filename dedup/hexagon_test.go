package dedup

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/uber/h3-go/v4"
)

// Every point a hexagon holds is in its cell by H3, at every resolution and
// wherever the cell is: at random on the globe, at the poles and the
// antimeridian, beside the icosahedron's corners (H3's pentagons), along its
// edges and at its faces' centres, where H3's arithmetic is least precise.
// The points are scattered over the cell and its neighbours, and packed
// against its edges, on both sides and inside the margin.
func TestHexagonHoldsOnlyWhatH3Computes(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	places := icosahedronLandmarks()
	places = append(places, h3.NewLatLng(89.99, 0), h3.NewLatLng(-89.99, 45), h3.NewLatLng(0, 179.999),
		h3.NewLatLng(0, -179.999), h3.NewLatLng(52.52, 13.40))
	landmarks := len(places)
	for range 120 {
		places = append(places, latLngOf(randomDirection(rng)))
	}
	refusedAtRandom := 0
	for res := range 16 {
		held := 0
		for i, place := range places {
			cell := h3.LatLngToCell(place, res)
			hex, ok := newHexagon(cell)
			if !ok {
				if i >= landmarks && res >= 4 {
					refusedAtRandom++
				}
				if len(h3.CellToBoundary(cell)) == 6 && len(cell.IcosahedronFaces()) == 1 {
					t.Errorf("%v (resolution %d) is a hexagon of one face, but was refused", cell, res)
				}
				continue
			}
			for _, ll := range pointsAround(rng, cell, 60) {
				if !hex.holds(unitVector(ll)) {
					continue
				}
				held++
				if got := h3.LatLngToCell(ll, res); got != cell {
					t.Fatalf("resolution %d: %v held %v, which H3 puts in %v", res, cell, ll, got)
				}
			}
		}
		if held < len(places)*10 {
			t.Errorf("resolution %d: hexagons held %d points of %d: the margin leaves too much to H3", res, held, len(places)*60)
		}
	}
	// From resolution 4 (cells of 26 km) on, few cells reach over an edge
	// of the icosahedron: a cache of hexagons holds nearly every cell.
	if atRandom := (len(places) - landmarks) * 12; refusedAtRandom > atRandom/50 {
		t.Errorf("%d of %d cells at random places refused from resolution 4 on", refusedAtRandom, atRandom)
	}
}

// pointsAround returns n points around cell: half of them anywhere within
// twice its radius, half against one of its edges, within a few margins
// of it on either side.
func pointsAround(rng *rand.Rand, cell h3.Cell, n int) []h3.LatLng {
	var corners []vec3
	for _, ll := range h3.CellToBoundary(cell) {
		corners = append(corners, unitVector(ll))
	}
	centre := unitVector(h3.CellToLatLng(cell))
	radius := corners[0].minus(centre).length()
	margin := hexagonMarginFloor + hexagonMarginShare*radius
	points := make([]h3.LatLng, 0, n)
	for i := range n {
		var p vec3
		if i%2 == 0 {
			p = centre.plus(randomDirection(rng).scale(2 * radius * rng.Float64()))
		} else {
			k := rng.IntN(len(corners))
			a, b := corners[k], corners[(k+1)%len(corners)]
			along := a.plus(b.minus(a).scale(rng.Float64()))
			p = along.plus(randomDirection(rng).scale(4 * margin * rng.Float64()))
		}
		points = append(points, latLngOf(p.unit()))
	}
	return points
}

// icosahedronLandmarks returns places where H3's icosahedron is awkward: its
// twelve corners (the centres of the pentagons), points along its thirty
// edges, and the centres of its twenty faces.
func icosahedronLandmarks() []h3.LatLng {
	var corners []vec3
	for _, p := range h3.Pentagons(0) {
		corners = append(corners, unitVector(h3.CellToLatLng(p)))
	}
	edgeLength := 0.0 // the shortest distance between two corners
	for i, a := range corners {
		for _, b := range corners[i+1:] {
			if d := a.minus(b).length(); edgeLength == 0 || d < edgeLength {
				edgeLength = d
			}
		}
	}
	adjacent := func(a, b vec3) bool { return a.minus(b).length() < edgeLength*1.001 }
	var places []h3.LatLng
	for i, a := range corners {
		places = append(places, latLngOf(a))
		for j := i + 1; j < len(corners); j++ {
			b := corners[j]
			if !adjacent(a, b) {
				continue
			}
			for _, share := range []float64{0.25, 0.5, 0.7} {
				places = append(places, latLngOf(a.plus(b.minus(a).scale(share)).unit()))
			}
			for _, c := range corners[j+1:] {
				if adjacent(a, c) && adjacent(b, c) {
					places = append(places, latLngOf(a.plus(b).plus(c).unit()))
				}
			}
		}
	}
	return places
}

func randomDirection(rng *rand.Rand) vec3 {
	for {
		v := vec3{rng.Float64()*2 - 1, rng.Float64()*2 - 1, rng.Float64()*2 - 1}
		if l := v.length(); l > 0.1 && l <= 1 {
			return v.unit()
		}
	}
}

func latLngOf(v vec3) h3.LatLng {
	return h3.NewLatLng(math.Asin(v.z)*h3.RadsToDegs, math.Atan2(v.y, v.x)*h3.RadsToDegs)
}

// The landmarks are what they say: 12 corners, 30 edges and 20 faces.
func TestIcosahedronLandmarks(t *testing.T) {
	if n := len(icosahedronLandmarks()); n != 12+30*3+20 {
		t.Fatalf("%d landmarks, want 12 corners, 3 points on each of 30 edges and 20 face centres", n)
	}
}
