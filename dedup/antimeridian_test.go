package dedup

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/uber/h3-go/v4"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/geo"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// A ship or a parked asset on the antimeridian (Fiji, Chukotka, Taveuni)
// whose fixes jitter a metre or two either side of ±180° is parked: in
// sliding and session it is admitted once, like any other parked asset,
// not at every fix that crosses the seam.
func TestParkedAssetOnTheAntimeridianIsJitter(t *testing.T) {
	const lat = -16.8
	east, west := 179.99999, -179.99999 // about 2 m apart
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		accepted := 0
		for i := range 30 {
			lon := east
			if i%2 == 1 {
				lon = west
			}
			if v := d.settled(t, at(time.Duration(10*i)*time.Second, lat, lon)); v.Decision == Accepted {
				accepted++
			}
		}
		if accepted != 1 {
			t.Fatalf("a parked asset jittering 2 m across ±180° over 5 minutes: %d admissions, want 1", accepted)
		}
	})
}

// The same jitter across the antimeridian, at fixes whose longitudes a
// sender writes as 180 and -180 (the same meridian).
func TestPlusAndMinus180AreTheSamePlace(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		d.settled(t, at(0, 10, 180))
		if v := d.settled(t, at(10*time.Second, 10, -180)); v.Decision != Suppressed {
			t.Fatalf("lon -180 ten seconds after lon 180 at the same latitude: %+v, want suppressed", v)
		}
	})
}

// Wrapping must not hide a real move: a ship steaming east across ±180°
// at 10 m/s is admitted at every 100 m, each side of the seam.
func TestAMoveAcrossTheAntimeridianIsAdmitted(t *testing.T) {
	const lat = -16.8
	const step = 100 / (metresPerDegree * 0.957319497532067) // 100 m of longitude at -16.8°
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		for i := range 8 {
			lon := geo.WrapLongitude(179.9965 + float64(i)*step)
			if v := d.settled(t, withSpeed(at(time.Duration(10*i)*time.Second, lat, lon), 10)); v.Decision != Accepted {
				t.Fatalf("fix %d at lon %v, 100 m on from the last: %+v, want accepted", i, lon, v)
			}
		}
	})
}

// nearPole is a ping r metres from the North Pole on meridian lon, sec
// seconds into the test.
func nearPole(sec, r, lon float64) ping.Ping {
	return at(time.Duration(sec*float64(time.Second)), 90-r/metresPerDegree, lon)
}

// Near a pole the plane tangent at a fix measures a point across the pole
// up to a fifth short: a vehicle parked 36 m from the North Pole (a camp on
// the sea ice, the vehicles of a station at the South Pole) that moved to
// 10.8 m from it on another meridian, 42 m from its last accepted fix on
// H3's sphere, was suppressed against a lag bound of 37.5 m (1.5 radii),
// and a fix of 95 m accuracy 113 m away against its 95. Within a degree of
// a pole, distances are measured in polar coordinates, in Go and in Lua
// alike. (Helper 3's review, stop 66.)
func TestAFixAcrossThePoleIsJudgedByItsTrueDistance(t *testing.T) {
	for _, tc := range []struct {
		name            string
		parkedR, fixR   float64 // metres from the pole
		accuracy, bound float64 // the fix's accuracy, and its lag bound
	}{
		{"a satellite fix, accuracy 34 m", 36, 10.8, 34, LagFactor * DefaultRadius},
		{"a poor fix, accuracy 95 m", 96, 28.8, 95, 95},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachTrackShape(t, func(t *testing.T, d *testDeduper) {
				parked := nearPole(0, tc.parkedR, 0)
				for i := range 6 {
					p := withAccuracy(nearPole(float64(10*i), tc.parkedR, 0), 5)
					d.clock = p.Time
					d.settled(t, p)
				}
				moved := withAccuracy(nearPole(61, tc.fixR, 120), tc.accuracy)
				d.clock = moved.Time
				dist := h3.GreatCircleDistanceM(h3.NewLatLng(parked.Lat, parked.Lon), h3.NewLatLng(moved.Lat, moved.Lon))
				if v := d.settled(t, moved); v.Decision != Accepted && dist > tc.bound {
					t.Fatalf("a fix %.1f m (great circle) from the last accepted one, past its %.1f m bound: %+v, want accepted", dist, tc.bound, v)
				}
			})
		})
	}
}

