package ping

import (
	"testing"
	"time"
)

var benchBody = []byte(`{"asset_id":"veh-88","occurred_at":"2026-08-08T12:00:00Z","lat":52.5200087,"lon":13.4049547,` +
	`"speed_kmh":0,"heading":270,"battery":0.82,"firmware":"4.2.1"}`)

// The parse alone, for the cost of the body checks: run with
// go test -run XXX -bench 'Parse$' ./ping/
func BenchmarkParse(b *testing.B) {
	traccar := mustPreset("traccar").Parser
	now := time.Date(2026, 8, 8, 12, 1, 0, 0, time.UTC)
	for _, bc := range []struct {
		name   string
		parser Parser
		body   []byte
	}{
		{"default", NewParser().Prepared(), benchBody},
		{"traccar", traccar.Prepared(), []byte(`{"position":{"id":0,"attributes":{"batteryLevel":87.0,"motion":false},"deviceId":1,` +
			`"protocol":"osmand","serverTime":"2026-08-08T12:00:01.000+00:00","deviceTime":"2026-08-08T12:00:00.000+00:00",` +
			`"fixTime":"2026-08-08T12:00:00.000+00:00","valid":true,"latitude":52.5200087,"longitude":13.4049547,` +
			`"altitude":34.0,"speed":0.0,"course":0.0},"device":{"id":1,"name":"Truck 88","uniqueId":"358240051111110",` +
			`"status":"online","category":"truck"}}`)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := bc.parser.Parse(bc.body, now); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
