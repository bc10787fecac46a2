package ping

import (
	"fmt"
	"strings"
	"time"
)

// span says how far from is from to, for a person: "6m", "3h20m",
// "12 days", "56 years". It works from the calendar dates rather than
// time.Time.Sub, which stops at 292 years and would print the year 9999
// as "2562047h47m16.854775807s".
func span(from, to time.Time) string {
	seconds := to.Unix() - from.Unix()
	const day = 24 * 60 * 60
	switch {
	case seconds < 2*day:
		return readable(to.Sub(from))
	case seconds < 2*365*day:
		return fmt.Sprintf("%d days", seconds/day)
	}
	years := to.Year() - from.Year()
	if to.YearDay() < from.YearDay() {
		years--
	}
	return fmt.Sprintf("%d years", years)
}

// readable prints a duration without the zero units Duration.String adds
// ("5m", not "5m0s"), to the second, or in days from two days on.
func readable(d time.Duration) string {
	const day = 24 * time.Hour
	if d >= 2*day {
		if d%day == 0 {
			return fmt.Sprintf("%d days", d/day)
		}
		return fmt.Sprintf("%.1f days", float64(d)/float64(day))
	}
	if d >= time.Second {
		d = d.Round(time.Second)
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
