package dedup

import (
	"fmt"
	"time"

	"github.com/uber/h3-go/v4"
)

// Shape is how the window is laid over an asset's pings.
type Shape string

// The window shapes.
const (
	// Tumbling puts the time bucket in the key: stateless, one write per
	// ping. Two pings seconds apart across a bucket boundary are both
	// admitted; that is its price.
	Tumbling Shape = "tumbling"
	// Sliding also compares each ping with the asset's last accepted one:
	// the same place less than a window of device time away is suppressed,
	// across bucket boundaries.
	Sliding Shape = "sliding"
	// Session opens a new session after a gap of more than SessionIdle of
	// device time; inside a session, pings in the same place are suppressed
	// however long the burst.
	Session Shape = "session"
)

// Shapes lists every Shape, for error messages.
var Shapes = []Shape{Tumbling, Sliding, Session}

// ParseShape returns the Shape named s, or an error listing the shapes.
func ParseShape(s string) (Shape, error) {
	for _, sh := range Shapes {
		if string(sh) == s {
			return sh, nil
		}
	}
	return "", fmt.Errorf("unknown shape %q: use one of %v", s, Shapes)
}

// DefaultSessionIdle is the device-time gap that opens a new session.
const DefaultSessionIdle = 10 * time.Minute

// Policy is how claims are judged. It is the same for every ping of one
// handler.
type Policy struct {
	// Shape is the window shape.
	Shape Shape
	// Window is the tumbling bucket width, and for Sliding how long the same
	// place stays suppressed after the last accepted ping.
	Window time.Duration
	// SessionIdle is the gap that opens a new session (Session only).
	SessionIdle time.Duration
	// Hysteresis, in metres, makes a fix in a neighbouring cell within this
	// distance of the last accepted fix count as the same place (Sliding and
	// Session only). Zero turns it off.
	Hysteresis float64
	// TTL is how long a claim lives in the store.
	TTL time.Duration
	// InFlightTimeout is how long an unsettled claim counts as in flight.
	InFlightTimeout time.Duration
}

// Check reports a Policy that contradicts itself or the resolution, naming
// the option to fix.
func (p Policy) Check(resolution int) error {
	if p.Shape == Session && p.SessionIdle <= 0 {
		return &ConfigError{Option: "session_idle", Problem: fmt.Sprintf("%s is not positive; use the device-time gap that ends a burst, e.g. 10m", p.SessionIdle)}
	}
	if !(p.Hysteresis >= 0) { // also refuses NaN
		return &ConfigError{Option: "hysteresis", Problem: fmt.Sprintf("%v is not a distance; use metres, or 0 for off", p.Hysteresis)}
	}
	if p.Hysteresis > 0 && p.Shape == Tumbling {
		return &ConfigError{Option: "hysteresis", Problem: "needs shape sliding or session: tumbling keys on the cell alone and keeps no " +
			"last position to measure the distance from, so a neighbouring cell is always a new key"}
	}
	if edge := h3.HexagonEdgeLengthAvgM(resolution); p.Hysteresis > edge {
		return &ConfigError{Option: "hysteresis", Problem: fmt.Sprintf(
			"%gm is wider than a resolution-%d cell edge (%.1fm): real moves shorter than that would be swallowed; "+
				"use at most %.1fm, or a coarser resolution", p.Hysteresis, resolution, edge, edge)}
	}
	return nil
}
