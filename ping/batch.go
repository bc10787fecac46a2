package ping

import (
	"bytes"
	"cmp"
	"fmt"
	"unsafe"

	"github.com/tidwall/gjson"
)

// DefaultMaxBatch bounds the pings of one batch body.
const DefaultMaxBatch = 1000

// BatchTooLargeError reports a batch with more pings than allowed. The
// handler answers it with 413.
type BatchTooLargeError struct {
	// Count is how many pings the batch holds, Max how many are allowed.
	Count, Max int
	// Fix is what to do, for a sender known to the caller: "split it"
	// when empty.
	Fix string
}

// Error says how many pings came, how many may, and what to do.
func (e *BatchTooLargeError) Error() string {
	return fmt.Sprintf("the batch holds %d pings; at most %d are allowed (max_batch): %s", e.Count, e.Max, cmp.Or(e.Fix, "split it"))
}

// Framing is how a request body holds its pings.
type Framing int

// The framings of a body.
const (
	// Single is one JSON object: a batch of one.
	Single Framing = iota
	// Array is a JSON array of pings.
	Array
	// Lines is NDJSON: one ping per line.
	Lines
	// Wrapped is a JSON object holding its pings in an array member
	// (Overland's {"locations":[...],"current":...}); the other members
	// are the batch's, not pings.
	Wrapped
	// Form is a ping in form fields, of the URL query or the body: a batch
	// of one, like Single.
	Form
)

// Batch is a request body split into its pings. Each element is a slice of
// the body, untouched, so that a batch can be forwarded with some elements
// left out and the others byte for byte as sent.
type Batch struct {
	// Framing is how the body holds its pings.
	Framing Framing
	// Elements are the pings' bytes, in the body's order. A Single batch
	// has one element, the whole body; a Form batch one element, its
	// fields written as a JSON object.
	Elements [][]byte

	// body, start and end are a Wrapped body and where its array of pings
	// is in it; sent is a Form ping's fields as they came.
	body       []byte
	start, end int
	sent       []byte
	// lone is a Wrapped body whose wrapper holds one object, not an array
	// (the Transistorsoft SDK's {"location":{...}} when it does not batch).
	lone bool
}

// Single reports a batch of one that came alone: a JSON object, form
// fields, or one object under the wrapper. It is answered as a single
// ping.
func (b Batch) Single() bool { return b.Framing == Single || b.Framing == Form || b.lone }

// Sent returns element i as the sender wrote it: the element itself, or a
// Form ping's fields.
func (b Batch) Sent(i int) []byte {
	if b.Framing == Form {
		return b.sent
	}
	return b.Elements[i]
}

// Splitter splits request bodies into their pings.
type Splitter struct {
	// Wrapper, when set, is the plain dotted path of the array that an
	// object body holds its pings in (Overland's locations, the
	// Transistorsoft SDK's location). Every other member of the object is
	// forwarded as it came. An object there instead of an array is a batch
	// of one.
	Wrapper string
	// Collection, when set and Wrapper is not, is the member a format's
	// collection object holds its pings in (a GeoJSON FeatureCollection's
	// features): such a body is refused, naming the batch option that
	// reads it, where it would be read as one ping and refused for fields
	// each of its pings holds.
	Collection string
	// Max bounds the pings of one batch.
	Max int
}

// Split returns the pings of a body: the elements of a JSON array, the
// non-blank lines of NDJSON (ndjson set from the request's Content-Type),
// the elements of the wrapper's array, or else the body itself as a batch
// of one. Elements are not checked here: each is a ping for
// Parser.Extract. The batch's elements are appended to elements (nil, or
// an empty slice of the caller's): one with room for a single ping spares
// the most common request an allocation.
func (s Splitter) Split(elements [][]byte, body []byte, ndjson bool) (Batch, error) {
	if bytes.HasPrefix(body, byteOrderMark) {
		// Refused whole: in NDJSON it would break only the first line, and
		// a sender that reads only the status would lose that ping.
		return Batch{}, &MalformedError{Reason: "the body starts with a UTF-8 byte order mark (EF BB BF), which JSON senders must not write; send it without"}
	}
	if ndjson {
		lines, err := splitLines(elements, body, s.Max)
		return Batch{Framing: Lines, Elements: lines}, err
	}
	start := bytes.TrimLeft(body, " \t\r\n")
	switch {
	case len(start) > 0 && start[0] == '[':
		if err := checkJSON(body); err != nil {
			return Batch{}, err
		}
		elements, err := splitArray(elements, body, 0, body, s.Max)
		return Batch{Framing: Array, Elements: elements}, err
	case len(start) > 0 && start[0] == '{' && s.Wrapper != "":
		return s.splitWrapped(elements, body)
	case len(start) > 0 && start[0] == '{' && s.Collection != "" && s.BatchMember(body) == s.Collection:
		return Batch{}, &MalformedError{Reason: fmt.Sprintf(
			"the body is a collection of pings in %q, read as one ping: set batch %s to read each as a ping", s.Collection, s.Collection)}
	}
	return Batch{Framing: Single, Elements: append(elements, body)}, nil
}

