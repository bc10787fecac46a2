package ping

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// Events and states are read from their paths: an event match without
// values holds for any value but null, false and "", one with values for
// those exactly; the first event that matches is the ping's; the states
// present are its state, escaped so that no value spells two fields.
func TestEventsAndStatesAreReadFromTheirFields(t *testing.T) {
	p := NewParser()
	p.Events = []Match{{Path: "alarm"}, {Path: "t", Values: []string{"u", "r"}}, {Path: "n", Values: []string{"1"}}}
	p.States = []string{"ign", "driver.id"}
	p = p.Prepared()
	const base = `"asset_id":"a","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2`
	for _, tt := range []struct{ extra, event, state string }{
		{``, "", ""},
		{`,"alarm":"sos"`, "alarm=sos", ""},
		{`,"alarm":"sos,lowBattery","t":"u"`, "alarm=sos%2ClowBattery", ""},
		{`,"alarm":"","t":"u"`, "t=u", ""},
		{`,"alarm":null,"t":"p"`, "", ""},
		{`,"alarm":false,"n":1`, "n=1", ""},
		{`,"alarm":true`, "alarm=true", ""},
		{`,"n":1.0`, "", ""}, // a number matches as written
		{`,"ign":false`, "", "ign=false"},
		{`,"ign":true,"driver":{"id":"a&b=c"}`, "", "ign=true&driver.id=a%26b%3Dc"},
		{`,"driver":{"id":42}`, "", "driver.id=42"},
	} {
		got, err := p.Parse([]byte("{"+base+tt.extra+"}"), parseNow)
		if err != nil || got.Event != tt.event || got.State != tt.state {
			t.Errorf("%s: event %q state %q (%v); want %q %q", tt.extra, got.Event, got.State, err, tt.event, tt.state)
		}
	}
	// The fields are read where the duplicate-key scan reads: a second
	// alarm would be what the backend sees.
	var me *MalformedError
	if _, err := p.Parse([]byte("{"+base+`,"alarm":"","alarm":"sos"}`), parseNow); !errors.As(err, &me) {
		t.Errorf("duplicate alarm: got %v, want malformed", err)
	}
}

func TestParseMatchAndPlainPaths(t *testing.T) {
	for s, want := range map[string]string{
		"position.attributes.alarm": "position.attributes.alarm",
		"t=u|r|c|b":                 "t=u|r|c|b",
		`a\.b=1`:                    `a\.b=1`,
	} {
		m, err := ParseMatch(s)
		if err != nil || m.String() != want {
			t.Errorf("ParseMatch(%q) = %v, %v", s, m, err)
		}
	}
	for _, s := range []string{"", "t=", "t=u||r", "a..b", "a.", "friends.#.name", "a|@reverse", "*"} {
		if _, err := ParseMatch(s); err == nil {
			t.Errorf("ParseMatch(%q) accepted", s)
		}
	}
}

// Accuracy and speed are what the device reports when it does; anything
// else counts as not reported rather than refusing the position.
func TestAccuracyAndSpeedAreReportedOrNot(t *testing.T) {
	p := NewParser()
	p.AccuracyPath, p.SpeedPath, p.SpeedUnit = "acc", "vel", KilometresPerHour
	p = p.Prepared()
	const base = `"asset_id":"a","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2`
	for _, tt := range []struct {
		extra    string
		accuracy float64
		speed    float64
		hasSpeed bool
	}{
		{``, 0, 0, false},
		{`,"acc":12.5,"vel":36`, 12.5, 10, true},
		{`,"acc":-1,"vel":-1`, 0, 0, false},
		{`,"acc":"12","vel":"36"`, 0, 0, false},
		{`,"vel":0`, 0, 0, true},
		{`,"acc":1e400`, 0, 0, false},
	} {
		got, err := p.Parse([]byte("{"+base+tt.extra+"}"), parseNow)
		if err != nil || got.Accuracy != tt.accuracy || got.HasSpeed != tt.hasSpeed || !near(got.Speed, tt.speed) {
			t.Errorf("%s: accuracy %v speed %v/%v (%v)", tt.extra, got.Accuracy, got.Speed, got.HasSpeed, err)
		}
	}
	for _, u := range SpeedUnits {
		if got, err := ParseSpeedUnit(string(u)); err != nil || got != u {
			t.Errorf("ParseSpeedUnit(%s): %v", u, err)
		}
	}
	if _, err := ParseSpeedUnit("kph"); err == nil {
		t.Error("kph accepted")
	}
}

