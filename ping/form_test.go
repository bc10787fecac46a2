package ping

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// Form fields become one JSON object, in their order: numbers as written
// stay numbers (an id keeps its text), true and false are booleans, the
// rest strings, and a field given several times the list of its values,
// or its value when they are all the same.
func TestFormFieldsBecomeOneObject(t *testing.T) {
	for _, tt := range []struct{ query, body, want string }{
		{"id=0123&lat=52.52&lon=-13.4e0&valid=true&alarm=alert%20message&bearing=.5&name=a+b", "",
			`{"id":"0123","lat":52.52,"lon":-13.4e0,"valid":true,"alarm":"alert message","bearing":".5","name":"a b"}`},
		// The query wins; the body is read only when the URL has none, as
		// Traccar's decoder does.
		{"id=1&lat=1", "id=2&lat=2", `{"id":1,"lat":1}`},
		{"", "id=2&lat=2&&empty=&flag", `{"id":2,"lat":2,"empty":"","flag":""}`},
		{"cell=257,02&wifi=a,-80&cell=257,03", "", `{"cell":["257,02","257,03"],"wifi":"a,-80"}`},
		{"speed=1&id=1&speed=1", "", `{"speed":1,"id":1}`},
		{"lat=52.5&id=1&lat=52.50&id=1.0&speed=12&speed=1.2e1&accuracy=5&accuracy=05", "",
			`{"lat":52.5,"id":[1,1.0],"speed":12,"accuracy":[5,"05"]}`},
		{"q=%22%5C%0A%3C", "", `{"q":"\"\\\n\u003c"}`},
	} {
		batch, err := osmAnd().SplitForm(tt.query, []byte(tt.body))
		if err != nil {
			t.Fatalf("%q %q: %v", tt.query, tt.body, err)
		}
		if got := string(batch.Elements[0]); got != tt.want || batch.Framing != Form || !batch.Single() {
			t.Errorf("%q %q: got %s (framing %v), want %s", tt.query, tt.body, got, batch.Framing, tt.want)
		}
		if sent := string(batch.Sent(0)); sent != tt.query && sent != tt.body {
			t.Errorf("%q %q: sent as %q", tt.query, tt.body, sent)
		}
	}
}

