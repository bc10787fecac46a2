package dedup

import (
	"math"

	"github.com/uber/h3-go/v4"
)

// hexagon is an H3 cell that lies on one face of H3's icosahedron, held as
// the six planes through the Earth's centre and its edges, so that whether
// a point lies in it costs six dot products instead of a cgo call.
//
// It answers exactly what H3 answers, because of how H3 places a point: it
// projects the point gnomonically onto the icosahedron face it is nearest
// and takes the hexagon of that face's grid that holds it. A gnomonic
// projection maps great circles to straight lines, so a hexagon of one face
// is, on the sphere, the region inside six great circles through its
// corners: the planes held here. A cell that reaches over a face's edge is
// bent there, and a pentagon sits on a corner of the icosahedron: neither is
// made a hexagon. A point nearer an edge than the margin is left to H3, so
// that neither the rounding here nor H3's own can put it on the other side.
type hexagon struct {
	edges [6]edgePlane
}

// edgePlane is one edge of a hexagon: the unit normal of its great circle,
// pointing into the cell, and how far inside a point must be to count.
type edgePlane struct {
	normal vec3
	inside float64
}

// Margins of a hexagon's edges, in radians of arc: a share of the cell's
// shortest edge, plus a floor. H3 computes a point's distance from the
// centre of its face with acos, which loses precision within metres of that
// centre: about 1e-16/r radians at r radians from it, 2e-9 for a point on
// the edge of the finest cell that holds a face centre. Everything else
// here and in H3 rounds at about 1e-15. The floor, 6 cm, stays above all of
// it; the share scales the margin with coarser cells. At the default
// resolution, 12, the two leave H3 a band of 7 cm along edges of 10.8 m:
// under 2% of a cell.
const (
	hexagonMarginFloor = 1e-8
	hexagonMarginShare = 1e-3
)

// newHexagon returns cell as a hexagon, or false if it is not one of a
// single face.
func newHexagon(cell h3.Cell) (hexagon, bool) {
	boundary := h3.CellToBoundary(cell)
	if len(boundary) != 6 || len(cell.IcosahedronFaces()) != 1 {
		return hexagon{}, false
	}
	var corners [6]vec3
	var middle vec3
	for i, ll := range boundary {
		corners[i] = unitVector(ll)
		middle = middle.plus(corners[i])
	}
	var hex hexagon
	shortest := math.Inf(1)
	for i, a := range corners {
		b := corners[(i+1)%6]
		shortest = min(shortest, b.minus(a).length())
		hex.edges[i].normal = a.cross(b).unit()
	}
	margin := hexagonMarginFloor + hexagonMarginShare*shortest
	// The corners' order decides which side of each plane is inside: the
	// middle of the corners is inside every edge, or the cell is no
	// hexagon this test can hold.
	sign := math.Copysign(1, hex.edges[0].normal.dot(middle))
	for i, a := range corners {
		e := &hex.edges[i]
		e.normal = e.normal.scale(sign)
		if e.normal.dot(middle) <= 0 {
			return hexagon{}, false
		}
		// A point is inside by its distance from the plane through the
		// edge's corner: the plane's own rounding then cancels out.
		e.inside = e.normal.dot(a) + margin
	}
	return hex, true
}

// holds reports whether p lies in the hexagon, farther than the margin from
// each edge. False says nothing: the point may be in it, near an edge.
func (hex *hexagon) holds(p vec3) bool {
	for i := range hex.edges {
		if hex.edges[i].normal.dot(p) <= hex.edges[i].inside {
			return false
		}
	}
	return true
}

// vec3 is a point of the unit sphere, or a direction, in Earth-centred
// coordinates.
type vec3 struct{ x, y, z float64 }

// unitVector is ll on the unit sphere, from radians computed as h3-go
// computes them for H3.
func unitVector(ll h3.LatLng) vec3 {
	sinLat, cosLat := math.Sincos(h3.DegsToRads * ll.Lat)
	sinLng, cosLng := math.Sincos(h3.DegsToRads * ll.Lng)
	return vec3{cosLat * cosLng, cosLat * sinLng, sinLat}
}

func (a vec3) plus(b vec3) vec3     { return vec3{a.x + b.x, a.y + b.y, a.z + b.z} }
func (a vec3) minus(b vec3) vec3    { return vec3{a.x - b.x, a.y - b.y, a.z - b.z} }
func (a vec3) scale(s float64) vec3 { return vec3{a.x * s, a.y * s, a.z * s} }
func (a vec3) dot(b vec3) float64   { return a.x*b.x + a.y*b.y + a.z*b.z }
func (a vec3) length() float64      { return math.Sqrt(a.dot(a)) }
func (a vec3) unit() vec3           { return a.scale(1 / a.length()) }
func (a vec3) cross(b vec3) vec3 {
	return vec3{a.y*b.z - a.z*b.y, a.z*b.x - a.x*b.z, a.x*b.y - a.y*b.x}
}
