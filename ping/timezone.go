package ping

import (
	"fmt"
	"time"
	// The zone database, built in: a Caddy in a container without
	// /usr/share/zoneinfo (scratch, distroless) would otherwise refuse
	// every time_zone.
	_ "time/tzdata"
)

// ParseTimeZone returns the IANA time zone named s (Europe/Berlin, UTC).
// The name must be explicit: "Local" would make a reading depend on the
// machine Caddy happens to run on.
func ParseTimeZone(s string) (*time.Location, error) {
	if s == "" || s == "Local" {
		return nil, fmt.Errorf("%q is not an explicit time zone; name the zone the devices write their local time in, e.g. Europe/Berlin or UTC", s)
	}
	loc, err := time.LoadLocation(s)
	if err != nil {
		return nil, fmt.Errorf("%v; use an IANA name such as Europe/Berlin or UTC", err)
	}
	return loc, nil
}

// parseLocalTime reads a timestamp without an offset as a local time of
// loc: what Traccar does with "yyyy-MM-dd HH:mm:ss", in its JVM's zone. In
// the hour a clock is set back the reading is ambiguous; Go picks one of
// the two instants.
func parseLocalTime(s string, loc *time.Location, field string) (time.Time, error) {
	for _, layout := range naiveLayouts {
		if t, err := time.ParseInLocation(layout, s, loc); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, invalid(field, RuleTimeFormat, "%q is not a timestamp such as \"2026-08-08 12:00:00\"", s)
}