// A form request that carries no fix to key (no lat: a cell or Wi-Fi
// report; no timestamp: Traccar takes its own clock) goes on as it came,
// whatever it repeats: nothing of it is judged, so no parser's reading of
// a repeated field can differ from the judgement. It was refused, and
// Traccar Client resends a refusal forever. A valid flag given two values
// still is: it decides the skip itself.
func TestARequestWithoutAFixGoesOnWhateverItRepeats(t *testing.T) {
	for _, tt := range []struct {
		query    string
		conflict string // the field refused, if any
	}{
		{"id=a&id=b&timestamp=1786190400&cell=257,02,1,2&cell=257,02,1,3", ""},
		{"id=veh&lat=52.5&lon=13.4&speed=1&speed=2", ""},
		{"id=veh&lat=52.5&lat=52.6&lon=13.4", ""},
		{"id=veh&timestamp=1786190400&lat=52.5&lon=13.4&valid=false&alarm=sos&alarm=low", ""},
		{"id=veh&timestamp=1786190400&lat=52.5&lon=13.4&valid=true&valid=false", "valid"},
	} {
		batch, err := osmAnd().SplitForm(tt.query, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = mustPreset("osmand").Form.Parse(batch.Elements[0], sendersNow)
		var ie *InvalidPingError
		switch {
		case tt.conflict == "" && !errors.Is(err, ErrNotAPing):
			t.Errorf("%s: got %v; want it passed on as not a ping", tt.query, err)
		case tt.conflict != "" && (!errors.As(err, &ie) || ie.Field != tt.conflict):
			t.Errorf("%s: got %v; want a type error on %s", tt.query, err, tt.conflict)
		}
	}
}

// OsmAnd's id and deviceid are two names of the asset id, and Traccar's
// decoder applies each in turn, so the one given last counts there: given
// together with different values, the ping is refused naming both, as a
// field given twice is, and the error names the one Traccar keeps: the
// later in the query (it said id whatever the order, where Traccar keeps
// deviceid=b of id=a&deviceid=b). It was keyed by id, so id=a&deviceid=b
// was judged as device a's ping and stored by Traccar as device b's.
func TestIDAndDeviceIDNameOneAssetID(t *testing.T) {
	const fix = "&timestamp=1786190400&lat=52.5&lon=13.4"
	for _, tt := range []struct{ query, asset, conflict string }{
		{"id=veh" + fix, "veh", ""},
		{"deviceid=veh" + fix, "veh", ""},
		{"id=veh&deviceid=veh" + fix, "veh", ""},
		{"id=4711&deviceid=4711" + fix, "4711", ""},
		{"id=a&deviceid=b" + fix, "", `given as both id ("a") and deviceid ("b"), two names of the asset id, and parsers disagree on which counts (Traccar's the one given last, here deviceid)`},
		{"deviceid=b" + fix + "&id=a", "", `given as both id ("a") and deviceid ("b"), two names of the asset id, and parsers disagree on which counts (Traccar's the one given last, here id)`},
		{"id=4711&deviceid=04711" + fix, "", `given as both id ("4711") and deviceid ("04711"), two names of the asset id, and parsers disagree on which counts (Traccar's the one given last, here deviceid)`},
	} {
		batch, err := osmAnd().SplitForm(tt.query, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := mustPreset("osmand").Form.Parse(batch.Elements[0], sendersNow)
		if tt.conflict == "" {
			if err != nil || got.Asset != tt.asset {
				t.Errorf("%s: got %q, %v; want the asset %q", tt.query, got.Asset, err, tt.asset)
			}
			continue
		}
		var ie *InvalidPingError
		if !errors.As(err, &ie) || ie.Field != "id" || ie.Rule != RuleType || !strings.Contains(ie.Detail, tt.conflict) {
			t.Errorf("%s: got %q, %v; want a type error on id saying it was %s", tt.query, got.Asset, err, tt.conflict)
		}
	}
}

// What parsers would read differently, or not at all, is refused with a
// reason: a ';' (a separator to Traccar, not to Go), a broken escape,
// invalid UTF-8, nothing at all.
func TestFormFieldsThatParsersDisagreeOnAreRefused(t *testing.T) {
	for _, tt := range []struct{ query, want string }{
		{"id=1;lat=91&lat=1", "';'"},
		{"id=1&lat=%zz", `"lat" is not validly percent-encoded`},
		{"id=%FF&lat=1", "not valid UTF-8"},
		{"", "neither a query string nor a form body"},
	} {
		var me *MalformedError
		if _, err := osmAnd().SplitForm(tt.query, nil); !errors.As(err, &me) || !strings.Contains(me.Reason, tt.want) {
			t.Errorf("%q: got %v, want a MalformedError saying %s", tt.query, err, tt.want)
		}
	}
}

// A field the parser reads, given several times, follows one rule whether
// the ping needs it or not: the same value throughout is that value, as
// every parser reads it (for a field read as a number, the same number
// however written; an id or a time is compared as written, as Traccar
// does); different values are a type error naming the
// field, since Traccar's decoder takes the last and Go's the first. Before,
// a required field was refused even when its values agreed, and an
// optional one read as not reported: a speed, an alarm or a valid flag
// given twice was lost, or made the fix go unkeyed.
func TestAFormFieldGivenSeveralTimesFollowsOneRule(t *testing.T) {
	const fix = "id=veh&timestamp=1786190400&lat=52.5&lon=13.4"
	for _, tt := range []struct {
		name, query string
		check       func(Ping) bool
		conflict    string // the field refused, if any
	}{
		{"required, agreeing", "id=veh&timestamp=1786190400&lat=52.5&lat=52.5&lon=13.4",
			func(p Ping) bool { return p.Lat == 52.5 }, ""},
		{"speed, agreeing", fix + "&speed=10&speed=10",
			func(p Ping) bool { return p.HasSpeed && p.Speed > 5.14 && p.Speed < 5.15 }, ""},
		{"accuracy, agreeing", fix + "&accuracy=5&accuracy=5",
			func(p Ping) bool { return p.Accuracy == 5 }, ""},
		{"event, agreeing", fix + "&alarm=sos&alarm=sos",
			func(p Ping) bool { return p.Event == "alarm=sos" }, ""},
		{"state, agreeing", fix + "&ignition=true&ignition=true",
			func(p Ping) bool { return p.State == "ignition=true&alarm=" }, ""},
		{"valid, agreeing", fix + "&valid=1&valid=1",
			func(p Ping) bool { return p.Asset == "veh" }, ""},
		{"required, the same number written twice", "id=veh&timestamp=1786190400&lat=52.5&lat=52.50&lon=13.4",
			func(p Ping) bool { return p.Lat == 52.5 }, ""},
		{"speed, the same number written twice", fix + "&speed=10&speed=10.0",
			func(p Ping) bool { return p.HasSpeed && p.Speed > 5.14 && p.Speed < 5.15 }, ""},
		{"asset, the same number written twice", "id=4711&id=4711.0&timestamp=1786190400&lat=52.5&lon=13.4", nil, "id"},
		{"time, the same number written twice", "id=veh&timestamp=1786190400&timestamp=1786190400.0&lat=52.5&lon=13.4", nil, "timestamp"},
		{"required, differing", "id=veh&timestamp=1786190400&lat=52.5&lat=91&lon=13.4", nil, "lat"},
		{"asset, differing", "id=a&id=b&timestamp=1786190400&lat=52.5&lon=13.4", nil, "id"},
		{"speed, differing", fix + "&speed=10&speed=0", nil, "speed"},
		{"accuracy, differing", fix + "&accuracy=5&accuracy=500", nil, "accuracy"},
		{"event, differing", fix + "&alarm=sos&alarm=lowBattery", nil, "alarm"},
		{"state, differing", fix + "&ignition=true&ignition=false", nil, "ignition"},
		{"valid, differing", fix + "&valid=true&valid=false", nil, "valid"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			batch, err := osmAnd().SplitForm(tt.query, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := mustPreset("osmand").Form.Parse(batch.Elements[0], sendersNow)
			if tt.conflict == "" {
				if err != nil || !tt.check(got) {
					t.Fatalf("%s: got %+v, %v; want the value it was given", tt.query, got, err)
				}
				return
			}
			var ie *InvalidPingError
			if !errors.As(err, &ie) || ie.Field != tt.conflict || ie.Rule != RuleType || !strings.Contains(ie.Detail, "given 2 times with different values (") {
				t.Fatalf("%s: got %+v, %v; want a type error on %s saying it was given twice", tt.query, got, err, tt.conflict)
			}
		})
	}
}

// isJSONNumber agrees with encoding/json on what one JSON number literal
// is.
func TestIsJSONNumberAgreesWithEncodingJSON(t *testing.T) {
	for _, s := range []string{"0", "-0", "1", "12.5", "1e5", "1E+5", "-1.5e-7", "0.0", "01", "1.", ".5", "+1", "-", "",
		"1e", "1e+", "0x10", "1_000", "Infinity", "NaN", " 1", "1 ", "1.0E-4", "2.332613", "00", "-01", "1.2.3"} {
		var n json.Number
		want := json.Unmarshal([]byte(s), &n) == nil && n.String() == s
		if got := isJSONNumber(s); got != want {
			t.Errorf("isJSONNumber(%q) = %v, encoding/json says %v", s, got, want)
		}
	}
}
