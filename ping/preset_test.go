package ping

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/geo"
)

// Each preset reads a real sample of its tracker's format.
func TestPresetsReadTheirFormats(t *testing.T) {
	now := time.Date(2024, 5, 1, 10, 1, 0, 0, time.UTC)
	tests := []struct {
		preset string
		body   string
		want   Ping
	}{
		{"owntracks",
			// OwnTracks HTTP mode, as the Android app posts a location.
			`{"_type":"location","acc":12,"alt":41,"batt":83,"bs":1,"conn":"w","created_at":1714557660,"lat":52.5200087,` +
				`"lon":13.4049547,"m":1,"t":"u","tid":"jj","tst":1714557600,"vac":3,"vel":0}`,
			Ping{Asset: "jj", Time: time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC), Lat: 52.5200087, Lon: 13.4049547}},
		{"traccar",
			// Traccar position forwarding with forward.json enabled.
			`{"position":{"id":0,"attributes":{"batteryLevel":87.0,"distance":0.0,"totalDistance":1234.5,"motion":false},` +
				`"deviceId":1,"protocol":"osmand","serverTime":"2024-05-01T10:00:01.000+00:00","deviceTime":"2024-05-01T10:00:00.000+00:00",` +
				`"fixTime":"2024-05-01T10:00:00.000+00:00","outdated":false,"valid":true,"latitude":52.5200087,"longitude":13.4049547,` +
				`"altitude":34.0,"speed":0.0,"course":0.0,"address":null,"accuracy":5.0,"network":null,"geofenceIds":null},` +
				`"device":{"id":1,"attributes":{},"groupId":0,"calendarId":0,"name":"Truck 88","uniqueId":"358240051111110",` +
				`"status":"online","lastUpdate":"2024-05-01T10:00:01.000+00:00","positionId":0,"phone":null,"model":null,` +
				`"contact":null,"category":"truck","disabled":false,"expirationTime":null}}`,
			Ping{Asset: "358240051111110", Time: time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC), Lat: 52.5200087, Lon: 13.4049547}},
		{"traccar",
			// Without the device object, the position's deviceId names the asset.
			`{"position":{"deviceId":7,"fixTime":"2024-05-01T12:00:00.000+0200","latitude":-33.8688,"longitude":151.2093}}`,
			Ping{Asset: "7", Time: time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC), Lat: -33.8688, Lon: 151.2093}},
		{"traccar",
			// A status message without a fix: the last fix's fixTime, its own deviceTime.
			`{"position":{"deviceId":7,"protocol":"gt06","fixTime":"2024-05-01T09:40:00.000+00:00","deviceTime":"2024-05-01T10:00:00.000+00:00",` +
				`"valid":true,"latitude":52.5200087,"longitude":13.4049547,"attributes":{"ignition":true}},"device":{"uniqueId":"358240051111110"}}`,
			Ping{Asset: "358240051111110", Time: time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC), Lat: 52.5200087, Lon: 13.4049547}},
		{"geojson",
			`{"type":"Feature","id":"veh-88","geometry":{"type":"Point","coordinates":[13.4049547,52.5200087]},` +
				`"properties":{"time":"2024-05-01T10:00:00Z","speed":0}}`,
			Ping{Asset: "veh-88", Time: time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC), Lat: 52.5200087, Lon: 13.4049547}},
		{"geojson",
			`{"type":"Feature","geometry":{"type":"Point","coordinates":[-122.0936,37.4263,12.5]},` +
				`"properties":{"id":42,"timestamp":1714557600000}}`,
			Ping{Asset: "42", Time: time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC), Lat: 37.4263, Lon: -122.0936}},
		{"geojson",
			// A serializer writes an unset id as null: the next path names the asset.
			`{"type":"Feature","id":null,"geometry":{"type":"Point","coordinates":[-122.0936,37.4263]},` +
				`"properties":{"id":"veh-7","time":null,"timestamp":1714557600000}}`,
			Ping{Asset: "veh-7", Time: time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC), Lat: 37.4263, Lon: -122.0936}},
		{"geojson",
			// An empty or blank id names no device: the next path does.
			`{"type":"Feature","id":"","geometry":{"type":"Point","coordinates":[-122.0936,37.4263]},` +
				`"properties":{"id":"veh-7","time":"2024-05-01T10:00:00Z"}}`,
			Ping{Asset: "veh-7", Time: time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC), Lat: 37.4263, Lon: -122.0936}},
		{"owntracks",
			// Android sends "tid":"" for a tid setting of no letters or digits.
			`{"_type":"location","tid":"","topic":"owntracks/jane/phone","tst":1714557600,"lat":52.52,"lon":13.4}`,
			Ping{Asset: "owntracks/jane/phone", Time: time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC), Lat: 52.52, Lon: 13.4}},
		{"traccar",
			// Traccar's ObjectMapper writes null for a time it was not given.
			`{"position":{"deviceId":7,"deviceTime":null,"fixTime":"2024-05-01T10:00:00.000+00:00","latitude":-33.8688,"longitude":151.2093},` +
				`"device":{"uniqueId":null}}`,
			Ping{Asset: "7", Time: time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC), Lat: -33.8688, Lon: 151.2093}},
	}
	for _, tt := range tests {
		t.Run(tt.preset, func(t *testing.T) {
			got, err := mustPreset(tt.preset).Parser.Parse([]byte(tt.body), now)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got.Asset != tt.want.Asset || !got.Time.Equal(tt.want.Time) || got.Lat != tt.want.Lat || got.Lon != tt.want.Lon {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestOwnTracksNonLocationMessagesAreNotPings(t *testing.T) {
	p := mustPreset("owntracks").Parser
	for _, body := range []string{
		`{"_type":"card","name":"Jane","face":"iVBORw0KGgo="}`,
		`{"_type":"transition","event":"leave","desc":"Home","lat":52.52,"lon":13.40,"tid":"jj","tst":1714557600,"wtst":1700000000,"t":"c"}`,
		`{"_type":"lwt","tst":1714557600}`,
	} {
		if _, err := p.Parse([]byte(body), time.Now()); !errors.Is(err, ErrNotAPing) {
			t.Errorf("%s: got %v, want ErrNotAPing", body, err)
		}
	}
}

// What Traccar's event forwarder posts is not a position, with or without
// the position the event happened at; a position forward is, whatever its
// attributes say (an attribute named event is a device's own).
func TestTraccarEventForwardsAreNotPings(t *testing.T) {
	p := mustPreset("traccar").Parser
	for _, body := range []string{
		`{"event":{"id":9,"attributes":{},"deviceId":7,"type":"deviceOnline","eventTime":"2024-05-01T10:00:00.000+00:00",` +
			`"positionId":0,"geofenceId":0,"maintenanceId":0},"device":{"id":7,"uniqueId":"358240051111110"}}`,
		`{"event":{"id":10,"attributes":{},"deviceId":7,"type":"geofenceEnter","eventTime":"2024-05-01T10:00:00.000+00:00",` +
			`"positionId":31,"geofenceId":2,"maintenanceId":0},"position":{"id":31,"deviceId":7,"fixTime":"2024-05-01T10:00:00.000+00:00",` +
			`"latitude":52.52,"longitude":13.40},"device":{"id":7,"uniqueId":"358240051111110"},"geofence":{"id":2,"name":"Depot"}}`,
	} {
		if _, err := p.Parse([]byte(body), time.Now()); !errors.Is(err, ErrNotAPing) {
			t.Errorf("%s: got %v, want ErrNotAPing", body, err)
		}
	}
	position := `{"position":{"deviceId":7,"fixTime":"2024-05-01T10:00:00.000+00:00","latitude":52.52,"longitude":13.40,` +
		`"attributes":{"event":3}},"device":{"uniqueId":"358240051111110"}}`
	if _, err := p.Parse([]byte(position), time.Date(2024, 5, 1, 10, 1, 0, 0, time.UTC)); err != nil {
		t.Errorf("a position with an event attribute: %v, want a ping", err)
	}
}

func TestGeoJSONWithoutAPointIsRejected(t *testing.T) {
	p := mustPreset("geojson").Parser
	body := `{"type":"Feature","id":"a","geometry":{"type":"LineString","coordinates":[[13.4,52.5],[13.5,52.6]]},"properties":{"time":"2024-05-01T10:00:00Z"}}`
	var ie *InvalidPingError
	if _, err := p.Parse([]byte(body), time.Now()); !errors.As(err, &ie) || ie.Field != "geometry.coordinates.1" || ie.Rule != RuleType {
		t.Fatalf("got %v, want a type error on geometry.coordinates.1", err)
	}
}

// mustPreset returns a preset that exists.
func mustPreset(name string) Preset {
	p, err := ParsePreset(name)
	if err != nil {
		panic(err)
	}
	return p
}

func TestEveryPresetExists(t *testing.T) {
	for _, name := range Presets {
		if _, err := ParsePreset(name); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := ParsePreset("teltonika"); err == nil {
		t.Error("unknown preset accepted")
	}
}

// A projected position is reprojected before validation and keying: the
// fields name the axis the CRS refused.
func TestParserReprojects(t *testing.T) {
	utm33, _ := geo.ParseCRS("EPSG:32633")
	webMercator, _ := geo.ParseCRS("EPSG:3857")
	for _, tt := range []struct {
		crs      geo.CRS
		x, y     string
		lat, lon float64
	}{
		// The central meridian of zone 33 (15°E) at the equator.
		{utm33, "500000", "0", 0, 15},
		// EPSG Guidance Note 7-2, Pseudo-Mercator example: 24°22'54.433"N 100°20'W.
		{webMercator, "-11169055.58", "2800000.00", 24.381787, -100.333333},
	} {
		p := NewParser()
		p.CRS = tt.crs
		body := `{"asset_id":"a","occurred_at":"2024-05-01T10:00:00Z","lat":` + tt.y + `,"lon":` + tt.x + `}`
		got, err := p.Extract([]byte(body))
		if err != nil {
			t.Fatalf("%s: %v", tt.crs, err)
		}
		if math.Abs(got.Lat-tt.lat) > 1e-6 || math.Abs(got.Lon-tt.lon) > 1e-6 {
			t.Errorf("%s (%s, %s): got %v, %v; want %v, %v", tt.crs, tt.x, tt.y, got.Lat, got.Lon, tt.lat, tt.lon)
		}
	}

	p := NewParser()
	p.CRS = utm33
	var ie *InvalidPingError
	_, err := p.Extract([]byte(`{"asset_id":"a","occurred_at":"2024-05-01T10:00:00Z","lat":5000000,"lon":1200000}`))
	if !errors.As(err, &ie) || ie.Field != "lon" || ie.Rule != RuleRange {
		t.Fatalf("easting out of the zone: got %v, want lon/range", err)
	}
}

// Traccar keeps a position whatever its time or place, so the presets of
// what reaches it pass such a position on unkeyed (ErrNotAPing, naming the
// rule), where the others refuse it.
func TestTraccarPresetsPassImplausiblePositions(t *testing.T) {
	now := time.Date(2024, 5, 1, 10, 1, 0, 0, time.UTC)
	for _, tt := range []struct {
		preset, body string
		rule         Rule
	}{
		{"traccar", `{"position":{"deviceId":7,"deviceTime":"2004-09-16T10:00:00.000+00:00","latitude":52.52,"longitude":13.40}}`, RulePast},
		{"traccar", `{"position":{"deviceId":7,"deviceTime":"2024-05-01T13:00:00.000+00:00","latitude":52.52,"longitude":13.40}}`, RuleFuture},
		{"traccar", `{"position":{"deviceId":7,"deviceTime":"2024-05-01T10:00:00.000+00:00","latitude":0.0,"longitude":0.0}}`, RuleNullIsland},
		{"osmand", `{"location":{"timestamp":"2024-05-01T13:00:00.000Z","coords":{"latitude":37.42,"longitude":-122.08}},"device_id":"48241179"}`, RuleFuture},
	} {
		_, err := mustPreset(tt.preset).Parser.Parse([]byte(tt.body), now)
		var implausible ImplausibleError
		if !errors.Is(err, ErrNotAPing) || !errors.As(err, &implausible) || implausible.Rule != tt.rule {
			t.Errorf("%s %s: got %v, want it passed on for %s", tt.preset, tt.body, err, tt.rule)
		}
		// What counts pings by rule (analyze) finds the rule too.
		if invalid := (*InvalidPingError)(nil); !errors.As(err, &invalid) || invalid.Rule != tt.rule {
			t.Errorf("%s %s: %v does not unwrap to the rule %s", tt.preset, tt.body, err, tt.rule)
		}
	}
	form := mustPreset("osmand").Form
	if _, err := form.Parse([]byte(`{"id":"1","timestamp":1714557660,"lat":0,"lon":0}`), now); !errors.Is(err, ErrNotAPing) {
		t.Errorf("osmand form at (0, 0): got %v, want it passed on", err)
	}
	_, err := mustPreset("geojson").Parser.Parse([]byte(`{"id":"a","geometry":{"coordinates":[13.4,52.5]},"properties":{"time":"2004-09-16T10:00:00Z"}}`), now)
	var invalidPing *InvalidPingError
	if errors.Is(err, ErrNotAPing) || !errors.As(err, &invalidPing) || invalidPing.Rule != RulePast {
		t.Errorf("geojson from 2004: got %v, want it refused", err)
	}
}

// Traccar reads OsmAnd's valid as Boolean.parseBoolean(v) || "1".equals(v):
// only true, in any letter case, and 1 mark a valid position; the preset
// passes every other on unkeyed, as Traccar stores it marked invalid.
func TestOsmAndValidIsReadAsTraccarReadsIt(t *testing.T) {
	form := *mustPreset("osmand").Form
	form.MaxPast = 0
	for value, valid := range map[string]bool{"true": true, "TRUE": true, "True": true, "1": true,
		"false": false, "False": false, "0": false, "no": false, "yes": false, "": false} {
		batch, err := form.SplitForm("id=1&timestamp=1714557600&lat=52.52&lon=13.40&valid="+value, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = form.Parse(batch.Elements[0], time.Date(2024, 5, 1, 10, 1, 0, 0, time.UTC))
		if got := !errors.Is(err, ErrNotAPing); got != valid || (valid && err != nil) {
			t.Errorf("valid=%s: %v, want a position %v", value, err, valid)
		}
	}
}

// A Transistorsoft geofence crossing that Traccar forwards carries the
// event attribute its OsmAnd decoder copied from location.event: an event,
// as the osmand preset reads it at Traccar's door. Other protocols' event
// codes, numbers sent with routine positions, are not.
func TestTraccarForwardsAGeofenceCrossingAsAnEvent(t *testing.T) {
	p := mustPreset("traccar").Parser
	position := func(attributes string) string {
		return `{"position":{"deviceId":7,"fixTime":"2024-05-01T10:00:00.000+00:00","latitude":52.52,"longitude":13.4,"attributes":{` +
			attributes + `}},"device":{"uniqueId":"48241179"}}`
	}
	for _, tt := range []struct{ attributes, event string }{
		{`"event":"geofence","motion":false`, "position.attributes.event=geofence"},
		{`"event":"motionchange"`, ""},
		{`"event":35`, ""},
		{`"motion":false`, ""},
	} {
		got, err := p.Parse([]byte(position(tt.attributes)), time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC))
		if err != nil || got.Event != tt.event {
			t.Errorf("%s: event %q (%v), want %q", tt.attributes, got.Event, err, tt.event)
		}
	}
}

// The OsmAnd app fills its live tracking URL's {3} with the fix's
// accuracy in metres, which the URL Traccar documents for it names hdop
// (...&timestamp={2}&hdop={3}&altitude={4}&speed={5}); it has no accuracy
// field. Read only at accuracy, every OsmAnd fix had no uncertainty, and
// sliding and session judged a phone indoors reporting 40 m by the radius
// alone. Traccar Client's accuracy, when sent, counts. hdop follows
// accuracy's rules for a field given again: one number in two spellings is
// one value, and a fallback given twice with two values reads as no
// accuracy rather than refusing a fix (refused, the clients resend it
// forever; when hdop was first read, these were refused 400).
func TestOsmAndAppsAccuracyIsReadFromHdop(t *testing.T) {
	parser := *mustPreset("osmand").Form
	now := time.Date(2026, 12, 6, 15, 0, 0, 0, time.UTC)
	const fix = "id=pixel7&lat=48.856827&lon=2.292713&timestamp=1796568000000"
	for _, tt := range []struct {
		query string
		want  float64
	}{
		// As the OsmAnd app GETs it: Java floats, the time in milliseconds.
		{fix + "&hdop=40.0&altitude=35.0&speed=0.0&bearing=0.0", 40},
		{fix + "&accuracy=12&hdop=40", 12},
		{fix, 0},
		{fix + "&accuracy=40.0&accuracy=40", 40},
		{fix + "&hdop=40.0&hdop=40", 40},
		{fix + "&accuracy=12&hdop=40&hdop=41", 12},
		{fix + "&hdop=40&hdop=41", 0},
	} {
		batch, err := parser.SplitForm(tt.query, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := parser.Parse(batch.Elements[0], now)
		if err != nil || got.Accuracy != tt.want {
			t.Errorf("%s: accuracy %v (%v), want %v", tt.query, got.Accuracy, err, tt.want)
		}
	}
}