// A timestamp without an offset is refused, with the fix named, unless a
// time zone says whose local time it is.
func TestTimestampsWithoutAnOffset(t *testing.T) {
	p := NewParser()
	var ie *InvalidPingError
	body := []byte(`{"asset_id":"a","occurred_at":"2026-08-08 11:59:00","lat":1,"lon":2}`)
	if _, err := p.Parse(body, parseNow); !errors.As(err, &ie) || ie.Rule != RuleTimezone || !strings.Contains(ie.Detail, "time_zone") {
		t.Fatalf("got %v, want a timezone error naming time_zone", err)
	}
	berlin, err := ParseTimeZone("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	p.TimeZone = berlin
	got, err := p.Parse(body, parseNow)
	if err != nil || !got.Time.Equal(time.Date(2026, 8, 8, 9, 59, 0, 0, time.UTC)) {
		t.Fatalf("got %v, %v; want 09:59Z (CEST)", got.Time, err)
	}
	for _, bad := range []string{"", "Local", "Mars/Olympus"} {
		if _, err := ParseTimeZone(bad); err == nil {
			t.Errorf("time zone %q accepted", bad)
		}
	}
}

// Records that are not positions, though their kind says so, are not
// pings; nor is an empty body for a format whose app posts them.
func TestRecordsThatAreNotPositions(t *testing.T) {
	for _, tt := range []struct{ preset, body string }{
		{"overland", `{"type":"Feature","geometry":{"type":"Point","coordinates":[1,2]},"properties":{"timestamp":"2026-08-08T11:59:00Z","action":"visit"}}`},
		{"overland", `{"type":"Feature","properties":{"type":"trip","start":"2026-08-08T11:00:00Z"}}`},
		{"traccar", `{"position":{"deviceId":1,"fixTime":"2026-08-08T11:59:00Z","valid":false,"latitude":1,"longitude":2},"device":{"uniqueId":"x"}}`},
		{"owntracks", ``},
	} {
		if _, err := mustPreset(tt.preset).Parser.Parse([]byte(tt.body), parseNow); !errors.Is(err, ErrNotAPing) {
			t.Errorf("%s %s: got %v, want not a position", tt.preset, tt.body, err)
		}
	}
	if _, err := NewParser().Parse(nil, parseNow); errors.Is(err, ErrNotAPing) {
		t.Error("an empty body is not a ping only for formats that post them")
	}
}

// Traccar's forwarder writes fixTime with +00:00, older versions +0000,
// and epoch milliseconds are read too.
func TestTraccarFixTimes(t *testing.T) {
	want := time.Date(2021, 8, 11, 9, 4, 7, 468e6, time.UTC)
	for _, fixTime := range []string{`"2021-08-11T09:04:07.468+00:00"`, `"2021-08-11T09:04:07.468+0000"`, `"2021-08-11T11:04:07.468+0200"`, `1628672647468`} {
		body := `{"position":{"deviceId":1,"fixTime":` + fixTime + `,"valid":true,"latitude":1,"longitude":2},"device":{"uniqueId":"x"}}`
		parser := mustPreset("traccar").Parser
		parser.MaxPast = 0 // a 2021 capture
		got, err := parser.Parse([]byte(body), parseNow)
		if err != nil || !got.Time.Equal(want) {
			t.Errorf("fixTime %s: got %v, %v", fixTime, got.Time, err)
		}
	}
}

// In the hour a clock is set back (Europe/Berlin, 25 October 2026: 02:00
// to 02:59 local happen first in CEST, 00:00Z to 00:59Z, then again in
// CET, 01:00Z to 01:59Z), a local time without an offset has two
// readings, and the server clock tells which one a live device means:
// the one that is not an hour ahead of it. Go's ParseInLocation picks the
// later instant, CET, so during the first pass every ping of every device
// writing local time is read an hour in the future and refused
// (max_future), or with preset osmand or traccar passed on unkeyed, for
// the whole hour, every year.
func TestAnAmbiguousLocalTimeIsReadAsTheInstantTheServerClockIsIn(t *testing.T) {
	berlin, err := ParseTimeZone("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, local string
		now, want   time.Time
	}{
		{"first pass (CEST)", "2026-10-25 02:30:00", time.Date(2026, 10, 25, 0, 30, 5, 0, time.UTC), time.Date(2026, 10, 25, 0, 30, 0, 0, time.UTC)},
		{"second pass (CET)", "2026-10-25 02:30:00", time.Date(2026, 10, 25, 1, 30, 5, 0, time.UTC), time.Date(2026, 10, 25, 1, 30, 0, 0, time.UTC)},
		{"the first pass's first second", "2026-10-25 02:00:00", time.Date(2026, 10, 25, 0, 0, 2, 0, time.UTC), time.Date(2026, 10, 25, 0, 0, 0, 0, time.UTC)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := NewParser()
			p.TimeZone = berlin
			body := []byte(`{"asset_id":"a","occurred_at":"` + tt.local + `","lat":52.52,"lon":13.40}`)
			got, err := p.Parse(body, tt.now)
			if err != nil || !got.Time.Equal(tt.want) {
				t.Fatalf("%s at server time %s: got %v, %v; want %s", tt.local, tt.now.Format(time.TimeOnly), got.Time, err, tt.want.Format(time.RFC3339))
			}
			// A retry of the same bytes reads the same (helper 2's
			// finding: the parsed-ping cache kept one reading, and a
			// retry in the first pass was an hour in the future).
			cache := NewExtractCache(p.Prepared())
			for attempt := 1; attempt <= 3; attempt++ {
				got, err := cache.Extract(body)
				if err == nil {
					got = p.AtServerClock(got, tt.now)
				}
				if err != nil || !got.Time.Equal(tt.want) {
					t.Fatalf("attempt %d through the parsed-ping cache: got %v, %v; want %s", attempt, got.Time, err, tt.want.Format(time.RFC3339))
				}
			}
		})
	}
}

