package ping

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/tidwall/gjson"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/geo"
)

// Run a target with, for example:
//
//	go test -run XXX -fuzz FuzzParse$ -fuzztime 60s ./dedup/
//	go test -run XXX -fuzz FuzzParseTime -fuzztime 60s ./dedup/
//
// Plain go test runs every seed below and in testdata/fuzz as a regression
// test.

// fuzzNow is the server clock of the fuzz targets.
var fuzzNow = time.Date(2026, 8, 8, 12, 0, 0, 0, time.UTC)

// parseSeeds are the most important bodies; testdata/fuzz/FuzzParse holds
// more, one case a file.
var parseSeeds = []string{
	// Valid pings in every format.
	`{"asset_id":"veh-88","occurred_at":"2026-08-08T11:59:00Z","lat":52.5200087,"lon":13.4049547}`,
	`{"asset_id":4711,"occurred_at":1786190340500,"lat":-33.9,"lon":151.2,"speed":12.5}`,
	`{"_type":"location","acc":12,"alt":41,"batt":83,"bs":1,"conn":"w","created_at":1786190340,"lat":52.5200087,` +
		`"lon":13.4049547,"m":1,"t":"u","tid":"jj","tst":1786190340,"vac":3,"vel":0}`,
	`{"position":{"id":0,"attributes":{"batteryLevel":87.0,"motion":false},"deviceId":1,"protocol":"osmand",` +
		`"fixTime":"2026-08-08T11:59:00.000+00:00","valid":true,"latitude":52.5200087,"longitude":13.4049547},` +
		`"device":{"id":1,"name":"Truck 88","uniqueId":"358240051111110","status":"online"}}`,
	`{"type":"Feature","id":"veh-88","geometry":{"type":"Point","coordinates":[13.4049547,52.5200087]},` +
		`"properties":{"time":"2026-08-08T11:59:00Z","speed":0}}`,
	`{"type":"Feature","geometry":{"type":"Point","coordinates":[-122.6764971,45.5230622]},"properties":` +
		`{"timestamp":"2026-08-08T11:59:00Z","speed":-1,"horizontal_accuracy":5,"device_id":"phone1","action":null}}`,
	`{"location":{"timestamp":"2026-08-08T11:59:00.444Z","coords":{"latitude":-6.1148096,"longitude":106.6837015,` +
		`"accuracy":3.8,"speed":18.67},"is_moving":false,"event":"geofence","alarm":"sos"},"device_id":"8737767034"}`,
	`{"id":123456,"timestamp":1786190340,"lat":60.0,"lon":30.0,"speed":0.0,"alarm":"sos","ignition":true,"valid":1}`,
	`{"position":{"attributes":{"alarm":"sos","ignition":false,"driverUniqueId":4711},"deviceId":1,` +
		`"fixTime":1786190340000,"valid":true,"latitude":52.52,"longitude":13.40},"device":{"uniqueId":"t"}}`,
	`{"asset_id":"utm","occurred_at":"2026-08-08T11:59:00+02:00","lat":5820000,"lon":390000}`,
	// Hostile ones.
	`{"asset_id":"a","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2,"lat":91}`,
	`{"asset_id":"a","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2,"l\u0061t":91}`,
	`{"asset_id":"a","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2,"LAT":91}`,
	`{"position":{"latitude":1,"longitude":2,"fixTime":"2026-08-08T11:59:00Z"},"position":{"latitude":91},"device":{"uniqueId":"t"}}`,
	`{"_type":"card","_type":"location","tid":"jj","tst":1786190340,"lat":1,"lon":2}`,
	"{\"asset_id\":\"veh-\xff\",\"occurred_at\":\"2026-08-08T11:59:00Z\",\"lat\":1,\"lon\":2}",
	`{"asset_id":"a","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2,"x":` + strings.Repeat("[", 65) + strings.Repeat("]", 65) + `}`,
	`{"asset_id":"a\"[[[[","occurred_at":"2026-08-08T11:59:00Z","lat":1e400,"lon":2}`,
	`{"asset_id":123456789012345678901234567890,"occurred_at":1e30,"lat":1,"lon":2}`,
	`{"asset_id":"veh\n88","occurred_at":1e13,"lat":0,"lon":0}`,
	`{"_type":"location","tid":"jj","tst":1786190340,"lat":52.08,"lon":5.12,"t":"u","poi":"Café","tag":"work","inregions":["Home"]}`,
}

