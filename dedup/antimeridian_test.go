package dedup

import (
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/geo"
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
