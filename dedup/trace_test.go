package dedup

import (
	"context"
	"math"
	"testing"

	"github.com/uber/h3-go/v4"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/geo"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/nmea"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// The real GPS traces of testdata/traces: a car in Mountain View at 1 Hz
// with loops and stop-and-go, and a consumer receiver standing still in
// Amsterdam.
const (
	carTrace    = nmea.CarTrace
	parkedTrace = nmea.ParkedTrace
)

// traceFix is one fix of a trace, as a ping of the asset named after the trace.
type traceFix struct {
	ping.Ping
	knots float64
}

func readRMC(t *testing.T, trace string) []traceFix {
	t.Helper()
	rmc, err := nmea.ReadRMC(trace)
	if err != nil {
		t.Fatal(err)
	}
	fixes := make([]traceFix, len(rmc))
	for i, f := range rmc {
		fixes[i] = traceFix{Ping: ping.Ping{Asset: trace, Time: f.Time, Lat: f.Lat, Lon: f.Lon}, knots: f.SpeedMS / 0.514444}
	}
	return fixes
}

// replayStats is what one shape made of a trace.
type replayStats struct {
	admitted, suppressed int
	// farSuppressed counts moving fixes (over 1 m/s) suppressed although
	// they lie more than two cell widths from the last admitted fix.
	farSuppressed  int
	minFar, maxFar float64
}

func replay(t *testing.T, fixes []traceFix, pol *Policy) replayStats {
	t.Helper()
	d := newTestDeduper(NewMemoryStore(0), pol.Shape)
	d.Policy = *pol
	twoCells := 4 * h3.HexagonEdgeLengthAvgM(DefaultResolution)
	var st replayStats
	var last ping.Ping
	for _, f := range fixes {
		d.clock = f.Time
		c, v := d.claim(t, f.Ping)
		if v.Decision == Accepted {
			d.Settle(context.Background(), c)
			st.admitted++
			last = f.Ping
			continue
		}
		st.suppressed++
		if dist := geo.DistanceM(f.Lat, f.Lon, last.Lat, last.Lon); f.knots*0.514444 > 1 && dist > twoCells {
			st.farSuppressed++
			st.maxFar = math.Max(st.maxFar, dist)
			if st.minFar == 0 || dist < st.minFar {
				st.minFar = dist
			}
		}
	}
	return st
}

// Tumbling cannot tell a return to a cell from a re-observation: on the
// real drive it suppresses moving fixes tens of metres from the last
// admitted one, because the car passed those cells earlier in the bucket.
// Sliding and session compare with the last accepted place, so no moving
// fix is suppressed farther than two cell widths from it.
func TestCarDriveReturnsToACellAreAdmitted(t *testing.T) {
	fixes := readRMC(t, carTrace)
	if len(fixes) != 1653 {
		t.Fatalf("read %d fixes, want the 1653 of the trace", len(fixes))
	}
	for _, tt := range []struct {
		shape Shape
	}{
		{Tumbling}, {Sliding}, {Session},
	} {
		pol := testPolicy(tt.shape)
		st := replay(t, fixes, pol)
		t.Logf("%-8s %d admitted, %d suppressed, %d moving fixes suppressed beyond two cells (%.0f–%.0f m)",
			tt.shape, st.admitted, st.suppressed, st.farSuppressed, st.minFar, st.maxFar)
		if tt.shape == Tumbling {
			if st.farSuppressed == 0 {
				t.Errorf("tumbling suppressed no distant moving fix; the trace should show its blind spot")
			}
			continue
		}
		if st.farSuppressed != 0 {
			t.Errorf("%s suppressed %d moving fixes beyond two cell widths (up to %.0f m) from the last accepted one",
				tt.shape, st.farSuppressed, st.maxFar)
		}
	}
}

// On a consumer receiver standing still (median jitter 5 m, p95 20 m, a
// slow wander of 20 m over the twenty minutes), the shapes collapse 1,201
// fixes at 1 Hz to a handful: sliding and session judge them against the
// stay and admit one per window at most (sliding's fifth is the fix at
// exactly 20:00, four windows after the first), tumbling flaps across cell
// edges.
func TestParkedReceiverCollapses(t *testing.T) {
	fixes := readRMC(t, parkedTrace)
	windows := float64(fixes[len(fixes)-1].Time.Sub(fixes[0].Time)) / float64(DefaultWindow)
	for _, shape := range Shapes {
		st := replay(t, fixes, testPolicy(shape))
		perWindow := float64(st.admitted) / windows
		t.Logf("%-8s %d fixes: %d admitted, %.2f per window", shape, len(fixes), st.admitted, perWindow)
		if st.admitted*5 > len(fixes) {
			t.Errorf("%s admitted %d of %d fixes from a receiver that never moved", shape, st.admitted, len(fixes))
		}
		if shape != Tumbling && perWindow > 1.25 {
			t.Errorf("%s admitted %.2f per window from a parked receiver, want at most 1.25", shape, perWindow)
		}
	}
}