// fuzzParsers are the parsers FuzzParse feeds every body to: the defaults,
// every preset, and a projected CRS, all without max_past, since the
// corpus spans decades (FuzzParseTime keeps it).
func fuzzParsers(tb testing.TB) map[string]Parser {
	parsers := map[string]Parser{"default": NewParser()}
	for _, name := range Presets {
		p, err := ParsePreset(name)
		if err != nil {
			tb.Fatal(err)
		}
		parsers[name] = p.Parser
		if p.Form != nil {
			parsers[name+" form"] = *p.Form
		}
	}
	utm, err := geo.ParseCRS("EPSG:32633")
	if err != nil {
		tb.Fatal(err)
	}
	p := NewParser()
	p.CRS = utm
	parsers["EPSG:32633"] = p
	for name, p := range parsers {
		p.MaxPast = 0
		parsers[name] = p
	}
	return parsers
}

// FuzzParse feeds arbitrary bodies to every parser. A ping it accepts keeps
// every rule, and reads as encoding/json reads the same body (which keeps
// the last of duplicate keys, like many backends): nothing the dedup
// validated may be stored differently upstream. Anything it refuses is a
// *MalformedError, an *InvalidPingError or ErrNotAPing.
func FuzzParse(f *testing.F) {
	for _, seed := range parseSeeds {
		f.Add([]byte(seed))
	}
	parsers := fuzzParsers(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		for name, p := range parsers {
			ping, err := p.Parse(body, fuzzNow)
			if err != nil {
				checkParseError(t, name, p, err)
				continue
			}
			checkPing(t, name, p, ping, fuzzNow)
			checkReadsLikeEncodingJSON(t, name, p, body, ping)
		}
	})
}

// checkParseError requires one of the three documented errors, complete.
func checkParseError(t *testing.T, name string, p Parser, err error) {
	t.Helper()
	var me *MalformedError
	var ie *InvalidPingError
	switch {
	case errors.Is(err, ErrNotAPing):
		if p.KindPath == "" && len(p.Skip) == 0 && !p.SkipEmpty {
			t.Fatalf("%s: ErrNotAPing from a parser without a kind filter", name)
		}
	case errors.As(err, &me):
		if me.Reason == "" {
			t.Fatalf("%s: MalformedError without a reason", name)
		}
	case errors.As(err, &ie):
		if ie.Field == "" || ie.Rule == "" || ie.Detail == "" {
			t.Fatalf("%s: incomplete InvalidPingError %#v", name, ie)
		}
		if !knownRules[ie.Rule] {
			t.Fatalf("%s: unknown rule %q in %v", name, ie.Rule, ie)
		}
		if !isConfiguredField(p, ie.Field) {
			t.Fatalf("%s: field %q is not a configured path (%v)", name, ie.Field, ie)
		}
	default:
		t.Fatalf("%s: error %T %v is none of MalformedError, InvalidPingError, ErrNotAPing", name, err, err)
	}
}

var knownRules = map[Rule]bool{
	RuleRequired: true, RuleType: true, RuleTimeFormat: true, RuleTimezone: true,
	RuleFinite: true, RuleRange: true, RuleNullIsland: true, RuleFuture: true, RulePast: true,
}

func isConfiguredField(p Parser, field string) bool {
	if field == "asset" && len(p.AssetPaths) == 0 {
		return true
	}
	// Every path the parser reads: a field given twice with different
	// values is refused at its path, an event's or a state's too.
	paths := slices.Concat(p.AssetPaths, p.TimePaths, p.States, p.EventDetails,
		[]string{p.LatPath, p.LonPath, p.PairField, p.KindPath, p.AccuracyPath, p.SpeedPath, p.AccuracyFallback})
	for _, m := range slices.Concat(p.Events, p.Skip) {
		paths = append(paths, m.Path)
	}
	return field != "" && slices.Contains(paths, field)
}

// checkPing requires an accepted ping to keep every rule.
func checkPing(t *testing.T, name string, p Parser, ping Ping, now time.Time) {
	t.Helper()
	if strings.TrimSpace(ping.Asset) == "" || len(ping.Asset) > MaxAssetBytes {
		t.Fatalf("%s: accepted asset id of %d bytes", name, len(ping.Asset))
	}
	for i := 0; i < len(ping.Asset); i++ {
		if controlAt(ping.Asset, i) >= 0 {
			t.Fatalf("%s: accepted asset id %q with a control character", name, ping.Asset)
		}
	}
	if math.IsNaN(ping.Lat) || ping.Lat < -90 || ping.Lat > 90 {
		t.Fatalf("%s: accepted latitude %v", name, ping.Lat)
	}
	if math.IsNaN(ping.Lon) || ping.Lon < -180 || ping.Lon > 180 {
		t.Fatalf("%s: accepted longitude %v", name, ping.Lon)
	}
	if ping.Lat == 0 && ping.Lon == 0 && !p.AllowNullIsland {
		t.Fatalf("%s: accepted null island", name)
	}
	if ping.Time.After(now.Add(p.MaxFuture)) {
		t.Fatalf("%s: accepted time %v, more than %v after %v", name, ping.Time, p.MaxFuture, now)
	}
	if p.MaxPast > 0 && ping.Time.Before(now.Add(-p.MaxPast)) {
		t.Fatalf("%s: accepted time %v, more than %v before %v", name, ping.Time, p.MaxPast, now)
	}
	if ping.Time.Location() != time.UTC {
		t.Fatalf("%s: time %v is not in UTC", name, ping.Time)
	}
}

