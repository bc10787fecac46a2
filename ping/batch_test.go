package ping

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A wrapped batch is the wrapper's array, each element a slice of the body;
// joined with some elements left out, it is the same object with only those
// in its array, every other byte (current, trip, whitespace) as it came.
func TestWrappedBatchKeepsEverythingButTheLeftOutElements(t *testing.T) {
	body, err := os.ReadFile(filepath.Join(sendersDir, "overland/batch_composed.json"))
	if err != nil {
		t.Fatal(err)
	}
	batch, err := Splitter{Wrapper: "locations", Max: 10}.Split(nil, body, false)
	if err != nil {
		t.Fatal(err)
	}
	if batch.Framing != Wrapped || batch.Single() || len(batch.Elements) != 3 {
		t.Fatalf("framing %v, %d elements", batch.Framing, len(batch.Elements))
	}
	for i, e := range batch.Elements {
		if !strings.HasPrefix(string(e), "{") || !strings.Contains(string(body), string(e)) || string(batch.Sent(i)) != string(e) {
			t.Fatalf("element %d is not a slice of the body: %s", i, e)
		}
	}
	joined := string(batch.Join([][]byte{batch.Elements[1], batch.Elements[2]}))
	start, end := strings.Index(string(body), `[`), strings.LastIndex(string(body), `],`+"\n"+`  "current"`)+1
	want := string(body[:start]) + "[" + string(batch.Elements[1]) + "," + string(batch.Elements[2]) + "]" + string(body[end:])
	if joined != want {
		t.Fatalf("joined\n%s\nwant\n%s", joined, want)
	}
	if !strings.HasSuffix(joined, string(body[strings.Index(string(body), `  "current"`):])) {
		t.Fatal("current and trip were not kept byte for byte")
	}
}

func TestWrappedBatchRefusals(t *testing.T) {
	s := Splitter{Wrapper: "locations", Max: 2}
	for _, tt := range []struct{ body, want string }{
		{`{"current":{}}`, `no array of pings at "locations"`},
		{`{"locations":"x"}`, `no array of pings at "locations"`},
		{`{"locations":[]}`, "empty array"},
		// The backend would read the second array: refused like any
		// duplicate key on a path this module reads.
		{`{"locations":[{"a":1}],"locations":[{"a":2}]}`, `duplicate key "locations"`},
		{`{"Locations":[{"a":1}],"locations":[{"a":2}]}`, "letter case"},
		{`{"locations":[{"a":1}]`, "not valid JSON"},
	} {
		var me *MalformedError
		if _, err := s.Split(nil, []byte(tt.body), false); !errors.As(err, &me) || !strings.Contains(me.Reason, tt.want) {
			t.Errorf("%s: got %v, want %q", tt.body, err, tt.want)
		}
	}
	var tooLarge *BatchTooLargeError
	if _, err := s.Split(nil, []byte(`{"locations":[{},{},{}]}`), false); !errors.As(err, &tooLarge) || tooLarge.Count != 3 {
		t.Errorf("three pings over max 2: got %v", err)
	}
	// An object where the array would be is a batch of one; arrays and
	// bodies without the wrapper keep their framings.
	for body, framing := range map[string]Framing{`{"location":{"a":1},"device_id":"x"}`: Wrapped, `[{"a":1}]`: Array} {
		b, err := Splitter{Wrapper: "location", Max: 2}.Split(nil, []byte(body), false)
		if err != nil || b.Framing != framing || len(b.Elements) != 1 || string(b.Elements[0]) != `{"a":1}` {
			t.Errorf("%s: got %v %q, %v", body, b.Framing, b.Elements, err)
		}
	}
}

// A body that starts with a byte order mark is refused whole, in every
// framing: in NDJSON it used to break only the first line, whose sender,
// reading only the status of a partial batch, lost it.
func TestAByteOrderMarkIsRefusedWhole(t *testing.T) {
	bom := "\xEF\xBB\xBF"
	for _, tt := range []struct {
		body   string
		ndjson bool
	}{{bom + `{"a":1}` + "\n" + `{"a":2}` + "\n", true}, {bom + `[{"a":1}]`, false}, {bom + `{"a":1}`, false}} {
		var me *MalformedError
		if _, err := (Splitter{Max: 10}).Split(nil, []byte(tt.body), tt.ndjson); !errors.As(err, &me) || !strings.Contains(me.Reason, "byte order mark") {
			t.Errorf("%q: got %v, want the byte order mark named", tt.body, err)
		}
	}
}

