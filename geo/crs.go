// Reprojection uses closed-form formulas here rather than github.com/wroge/wgs84:
// that library's UTM inverse (a truncated Snyder series with a 3/2 integer-division
// bug) is off by up to 1.5e-4° (~17 m), while Karney's (2011) 6th-order Krüger
// series below is accurate to nanometres and needs no dependency.

package geo

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// CRS is a coordinate reference system pings can arrive in. The zero value is
// WGS84, and CRS values are comparable with ==.
type CRS struct {
	kind crsKind
	zone int // UTM zone, 1 to 60; zero for the other kinds
}

// crsKind keeps WGS 84 at zero so that an unset CRS means "no reprojection".
type crsKind uint8

const (
	kindWGS84 crsKind = iota
	kindWebMercator
	kindUTMNorth
	kindUTMSouth
)

// WGS84 is EPSG:4326, the default: x is longitude, y is latitude, in degrees.
var WGS84 CRS

// EPSG codes of the supported systems; a UTM code is the base plus the zone.
const (
	epsgWGS84       = 4326
	epsgWebMercator = 3857
	epsgUTMNorth    = 32600
	epsgUTMSouth    = 32700
	utmZones        = 60
)

// acceptedCRS ends every ParseCRS error, so a bad configuration says how to
// fix itself.
const acceptedCRS = "accepted are EPSG:4326 (WGS 84 longitude/latitude in degrees), " +
	"EPSG:3857 (Web Mercator), EPSG:32601 to EPSG:32660 (UTM north, zones 1-60) " +
	"and EPSG:32701 to EPSG:32760 (UTM south, zones 1-60)"

// ParseCRS reads "EPSG:4326", "EPSG:3857", "EPSG:326xx" or "EPSG:327xx" (the
// "EPSG:" prefix in any case), returning an error that lists what is accepted.
func ParseCRS(s string) (CRS, error) {
	const prefix = "EPSG:"
	t := strings.TrimSpace(s)
	if len(t) < len(prefix) || !strings.EqualFold(t[:len(prefix)], prefix) {
		return CRS{}, fmt.Errorf("%q: write it as \"EPSG:<code>\"; %s", s, acceptedCRS)
	}
	code, ok := parseDigits(t[len(prefix):])
	if !ok {
		return CRS{}, fmt.Errorf("%q: the EPSG code must be a number; %s", s, acceptedCRS)
	}
	c, ok := crsFromEPSG(code)
	if !ok {
		return CRS{}, fmt.Errorf("%q is not supported; %s", s, acceptedCRS)
	}
	return c, nil
}

// parseDigits accepts only ASCII digits, because strconv.Atoi would also take
// a sign and "EPSG:+3857" is not an EPSG code.
func parseDigits(s string) (int, bool) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}

func crsFromEPSG(code int) (CRS, bool) {
	switch {
	case code == epsgWGS84:
		return WGS84, true
	case code == epsgWebMercator:
		return CRS{kind: kindWebMercator}, true
	case code > epsgUTMNorth && code <= epsgUTMNorth+utmZones:
		return CRS{kind: kindUTMNorth, zone: code - epsgUTMNorth}, true
	case code > epsgUTMSouth && code <= epsgUTMSouth+utmZones:
		return CRS{kind: kindUTMSouth, zone: code - epsgUTMSouth}, true
	}
	return CRS{}, false
}

// String returns the EPSG code, e.g. "EPSG:32633".
func (c CRS) String() string {
	return "EPSG:" + strconv.Itoa(c.epsg())
}

func (c CRS) epsg() int {
	switch c.kind {
	case kindWebMercator:
		return epsgWebMercator
	case kindUTMNorth:
		return epsgUTMNorth + c.zone
	case kindUTMSouth:
		return epsgUTMSouth + c.zone
	}
	return epsgWGS84
}

// IsWGS84 reports whether no reprojection is needed.
func (c CRS) IsWGS84() bool { return c.kind == kindWGS84 }

// ToWGS84 converts a position (x = easting/longitude, y = northing/latitude)
// to latitude and longitude in degrees.
// A coordinate outside the CRS's valid area gives an *AxisError naming the axis.
//
// WGS84 positions are returned unchanged and unchecked: latitude and longitude
// ranges are validated where pings are parsed. For Web Mercator the valid area
// is the square |x|, |y| <= 20037508.342789244 m (π times the WGS 84
// semi-major axis), i.e. latitudes up to ±85.0511°.
//
// For UTM, eastings must lie in [100000, 900000] m: the whole zone (166021 m
// to 833979 m at the equator, narrower poleward) plus about half a degree of
// overlap for positions read in a neighbouring zone's grid, while still
// rejecting swapped or unprojected values. Northings must lie between the
// equator and the pole: [0, 9997964.943] m in the north, [2035.057, 10000000]
// m in the south (false northing 10000000 m). Latitudes beyond the UTM band
// [-80, 84] are accepted, because the projection is still exact there and
// some receivers keep reporting UTM near the poles. Longitudes are wrapped into
// [-180, 180], which matters for zones 1 and 60.
func (c CRS) ToWGS84(x, y float64) (lat, lon float64, err error) {
	switch c.kind {
	case kindWebMercator:
		return c.webMercatorToWGS84(x, y)
	case kindUTMNorth, kindUTMSouth:
		return c.utmToWGS84(x, y)
	}
	return y, x, nil
}