// Within the polar cap distances are the great circle's: the polar
// measure agrees with H3's to a part in 10,000 from the pole out to the
// cap's edge, across the pole and along a parallel, where the tangent
// plane was up to a fifth short.
func TestPolarDistancesAreTheGreatCircles(t *testing.T) {
	for _, p := range [][4]float64{
		{89.9996, 0, 89.9999, 120},    // across the pole, metres from it
		{89.99, 10, 89.9905, 11},      // a kilometre out
		{89.2, -170, 89.2003, 170},    // near the cap's edge, across ±180°
		{-89.9997, 45, -89.9995, -90}, // the South Pole
	} {
		f := fix{trackPoint: trackPoint{lat: p[0], lon: p[1]}, kx: math.Cos(p[0]*math.Pi/180) * metresPerDegree}
		got := math.Sqrt(f.distance2(p[2], p[3]))
		want := h3.GreatCircleDistanceM(h3.NewLatLng(p[0], p[1]), h3.NewLatLng(p[2], p[3]))
		if math.Abs(got-want) > want*1e-4 {
			t.Errorf("(%v, %v) to (%v, %v): %.4f m, want the great circle's %.4f", p[0], p[1], p[2], p[3], got, want)
		}
	}
}

// The stores agree near the pole, where both measure in polar
// coordinates (Go's math.Sin and Lua's C sin): fixes within 100 m of the
// North Pole on any meridian, of any accuracy a phone gives, decided one
// by one by each store, get the same verdicts.
func TestStoresAgreeNearThePole(t *testing.T) {
	for _, shape := range []Shape{Sliding, Session} {
		t.Run(string(shape), func(t *testing.T) {
			mem, red := newTestDeduper(NewMemoryStore(0), shape), newTestDeduper(newRedisStore(t, redistest.Start(t)), shape)
			rng := rand.New(rand.NewPCG(66, uint64(len(shape))))
			for i := range 300 {
				p := withAccuracy(nearPole(float64(5*i), 100*rng.Float64()*rng.Float64(), 360*rng.Float64()-180), 3+40*rng.Float64())
				mem.clock, red.clock = p.Time, p.Time
				if a, b := mem.settled(t, p), red.settled(t, p); a.Decision != b.Decision || a.Reason != b.Reason {
					t.Fatalf("fix %d (%.7f, %.7f): memory %+v, Redis %+v", i, p.Lat, p.Lon, a, b)
				}
			}
		})
	}
}

// A still fix (speed 0, accuracy 5 m) of a vehicle parked 19 m from the
// North Pole, at its lag bound (1.5 radii) from the last accepted fix on
// another meridian, was judged on one side of the bound by the memory
// store and on the other by Redis: each measured with its own sine (Go's
// math.Sin, the C library's sin in Redis's Lua), and they differ in the
// last bit for about one argument in six. Both now compute it alike
// (sine). (Helper 7's review, stop 66.)
func TestStoresAgreeOnAFixAtTheLagBoundNearThePole(t *testing.T) {
	for _, c := range [][2]float64{
		{89.999828769359226, 159.97438185526374},
		{89.99982804990276, 157.41982025612089},
		{89.999825531805101, 150.25297426211523},
		{89.999821934522728, 142.51410816134725},
	} {
		for _, shape := range []Shape{Sliding, Session} {
			mem, red := newTestDeduper(NewMemoryStore(0), shape), newTestDeduper(newRedisStore(t, redistest.Start(t)), shape)
			for i := range 6 {
				p := withAccuracy(at(time.Duration(10*i)*time.Second, c[0], 0), 5)
				mem.clock, red.clock = p.Time, p.Time
				mem.settled(t, p)
				red.settled(t, p)
			}
			p := withSpeed(withAccuracy(at(61*time.Second, c[0], c[1]), 5), 0)
			mem.clock, red.clock = p.Time, p.Time
			if a, b := mem.settled(t, p), red.settled(t, p); a.Decision != b.Decision || a.Reason != b.Reason {
				t.Errorf("%s: a still fix %.12f m from the last accepted one (lag bound %.1f m), at (%v, %v): memory %+v, Redis %+v",
					shape, math.Sqrt(polarSeparation2(c[0], 0, c[0], c[1])), LagFactor*DefaultRadius, c[0], c[1], a, b)
			}
		}
	}
}

// sine is the sine, to a part in 10¹³, over the half-angles of every
// longitude difference.
func TestSineIsTheSine(t *testing.T) {
	for d := -180.0; d <= 180; d += 0.37 {
		x := d * halfRadian
		if got, want := sine(x), math.Sin(x); math.Abs(got-want) > 1e-13 {
			t.Errorf("sine(%v) = %v, want %v", x, got, want)
		}
	}
}