// An NDJSON batch over max says how many pings it holds: its non-blank
// lines, not its newlines.
func TestAnNDJSONBatchOverMaxCountsItsPings(t *testing.T) {
	body := strings.Repeat(`{"a":1}`+"\n", 6) + "\n\n\n"
	var tooLarge *BatchTooLargeError
	if _, err := (Splitter{Max: 5}).Split(nil, []byte(body), true); !errors.As(err, &tooLarge) || tooLarge.Count != 6 {
		t.Errorf("six lines and three blank ones over max 5: got %v, want a count of 6", err)
	}
}

// Split appends to the caller's elements: a single ping lands in a slot
// the caller holds (the handler's request has one, so the most common
// request allocates no slice for it), and a batch of more grows past it
// with every element as sent.
func TestSplitAppendsToTheCallersElements(t *testing.T) {
	for _, tt := range []struct {
		wrapper, body string
		ndjson        bool
		want          []string
	}{
		{"", `{"a":1}`, false, []string{`{"a":1}`}},
		{"", `[{"a":1}, {"a":2}]`, false, []string{`{"a":1}`, `{"a":2}`}},
		{"", `{"a":1}` + "\n\n" + `{"a":2}` + "\n", true, []string{`{"a":1}`, `{"a":2}`}},
		{"locations", `{"locations":{"a":1}}`, false, []string{`{"a":1}`}},
		{"locations", `{"locations":[{"a":1},{"a":2},{"a":3}]}`, false, []string{`{"a":1}`, `{"a":2}`, `{"a":3}`}},
	} {
		var slot [1][]byte
		batch, err := Splitter{Wrapper: tt.wrapper, Max: 10}.Split(slot[:0], []byte(tt.body), tt.ndjson)
		if err != nil {
			t.Fatalf("%q: %v", tt.body, err)
		}
		var got []string
		for _, e := range batch.Elements {
			got = append(got, string(e))
		}
		if strings.Join(got, " ") != strings.Join(tt.want, " ") {
			t.Errorf("%q: elements %q, want %q", tt.body, got, tt.want)
		}
		if len(tt.want) == 1 && &batch.Elements[0] != &slot[0] {
			t.Errorf("%q: a batch of one was not put in the caller's slot", tt.body)
		}
	}
	var me *MalformedError
	if _, err := (Splitter{Max: 10}).Split(make([][]byte, 0, 1), []byte("\n \n"), true); !errors.As(err, &me) {
		t.Errorf("an NDJSON body of blank lines: got %v, want it refused as malformed", err)
	}
}

// A collection object on a route without a wrapper is refused naming the
// batch option that reads it; a lone ping, and the collection once its
// member is the wrapper, are split as usual.
func TestACollectionWithoutItsWrapperIsRefusedNamingIt(t *testing.T) {
	collection := []byte(`{"type":"FeatureCollection","features":[{"id":"a"},{"id":"b"}]}`)
	var me *MalformedError
	if _, err := (Splitter{Collection: "features", Max: 10}).Split(nil, collection, false); !errors.As(err, &me) ||
		!strings.Contains(me.Reason, "set batch features") {
		t.Fatalf("a FeatureCollection without batch features: %v; want it refused naming batch features", err)
	}
	if batch, err := (Splitter{Collection: "features", Max: 10}).Split(nil, []byte(`{"type":"Feature","id":"a"}`), false); err != nil || batch.Framing != Single {
		t.Fatalf("a Feature: %v, %v; want a single ping", batch.Framing, err)
	}
	if batch, err := (Splitter{Wrapper: "features", Collection: "features", Max: 10}).Split(nil, collection, false); err != nil || len(batch.Elements) != 2 {
		t.Fatalf("a FeatureCollection with batch features: %v; want its two features", err)
	}
}