// Axis names the coordinate an AxisError is about.
type Axis string

// The axes of a position, as ToWGS84 takes them.
const (
	// AxisX is the easting, or the longitude in WGS84.
	AxisX Axis = "x"
	// AxisY is the northing, or the latitude in WGS84.
	AxisY Axis = "y"
)

// AxisError reports a projected coordinate outside the CRS's valid area (or
// not finite).
type AxisError struct {
	// Axis is the offending coordinate.
	Axis Axis
	// Detail says what was found and what is allowed.
	Detail string
}

// Error names the coordinate and says what was found and what is allowed.
func (e *AxisError) Error() string {
	return fmt.Sprintf("%s: %s", e.Axis, e.Detail)
}

// axisRange is the valid interval of one projected coordinate, with the words
// an error needs to explain it.
type axisRange struct {
	axis   Axis
	name   string // "easting" or "northing"
	system string // "UTM" or "Web Mercator"
	lo, hi float64
}

// check rejects NaN and ±Inf explicitly: they fail no comparison, so a bare
// range test would let NaN through.
func (r axisRange) check(v float64, c CRS) *AxisError {
	bounds := fmt.Sprintf("the %s range [%s, %s] m for %s", r.system, formatMetres(r.lo), formatMetres(r.hi), c)
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return &AxisError{Axis: r.axis, Detail: fmt.Sprintf("%s %s is not a finite number; %s is allowed", r.name, formatCoord(v), bounds)}
	case v < r.lo || v > r.hi:
		return &AxisError{Axis: r.axis, Detail: fmt.Sprintf("%s %s is outside %s", r.name, formatCoord(v), bounds)}
	}
	return nil
}

