// Package nmea reads the real GPS traces in testdata/traces, recorded as
// NMEA 0183, into fixes, so that tests in every package replay the same
// devices.
package nmea

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// The real traces (see testdata/traces/SOURCES.md).
const (
	// CarTrace is a u-blox F9K in a car in Mountain View, 1 Hz, with loops
	// and stop-and-go: RTK-grade, sub-metre parked jitter.
	CarTrace = "ublox-f9k-car-mountain-view-2020-rmc-gga.nmea"
	// ParkedTrace is a consumer receiver standing still in Amsterdam for
	// 20 minutes at 1 Hz: median jitter 5 m, p95 20 m.
	ParkedTrace = "signalk-gps-stationary-amsterdam-2014.nmea"
)

// knotsToMS converts the RMC speed over ground.
const knotsToMS = 1852.0 / 3600

// Fix is one valid RMC sentence.
type Fix struct {
	// Time is the fix's UTC time.
	Time time.Time
	// Lat and Lon are WGS 84 degrees.
	Lat, Lon float64
	// SpeedMS is the speed over ground the receiver reported, in m/s.
	SpeedMS float64
}

// Path returns the path of a trace in testdata/traces, wherever the test
// that asks runs from.
func Path(trace string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "testdata", "traces", trace)
}

// ReadRMC returns the valid fixes ($..RMC with status A) of a trace.
func ReadRMC(trace string) ([]Fix, error) {
	f, err := os.Open(Path(trace))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readRMC(f, trace)
}

// readRMC reads the valid fixes of a recording. A sentence whose checksum
// does not match was garbled on the wire, as a receiver's serial line
// does now and then: it is skipped, as a receiver's reader would.
func readRMC(r io.Reader, name string) ([]Fix, error) {
	var fixes []Fix
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		sentence, ok := checked(strings.TrimSpace(sc.Text()))
		if !ok {
			continue
		}
		fields := strings.Split(sentence, ",")
		if len(fields) < 10 || !strings.HasSuffix(fields[0], "RMC") || fields[2] != "A" {
			continue
		}
		fix, err := rmcFix(fields)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %v", name, line, err)
		}
		fixes = append(fixes, fix)
	}
	return fixes, sc.Err()
}

// checked returns a sentence without its checksum, and whether the
// checksum (the XOR of the bytes between $ and *) matches; a sentence
// without one is taken as it is.
func checked(line string) (string, bool) {
	star := strings.LastIndexByte(line, '*')
	if star < 0 {
		return line, true
	}
	want, err := strconv.ParseUint(line[star+1:], 16, 8)
	if err != nil {
		return "", false
	}
	var sum byte
	for i := 1; i < star; i++ { // after the $
		sum ^= line[i]
	}
	return line[:star], sum == byte(want)
}

func rmcFix(fields []string) (Fix, error) {
	at, err := time.Parse("020106 150405", fields[9]+" "+fields[1][:6])
	if err != nil {
		return Fix{}, err
	}
	frac, _ := strconv.ParseFloat("0"+fields[1][6:], 64)
	knots, _ := strconv.ParseFloat(fields[7], 64)
	lat, err := degrees(fields[3], fields[4])
	if err != nil {
		return Fix{}, err
	}
	lon, err := degrees(fields[5], fields[6])
	if err != nil {
		return Fix{}, err
	}
	return Fix{Time: at.Add(time.Duration(frac * float64(time.Second))), Lat: lat, Lon: lon, SpeedMS: knots * knotsToMS}, nil
}

// degrees reads ddmm.mmmm (or dddmm.mmmm) with its hemisphere.
func degrees(v, hemisphere string) (float64, error) {
	dot := strings.IndexByte(v, '.')
	if dot < 2 {
		return 0, fmt.Errorf("NMEA coordinate %q", v)
	}
	deg, err1 := strconv.ParseFloat(v[:dot-2], 64)
	minutes, err2 := strconv.ParseFloat(v[dot-2:], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("NMEA coordinate %q", v)
	}
	d := deg + minutes/60
	if hemisphere == "S" || hemisphere == "W" {
		d = -d
	}
	return d, nil
}
