package main

import (
	"strings"
	"testing"
)

// A flag out of range is refused, naming it: the Config reads a negative
// value as none and a zero as its default, so -sigma -3 ran without noise,
// -seed 0 ran seed 1, and -parked 0-10m parked 5 to 10 minutes, all
// without a word.
func TestParseFlagsRefusesValuesOutOfRange(t *testing.T) {
	for _, tt := range []struct {
		flags []string
		err   string // "" means accepted
	}{
		{[]string{"-sigma", "-3"}, "-sigma -3"},
		{[]string{"-multipath", "-0.5"}, "-multipath -0.5"},
		{[]string{"-heading-drift", "-1"}, "-heading-drift -1"},
		{[]string{"-redeliveries", "-0.1"}, "-redeliveries -0.1"},
		{[]string{"-offline", "-0.1"}, "-offline -0.1"},
		{[]string{"-assets", "0"}, "-assets 0"},
		{[]string{"-duration", "0s"}, "-duration 0s"},
		{[]string{"-cadence", "0s"}, "-cadence 0s"},
		{[]string{"-seed", "0"}, "-seed 0"},
		{[]string{"-parked", "0s-10m"}, "-parked 0s-10m"},
		{[]string{"-driving", "0s-10m"}, "-driving 0s-10m"},
		{[]string{"-offline-duration", "0s-30m"}, "-offline-duration 0s-30m"},
		{[]string{"-multipath-sigmas", "0-8"}, "-multipath-sigmas 0-8"},
		{[]string{"-driving-speed", "0"}, "-driving-speed 0"},
		{[]string{"-redelivery-max-delay", "0s"}, "-redelivery-max-delay 0s"},
		{[]string{"-max-batch", "0"}, "-max-batch 0"},
		{[]string{"-window", "0s"}, "-window 0s"},
		{[]string{"-lost-move", "0"}, "-lost-move 0"},
		{[]string{"-conns", "0"}, "-conns 0"},
		// 0 switches these off, as documented.
		{[]string{"-sigma", "0", "-multipath", "0", "-heading-drift", "0", "-redeliveries", "0", "-offline", "0"}, ""},
		{[]string{"-driving-speed", "0-10"}, ""},
		{nil, ""},
	} {
		t.Run(strings.Join(tt.flags, " "), func(t *testing.T) {
			_, _, err := parseFlags(tt.flags)
			if tt.err == "" && err != nil || tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)) {
				t.Errorf("got %v, want %q", err, tt.err)
			}
		})
	}
}