// checkReadsLikeEncodingJSON decodes an accepted body with encoding/json and
// requires the same asset, time, position and kind at the configured paths.
func checkReadsLikeEncodingJSON(t *testing.T, name string, p Parser, body []byte, ping Ping) {
	t.Helper()
	if !utf8.Valid(body) {
		t.Fatalf("%s: accepted a body that is not UTF-8", name)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("%s: accepted a body encoding/json refuses: %v", name, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		t.Fatalf("%s: accepted a body with data after the object (%v)", name, err)
	}
	if _, ok := doc.(map[string]any); !ok {
		t.Fatalf("%s: accepted a body that is not an object: %T", name, doc)
	}

	if p.KindPath != "" {
		if v, _ := lookup(doc, p.KindPath); v != p.Kind {
			t.Fatalf("%s: kind %q read, encoding/json reads %#v", name, p.Kind, v)
		}
	}
	if len(p.AssetPaths) > 0 {
		v, path := lookupFirst(doc, p.AssetPaths, true)
		var asset string
		switch v := v.(type) {
		case string:
			asset = v
		case json.Number:
			asset = v.String()
		default:
			t.Fatalf("%s: asset %q read, encoding/json reads %#v at %q", name, ping.Asset, v, path)
		}
		if asset != ping.Asset {
			t.Fatalf("%s: asset %q read, encoding/json reads %q at %q", name, ping.Asset, asset, path)
		}
	}

	v, path := lookupFirst(doc, p.TimePaths, false)
	var tv gjson.Result
	switch v := v.(type) {
	case string:
		tv = gjson.Result{Type: gjson.String, Str: v, Raw: strconv.Quote(v)}
	case json.Number:
		tv = gjson.Parse(v.String())
	default:
		t.Fatalf("%s: time %v read, encoding/json reads %#v at %q", name, ping.Time, v, path)
	}
	if tm, err := parseTime(tv, p.TimeFormat, path); err != nil || !tm.Equal(ping.Time) {
		t.Fatalf("%s: time %v read, encoding/json's %#v at %q gives %v (%v)", name, ping.Time, v, path, tm, err)
	}

	y, yok := lookupNumber(doc, p.LatPath)
	x, xok := lookupNumber(doc, p.LonPath)
	if !yok || !xok {
		t.Fatalf("%s: position read, encoding/json finds no numbers at %q, %q", name, p.LatPath, p.LonPath)
	}
	lat, lon, err := p.CRS.ToWGS84(x, y)
	if err != nil || lat != ping.Lat || lon != ping.Lon {
		t.Fatalf("%s: position %v, %v read, encoding/json's gives %v, %v (%v)", name, ping.Lat, ping.Lon, lat, lon, err)
	}
	checkFieldsReadLikeEncodingJSON(t, name, p, doc, ping)
}

// checkFieldsReadLikeEncodingJSON requires the event, the state and the
// records that are not positions to be what encoding/json finds at their
// paths.
func checkFieldsReadLikeEncodingJSON(t *testing.T, name string, p Parser, doc any, ping Ping) {
	t.Helper()
	for _, m := range p.Skip {
		if decodedMatches(doc, m) {
			t.Fatalf("%s: read as a ping, but encoding/json finds %v, which is not a position", name, m)
		}
	}
	for _, path := range append(slices.Clone(p.States), p.EventDetails...) {
		switch v, _ := lookup(doc, path); v.(type) {
		case map[string]any, []any:
			return // read as its raw JSON, whose spacing and key order encoding/json does not keep
		}
	}
	event := ""
	for _, m := range p.Events {
		if decodedMatches(doc, m) {
			s, _ := decodedText(doc, m.Path)
			event = field(m.Path, s)
			for _, path := range p.EventDetails {
				if s, ok := decodedText(doc, path); ok && s != "" {
					event += "&" + field(path, s)
				}
			}
			break
		}
	}
	var state []string
	for _, path := range p.States {
		if s, ok := decodedText(doc, path); ok || slices.Contains(p.ClearedWhenAbsent, path) {
			state = append(state, field(path, s))
		}
	}
	if event != ping.Event || strings.Join(state, "&") != ping.State {
		t.Fatalf("%s: event %q state %q read, encoding/json finds %q %q", name, ping.Event, ping.State, event, strings.Join(state, "&"))
	}
}

// decodedText is text() over what encoding/json decoded; objects and arrays,
// whose raw JSON it does not keep, as their Go form.
func decodedText(doc any, path string) (string, bool) {
	v, ok := lookup(doc, path)
	switch v := v.(type) {
	case nil:
		return "", false
	case string:
		return v, true
	case json.Number:
		return v.String(), true
	case bool:
		return strconv.FormatBool(v), ok
	}
	b, _ := json.Marshal(v)
	return string(b), ok
}

func decodedMatches(doc any, m Match) bool {
	s, ok := decodedText(doc, m.Path)
	v, _ := lookup(doc, m.Path)
	switch {
	case m.Absent:
		return !ok
	case m.Except:
		return ok && !slices.ContainsFunc(m.Values, func(value string) bool { return strings.EqualFold(s, value) })
	case m.Negative:
		n, isNumber := v.(json.Number)
		f, _ := n.Float64() // -Inf past the float range, as gjson reads it
		return isNumber && f < 0
	case len(m.Values) == 0:
		return ok && s != "" && v != false
	}
	for _, want := range m.Values {
		if ok && s == want {
			return true
		}
	}
	return false
}

// FuzzSplitForm feeds arbitrary query strings to the OsmAnd parser: what it
// accepts reads as encoding/json reads the object the fields became, like
// any JSON ping, and it refuses only with the documented errors.
func FuzzSplitForm(f *testing.F) {
	for _, seed := range []string{
		"id=123456&timestamp=1786190340&lat=60.0&lon=30.0&speed=0.0&alarm=sos&ignition=true",
		"id=902064&lat=42.06288&lon=-88.23412&timestamp=2026-08-08T11%3A59%3A00Z",
		"id=1&timestamp=1786190340&lat=1&lat=91&lon=2",
		"id=1;lat=91", "id=%zz", "cell=1&cell=2&id=1", "id=0123&timestamp=1786190340&lat=1e400&lon=2",
	} {
		f.Add(seed)
	}
	p := *mustPreset("osmand").Form
	f.Fuzz(func(t *testing.T, query string) {
		batch, err := p.SplitForm(query, nil)
		var me *MalformedError
		if err != nil {
			if !errors.As(err, &me) {
				t.Fatalf("%q: error %T %v is not a MalformedError", query, err, err)
			}
			return
		}
		body := batch.Elements[0]
		ping, err := p.Parse(body, fuzzNow)
		if err != nil {
			checkParseError(t, "osmand form", p, err)
			return
		}
		checkPing(t, "osmand form", p, ping, fuzzNow)
		checkReadsLikeEncodingJSON(t, "osmand form", p, body, ping)
	})
}

// lookup follows a plain dotted path (no gjson syntax) through what
// encoding/json decoded, as gjson would: keys in objects, indexes in arrays.
func lookup(doc any, path string) (any, bool) {
	v := doc
	for part := range strings.SplitSeq(path, ".") {
		switch c := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = c[part]; !ok {
				return nil, false
			}
		case []any:
			i, err := strconv.Atoi(part)
			if err != nil || i < 0 || i >= len(c) || part != strconv.Itoa(i) {
				return nil, false
			}
			v = c[i]
		default:
			return nil, false
		}
	}
	return v, true
}

