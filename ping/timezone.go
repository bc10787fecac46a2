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
// loc: what Traccar does with "yyyy-MM-dd HH:mm:ss", in its JVM's zone. A
// wall-clock time the zone passes twice (the hour its clock is set back)
// is read as the later instant, with how much earlier the other is:
// Parser.AtServerClock chooses between them.
func parseLocalTime(s string, loc *time.Location, field string) (time.Time, time.Duration, error) {
	for _, layout := range naiveLayouts {
		if wall, err := time.Parse(layout, s); err == nil {
			earliest, latest := readingsOf(wall, loc)
			return latest, latest.Sub(earliest), nil
		}
	}
	return time.Time{}, 0, invalid(field, RuleTimeFormat, "%q is not a timestamp such as \"2026-08-08 12:00:00\"", s)
}

// readingsOf returns the first and last instant at which loc's clocks
// show wall (a wall-clock time, read as UTC): two in the hour the clock is
// set back, else one. A zone's offsets three hours either side of a
// reading are the ones its clock can have changed between. A time the
// clock skips when it is set forward (a device that changes its clock
// late) is read with the offset in force before the change, as Traccar's
// SimpleDateFormat reads it: Go's time.Date leaves the choice open, and
// made it east of UTC, but read New York's 02:30 an hour early, in the
// bucket of the device's pings of an hour before.
func readingsOf(wall time.Time, loc *time.Location) (earliest, latest time.Time) {
	first := time.Date(wall.Year(), wall.Month(), wall.Day(), wall.Hour(), wall.Minute(), wall.Second(), wall.Nanosecond(), loc).UTC()
	if !showsWall(first, loc, wall) {
		_, before := first.Add(-3 * time.Hour).In(loc).Zone()
		at := wall.Add(-time.Duration(before) * time.Second)
		return at, at
	}
	earliest, latest = first, first
	for _, probe := range []time.Time{first.Add(-3 * time.Hour), first.Add(3 * time.Hour)} {
		_, offset := probe.In(loc).Zone()
		at := wall.Add(-time.Duration(offset) * time.Second)
		if !showsWall(at, loc, wall) {
			continue
		}
		if at.Before(earliest) {
			earliest = at
		}
		if at.After(latest) {
			latest = at
		}
	}
	return earliest, latest
}

// showsWall reports whether loc's clocks show wall at the instant at.
func showsWall(at time.Time, loc *time.Location, wall time.Time) bool {
	local := at.In(loc)
	y, mo, d := local.Date()
	h, mi, sec := local.Clock()
	return time.Date(y, mo, d, h, mi, sec, local.Nanosecond(), time.UTC).Equal(wall)
}
