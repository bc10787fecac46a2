package ping

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// RFC 3339 offsets are time-hour ":" time-minute, 00-23 and 00-59. Go's
// parser takes +24:00 and +23:60 (a whole day), so such a timestamp was
// read as the previous day and keyed into that day's bucket instead of
// being refused as unreadable.
func TestAnOffsetOutOfRangeIsRefused(t *testing.T) {
	now := time.Date(2026, 8, 8, 12, 10, 0, 0, time.UTC)
	p := NewParser().Prepared()
	for _, at := range []string{
		"2026-08-08T12:00:00+24:00", "2026-08-08T12:00:00-24:00", "2026-08-08T12:00:00+23:60",
		"2026-08-08T12:00:00+00:60", "2026-08-08T12:00:00+2400", "2026-08-08T12:00:00.5+24:00",
	} {
		got, err := p.Parse([]byte(`{"asset_id":"a","occurred_at":"`+at+`","lat":52.5,"lon":13.4}`), now)
		var invalid *InvalidPingError
		if !errors.As(err, &invalid) || invalid.Rule != RuleTimeFormat || invalid.Field != "occurred_at" {
			t.Errorf("%s: read as %s (err %v), want 422 occurred_at time_format", at, got.Time, err)
		}
	}
	// The valid extremes still parse.
	for _, at := range []string{"2026-08-08T12:00:00+23:59", "2026-08-08T12:00:00-23:59", "2026-08-08T12:00:00+0000", "2026-08-08T14:00:00+02:00"} {
		if _, err := p.Parse([]byte(`{"asset_id":"a","occurred_at":"`+at+`","lat":52.5,"lon":13.4}`), now.Add(24*time.Hour)); err != nil {
			t.Errorf("%s: %v", at, err)
		}
	}
}

// RFC 3339 (section 5.6, the note under its grammar) lets a timestamp put
// a space between the date and the time, and that is what Python's
// str(datetime) writes for an aware time: "2026-08-08 12:00:00+00:00".
// Traccar reads none (its OsmAnd decoder takes a time without a T as local
// and fails on the offset), so it stays refused, but saying what to send:
// it was refused as "not an RFC 3339 timestamp" (helper 2's finding), and
// accepted, it was keyed at an instant Traccar never stores (helper 6's).
func TestASpaceSeparatedTimestampWithAnOffsetIsRefusedSayingWhatToSend(t *testing.T) {
	p := NewParser()
	now := time.Date(2026, 8, 8, 12, 1, 0, 0, time.UTC)
	for ts, want := range map[string]string{
		"2026-08-08 12:00:00+00:00":        "2026-08-08T12:00:00+00:00",
		"2026-08-08 14:00:00.000000+02:00": "2026-08-08T14:00:00.000000+02:00",
		"2026-08-08 12:00:00Z":             "2026-08-08T12:00:00Z",
	} {
		body := []byte(`{"asset_id":"a","occurred_at":"` + ts + `","lat":52.52,"lon":13.40}`)
		_, err := p.Parse(body, now)
		var invalid *InvalidPingError
		if !errors.As(err, &invalid) || invalid.Rule != RuleTimeFormat || !strings.Contains(err.Error(), "send it as \""+want+"\"") {
			t.Errorf("%q: got %v; want it refused (time_format), saying to send %q", ts, err, want)
		}
	}
}
