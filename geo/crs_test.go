package geo

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
)

// publishedTolerance is the agreement required with published reference
// points, in degrees (≈1 cm on the ground).
const publishedTolerance = 1e-7

// roundTripTolerance is the agreement required between a point and
// inverse(forward(point)), in degrees (≈0.1 mm).
const roundTripTolerance = 1e-9

func dms(d, m, s float64) float64 { return d + m/60 + s/3600 }

// assertLatLon fails unless (lat, lon) is within tol of the wanted point and
// returns the larger of the two errors, for reporting. Longitudes are compared
// modulo 360°, so -180 and 179.999999999999 are neighbours.
func assertLatLon(t *testing.T, lat, lon, wantLat, wantLon, tol float64) float64 {
	t.Helper()
	dLat, dLon := math.Abs(lat-wantLat), math.Abs(math.Remainder(lon-wantLon, 360))
	if !(dLat <= tol && dLon <= tol) {
		t.Errorf("got (%.12f, %.12f), want (%.12f, %.12f) within %g°: off by (%.3g, %.3g)",
			lat, lon, wantLat, wantLon, tol, dLat, dLon)
	}
	return math.Max(dLat, dLon)
}

func mustParseCRS(t *testing.T, s string) CRS {
	t.Helper()
	c, err := ParseCRS(s)
	if err != nil {
		t.Fatalf("ParseCRS(%q): %v", s, err)
	}
	return c
}

func TestParseCRSAccepts(t *testing.T) {
	tests := []struct {
		in, want string
		wgs84    bool
	}{
		{"EPSG:4326", "EPSG:4326", true},
		{"epsg:4326", "EPSG:4326", true},
		{"EPSG:3857", "EPSG:3857", false},
		{"Epsg:3857", "EPSG:3857", false},
		{"EPSG:32601", "EPSG:32601", false},
		{"EPSG:32633", "EPSG:32633", false},
		{"EPSG:32660", "EPSG:32660", false},
		{"EPSG:32701", "EPSG:32701", false},
		{"epsg:32756", "EPSG:32756", false},
		{"EPSG:32760", "EPSG:32760", false},
		{" EPSG:32733\n", "EPSG:32733", false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			c := mustParseCRS(t, tt.in)
			if got := c.String(); got != tt.want {
				t.Errorf("String() = %q, want %q", got, tt.want)
			}
			if got := c.IsWGS84(); got != tt.wgs84 {
				t.Errorf("IsWGS84() = %v, want %v", got, tt.wgs84)
			}
			if again := mustParseCRS(t, c.String()); again != c {
				t.Errorf("ParseCRS(String()) = %v, want %v", again, c)
			}
		})
	}
}

func TestParseCRSRejects(t *testing.T) {
	tests := []struct {
		in   string
		hint string // must appear besides the list of accepted codes
	}{
		{"", `"EPSG:<code>"`},
		{"3857", `"EPSG:<code>"`},
		{"4326", `"EPSG:<code>"`},
		{"ESRI:102100", `"EPSG:<code>"`},
		{"EPSG:", "must be a number"},
		{"EPSG:+3857", "must be a number"},
		{"EPSG:-4326", "must be a number"},
		{"EPSG:3857x", "must be a number"},
		{"EPSG:99999999999999999999", "must be a number"},
		{"EPSG:32600", "not supported"},
		{"EPSG:32661", "not supported"},
		{"EPSG:32700", "not supported"},
		{"EPSG:32761", "not supported"},
		{"EPSG:4269", "not supported"},
		{"EPSG:900913", "not supported"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			c, err := ParseCRS(tt.in)
			if err == nil {
				t.Fatalf("ParseCRS(%q) = %v, want an error", tt.in, c)
			}
			msg := err.Error()
			for _, want := range []string{`"` + tt.in + `"`, tt.hint, "EPSG:4326", "EPSG:3857", "EPSG:32601", "EPSG:32660", "EPSG:32701", "EPSG:32760"} {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q does not mention %q", msg, want)
				}
			}
		})
	}
}

func TestCRSZeroValueIsWGS84(t *testing.T) {
	var zero CRS
	if zero != WGS84 || !zero.IsWGS84() || zero.String() != "EPSG:4326" {
		t.Errorf("zero CRS = %v (IsWGS84 %v), want WGS84", zero, zero.IsWGS84())
	}
	if c := mustParseCRS(t, "EPSG:4326"); c != WGS84 {
		t.Errorf("ParseCRS(EPSG:4326) = %#v, want WGS84 %#v", c, WGS84)
	}
}

