package ping

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// Form fields become one JSON object, in their order: numbers as written
// stay numbers (an id keeps its text), true and false are booleans, the
// rest strings, and a field given several times the list of its values.
func TestFormFieldsBecomeOneObject(t *testing.T) {
	for _, tt := range []struct{ query, body, want string }{
		{"id=0123&lat=52.52&lon=-13.4e0&valid=true&alarm=alert%20message&bearing=.5&name=a+b", "",
			`{"id":"0123","lat":52.52,"lon":-13.4e0,"valid":true,"alarm":"alert message","bearing":".5","name":"a b"}`},
		// The query wins; the body is read only when the URL has none, as
		// Traccar's decoder does.
		{"id=1&lat=1", "id=2&lat=2", `{"id":1,"lat":1}`},
		{"", "id=2&lat=2&&empty=&flag", `{"id":2,"lat":2,"empty":"","flag":""}`},
		{"cell=257,02&wifi=a,-80&cell=257,03", "", `{"cell":["257,02","257,03"],"wifi":"a,-80"}`},
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

// What parsers would read differently, or not at all, is refused with a
// reason: a ';' (a separator to Traccar, not to Go), a broken escape,
// invalid UTF-8, nothing at all. A position field given twice names
// itself.
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
	batch, err := osmAnd().SplitForm("id=1&timestamp=1700000000&lat=1&lat=91&lon=2", nil)
	if err != nil {
		t.Fatal(err)
	}
	var ie *InvalidPingError
	if _, err := mustPreset("osmand").Form.Parse(batch.Elements[0], sendersNow); !errors.As(err, &ie) || ie.Field != "lat" || ie.Rule != RuleType ||
		!strings.Contains(ie.Detail, `given 2 times ("1", "91")`) {
		t.Fatalf("lat given twice: got %v, want a type error on lat saying it was given twice", err)
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