func formatCoord(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// formatMetres shows a bound to the millimetre; bounds like the pole's
// northing have digits no reader needs.
func formatMetres(v float64) string { return formatCoord(math.Round(v*1000) / 1000) }

// WGS 84 ellipsoid (EPSG:7030).
const (
	wgs84A = 6378137.0
	wgs84F = 1 / 298.257223563
)

// webMercatorLimit is where the Web Mercator square ends: longitude ±180°.
const webMercatorLimit = math.Pi * wgs84A

// webMercatorToWGS84 is the exact spherical inverse; EPSG:3857 treats the
// ellipsoid's latitudes as if they were on a sphere of radius a.
func (c CRS) webMercatorToWGS84(x, y float64) (lat, lon float64, err error) {
	if err := (axisRange{AxisX, "easting", "Web Mercator", -webMercatorLimit, webMercatorLimit}).check(x, c); err != nil {
		return 0, 0, err
	}
	if err := (axisRange{AxisY, "northing", "Web Mercator", -webMercatorLimit, webMercatorLimit}).check(y, c); err != nil {
		return 0, 0, err
	}
	// atan(sinh) rather than 2·atan(exp) - π/2: no cancellation near the equator.
	return radToDeg(math.Atan(math.Sinh(y / wgs84A))), radToDeg(x / wgs84A), nil
}

// UTM grid constants (NGA.SIG.0012, EPSG:16001 to 16160).
const (
	utmK0            = 0.9996
	utmFalseEasting  = 500000.0
	utmSouthFN       = 10000000.0
	utmMinEasting    = 100000.0
	utmMaxEasting    = 900000.0
	utmZoneWidthDeg  = 6
	utmFirstZoneEdge = -180
)

var utmTM = newTransverseMercator(wgs84A, wgs84F, utmK0)

// utmPoleNorthing is the grid distance from the equator to a pole: a northing
// beyond it would be a point past the pole on the opposite meridian.
var utmPoleNorthing = utmTM.k0A * math.Pi / 2

func (c CRS) utmToWGS84(x, y float64) (lat, lon float64, err error) {
	falseNorthing, lo, hi := 0.0, 0.0, utmPoleNorthing
	if c.kind == kindUTMSouth {
		falseNorthing, lo, hi = utmSouthFN, utmSouthFN-utmPoleNorthing, utmSouthFN
	}
	if err := (axisRange{AxisX, "easting", "UTM", utmMinEasting, utmMaxEasting}).check(x, c); err != nil {
		return 0, 0, err
	}
	if err := (axisRange{AxisY, "northing", "UTM", lo, hi}).check(y, c); err != nil {
		return 0, 0, err
	}
	lat, dlon := utmTM.inverse(x-utmFalseEasting, y-falseNorthing)
	return lat, WrapLongitude(c.centralMeridian() + dlon), nil
}

func (c CRS) centralMeridian() float64 {
	return float64(utmFirstZoneEdge + utmZoneWidthDeg*c.zone - utmZoneWidthDeg/2)
}

// WrapLongitude folds a longitude less than a turn outside [-180, 180]
// (the overlap of UTM zones 1 and 60, a position moved across the
// antimeridian, a difference of two longitudes) back into it, with one
// addition or subtraction of 360, which the track shapes' Lua script
// repeats to the bit.
func WrapLongitude(lon float64) float64 {
	switch {
	case lon > 180:
		return lon - 360
	case lon < -180:
		return lon + 360
	}
	return lon
}

func radToDeg(rad float64) float64 { return rad * 180 / math.Pi }

// krugerOrder is the number of terms kept in the Krüger series. At 6th order
// in n the truncation error is about 5 nm within 4000 km of the central
// meridian (Karney 2011, sec. 4), far below float64 noise in degrees.
const krugerOrder = 6

// transverseMercator holds the ellipsoid constants of the inverse transverse
// Mercator projection with latitude of origin 0, after C. F. F. Karney,
// "Transverse Mercator with an accuracy of a few nanometers", J. Geodesy 85
// (2011) 475-485, eqs. (7), (36) and (19)-(21).
type transverseMercator struct {
	e    float64              // first eccentricity
	k0A  float64              // central scale times the rectifying radius A
	beta [krugerOrder]float64 // β_j of eq. (36), from n = f/(2-f)
}

func newTransverseMercator(a, f, k0 float64) transverseMercator {
	n := f / (2 - f)
	n2 := n * n
	n3 := n2 * n
	n4, n5, n6 := n2*n2, n3*n2, n3*n3
	return transverseMercator{
		e:   math.Sqrt(f * (2 - f)),
		k0A: k0 * a / (1 + n) * (1 + n2/4 + n4/64 + n6/256),
		beta: [krugerOrder]float64{
			n/2 - 2*n2/3 + 37*n3/96 - n4/360 - 81*n5/512 + 96199*n6/604800,
			n2/48 + n3/15 - 437*n4/1440 + 46*n5/105 - 1118711*n6/3870720,
			17*n3/480 - 37*n4/840 - 209*n5/4480 + 5569*n6/90720,
			4397*n4/161280 - 11*n5/504 - 830251*n6/7257600,
			4583*n5/161280 - 108847*n6/3991680,
			20648693 * n6 / 638668800,
		},
	}
}

// inverse maps grid offsets from the natural origin (metres east of the
// central meridian, metres north of the equator) to latitude and longitude
// difference from the central meridian, both in degrees.
func (t transverseMercator) inverse(x, y float64) (lat, dlon float64) {
	xi, eta := y/t.k0A, x/t.k0A
	// Undo the Krüger series to reach the spherical (conformal) TM plane.
	xip, etap := xi, eta
	for j, b := range t.beta {
		k := 2 * float64(j+1)
		xip -= b * math.Sin(k*xi) * math.Cosh(k*eta)
		etap -= b * math.Cos(k*xi) * math.Sinh(k*eta)
	}
	sinhEtap, cosXip := math.Sinh(etap), math.Cos(xip)
	taup := math.Sin(xip) / math.Hypot(sinhEtap, cosXip)
	return radToDeg(math.Atan(t.tauFromConformal(taup))), radToDeg(math.Atan2(sinhEtap, cosXip))
}

// conformalTau is τ' = tan(conformal latitude) for τ = tan(latitude), eq. (7),
// written with hypot and atanh so it stays accurate up to the poles.
func (t transverseMercator) conformalTau(tau float64) float64 {
	sigma := math.Sinh(t.e * math.Atanh(t.e*tau/math.Hypot(1, tau)))
	return tau*math.Hypot(1, sigma) - sigma*math.Hypot(1, tau)
}

// tauFromConformal inverts conformalTau by Newton's method, eqs. (19)-(21).
// Convergence is quadratic from τ'/(1-e²), so once a step drops below
// √ε/10 the next one is already below rounding.
func (t transverseMercator) tauFromConformal(taup float64) float64 {
	const maxSteps = 5
	e2m := 1 - t.e*t.e
	tol := math.Sqrt(0x1p-52) / 10 * math.Max(1, math.Abs(taup))
	tau := taup / e2m
	for range maxSteps {
		tp := t.conformalTau(tau)
		step := (taup - tp) / math.Hypot(1, tp) *
			(1 + e2m*tau*tau) / (e2m * math.Hypot(1, tau))
		tau += step
		if math.Abs(step) < tol {
			break
		}
	}
	return tau
}