// WGS 84 input is passed through untouched, even when out of range or NaN:
// validating latitude and longitude is the parser's job, with its own rules.
func TestCRSWGS84IsIdentity(t *testing.T) {
	for _, p := range [][2]float64{{13.4, 52.5}, {-181, 95}, {math.NaN(), math.Inf(1)}} {
		lat, lon, err := WGS84.ToWGS84(p[0], p[1])
		if err != nil {
			t.Fatalf("ToWGS84(%v, %v): %v", p[0], p[1], err)
		}
		same := func(a, b float64) bool { return a == b || math.IsNaN(a) && math.IsNaN(b) }
		if !same(lat, p[1]) || !same(lon, p[0]) {
			t.Errorf("ToWGS84(%v, %v) = (%v, %v), want (%v, %v)", p[0], p[1], lat, lon, p[1], p[0])
		}
	}
}

func TestWebMercatorReferencePoints(t *testing.T) {
	tests := []struct {
		name             string
		x, y             float64
		wantLat, wantLon float64
	}{
		{"origin", 0, 0, 0, 0},
		// IOGP Publication 373-7-2 (EPSG Guidance Note 7-2), Popular
		// Visualisation Pseudo-Mercator (method 1024) worked example, WGS 84 /
		// Pseudo-Mercator: 24°22'54.433"N 100°20'00.000"W <-> E -11169055.58 m,
		// N 2800000.00 m.
		{"GN7-2 forward example", -11169055.58, 2800000.00, dms(24, 22, 54.433), -dms(100, 20, 0)},
		// Same guidance note, reverse example: N 2810000.00 m -> 24°27'48.889"N.
		{"GN7-2 reverse example", -11169055.58, 2810000.00, dms(24, 27, 48.889), -dms(100, 20, 0)},
		// The corners of the square: longitude ±180°, latitude ±atan(sinh π) =
		// ±85.0511287798066°, the documented limit of Web Mercator maps.
		{"north-east corner", 20037508.342789244, 20037508.342789244, 85.0511287798066, 180},
		{"south-west corner", -20037508.342789244, -20037508.342789244, -85.0511287798066, -180},
	}
	c := mustParseCRS(t, "EPSG:3857")
	maxErr := 0.0
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lat, lon, err := c.ToWGS84(tt.x, tt.y)
			if err != nil {
				t.Fatalf("ToWGS84(%v, %v): %v", tt.x, tt.y, err)
			}
			maxErr = math.Max(maxErr, assertLatLon(t, lat, lon, tt.wantLat, tt.wantLon, publishedTolerance))
		})
	}
	t.Logf("max error against published Web Mercator points: %.3g°", maxErr)
}

// UTM reference points. The grid coordinates come from PROJ's test suite,
// test/gie/tmerczoned.gie (EPSG:4326 -> EPSG:32600/EPSG:32700, the WGS 84
// zoned UTM grids, tolerance 0.1 mm), where the zone number is written as the
// millions of the easting; they sit on the zone boundaries, 3° from the
// central meridian, at the equator and at ±80°.
func TestUTMReferencePoints(t *testing.T) {
	tests := []struct {
		crs              string
		x, y             float64
		wantLat, wantLon float64
	}{
		// Central meridians at the equator, by definition of the grids.
		{"EPSG:32633", 500000, 0, 0, 15},
		{"EPSG:32733", 500000, 10000000, 0, 15},
		{"EPSG:32756", 500000, 10000000, 0, 153},
		{"EPSG:32601", 500000, 0, 0, -177},
		// tmerczoned.gie, EPSG:32600 zone 33.
		{"EPSG:32633", 166021.4431, 0.0, 0, 12},
		{"EPSG:32633", 441867.7849, 8883084.9559, 80, 12},
		{"EPSG:32633", 833978.5568, 0.0, 0, 17.999999999},
		{"EPSG:32633", 558132.2151, 8883084.9559, 80, 17.999999999},
		// tmerczoned.gie, EPSG:32700 zone 56 (Sydney's zone) and zone 30.
		{"EPSG:32756", 166021.4431, 10000000, 0, 150},
		{"EPSG:32756", 441867.7849, 1116915.0441, -80, 150},
		{"EPSG:32756", 833978.5568, 10000000, 0, 155.999999999},
		{"EPSG:32756", 558132.2151, 1116915.0441, -80, 155.999999999},
		{"EPSG:32730", 441867.7849, 1116915.0441, -80, -6},
		// tmerczoned.gie, the antimeridian: zone 1's west edge and zone 60's
		// east edge.
		{"EPSG:32601", 166021.4431, 0.0, 0, -180},
		{"EPSG:32660", 833978.5568, 0.0, 0, 179.999999999},
		{"EPSG:32760", 558132.2151, 1116915.0441, -80, 179.999999999},
	}
	maxErr := 0.0
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s %g,%g", tt.crs, tt.wantLat, tt.wantLon), func(t *testing.T) {
			lat, lon, err := mustParseCRS(t, tt.crs).ToWGS84(tt.x, tt.y)
			if err != nil {
				t.Fatalf("ToWGS84(%v, %v): %v", tt.x, tt.y, err)
			}
			maxErr = math.Max(maxErr, assertLatLon(t, lat, lon, tt.wantLat, tt.wantLon, publishedTolerance))
		})
	}
	t.Logf("max error against published UTM points: %.3g°", maxErr)
}