// lookupFirst reads the value at the first of paths that holds one, as
// the parser's first does: a null, or for an asset id (asset) an empty or
// blank string, leaves the next path to hold it, and is what it returns
// when none does.
func lookupFirst(doc any, paths []string, asset bool) (any, string) {
	var none any
	noneAt, found := paths[0], false
	for _, path := range paths {
		v, ok := lookup(doc, path)
		if !ok {
			continue
		}
		s, isString := v.(string)
		if v != nil && !(asset && isString && (s == "" || blank(s))) {
			return v, path
		}
		if !found {
			none, noneAt, found = v, path, true
		}
	}
	return none, noneAt
}

func lookupNumber(doc any, path string) (float64, bool) {
	v, _ := lookup(doc, path)
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	f, _ := strconv.ParseFloat(n.String(), 64) // ±Inf beyond float64, as gjson reads it
	return f, true
}

// FuzzParseTime feeds an arbitrary string, as a JSON string, and an
// arbitrary float64, as a JSON number, to the time field of an otherwise
// valid ping in every time format; a string that is itself a JSON number is
// fed as one too. An accepted time is in UTC and is what the text says:
// the same instant as time.Parse, the same number of seconds (or
// milliseconds) since the epoch.
func FuzzParseTime(f *testing.F) {
	for _, seed := range []struct {
		s string
		n float64
	}{
		{"2026-08-08T11:59:00Z", 1786190340},
		{"2026-08-08T13:59:00.250+02:00", 1786190340.25},
		{"2026-08-08T11:59:00.000+0000", 1786190340500},
		{"2026-08-08T11:59:00", 1e11},
		{"2026-08-08 11:59:00", 99999999999.999},
		{"yesterday", 1e13},
		{"1e13", 1e16},
		{"-1.5e12", -1e16},
		{"123456789012345678901234567890", 1e30},
		{"9999-12-31T23:59:59.999999999+23:59", math.MaxFloat64},
		{"0000-01-01T00:00:00Z", -0.5},
		{"2026-02-30T00:00:00Z", 5e-324},
	} {
		f.Add(seed.s, seed.n)
	}
	parsers := make(map[TimeFormat]Parser)
	for _, tf := range TimeFormats {
		p := NewParser()
		p.TimeFormat = tf
		parsers[tf] = p
	}
	f.Fuzz(func(t *testing.T, s string, n float64) {
		values := []string{quote(s)}
		if !math.IsNaN(n) && !math.IsInf(n, 0) {
			values = append(values, strconv.FormatFloat(n, 'g', -1, 64))
		}
		if isJSONNumber(s) {
			values = append(values, s)
		}
		for tf, p := range parsers {
			for _, raw := range values {
				body := []byte(`{"asset_id":"a","occurred_at":` + raw + `,"lat":1,"lon":2}`)
				if _, err := p.Parse(body, fuzzNow); err != nil {
					checkParseError(t, string(tf), p, err)
				}
				ping, err := p.Extract(body)
				if err != nil {
					checkParseError(t, string(tf), p, err)
					continue
				}
				if ping.Time.Location() != time.UTC {
					t.Fatalf("%s %s: time %v is not in UTC", tf, raw, ping.Time)
				}
				checkTimeMeans(t, tf, raw, ping.Time)
			}
		}
	})
}

