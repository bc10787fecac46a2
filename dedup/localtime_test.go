package dedup

import (
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// A device writing local time (time_zone Europe/Berlin) through the hour
// its clock is set back, parked, once a minute: its first pass is read as
// the earlier reading, the instants it is lived at, and each pass is
// admitted once a bucket. Told apart by max_future alone, a max_future of
// an hour or more (allowed; Traccar's own filter.future is a day) read
// the first pass an hour ahead, in the second pass's buckets, and the
// whole second pass was suppressed: the backend heard nothing for an hour
// (helper 7's finding).
func TestALiveFirstPassIsReadAsTheEarlierReadingWhateverMaxFuture(t *testing.T) {
	berlin, err := ping.ParseTimeZone("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	for _, maxFuture := range []time.Duration{5 * time.Minute, 2 * time.Hour} {
		t.Run(maxFuture.String(), func(t *testing.T) {
			parser := ping.NewParser()
			parser.TimeZone, parser.MaxFuture = berlin, maxFuture
			parser = parser.Prepared()
			td := newTestDeduper(NewMemoryStore(0), Tumbling)
			start := time.Date(2026, 10, 25, 0, 0, 0, 0, time.UTC) // 02:00 CEST
			admitted := map[string]int{}
			for i := range 120 {
				instant := start.Add(time.Duration(i) * time.Minute)
				td.clock = instant.Add(2 * time.Second)
				local := instant.In(berlin).Format(time.DateTime)
				p, err := parser.Parse([]byte(`{"asset_id":"veh-88","occurred_at":"`+local+`","lat":52.5200087,"lon":13.4049547}`), td.clock)
				if err != nil {
					t.Fatalf("%s at %s: %v", local, td.clock.Format(time.TimeOnly), err)
				}
				if v := td.settled(t, p); v.Decision == Accepted {
					admitted[map[bool]string{true: "first pass", false: "second pass"}[i < 60]]++
				}
			}
			if admitted["first pass"] != 12 || admitted["second pass"] != 12 {
				t.Errorf("max_future %s: admitted %v of a parked device's pings once a minute; want 12 in each pass, one a 5-minute bucket", maxFuture, admitted)
			}
		})
	}
}