// grs80 is the ellipsoid PROJ uses when none is given, and so the one of its
// builtins.gie UTM tests.
const (
	grs80A = 6378137.0
	grs80F = 1 / 298.257222101
)

// PROJ's test/gie/builtins.gie, section "Universal Transverse Mercator (UTM)",
// publishes UTM on GRS80 to 1e-8 m and 1e-9°. Checking the same series with
// GRS80 constants pins the implementation far below the WGS 84 points'
// 0.1 mm rounding, and validates krugerForward, used by the round trips.
func TestUTMGRS80PROJBuiltins(t *testing.T) {
	grs := newTransverseMercator(grs80A, grs80F, utmK0)
	tests := []struct {
		name             string
		zone             int
		x, y             float64
		wantLat, wantLon float64
		forward          bool // published in the forward direction
	}{
		// operation +proj=utm +zone=32, accept 12 56, expect 687071.43910944 6210141.32674801.
		{"zone 32 12E 56N", 32, 687071.43910944, 6210141.32674801, 56, 12, true},
		// operation +proj=utm +zone=30, accept 2 1, expect 1057002.405491298 110955.141175949.
		{"zone 30 2E 1N", 30, 1057002.405491298, 110955.141175949, 1, 2, true},
		// Same operation, direction inverse: accept 200 100, expect -7.486952083 0.000901940 ...
		{"zone 30 inverse 200 100", 30, 200, 100, 0.000901940, -7.486952083, false},
		{"zone 30 inverse 200 -100", 30, 200, -100, -0.000901940, -7.486952083, false},
		{"zone 30 inverse -200 100", 30, -200, 100, 0.000901935, -7.490535682, false},
		{"zone 30 inverse -200 -100", 30, -200, -100, -0.000901935, -7.490535682, false},
	}
	maxErr := 0.0
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cm := float64(6*tt.zone - 183)
			lat, dlon := grs.inverse(tt.x-utmFalseEasting, tt.y)
			// The inverse values are published to 9 decimals.
			maxErr = math.Max(maxErr, assertLatLon(t, lat, cm+dlon, tt.wantLat, tt.wantLon, 1e-9))
			if tt.forward {
				x, y := newKrugerForward(grs80A, grs80F, utmK0).forward(tt.wantLat, tt.wantLon-cm)
				if dx, dy := math.Abs(x+utmFalseEasting-tt.x), math.Abs(y-tt.y); dx > 1e-6 || dy > 1e-6 {
					t.Errorf("krugerForward(%v, %v) = (%.8f, %.8f), want (%.8f, %.8f)",
						tt.wantLat, tt.wantLon, x+utmFalseEasting, y, tt.x, tt.y)
				}
			}
		})
	}
	t.Logf("max error against PROJ's GRS80 UTM points: %.3g°", maxErr)
}

// krugerForward is the forward transverse Mercator projection of Karney
// (2011), eqs. (7)-(11) and (35). It lives in the test only: production code
// never projects, and an independent forward keeps the round trips honest.
type krugerForward struct {
	e, k0A float64
	alpha  [6]float64
}

