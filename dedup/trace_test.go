package dedup

import (
	"bufio"
	"context"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/uber/h3-go/v4"
)

// Real GPS traces in testdata/ (see testdata/SOURCES.md): a car in Mountain
// View at 1 Hz with loops and stop-and-go, and a consumer receiver standing
// still in Amsterdam.
const (
	carTrace    = "testdata/ublox-f9k-car-mountain-view-2020-rmc-gga.nmea"
	parkedTrace = "testdata/signalk-gps-stationary-amsterdam-2014.nmea"
)

// fix is one valid RMC sentence.
type fix struct {
	Ping
	knots float64
}

// readRMC returns the valid ($..RMC with status A) fixes of an NMEA file.
func readRMC(t *testing.T, path string) []fix {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var fixes []fix
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(strings.TrimSpace(sc.Text()), ",")
		if len(fields) < 10 || !strings.HasSuffix(fields[0], "RMC") || fields[2] != "A" {
			continue
		}
		at, err := time.Parse("020106 150405", fields[9]+" "+fields[1][:6])
		if err != nil {
			t.Fatalf("%s: %v", sc.Text(), err)
		}
		frac, _ := strconv.ParseFloat("0"+fields[1][6:], 64)
		knots, _ := strconv.ParseFloat(fields[7], 64)
		fixes = append(fixes, fix{
			Ping: Ping{
				Asset: path,
				Time:  at.Add(time.Duration(frac * float64(time.Second))),
				Lat:   nmeaDegrees(t, fields[3], fields[4]),
				Lon:   nmeaDegrees(t, fields[5], fields[6]),
			},
			knots: knots,
		})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return fixes
}

// nmeaDegrees reads ddmm.mmmm (or dddmm.mmmm) with its hemisphere.
func nmeaDegrees(t *testing.T, v, hemisphere string) float64 {
	dot := strings.IndexByte(v, '.')
	deg, err1 := strconv.ParseFloat(v[:dot-2], 64)
	min, err2 := strconv.ParseFloat(v[dot-2:], 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("NMEA coordinate %q", v)
	}
	d := deg + min/60
	if hemisphere == "S" || hemisphere == "W" {
		d = -d
	}
	return d
}

// replayStats is what one shape made of a trace.
type replayStats struct {
	admitted, suppressed int
	// farSuppressed counts moving fixes (over 1 m/s) suppressed although
	// they lie more than two cell widths from the last admitted fix.
	farSuppressed  int
	minFar, maxFar float64
}

func replay(t *testing.T, fixes []fix, pol *Policy) replayStats {
	t.Helper()
	d := newTestDeduper(NewMemoryStore(0), pol.Shape)
	d.Policy = *pol
	twoCells := 4 * h3.HexagonEdgeLengthAvgM(DefaultResolution)
	var st replayStats
	var last Ping
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
		if dist := distanceM(f.Lat, f.Lon, last.Lat, last.Lon); f.knots*0.514444 > 1 && dist > twoCells {
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
		shape      Shape
		hysteresis float64
	}{
		{Tumbling, 0}, {Sliding, 0}, {Sliding, 5}, {Session, 0}, {Session, 5},
	} {
		pol := testPolicy(tt.shape)
		pol.Hysteresis = tt.hysteresis
		st := replay(t, fixes, pol)
		t.Logf("%-8s hysteresis %gm: %d admitted, %d suppressed, %d moving fixes suppressed beyond two cells (%.0f–%.0f m)",
			tt.shape, tt.hysteresis, st.admitted, st.suppressed, st.farSuppressed, st.minFar, st.maxFar)
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

// On a consumer receiver standing still (median jitter 5 m, p95 20 m), the
// shapes collapse twenty minutes of 1 Hz fixes to a handful.
func TestParkedReceiverCollapses(t *testing.T) {
	fixes := readRMC(t, parkedTrace)
	for _, shape := range Shapes {
		st := replay(t, fixes, testPolicy(shape))
		t.Logf("%-8s %d fixes: %d admitted", shape, len(fixes), st.admitted)
		if st.admitted*5 > len(fixes) {
			t.Errorf("%s admitted %d of %d fixes from a receiver that never moved", shape, st.admitted, len(fixes))
		}
	}
}