// checkTimeMeans requires an accepted time to be the instant raw names.
func checkTimeMeans(t *testing.T, tf TimeFormat, raw string, got time.Time) {
	t.Helper()
	v := gjson.Parse(raw)
	if v.Type == gjson.String {
		if tf == TimeUnix || tf == TimeUnixMilli {
			t.Fatalf("%s accepted the string %s", tf, raw)
		}
		want, ok := parseWithOffset(v.Str)
		if !ok {
			// RFC 3339's lower-case t and z, and a leap second, read as the
			// last instant of its minute.
			s := strings.ToUpper(v.Str)
			leap := len(s) > 18 && s[16:19] == ":60"
			if leap {
				s = s[:17] + "59" + s[19:]
			}
			if want, ok = parseWithOffset(s); ok && leap {
				want = want.Truncate(time.Second).Add(time.Second - time.Nanosecond)
			}
		}
		if !ok {
			t.Fatalf("%s %s: accepted as %v, but no layout with an offset reads it", tf, raw, got)
		}
		if !want.Equal(got) {
			t.Fatalf("%s %s: got %v, time.Parse gives %v", tf, raw, got, want)
		}
		return
	}
	if tf == TimeRFC3339 {
		t.Fatalf("rfc3339 accepted the number %s", raw)
	}
	seconds := v.Num
	if tf == TimeUnixMilli || (tf == TimeAuto && math.Abs(v.Num) >= autoMillisAbove) {
		seconds = v.Num / 1000
	}
	gotSeconds := float64(got.Unix()) + float64(got.Nanosecond())/1e9
	// float64 holds about 16 digits: allow for that, and a nanosecond.
	if diff := math.Abs(gotSeconds - seconds); diff > 1e-6+math.Abs(seconds)*1e-14 {
		t.Fatalf("%s %s: got %v (%v s since the epoch), want %v s", tf, raw, got, gotSeconds, seconds)
	}
}

// parseWithOffset is time.Parse in the first layout with an offset that
// reads s.
func parseWithOffset(s string) (time.Time, bool) {
	for _, layout := range offsetLayouts {
		if t, err := time.Parse(layout, s); err == nil {
			return t, true
		}
	}
	return time.Time{}, false
}
