package dedup

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

	tests := []struct {
		name   string
		parser Parser
		body   string
		want   Ping
	}{
		{"defaults, UTC", NewParser(),
			`{"asset_id":"veh-88","occurred_at":"2026-08-08T11:59:00Z","lat":52.5200087,"lon":13.4049547}`,
			Ping{"veh-88", time.Date(2026, 8, 8, 11, 59, 0, 0, time.UTC), 52.5200087, 13.4049547}},
		{"offset converted to UTC", NewParser(),
			`{"asset_id":"veh-88","occurred_at":"2026-08-08T13:59:00.250+02:00","lat":1,"lon":2}`,
			Ping{"veh-88", time.Date(2026, 8, 8, 11, 59, 0, 250e6, time.UTC), 1, 2}},
		{"offset without colon (Java trackers)", NewParser(),
			`{"asset_id":"veh-88","occurred_at":"2026-08-08T11:59:00.000+0000","lat":1,"lon":2}`,
			Ping{"veh-88", time.Date(2026, 8, 8, 11, 59, 0, 0, time.UTC), 1, 2}},
		{"numeric asset id", NewParser(),
			`{"asset_id":4711,"occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`,
			Ping{"4711", time.Date(2026, 8, 8, 11, 59, 0, 0, time.UTC), 1, 2}},
		{"auto: epoch seconds", NewParser(),
			`{"asset_id":"a","occurred_at":1786190340,"lat":1,"lon":2}`,
			Ping{"a", time.Date(2026, 8, 8, 11, 59, 0, 0, time.UTC), 1, 2}},
		{"auto: epoch milliseconds", NewParser(),
			`{"asset_id":"a","occurred_at":1786190340500,"lat":1,"lon":2}`,
			Ping{"a", time.Date(2026, 8, 8, 11, 59, 0, 500e6, time.UTC), 1, 2}},
		{"unix with fraction", unix,
			`{"asset_id":"a","occurred_at":1786190340.5,"lat":1,"lon":2}`,
			Ping{"a", time.Date(2026, 8, 8, 11, 59, 0, 500e6, time.UTC), 1, 2}},
		{"unix_ms", unixMS,
			`{"asset_id":"a","occurred_at":1786190340000,"lat":1,"lon":2}`,
			Ping{"a", time.Date(2026, 8, 8, 11, 59, 0, 0, time.UTC), 1, 2}},
		{"nested paths", nested,
			`{"device":{"id":"t-1"},"position":{"fixTime":"2026-08-08T11:59:00Z","latitude":-33.9,"longitude":151.2}}`,
			Ping{"t-1", time.Date(2026, 8, 8, 11, 59, 0, 0, time.UTC), -33.9, 151.2}},
		{"extra fields ignored", NewParser(),
			`{"speed":12.5,"asset_id":"a","heading":90,"occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`,
			Ping{"a", time.Date(2026, 8, 8, 11, 59, 0, 0, time.UTC), 1, 2}},
		{"within max_future", NewParser(),
			`{"asset_id":"a","occurred_at":"2026-08-08T12:04:59Z","lat":1,"lon":2}`,
			Ping{"a", time.Date(2026, 8, 8, 12, 4, 59, 0, time.UTC), 1, 2}},
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
	rfc, unix := NewParser(), NewParser()
	rfc.TimeFormat, unix.TimeFormat = TimeRFC3339, TimeUnix
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
		{"missing asset", NewParser(), `{"occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "asset_id", RuleRequired},
		{"empty asset", NewParser(), `{"asset_id":"","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "asset_id", RuleRequired},
		{"null asset", NewParser(), `{"asset_id":null,"occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "asset_id", RuleRequired},
		{"object asset", NewParser(), `{"asset_id":{"id":1},"occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "asset_id", RuleType},
		{"missing time", NewParser(), `{"asset_id":"a","lat":1,"lon":2}`, "occurred_at", RuleRequired},
		{"boolean time", NewParser(), `{"asset_id":"a","occurred_at":true,"lat":1,"lon":2}`, "occurred_at", RuleType},
		{"number under rfc3339", rfc, `{"asset_id":"a","occurred_at":1786190340,"lat":1,"lon":2}`, "occurred_at", RuleType},
		{"string under unix", unix, `{"asset_id":"a","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`, "occurred_at", RuleType},
		{"missing lat", NewParser(), `{"asset_id":"a","occurred_at":"2026-08-08T11:59:00Z","lon":2}`, "lat", RuleRequired},
		{"string lat", NewParser(), `{"asset_id":"a","occurred_at":"2026-08-08T11:59:00Z","lat":"52.1","lon":2}`, "lat", RuleType},
		{"null lon", NewParser(), `{"asset_id":"a","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":null}`, "lon", RuleRequired},
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
	for name, body := range map[string]string{
		"empty":         ``,
		"not JSON":      `asset_id=veh-88`,
		"truncated":     `{"asset_id":"veh-88","lat":`,
		"array":         `[{"asset_id":"veh-88"}]`,
		"bare string":   `"veh-88"`,
		"trailing junk": `{"asset_id":"a"} x`,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := NewParser().Parse([]byte(body), parseNow)
			var me *MalformedError
			if !errors.As(err, &me) {
				t.Fatalf("got %v, want a MalformedError", err)
			}
		})
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
