package fleetsim

import (
	"testing"
)

// Validate accepts any Center longitude in [-180, 180], so a fleet near the
// antimeridian (Fiji, Chukotka, the Aleutians) is a valid Config. Its
// assets' positions must stay valid WGS 84 longitudes as they start, drive
// and scatter across it: a longitude beyond ±180 is a 422 from the module,
// which ends an HTTP run as an unexpected answer, and is never a position a
// receiver reports.
func TestLongitudesStayWithinRangeAcrossTheAntimeridian(t *testing.T) {
	for _, center := range []LatLon{{Lat: -17.8, Lon: 179.99}, {Lat: 52, Lon: -179.99}, {Lat: 0, Lon: 180}} {
		cfg := quiet()
		cfg.SigmaM = 3
		cfg.Center = center
		if err := cfg.Validate(); err != nil {
			t.Fatalf("center %v: %v", center, err)
		}
		bad, worst := 0, 0.0
		for _, p := range originals(Generate(cfg)) {
			if p.Lon < -180 || p.Lon > 180 {
				bad++
				if abs := max(p.Lon, -p.Lon); abs > worst {
					worst = abs
				}
			}
		}
		if bad > 0 {
			t.Errorf("center %v: %d pings with a longitude outside [-180, 180], up to |%.6f|", center, bad, worst)
		}
	}
}