// BatchMember is the member of body that holds its pings when body is a
// batch in an object (the wrapper's array, or the collection's), else "".
func (s Splitter) BatchMember(body []byte) string {
	switch {
	case s.Wrapper != "" && s.WrapperOpening(body) == '[':
		return s.Wrapper
	case s.Collection != "" && gjson.GetBytes(body, s.Collection).IsArray():
		return s.Collection
	}
	return ""
}

// WrapperOpening is the first byte of what the wrapper holds in head, the
// start of an object body that may be cut short (read up to a limit): '['
// for a batch, '{' for a lone ping, 0 where head does not reach it.
func (s Splitter) WrapperOpening(head []byte) byte {
	if v := gjson.GetBytes(head, s.Wrapper); v.IsObject() || v.IsArray() {
		return v.Raw[0]
	}
	return 0
}

// splitWrapped splits an object whose pings are in the wrapper's array.
// The path to the array is scanned like a ping's fields: a duplicate key on
// it would have the backend read another array than the one judged.
func (s Splitter) splitWrapped(elements [][]byte, body []byte) (Batch, error) {
	if err := checkJSON(body); err != nil {
		return Batch{}, err
	}
	json := unsafe.String(unsafe.SliceData(body), len(body))
	plan := &parsePlan{checks: appendKeyChecks(nil, s.Wrapper)}
	var buf [4]keyCheck
	if _, err := plan.scan(json, buf[:]); err != nil {
		return Batch{}, err
	}
	v := gjson.Get(json, s.Wrapper)
	switch {
	case v.IsObject():
		return Batch{Framing: Wrapped, Elements: append(elements, body[v.Index:v.Index+len(v.Raw)]),
			body: body, start: v.Index, end: v.Index + len(v.Raw), lone: true}, nil
	case !v.IsArray() || v.Index == 0:
		return Batch{}, &MalformedError{Reason: fmt.Sprintf("the body holds no array of pings at %q (batch %s); send the pings as an array there, "+
			"or set batch off for a route whose senders post single pings", s.Wrapper, s.Wrapper)}
	}
	elements, err := splitArray(elements, body, v.Index, body[v.Index:v.Index+len(v.Raw)], s.Max)
	return Batch{Framing: Wrapped, Elements: elements, body: body, start: v.Index, end: v.Index + len(v.Raw)}, err
}

// splitArray appends the elements of the JSON array arr, which starts at
// offset in body, to elements, as slices of body.
func splitArray(elements [][]byte, body []byte, offset int, arr []byte, max int) ([][]byte, error) {
	json := unsafe.String(unsafe.SliceData(arr), len(arr))
	n := 0
	gjson.Parse(json).ForEach(func(_, v gjson.Result) bool {
		if n++; n <= max {
			elements = append(elements, body[offset+v.Index:offset+v.Index+len(v.Raw)])
		}
		return true
	})
	switch {
	case n > max:
		return nil, &BatchTooLargeError{Count: n, Max: max}
	case n == 0:
		return nil, &MalformedError{Reason: "the batch is an empty array; send at least one ping"}
	}
	return elements, nil
}

// byteOrderMark is UTF-8's, which RFC 8259 forbids a sender to put before
// a JSON text (a parser may ignore it or refuse it; this one refuses it
// whole, as the backend's may).
var byteOrderMark = []byte{0xEF, 0xBB, 0xBF}

// splitLines appends the non-blank lines of body to lines.
func splitLines(lines [][]byte, body []byte, max int) ([][]byte, error) {
	n := 0 // non-blank lines, kept counting past max for the error
	for len(body) > 0 {
		line := body
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i], body[i+1:]
		} else {
			body = nil
		}
		if line = bytes.TrimRight(line, "\r"); len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if n++; n <= max {
			lines = append(lines, line)
		}
	}
	if n > max {
		return nil, &BatchTooLargeError{Count: n, Max: max}
	}
	if n == 0 {
		return nil, &MalformedError{Reason: "the NDJSON batch has no lines; send one JSON ping per line"}
	}
	return lines, nil
}

// Join builds the body of a batch of the given elements, in the batch's
// framing: a JSON array, NDJSON lines, or the wrapping object with only
// these elements in its array, every other byte of it as it came.
func (b Batch) Join(elements [][]byte) []byte {
	switch b.Framing {
	case Lines:
		return append(bytes.Join(elements, []byte("\n")), '\n')
	case Wrapped:
		out := append([]byte(nil), b.body[:b.start]...)
		out = append(append(out, '['), bytes.Join(elements, []byte(","))...)
		return append(append(out, ']'), b.body[b.end:]...)
	}
	out := append([]byte("["), bytes.Join(elements, []byte(","))...)
	return append(out, ']')
}
