package dedup

import (
	"fmt"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// Shape is how the window is laid over an asset's pings.
type Shape string

// The window shapes.
const (
	// Tumbling puts the time bucket in the key: stateless, one write per
	// ping. Two pings seconds apart across a bucket boundary are both
	// admitted; that is its price.
	Tumbling Shape = "tumbling"
	// Sliding judges each ping against where its asset stays: at the stay,
	// it is suppressed for a window of device time after the last accepted
	// ping there, across bucket boundaries.
	Sliding Shape = "sliding"
	// Session opens a new session after a gap of more than SessionIdle of
	// device time; inside a session, pings at the stay are suppressed
	// however long the burst.
	Session Shape = "session"
)

// Shapes lists every Shape, for error messages.
var Shapes = []Shape{Tumbling, Sliding, Session}

// ParseShape returns the Shape named s, or an error listing the shapes.
func ParseShape(s string) (Shape, error) {
	return ping.ParseName("shape", s, Shapes)
}

// DefaultSessionIdle is the device-time gap that opens a new session.
const DefaultSessionIdle = 10 * time.Minute

// Policy is how claims are judged. It is the same for every ping of one
// handler.
type Policy struct {
	// Shape is the window shape.
	Shape Shape
	// Window is the tumbling bucket width, for Sliding how long the same
	// place stays suppressed after the last accepted ping, and for Session
	// how long after an accepted ping off the stay the backend is told
	// where the asset stays (see trackState.offStay).
	Window time.Duration
	// SessionIdle is the gap that opens a new session (Session only).
	SessionIdle time.Duration
	// Radius, in metres, is how far from its stay's anchor a fix still
	// counts as the same place (Sliding and Session only): above the GPS
	// jitter of a parked asset, below the moves the backend must see.
	Radius float64
	// TTL is how long a claim lives in the store.
	TTL time.Duration
	// InFlightTimeout is how long an unsettled claim counts as in flight.
	InFlightTimeout time.Duration
}

// maxRadius bounds the radius: a stay wider than this swallows whole
// streets, and what a fix at such a distance reports is a move.
const maxRadius = 1000.0

// Check reports a Policy that contradicts itself, naming the option to fix.
func (p Policy) Check() error {
	if p.Shape == Session && p.SessionIdle <= 0 {
		return &ConfigError{Option: "session_idle", Problem: fmt.Sprintf("%s is not positive; use the device-time gap that ends a burst, e.g. 10m", p.SessionIdle)}
	}
	if err := CheckSeconds("session_idle", p.SessionIdle, "10m"); err != nil {
		return err
	}
	if p.Shape != Tumbling && !(p.Radius > 0 && p.Radius <= maxRadius) { // also refuses NaN
		return &ConfigError{Option: "radius", Problem: fmt.Sprintf(
			"%gm is not a distance a stay can have; use metres above your receivers' parked jitter, such as the default %gm (at most %gm)",
			p.Radius, DefaultRadius, maxRadius)}
	}
	return nil
}