// A local time the zone's clock skips when it is set forward
// (a device whose clock changes a few minutes late, or one set by hand)
// is read with the offset in force before the change in Europe/Berlin
// ("2026-03-29 02:30:00" is 01:30Z, 03:30 CEST), as Traccar's
// SimpleDateFormat("yyyy-MM-dd HH:mm:ss") reads it (and java.time, and
// Python's zoneinfo), the reading the README points to ("it is what
// Traccar does with OsmAnd's yyyy-MM-dd HH:mm:ss, in its JVM's zone").
// In every zone west of UTC it was read an hour earlier instead (helper
// 7's finding), with the offset after the change (Go's time.Date does not
// say which one it picks): America/New_York "2026-03-08 02:30:00" was
// 06:30Z, 01:30 EST, where Traccar stores 07:30Z, in the bucket of the
// device's pings of an hour before.
func TestALocalTimeInTheSpringGapIsReadAsTraccarReadsIt(t *testing.T) {
	for _, tt := range []struct {
		zone, local string
		want        time.Time // Java's SimpleDateFormat in that default zone
	}{
		{"Europe/Berlin", "2026-03-29 02:30:00", time.Date(2026, 3, 29, 1, 30, 0, 0, time.UTC)},
		{"America/New_York", "2026-03-08 02:30:00", time.Date(2026, 3, 8, 7, 30, 0, 0, time.UTC)},
		{"America/Los_Angeles", "2026-03-08 02:30:00", time.Date(2026, 3, 8, 10, 30, 0, 0, time.UTC)},
		{"America/Sao_Paulo", "2018-11-04 00:30:00", time.Date(2018, 11, 4, 3, 30, 0, 0, time.UTC)},
	} {
		loc, err := ParseTimeZone(tt.zone)
		if err != nil {
			t.Fatal(err)
		}
		p := NewParser()
		p.TimeZone, p.MaxPast = loc, 0
		body := []byte(`{"asset_id":"a","occurred_at":"` + tt.local + `","lat":52.52,"lon":13.40}`)
		got, err := p.Parse(body, tt.want.Add(time.Minute))
		if err != nil || !got.Time.Equal(tt.want) {
			t.Errorf("%s %s: read as %s (%s local), %v; want %s, as Traccar reads it", tt.zone, tt.local,
				got.Time.Format(time.RFC3339), got.Time.In(loc).Format("15:04 MST"), err, tt.want.Format(time.RFC3339))
		}
	}
}