func newKrugerForward(a, f, k0 float64) krugerForward {
	n := f / (2 - f)
	n2 := n * n
	n3 := n2 * n
	n4, n5, n6 := n2*n2, n3*n2, n3*n3
	return krugerForward{
		e:   math.Sqrt(f * (2 - f)),
		k0A: k0 * a / (1 + n) * (1 + n2/4 + n4/64 + n6/256),
		alpha: [6]float64{
			n/2 - 2*n2/3 + 5*n3/16 + 41*n4/180 - 127*n5/288 + 7891*n6/37800,
			13*n2/48 - 3*n3/5 + 557*n4/1440 + 281*n5/630 - 1983433*n6/1935360,
			61*n3/240 - 103*n4/140 + 15061*n5/26880 + 167603*n6/181440,
			49561*n4/161280 - 179*n5/168 + 6601661*n6/7257600,
			34729*n5/80640 - 3418889*n6/1995840,
			212378941 * n6 / 319334400,
		},
	}
}

// forward returns metres east of the central meridian and north of the
// equator for a latitude and a longitude difference in degrees.
func (k krugerForward) forward(lat, dlon float64) (x, y float64) {
	phi, lambda := lat*math.Pi/180, dlon*math.Pi/180
	tau := math.Tan(phi)
	sigma := math.Sinh(k.e * math.Atanh(k.e*tau/math.Hypot(1, tau)))
	taup := tau*math.Hypot(1, sigma) - sigma*math.Hypot(1, tau)
	xip := math.Atan2(taup, math.Cos(lambda))
	etap := math.Asinh(math.Sin(lambda) / math.Hypot(taup, math.Cos(lambda)))
	xi, eta := xip, etap
	for j, a := range k.alpha {
		m := 2 * float64(j+1)
		xi += a * math.Sin(m*xip) * math.Cosh(m*etap)
		eta += a * math.Cos(m*xip) * math.Sinh(m*etap)
	}
	return k.k0A * eta, k.k0A * xi
}

func TestUTMRoundTrip(t *testing.T) {
	fwd := newKrugerForward(wgs84A, wgs84F, utmK0)
	maxErr := 0.0
	for _, zone := range []int{1, 17, 33, 56, 60} {
		cm := float64(6*zone - 183)
		for lat := -80.0; lat <= 84; lat += 2 {
			code, fn := 32600+zone, 0.0
			if lat < 0 {
				code, fn = 32700+zone, utmSouthFN
			}
			c := mustParseCRS(t, fmt.Sprintf("EPSG:%d", code))
			// ±3.5° reaches past the zone edge into the neighbour's overlap
			// while staying inside the accepted eastings at the equator.
			for dlon := -3.5; dlon <= 3.5; dlon += 0.25 {
				x, y := fwd.forward(lat, dlon)
				gotLat, gotLon, err := c.ToWGS84(x+utmFalseEasting, y+fn)
				if err != nil {
					t.Fatalf("%v ToWGS84 of (%v, %v): %v", c, lat, dlon, err)
				}
				// Zones 1 and 60 reach across the antimeridian.
				if gotLon < -180 || gotLon > 180 {
					t.Errorf("%v ToWGS84 of (%v, %v): longitude %v is not wrapped into [-180, 180]", c, lat, dlon, gotLon)
				}
				maxErr = math.Max(maxErr, assertLatLon(t, gotLat, gotLon, lat, cm+dlon, roundTripTolerance))
			}
		}
	}
	t.Logf("max UTM round-trip error: %.3g°", maxErr)
}

func TestWebMercatorRoundTrip(t *testing.T) {
	c := mustParseCRS(t, "EPSG:3857")
	maxErr := 0.0
	for lat := -85.0; lat <= 85; lat += 2.5 {
		for lon := -180.0; lon <= 180; lon += 7.5 {
			// EPSG method 1024: spherical Mercator on the semi-major axis.
			x := wgs84A * lon * math.Pi / 180
			y := wgs84A * math.Log(math.Tan(math.Pi/4+lat*math.Pi/360))
			gotLat, gotLon, err := c.ToWGS84(x, y)
			if err != nil {
				t.Fatalf("ToWGS84(%v, %v) for (%v, %v): %v", x, y, lat, lon, err)
			}
			maxErr = math.Max(maxErr, assertLatLon(t, gotLat, gotLon, lat, lon, roundTripTolerance))
		}
	}
	t.Logf("max Web Mercator round-trip error: %.3g°", maxErr)
}

// Latitudes outside the UTM band [-80, 84] are accepted on purpose; see
// ToWGS84.
func TestUTMAcceptsLatitudesBeyondTheBand(t *testing.T) {
	fwd := newKrugerForward(wgs84A, wgs84F, utmK0)
	for _, lat := range []float64{-89, -85, 86, 89.5} {
		c, fn := mustParseCRS(t, "EPSG:32633"), 0.0
		if lat < 0 {
			c, fn = mustParseCRS(t, "EPSG:32733"), utmSouthFN
		}
		x, y := fwd.forward(lat, 1)
		gotLat, gotLon, err := c.ToWGS84(x+utmFalseEasting, y+fn)
		if err != nil {
			t.Fatalf("%v ToWGS84 for latitude %v: %v", c, lat, err)
		}
		assertLatLon(t, gotLat, gotLon, lat, 16, roundTripTolerance)
	}
}

