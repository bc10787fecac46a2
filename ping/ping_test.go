package ping

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

var parseNow = time.Date(2026, 8, 8, 12, 0, 0, 0, time.UTC)

func TestParseReadsPings(t *testing.T) {
	nested := NewParser()
	nested.AssetPaths, nested.TimePaths = []string{"device.id"}, []string{"position.fixTime"}
	nested.LatPath, nested.LonPath = "position.latitude", "position.longitude"
	unix, unixMS := NewParser(), NewParser()
	unix.TimeFormat, unixMS.TimeFormat = TimeUnix, TimeUnixMilli
	anyPast := NewParser()
	anyPast.MaxPast = 0 // no bound

	tests := []struct {
		name   string
		parser Parser
		body   string
		want   Ping
	}{
		{"defaults, UTC", NewParser(),
			`{"asset_id":"veh-88","occurred_at":"2026-08-08T11:59:00Z","lat":52.5200087,"lon":13.4049547}`,
			Ping{Asset: "veh-88", Time: time.Date(2026, 8, 8, 11, 59, 0, 0, time.UTC), Lat: 52.5200087, Lon: 13.4049547}},
		{"offset converted to UTC", NewParser(),
			`{"asset_id":"veh-88","occurred_at":"2026-08-08T13:59:00.250+02:00","lat":1,"lon":2}`,
			Ping{Asset: "veh-88", Time: time.Date(2026, 8, 8, 11, 59, 0, 250e6, time.UTC), Lat: 1, Lon: 2}},
		{"offset without colon (Java trackers)", NewParser(),
			`{"asset_id":"veh-88","occurred_at":"2026-08-08T11:59:00.000+0000","lat":1,"lon":2}`,
			Ping{Asset: "veh-88", Time: time.Date(2026, 8, 8, 11, 59, 0, 0, time.UTC), Lat: 1, Lon: 2}},
		{"numeric asset id", NewParser(),
			`{"asset_id":4711,"occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`,
			Ping{Asset: "4711", Time: time.Date(2026, 8, 8, 11, 59, 0, 0, time.UTC), Lat: 1, Lon: 2}},
		{"auto: epoch seconds", NewParser(),
			`{"asset_id":"a","occurred_at":1786190340,"lat":1,"lon":2}`,
			Ping{Asset: "a", Time: time.Date(2026, 8, 8, 11, 59, 0, 0, time.UTC), Lat: 1, Lon: 2}},
		{"auto: epoch milliseconds", NewParser(),
			`{"asset_id":"a","occurred_at":1786190340500,"lat":1,"lon":2}`,
			Ping{Asset: "a", Time: time.Date(2026, 8, 8, 11, 59, 0, 500e6, time.UTC), Lat: 1, Lon: 2}},
		{"unix with fraction", unix,
			`{"asset_id":"a","occurred_at":1786190340.5,"lat":1,"lon":2}`,
			Ping{Asset: "a", Time: time.Date(2026, 8, 8, 11, 59, 0, 500e6, time.UTC), Lat: 1, Lon: 2}},
		{"unix_ms", unixMS,
			`{"asset_id":"a","occurred_at":1786190340000,"lat":1,"lon":2}`,
			Ping{Asset: "a", Time: time.Date(2026, 8, 8, 11, 59, 0, 0, time.UTC), Lat: 1, Lon: 2}},
		{"unix_ms with an exponent and a fraction", unixMS,
			`{"asset_id":"a","occurred_at":1.7861903400005e12,"lat":1,"lon":2}`,
			Ping{Asset: "a", Time: time.Date(2026, 8, 8, 11, 59, 0, 500e3, time.UTC), Lat: 1, Lon: 2}},
		{"nested paths", nested,
			`{"device":{"id":"t-1"},"position":{"fixTime":"2026-08-08T11:59:00Z","latitude":-33.9,"longitude":151.2}}`,
			Ping{Asset: "t-1", Time: time.Date(2026, 8, 8, 11, 59, 0, 0, time.UTC), Lat: -33.9, Lon: 151.2}},
		{"extra fields ignored", NewParser(),
			`{"speed":12.5,"asset_id":"a","heading":90,"occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`,
			Ping{Asset: "a", Time: time.Date(2026, 8, 8, 11, 59, 0, 0, time.UTC), Lat: 1, Lon: 2}},
		{"within max_future", NewParser(),
			`{"asset_id":"a","occurred_at":"2026-08-08T12:04:59Z","lat":1,"lon":2}`,
			Ping{Asset: "a", Time: time.Date(2026, 8, 8, 12, 4, 59, 0, time.UTC), Lat: 1, Lon: 2}},
		{"30-digit numeric asset id kept as written", NewParser(),
			`{"asset_id":123456789012345678901234567890,"occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`,
			Ping{Asset: "123456789012345678901234567890", Time: time.Date(2026, 8, 8, 11, 59, 0, 0, time.UTC), Lat: 1, Lon: 2}},
		{"asset id of exactly 256 bytes", NewParser(),
			`{"asset_id":"` + strings.Repeat("x", MaxAssetBytes) + `","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`,
			Ping{Asset: strings.Repeat("x", MaxAssetBytes), Time: time.Date(2026, 8, 8, 11, 59, 0, 0, time.UTC), Lat: 1, Lon: 2}},
		{"non-ASCII asset id", NewParser(),
			`{"asset_id":"Lkw-Müller-\u00e9-🚚","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`,
			Ping{Asset: "Lkw-Müller-é-🚚", Time: time.Date(2026, 8, 8, 11, 59, 0, 0, time.UTC), Lat: 1, Lon: 2}},
		{"escaped key names are read unescaped", NewParser(),
			`{"asset_\u0069d":"a","occurred_at":"2026-08-08T11:59:00Z","l\u0061t":1,"lon":2}`,
			Ping{Asset: "a", Time: time.Date(2026, 8, 8, 11, 59, 0, 0, time.UTC), Lat: 1, Lon: 2}},
		{"duplicate keys off the configured paths are not looked at", NewParser(),
			`{"asset_id":"a","extra":{"x":1,"x":2},"occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`,
			Ping{Asset: "a", Time: time.Date(2026, 8, 8, 11, 59, 0, 0, time.UTC), Lat: 1, Lon: 2}},
		{"keys differing in case from keys not read", NewParser(),
			`{"asset_id":"a","speed":1,"SPEED":2,"occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`,
			Ping{Asset: "a", Time: time.Date(2026, 8, 8, 11, 59, 0, 0, time.UTC), Lat: 1, Lon: 2}},
		{"duplicate keys beside a nested path", nested,
			`{"device":{"id":"t-1","attributes":{"x":1,"x":2}},"position":{"fixTime":"2026-08-08T11:59:00Z","latitude":-33.9,"longitude":151.2,"attributes":{"a":1,"a":1}}}`,
			Ping{Asset: "t-1", Time: time.Date(2026, 8, 8, 11, 59, 0, 0, time.UTC), Lat: -33.9, Lon: 151.2}},
		{"nesting of exactly 64 levels", NewParser(),
			`{"asset_id":"a","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2,"x":` +
				strings.Repeat("[", MaxNesting-1) + strings.Repeat("]", MaxNesting-1) + `}`,
			Ping{Asset: "a", Time: time.Date(2026, 8, 8, 11, 59, 0, 0, time.UTC), Lat: 1, Lon: 2}},
		// RFC 3339 section 5.6 allows "t" and "z" in lower case.
		{"lower-case t and z", NewParser(),
			`{"asset_id":"a","occurred_at":"2026-08-08t11:59:00.5z","lat":1,"lon":2}`,
			Ping{Asset: "a", Time: time.Date(2026, 8, 8, 11, 59, 0, 500e6, time.UTC), Lat: 1, Lon: 2}},
		// A leap second (section 5.7) is the last instant of its minute,
		// whatever its fraction: it stays in its own minute and bucket.
		{"leap second", anyPast,
			`{"asset_id":"a","occurred_at":"2016-12-31T23:59:60Z","lat":1,"lon":2}`,
			Ping{Asset: "a", Time: time.Date(2016, 12, 31, 23, 59, 59, 999999999, time.UTC), Lat: 1, Lon: 2}},
		{"leap second with a fraction and an offset", anyPast,
			`{"asset_id":"a","occurred_at":"2017-01-01T00:59:60.25+01:00","lat":1,"lon":2}`,
			Ping{Asset: "a", Time: time.Date(2016, 12, 31, 23, 59, 59, 999999999, time.UTC), Lat: 1, Lon: 2}},
		{"a surrogate pair is one character", NewParser(),
			`{"asset_id":"truck-\ud83d\ude9a","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`,
			Ping{Asset: "truck-🚚", Time: time.Date(2026, 8, 8, 11, 59, 0, 0, time.UTC), Lat: 1, Lon: 2}},
		{"an escaped backslash before u is no escape", NewParser(),
			`{"asset_id":"a\\ud800","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`,
			Ping{Asset: `a\ud800`, Time: time.Date(2026, 8, 8, 11, 59, 0, 0, time.UTC), Lat: 1, Lon: 2}},
		{"a raw U+FFFD is a character like any other", NewParser(),
			`{"asset_id":"a�","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`,
			Ping{Asset: "a�", Time: time.Date(2026, 8, 8, 11, 59, 0, 0, time.UTC), Lat: 1, Lon: 2}},
		{"within max_past", NewParser(),
			`{"asset_id":"a","occurred_at":"2025-08-09T12:00:00Z","lat":1,"lon":2}`,
			Ping{Asset: "a", Time: time.Date(2025, 8, 9, 12, 0, 0, 0, time.UTC), Lat: 1, Lon: 2}},
		{"brackets and escaped quotes inside strings do not nest", NewParser(),
			`{"asset_id":"a","note":"\\\"` + strings.Repeat("[{", 100) + `\\","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`,
			Ping{Asset: "a", Time: time.Date(2026, 8, 8, 11, 59, 0, 0, time.UTC), Lat: 1, Lon: 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.parser.Parse([]byte(tt.body), parseNow)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got.Asset != tt.want.Asset || !got.Time.Equal(tt.want.Time) || got.Lat != tt.want.Lat || got.Lon != tt.want.Lon {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
			if got.Time.Location() != time.UTC {
				t.Fatalf("time %v is not in UTC", got.Time)
			}
		})
	}
}

func TestParseRejectsInvalidPings(t *testing.T) {
	rfc, unix, unixMS := NewParser(), NewParser(), NewParser()
	rfc.TimeFormat, unix.TimeFormat, unixMS.TimeFormat = TimeRFC3339, TimeUnix, TimeUnixMilli
	tests := []struct {
		name   string
		parser Parser
		body   string
		field  string
		rule   Rule
	}{
		{"latitude 91", NewParser(), `{"asset_id":"a","occurred_at":"2026-08-08T11:59:00Z","lat":91,"lon":2}`, "lat", RuleRange},
		{"latitude -90.0001", NewParser(), `{"asset_id":"a","occurred_at":"2026-08-08T11:59:00Z","lat":-90.0001,"lon":2}`, "lat", RuleRange},
		{"longitude 180.5", NewParser(), `{"asset_id":"a","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":180.5}`, "lon", RuleRange},
		{"latitude overflows to infinity", NewParser(), `{"asset_id":"a","occurred_at":"2026-08-08T11:59:00Z","lat":1e400,"lon":2}`, "lat", RuleFinite},
		{"naive timestamp", NewParser(), `{"asset_id":"a","occurred_at":"2026-08-08T11:59:00","lat":1,"lon":2}`, "occurred_at", RuleTimezone},
		{"naive timestamp with space", NewParser(), `{"asset_id":"a","occurred_at":"2026-08-08 11:59:00","lat":1,"lon":2}`, "occurred_at", RuleTimezone},
		{"unreadable timestamp", NewParser(), `{"asset_id":"a","occurred_at":"yesterday","lat":1,"lon":2}`, "occurred_at", RuleTimeFormat},
		{"null island", NewParser(), `{"asset_id":"a","occurred_at":"2026-08-08T11:59:00Z","lat":0,"lon":0}`, "lat", RuleNullIsland},
		{"six minutes in the future", NewParser(), `{"asset_id":"a","occurred_at":"2026-08-08T12:06:00Z","lat":1,"lon":2}`, "occurred_at", RuleFuture},
		{"a year and a day in the past", NewParser(), `{"asset_id":"a","occurred_at":"2025-08-07T12:00:00Z","lat":1,"lon":2}`, "occurred_at", RulePast},
		{"the epoch", NewParser(), `{"asset_id":"a","occurred_at":0,"lat":1,"lon":2}`, "occurred_at", RulePast},
		{"the year 1", NewParser(), `{"asset_id":"a","occurred_at":"0001-01-01T00:00:00Z","lat":1,"lon":2}`, "occurred_at", RulePast},
		{"leap second in the future", NewParser(), `{"asset_id":"a","occurred_at":"2026-08-08T12:05:60Z","lat":1,"lon":2}`, "occurred_at", RuleFuture},
		{"missing asset", NewParser(), `{"occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "asset_id", RuleRequired},
		{"empty asset", NewParser(), `{"asset_id":"","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "asset_id", RuleRequired},
		{"null asset", NewParser(), `{"asset_id":null,"occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "asset_id", RuleRequired},
		{"empty and blank at every asset path", mustPreset("geojson").Parser, `{"id":"","geometry":{"coordinates":[2,1]},"properties":{"id":" ","time":"2026-08-08T11:59:00Z"}}`, "id", RuleRequired},
		{"blank asset at the second asset path only", mustPreset("geojson").Parser, `{"geometry":{"coordinates":[2,1]},"properties":{"id":"\u00a0","time":"2026-08-08T11:59:00Z"}}`,
			"properties.id", RuleRequired},
		{"null at every asset path", mustPreset("geojson").Parser, `{"id":null,"geometry":{"coordinates":[2,1]},"properties":{"id":null,"time":"2026-08-08T11:59:00Z"}}`, "id", RuleRequired},
		{"object asset", NewParser(), `{"asset_id":{"id":1},"occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "asset_id", RuleType},
		{"missing time", NewParser(), `{"asset_id":"a","lat":1,"lon":2}`, "occurred_at", RuleRequired},
		// With several paths, the error names the one the ping filled.
		{"bad time at the second time path", mustPreset("traccar").Parser, `{"position":{"deviceId":1,"fixTime":"yesterday","latitude":1,"longitude":2}}`,
			"position.fixTime", RuleTimeFormat},
		{"object asset at the second asset path", mustPreset("geojson").Parser, `{"geometry":{"coordinates":[2,1]},"properties":{"id":{"x":1},"time":"2026-08-08T11:59:00Z"}}`,
			"properties.id", RuleType},
		{"null asset at the second asset path only", mustPreset("geojson").Parser, `{"geometry":{"coordinates":[2,1]},"properties":{"id":null,"time":"2026-08-08T11:59:00Z"}}`,
			"properties.id", RuleRequired},
		{"future time at the second time path", mustPreset("traccar").Parser, `{"position":{"deviceId":1,"fixTime":"2026-08-08T12:06:00Z","latitude":1,"longitude":2}}`,
			"position.fixTime", RuleFuture},
		{"past time at the second time path", mustPreset("traccar").Parser, `{"position":{"deviceId":1,"fixTime":"2025-08-07T12:00:00Z","latitude":1,"longitude":2}}`,
			"position.fixTime", RulePast},
		{"asset id with a newline at the second asset path", mustPreset("traccar").Parser, `{"position":{"deviceId":"veh\n88","fixTime":"2026-08-08T11:59:00Z","latitude":1,"longitude":2}}`,
			"position.deviceId", RuleType},
		{"boolean time", NewParser(), `{"asset_id":"a","occurred_at":true,"lat":1,"lon":2}`, "occurred_at", RuleType},
		{"number under rfc3339", rfc, `{"asset_id":"a","occurred_at":1786190340,"lat":1,"lon":2}`, "occurred_at", RuleType},
		{"string under unix", unix, `{"asset_id":"a","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "occurred_at", RuleType},
		{"missing lat", NewParser(), `{"asset_id":"a","occurred_at":"2026-08-08T11:59:00Z","lon":2}`, "lat", RuleRequired},
		{"string lat", NewParser(), `{"asset_id":"a","occurred_at":"2026-08-08T11:59:00Z","lat":"52.1","lon":2}`, "lat", RuleType},
		{"null lon", NewParser(), `{"asset_id":"a","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":null}`, "lon", RuleRequired},
		// Huge numbers: a coordinate overflowing float64 is infinite, a time
		// beyond any clock is unreadable, never a wrapped-around date.
		{"longitude overflows to -infinity", NewParser(), `{"asset_id":"a","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":-1e400}`, "lon", RuleFinite},
		{"latitude 1e308 is finite but out of range", NewParser(), `{"asset_id":"a","occurred_at":"2026-08-08T11:59:00Z","lat":1e308,"lon":2}`, "lat", RuleRange},
		{"time 1e30", NewParser(), `{"asset_id":"a","occurred_at":1e30,"lat":1,"lon":2}`, "occurred_at", RuleTimeFormat},
		{"time -1e30", NewParser(), `{"asset_id":"a","occurred_at":-1e30,"lat":1,"lon":2}`, "occurred_at", RuleTimeFormat},
		{"time 1e30 under unix", unix, `{"asset_id":"a","occurred_at":1e30,"lat":1,"lon":2}`, "occurred_at", RuleTimeFormat},
		{"time 1e400", NewParser(), `{"asset_id":"a","occurred_at":1e400,"lat":1,"lon":2}`, "occurred_at", RuleTimeFormat},
		{"time 30 digits", NewParser(), `{"asset_id":"a","occurred_at":123456789012345678901234567890,"lat":1,"lon":2}`, "occurred_at", RuleTimeFormat},
		// Epoch milliseconds written with an exponent or a fraction take the
		// float path: 1e13 ms is the year 2286, never a wrapped-around 1677.
		{"time 1e13 ms with an exponent", NewParser(), `{"asset_id":"a","occurred_at":1e13,"lat":1,"lon":2}`, "occurred_at", RuleFuture},
		{"time 1e16 ms with a fraction", NewParser(), `{"asset_id":"a","occurred_at":9999999999999999.5,"lat":1,"lon":2}`, "occurred_at", RuleFuture},
		{"time 1.8e12 ms with an exponent under unix_ms", unixMS, `{"asset_id":"a","occurred_at":1.8e12,"lat":1,"lon":2}`, "occurred_at", RuleFuture},
		// Asset ids that are not ids.
		{"asset id of 257 bytes", NewParser(), `{"asset_id":"` + strings.Repeat("x", MaxAssetBytes+1) + `","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "asset_id", RuleType},
		{"numeric asset id of 300 digits", NewParser(), `{"asset_id":` + strings.Repeat("7", 300) + `,"occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "asset_id", RuleType},
		{"asset id with a newline", NewParser(), `{"asset_id":"veh-88\nINFO forged log line","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "asset_id", RuleType},
		{"asset id with a NUL", NewParser(), `{"asset_id":"veh\u0000","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "asset_id", RuleType},
		{"asset id with a tab", NewParser(), `{"asset_id":"veh\t88","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "asset_id", RuleType},
		{"asset id with an escape sequence", NewParser(), `{"asset_id":"veh\u001b[31m","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "asset_id", RuleType},
		// U+009B is a terminal's CSI, as ESC [ is: a C1 control character.
		{"asset id with a C1 control character", NewParser(), `{"asset_id":"veh\u009b31m","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "asset_id", RuleType},
		{"asset id with a raw C1 control character", NewParser(), "{\"asset_id\":\"veh\u0085\",\"occurred_at\":\"2026-08-08T11:59:00Z\",\"lat\":1,\"lon\":2}", "asset_id", RuleType},
		// An id of blanks names no device: every sender whose id came out
		// blank would share one asset, and one's pings suppress another's.
		{"asset id of spaces", NewParser(), `{"asset_id":"   ","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "asset_id", RuleRequired},
		{"asset id of a no-break space", NewParser(), `{"asset_id":"\u00a0","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "asset_id", RuleRequired},
		{"asset id of a zero width space", NewParser(), `{"asset_id":"\u200b","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "asset_id", RuleRequired},
		{"asset id of a byte-order mark", NewParser(), `{"asset_id":"\ufeff","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "asset_id", RuleRequired},
		// A right-to-left override shows "veh-1\u202e2-hev" in a log line
		// as another id: refused as the controls are (stop 59).
		{"asset id with a right-to-left override", NewParser(), `{"asset_id":"veh-1\u202e2-hev","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "asset_id", RuleType},
		{"asset id with a first-strong isolate", NewParser(), `{"asset_id":"veh\u2068x\u2069","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "asset_id", RuleType},
		{"asset id of a Hangul filler", NewParser(), `{"asset_id":"\u3164","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "asset_id", RuleRequired},
		{"asset id of the blank braille pattern", NewParser(), `{"asset_id":"\u2800","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "asset_id", RuleRequired},
		{"asset id of a variation selector", NewParser(), `{"asset_id":"\ufe0f","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "asset_id", RuleRequired},
		{"asset id of a word joiner", NewParser(), `{"asset_id":"\u2060","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "asset_id", RuleRequired},
		{"asset id of blanks and a zero width space", NewParser(), `{"asset_id":" \u200b ","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "asset_id", RuleRequired},
		{"asset id of a no-break space and a byte-order mark", NewParser(), `{"asset_id":"\u00a0\ufeff","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "asset_id", RuleRequired},
		{"asset id with DEL", NewParser(), `{"asset_id":"veh\u007f","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "asset_id", RuleType},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.parser.Parse([]byte(tt.body), parseNow)
			var ie *InvalidPingError
			if !errors.As(err, &ie) {
				t.Fatalf("got %v, want an InvalidPingError", err)
			}
			if ie.Field != tt.field || ie.Rule != tt.rule {
				t.Fatalf("got field %q rule %q (%s), want field %q rule %q", ie.Field, ie.Rule, ie.Detail, tt.field, tt.rule)
			}
			if ie.Detail == "" {
				t.Fatal("error has no detail for the sender")
			}
		})
	}
}

func TestValidateRejectsNonFiniteCoordinates(t *testing.T) {
	for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		p := Ping{Asset: "a", Time: parseNow, Lat: v, Lon: 2}
		var ie *InvalidPingError
		if err := NewParser().Validate(p, parseNow); !errors.As(err, &ie) || ie.Rule != RuleFinite || ie.Field != "lat" {
			t.Errorf("lat %v: got %v, want lat/finite", v, err)
		}
		p.Lat, p.Lon = 2, v
		if err := NewParser().Validate(p, parseNow); !errors.As(err, &ie) || ie.Rule != RuleFinite || ie.Field != "lon" {
			t.Errorf("lon %v: got %v, want lon/finite", v, err)
		}
	}
}

func TestNullIslandCanBeAllowed(t *testing.T) {
	p := NewParser()
	p.AllowNullIsland = true
	if _, err := p.Parse([]byte(`{"asset_id":"buoy","occurred_at":"2026-08-08T11:59:00Z","lat":0,"lon":0}`), parseNow); err != nil {
		t.Fatalf("null_island allow still rejects (0, 0): %v", err)
	}
}

func TestParseRejectsMalformedBodies(t *testing.T) {
	owntracks, traccar, geojson := mustPreset("owntracks").Parser, mustPreset("traccar").Parser, mustPreset("geojson").Parser
	const valid = `"asset_id":"a","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2`
	many := ""
	for i := range 40 {
		many += `"k` + strings.Repeat("x", i) + `":1,`
	}
	tests := []struct {
		name   string
		parser Parser
		body   string
		want   string // in the message
	}{
		{"empty", NewParser(), ``, "empty"},
		{"not JSON", NewParser(), `asset_id=veh-88`, "not valid JSON"},
		{"form fields", NewParser(), `id=veh-88&lat=52.5&lon=13.4&timestamp=1786190400`, "looks form encoded"},
		{"truncated", NewParser(), `{"asset_id":"veh-88","lat":`, "not valid JSON"},
		{"where it breaks", NewParser(), "{\n" + valid + ",\n\"speed\": 12,,\n}", "line 3, column 13"},
		{"NDJSON without its content type", NewParser(), "{" + valid + "}\n{" + valid + "}\n", "Content-Type: application/x-ndjson"},
		{"array", NewParser(), `[{"asset_id":"veh-88"}]`, "JSON object"},
		{"bare string", NewParser(), `"veh-88"`, "JSON object"},
		{"trailing junk", NewParser(), `{"asset_id":"a"} x`, "not valid JSON"},
		{"bracket closed before opened", NewParser(), `}{` + valid + `}`, "not valid JSON"},
		{"trailing closing bracket", NewParser(), `{` + valid + `}]`, "not valid JSON"},

		// Invalid UTF-8, anywhere.
		{"invalid UTF-8 in the asset id", NewParser(), `{"asset_id":"veh-` + "\xff" + `","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "not valid UTF-8"},
		{"invalid UTF-8 in a key", NewParser(), `{"asset_id` + "\xc3" + `":"a",` + valid + `}`, "not valid UTF-8"},
		{"invalid UTF-8 in an ignored field", NewParser(), `{` + valid + `,"note":"` + "\xe2\x82" + `"}`, "not valid UTF-8"},
		{"overlong encoding of /", NewParser(), `{` + valid + `,"note":"` + "\xc0\xaf" + `"}`, "not valid UTF-8"},
		{"UTF-8 encoded surrogate", NewParser(), `{` + valid + `,"note":"` + "\xed\xa0\x80" + `"}`, "not valid UTF-8"},
		{"invalid UTF-8 outside strings", NewParser(), `{` + valid + `}` + "\xff", "not valid UTF-8"},
		{"Latin-1 body", NewParser(), `{"asset_id":"M` + "\xfc" + `ller",` + valid[len(`"asset_id":"a",`):] + `}`, "not valid UTF-8"},

		// Escapes of lone UTF-16 surrogates, anywhere: gjson reads each as
		// U+FFFD, other parsers refuse or keep them.
		{"lone high surrogate in the asset id", NewParser(), `{"asset_id":"a\ud800","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, `\ud800`},
		{"lone \\udbff", NewParser(), `{"asset_id":"a\udbff","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, `\udbff`},
		{"lone low surrogate", NewParser(), `{"asset_id":"a\udc00b","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, `\udc00`},
		{"low before high", NewParser(), `{"asset_id":"a\ude9a\ud83d","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, `\ude9a`},
		{"high followed by another escape", NewParser(), `{"asset_id":"a\ud83d\u0041","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, `\ud83d`},
		{"two highs", NewParser(), `{"asset_id":"a\ud83d\ud83d","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, `\ud83d`},
		{"lone surrogate in an ignored field", NewParser(), `{` + valid + `,"note":"\uD800"}`, `\uD800`},
		{"lone surrogate in a key", NewParser(), `{` + valid + `,"\ud800":1}`, `\ud800`},

		// Nesting beyond 64 levels, found before anything recurses.
		{"65 levels", NewParser(), `{` + valid + `,"x":` + strings.Repeat("[", MaxNesting) + strings.Repeat("]", MaxNesting) + `}`, "more than 64 levels"},
		{"65 levels of objects", NewParser(), strings.Repeat(`{"a":`, MaxNesting+1) + `1` + strings.Repeat("}", MaxNesting+1), "more than 64 levels"},
		{"an escaped backslash ends the string", NewParser(), `{` + valid + `,"x":"\\\\",` + `"y":` + strings.Repeat("[", MaxNesting) + strings.Repeat("]", MaxNesting) + `}`, "more than 64 levels"},

		// Duplicate keys on a configured path: gjson reads the first, many
		// backends the last.
		{"duplicate lat", NewParser(), `{"asset_id":"a","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2,"lat":91}`, `duplicate key "lat"`},
		{"duplicate asset id", NewParser(), `{"asset_id":"a",` + valid + `}`, `duplicate key "asset_id"`},
		{"duplicate time", NewParser(), `{` + valid + `,"occurred_at":"2026-08-08T13:59:00Z"}`, `duplicate key "occurred_at"`},
		{"duplicate of an ignored key", NewParser(), `{"speed":1,` + valid + `,"speed":2}`, `duplicate key "speed"`},
		{"duplicate written with an escape", NewParser(), `{` + valid + `,"l\u0061t":91}`, `duplicate key "lat"`},
		{"duplicate after 40 other keys", NewParser(), `{` + many + valid + `,"kxxx":2}`, `duplicate key "kxxx"`},
		{"duplicate lat after 40 other keys", NewParser(), `{` + many + valid + `,"lat":91}`, `duplicate key "lat"`},
		{"lat and LAT", NewParser(), `{` + valid + `,"LAT":91}`, `duplicate key "LAT"`},
		{"lat and Lat before it", NewParser(), `{"Lat":91,` + valid + `}`, `duplicate key "lat"`},
		// encoding/json folds like strings.EqualFold: the long s is an s.
		{"asset_id and a\u017fset_id", NewParser(), `{` + valid + `,"a\u017fset_id":"b"}`, `duplicate key "aſset_id"`},
		{"asset_id and aſset_id in UTF-8", NewParser(), `{` + valid + `,"aſset_id":"b"}`, `only in letter case`},
		{"duplicate nested latitude", traccar,
			`{"device":{"uniqueId":"t"},"position":{"fixTime":"2024-05-01T10:00:00Z","latitude":1,"longitude":2,"latitude":91}}`, `duplicate key "latitude"`},
		{"duplicate intermediate object", traccar,
			`{"device":{"uniqueId":"t"},"position":{"fixTime":"2024-05-01T10:00:00Z","latitude":1,"longitude":2},"position":{"latitude":91}}`, `duplicate key "position"`},
		{"duplicate in the second asset path's object", traccar,
			`{"device":{"uniqueId":"t","uniqueId":"u"},"position":{"fixTime":"2024-05-01T10:00:00Z","latitude":1,"longitude":2}}`, `duplicate key "uniqueId"`},
		{"duplicate in a GeoJSON geometry", geojson,
			`{"id":"a","geometry":{"type":"Point","coordinates":[1,2],"coordinates":[3,4]},"properties":{"time":"2024-05-01T10:00:00Z"}}`, `duplicate key "coordinates"`},
		{"duplicate in GeoJSON properties", geojson,
			`{"id":"a","geometry":{"type":"Point","coordinates":[1,2]},"properties":{"time":"2024-05-01T10:00:00Z","time":"2024-05-01T11:00:00Z"}}`, `duplicate key "time"`},
		{"duplicate kind", owntracks, `{"_type":"card","_type":"location","tid":"jj","tst":1714557600,"lat":1,"lon":2}`, `duplicate key "_type"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.parser.Parse([]byte(tt.body), parseNow)
			var me *MalformedError
			if !errors.As(err, &me) {
				t.Fatalf("got %v, want a MalformedError", err)
			}
			if !strings.Contains(me.Reason, tt.want) {
				t.Fatalf("message %q does not say %q", me.Reason, tt.want)
			}
		})
	}
}

// A megabyte of nesting is refused by a linear scan before gjson's validator,
// which recurses once per level, ever sees it.
func TestParseRejectsDeepNestingWithoutRecursing(t *testing.T) {
	const mib = 1 << 20
	for name, body := range map[string]string{
		"arrays":              strings.Repeat("[", mib),
		"objects":             strings.Repeat(`{"a":`, mib/5),
		"inside a valid ping": `{"asset_id":"a","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2,"x":` + strings.Repeat("[", mib),
		"balanced":            strings.Repeat("[", mib/2) + strings.Repeat("]", mib/2),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := NewParser().Parse([]byte(body), parseNow)
			var me *MalformedError
			if !errors.As(err, &me) || !strings.Contains(me.Reason, "more than 64 levels") {
				t.Fatalf("got %v, want the nesting MalformedError", err)
			}
		})
	}
}

// Asset ids that would bloat or break logs are refused wherever they come
// from, a placeholder template included (no asset paths: field "asset").
func TestValidateRejectsUnfitAssetIDs(t *testing.T) {
	template := NewParser()
	template.AssetPaths = nil
	for _, asset := range []string{strings.Repeat("a", MaxAssetBytes+1), "user\r\nSet-Cookie: x", "a\x00b", "a\x1fb", "a\x7f"} {
		var ie *InvalidPingError
		err := template.Validate(Ping{Asset: asset, Time: parseNow, Lat: 1, Lon: 2}, parseNow)
		if !errors.As(err, &ie) || ie.Field != "asset" || ie.Rule != RuleType || ie.Detail == "" {
			t.Errorf("asset %.20q: got %v, want asset/type", asset, err)
		}
	}
	for _, asset := range []string{"alice/phone", strings.Repeat("a", MaxAssetBytes), "ünïcödé ok", "a~b"} {
		if err := template.Validate(Ping{Asset: asset, Time: parseNow, Lat: 1, Lon: 2}, parseNow); err != nil {
			t.Errorf("asset %.20q: %v", asset, err)
		}
	}
}

// "\ud800", "\udbff" and a real U+FFFD were one asset id to gjson: now the
// first two are refused, and the third is itself.
func TestLoneSurrogatesCannotAliasAnAssetID(t *testing.T) {
	for _, asset := range []string{`\ud800`, `\udbff`} {
		body := `{"asset_id":"veh-` + asset + `","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`
		var me *MalformedError
		if _, err := NewParser().Parse([]byte(body), parseNow); !errors.As(err, &me) {
			t.Errorf("asset veh-%s: got %v, want a MalformedError", asset, err)
		}
	}
	p, err := NewParser().Parse([]byte(`{"asset_id":"veh-�","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`), parseNow)
	if err != nil || p.Asset != "veh-�" {
		t.Errorf("a real U+FFFD: %q, %v", p.Asset, err)
	}
}

// Far-off times are described in words a person reads, not as a saturated
// Duration ("2562047h47m16.854775807s").
func TestTimeBoundErrorsAreReadable(t *testing.T) {
	for _, tt := range []struct{ time, want string }{
		{"9999-12-31T23:59:59Z", "is 7973 years ahead of the server clock; at most 5m is allowed (max_future)"},
		{"2026-08-08T12:06:30Z", "is 6m30s ahead of the server clock; at most 5m is allowed (max_future)"},
		{"2026-08-20T12:00:00Z", "is 12 days ahead"},
		{"0001-01-01T00:00:00Z", "is 2025 years behind the server clock; at most 365 days is allowed (max_past)"},
		{"1970-01-01T00:00:00Z", "is 56 years behind"},
	} {
		_, err := NewParser().Parse([]byte(`{"asset_id":"a","occurred_at":"`+tt.time+`","lat":1,"lon":2}`), parseNow)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want it to say %q", tt.time, err, tt.want)
		}
	}
}

func TestNaiveTimestampErrorSaysWhatToSend(t *testing.T) {
	_, err := NewParser().Parse([]byte(`{"asset_id":"a","occurred_at":"2026-08-08T11:59:00","lat":1,"lon":2}`), parseNow)
	if err == nil || !strings.Contains(err.Error(), "2026-08-08T11:59:00Z") {
		t.Fatalf("error %v does not show the sender how to write the offset", err)
	}
}

func TestParseTimeFormat(t *testing.T) {
	for _, f := range TimeFormats {
		if got, err := ParseTimeFormat(string(f)); err != nil || got != f {
			t.Errorf("ParseTimeFormat(%q) = %q, %v", f, got, err)
		}
	}
	if _, err := ParseTimeFormat("iso8601"); err == nil || !strings.Contains(err.Error(), "rfc3339") {
		t.Errorf("unknown format error %v does not list the accepted ones", err)
	}
}

// A timestamp without an offset is answered with the fix, and the fix is
// one the parser takes.
func TestNaiveTimestampErrorSuggestsATimestampThatParses(t *testing.T) {
	for _, naive := range []string{"2026-08-08T11:59:00", "2026-08-08 11:59:00", "2026-08-08 11:59:00.5"} {
		_, err := NewParser().Parse([]byte(`{"asset_id":"a","occurred_at":"`+naive+`","lat":1,"lon":2}`), parseNow)
		var ie *InvalidPingError
		if !errors.As(err, &ie) || ie.Rule != RuleTimezone {
			t.Fatalf("%s: got %v, want a timezone error", naive, err)
		}
		_, suggestion, _ := strings.Cut(ie.Detail, "send it as ")
		suggested, _, ok := strings.Cut(suggestion, " or ")
		if !ok {
			t.Fatalf("%s: no suggestion in %q", naive, ie.Detail)
		}
		if _, err := NewParser().Parse([]byte(`{"asset_id":"a","occurred_at":"`+suggested+`","lat":1,"lon":2}`), parseNow); err != nil {
			t.Errorf("%s: the suggested %s is refused: %v", naive, suggested, err)
		}
	}
}

// Ids that print are kept, format characters in them included: a
// right-to-left name with its mark, an emoji sequence joined by U+200D, a
// soft hyphen. Only ids of nothing visible, and the bidirectional
// overrides that reorder a log line, are refused.
func TestAssetIdsThatPrintAreKept(t *testing.T) {
	for _, id := range []string{`\u05e8\u05db\u05d1-7\u200f`, `truck-\ud83d\udc68\u200d\ud83d\udd27`, `ab\u00adc`, `veh\u200b1`} {
		body := `{"asset_id":"` + id + `","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`
		if _, err := NewParser().Parse([]byte(body), parseNow); err != nil {
			t.Errorf("asset id %s: %v; want it kept", id, err)
		}
	}
}

// A device reporting in a projected CRS (UTM metres, the README's
// "Projected coordinates": some devices do) to a route without crs: its
// northing, 5,820,000, is refused with "are latitude and longitude
// swapped?". Swapping cannot bring either value into range (the easting,
// 390,000, is no latitude either). The swap hint is for a value a
// longitude could be; a crs hint would mislead under the presets that
// refuse crs, so a larger value gets none. (Helper 7's review, stop 64.)
func TestALatitudeInMetresIsNotToldToSwapItsAxes(t *testing.T) {
	p := NewParser().Prepared()
	_, err := p.Parse([]byte(`{"asset_id":"veh-utm","occurred_at":"2026-08-08T11:59:00Z","lat":5820000,"lon":390000}`), parseNow)
	if err == nil {
		t.Fatal("a northing in metres was taken for a latitude")
	}
	msg := err.Error()
	if strings.Contains(msg, "swapped") {
		t.Errorf("lat 5820000 (UTM metres): %q; want no swap, which cannot help", msg)
	}
	if _, err := p.Parse([]byte(`{"asset_id":"veh-swap","occurred_at":"2026-08-08T11:59:00Z","lat":123.4,"lon":52.5}`), parseNow); err == nil ||
		!strings.Contains(err.Error(), "swapped") {
		t.Errorf("lat 123.4, lon 52.5: %v; want the swap hint", err)
	}
}
