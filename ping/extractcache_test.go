package ping

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"sync"
	"testing"
)

// extractCases are bodies whose ping the cache remembers (every string read
// in place), bodies whose ping it cannot (a string Extract made: an escaped
// id, an event, a state), and bodies Extract refuses.
var extractCases = []struct {
	name       string
	parser     Parser
	body       string
	remembered bool
}{
	{"plain ping", NewParser(), `{"asset_id":"veh-88","occurred_at":"2026-08-08T12:00:00Z","lat":52.52,"lon":13.40}`, true},
	{"speed, accuracy, sub-second time", mustPreset("overland").Parser, `{"type":"Feature","geometry":{"type":"Point","coordinates":[13.40,52.52]},` +
		`"properties":{"timestamp":"2026-08-08T12:00:00.123Z","device_id":"iphone","speed":3.5,"horizontal_accuracy":8}}`, true},
	{"id and time at their second paths", mustPreset("traccar").Parser, `{"position":{"deviceId":7,"fixTime":"2026-08-08T12:00:00.000+00:00",` +
		`"latitude":52.52,"longitude":13.40}}`, true},
	{"a clock never set", NewParser(), `{"asset_id":"veh-88","occurred_at":"0001-01-01T00:00:00Z","lat":52.52,"lon":13.40}`, true},
	{"escaped id", NewParser(), `{"asset_id":"veh-\u0038\u0038","occurred_at":"2026-08-08T12:00:00Z","lat":52.52,"lon":13.40}`, false},
	{"owntracks event", mustPreset("owntracks").Parser, `{"_type":"location","tid":"ph","tst":1786190400,"lat":52.52,"lon":13.40,"t":"u"}`, false},
	{"traccar states", mustPreset("traccar").Parser, `{"position":{"deviceId":1,"deviceTime":"2026-08-08T12:00:00.000+00:00",` +
		`"latitude":52.52,"longitude":13.40,"attributes":{"ignition":true,"driverUniqueId":"d-7","alarm":"sos"}},"device":{"uniqueId":"35824"}}`, false},
	{"not a position", mustPreset("owntracks").Parser, `{"_type":"card","tid":"ph"}`, false},
	{"broken JSON", NewParser(), `{"asset_id":"veh-88",`, false},
	{"missing field", NewParser(), `{"asset_id":"veh-88","lat":52.52,"lon":13.40}`, false},
}

func TestExtractCacheAnswersWhatExtractAnswers(t *testing.T) {
	for _, tc := range extractCases {
		t.Run(tc.name, func(t *testing.T) {
			parser := tc.parser.Prepared()
			want, wantErr := parser.Extract([]byte(tc.body))
			cache := NewExtractCache(parser)
			for read := range 3 { // a miss, then hits (or misses again)
				got, err := cache.Extract([]byte(tc.body))
				if got != want || fmt.Sprint(err) != fmt.Sprint(wantErr) {
					t.Fatalf("read %d: got %+v, %v; Extract says %+v, %v", read+1, got, err, want, wantErr)
				}
			}
			if got := remembers(cache, []byte(tc.body)); got != tc.remembered {
				t.Fatalf("the cache remembers the ping: %v, want %v", got, tc.remembered)
			}
		})
	}
}

// remembers reports that c answers body without reading it.
func remembers(c *ExtractCache, body []byte) bool {
	h0, h1 := maphash.Bytes(c.seeds[0], body), maphash.Bytes(c.seeds[1], body)
	_, ok := c.slots[h0>>(64-extractCacheBits)].lookup(h0, h1, body)
	return ok
}

// The server reuses a request's buffer for the next request: a remembered
// ping must not change with it, nor a ping already handed out.
func TestExtractCacheKeepsNothingOfTheRequestBuffer(t *testing.T) {
	for _, tc := range extractCases {
		if !tc.remembered {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			parser := tc.parser.Prepared()
			want, err := parser.Extract([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			cache := NewExtractCache(parser)
			buf := []byte(tc.body)
			if _, err := cache.Extract(buf); err != nil {
				t.Fatal(err)
			}
			hit, _ := cache.Extract(bytes.Clone(buf))
			copy(buf, bytes.Repeat([]byte("x"), len(buf))) // the next request's bytes
			if got, _ := cache.Extract([]byte(tc.body)); got != want {
				t.Fatalf("after the buffer was reused the cache answers %+v, want %+v", got, want)
			}
			if hit != want {
				t.Fatalf("a ping read from the cache changed with the buffer: %+v, want %+v", hit, want)
			}
		})
	}
}

// Many requests at once, more distinct pings than slots, each read many
// times: every answer is its own ping's (run with -race).
func TestExtractCacheUnderConcurrentRequests(t *testing.T) {
	parser := NewParser().Prepared()
	bodies := make([][]byte, 2*extractCacheSlots)
	for i := range bodies {
		bodies[i] = fmt.Appendf(nil, `{"asset_id":"veh-%d","occurred_at":"2026-08-08T12:00:00Z","lat":52.52,"lon":13.40}`, i)
	}
	cache := NewExtractCache(parser)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for n := range 4 * len(bodies) {
				i := (n*7 + w*13) % len(bodies)
				p, err := cache.Extract(bytes.Clone(bodies[i]))
				if err != nil || p.Asset != fmt.Sprintf("veh-%d", i) {
					t.Errorf("ping %d read as %q, %v", i, p.Asset, err)
					return
				}
			}
		})
	}
	wg.Wait()
}