func TestCRSAxisErrors(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	tests := []struct {
		name     string
		crs      string
		x, y     float64
		axis     Axis
		contains []string
	}{
		{"easting too large", "EPSG:32633", 1200000, 5000000, AxisX,
			[]string{"easting 1200000 is outside the UTM range [100000, 900000] m for EPSG:32633"}},
		{"easting too small", "EPSG:32756", 99999.5, 6250000, AxisX,
			[]string{"easting 99999.5 is outside", "[100000, 900000]", "EPSG:32756"}},
		{"degrees given as metres", "EPSG:32633", 15.2, 52.1, AxisX,
			[]string{"easting 15.2 is outside"}},
		{"negative northing in the north", "EPSG:32633", 500000, -1, AxisY,
			[]string{"northing -1 is outside the UTM range [0, 9997964.943] m for EPSG:32633"}},
		{"northing past the north pole", "EPSG:32633", 500000, 9999000, AxisY,
			[]string{"northing 9999000 is outside"}},
		{"northing past the south pole", "EPSG:32733", 500000, 1000, AxisY,
			[]string{"northing 1000 is outside the UTM range [2035.057, 10000000] m for EPSG:32733"}},
		{"northing above the south false northing", "EPSG:32733", 500000, 10000000.5, AxisY,
			[]string{"northing 10000000.5 is outside"}},
		{"NaN easting", "EPSG:32633", nan, 5000000, AxisX,
			[]string{"easting NaN is not a finite number", "[100000, 900000]"}},
		{"Inf northing", "EPSG:32733", 500000, -inf, AxisY,
			[]string{"northing -Inf is not a finite number", "[2035.057, 10000000]"}},
		{"both NaN reports x first", "EPSG:32601", nan, nan, AxisX, []string{"easting NaN"}},
		{"Web Mercator easting", "EPSG:3857", 20037509, 0, AxisX,
			[]string{"easting 20037509 is outside the Web Mercator range [-20037508.343, 20037508.343] m for EPSG:3857"}},
		{"Web Mercator northing", "EPSG:3857", 0, -3e7, AxisY,
			[]string{"northing -30000000 is outside the Web Mercator range"}},
		{"Web Mercator NaN", "EPSG:3857", 0, nan, AxisY, []string{"northing NaN is not a finite number"}},
		{"Web Mercator Inf", "EPSG:3857", inf, 0, AxisX, []string{"easting +Inf is not a finite number"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lat, lon, err := mustParseCRS(t, tt.crs).ToWGS84(tt.x, tt.y)
			var axisErr *AxisError
			if !errors.As(err, &axisErr) {
				t.Fatalf("ToWGS84(%v, %v) = (%v, %v, %v), want an *AxisError", tt.x, tt.y, lat, lon, err)
			}
			if axisErr.Axis != tt.axis {
				t.Errorf("Axis = %q, want %q (%v)", axisErr.Axis, tt.axis, err)
			}
			for _, want := range tt.contains {
				if !strings.Contains(axisErr.Detail, want) {
					t.Errorf("Detail %q does not contain %q", axisErr.Detail, want)
				}
			}
			if got, want := err.Error(), string(tt.axis)+": "+axisErr.Detail; got != want {
				t.Errorf("Error() = %q, want %q", got, want)
			}
		})
	}
}

// The edges of the documented ranges are inside them.
func TestCRSAcceptsRangeEdges(t *testing.T) {
	tests := []struct {
		crs  string
		x, y float64
	}{
		{"EPSG:32633", 100000, 0},
		{"EPSG:32633", 900000, utmPoleNorthing},
		{"EPSG:32733", 100000, utmSouthFN},
		{"EPSG:32733", 900000, utmSouthFN - utmPoleNorthing},
		{"EPSG:3857", -20037508.342789244, 20037508.342789244},
	}
	for _, tt := range tests {
		if _, _, err := mustParseCRS(t, tt.crs).ToWGS84(tt.x, tt.y); err != nil {
			t.Errorf("%s ToWGS84(%v, %v): %v", tt.crs, tt.x, tt.y, err)
		}
	}
}
