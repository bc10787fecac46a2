package ping

import (
	"bytes"
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
}

func (e *BatchTooLargeError) Error() string {
	return fmt.Sprintf("the batch holds %d pings; at most %d are allowed (max_batch): split it", e.Count, e.Max)
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
)

// Batch is a request body split into its pings. Each element is a slice of
// the body, untouched, so that a batch can be forwarded with some elements
// left out and the others byte for byte as sent.
type Batch struct {
	// Framing is how the body holds its pings.
	Framing Framing
	// Elements are the pings' bytes, in the body's order. A Single batch
	// has one element, the whole body.
	Elements [][]byte
}

// Split returns the pings of a body: the elements of a JSON array, the
// non-blank lines of NDJSON (ndjson set from the request's Content-Type),
// or else the body itself as a batch of one. Elements are not checked here:
// each is a ping for Parser.Extract.
func Split(body []byte, ndjson bool, max int) (Batch, error) {
	if ndjson {
		lines, err := splitLines(body, max)
		return Batch{Framing: Lines, Elements: lines}, err
	}
	if start := bytes.TrimLeft(body, " \t\r\n"); len(start) == 0 || start[0] != '[' {
		return Batch{Framing: Single, Elements: [][]byte{body}}, nil
	}
	elements, err := splitArray(body, max)
	return Batch{Framing: Array, Elements: elements}, err
}

func splitArray(body []byte, max int) ([][]byte, error) {
	if err := checkJSON(body); err != nil {
		return nil, err
	}
	json := unsafe.String(unsafe.SliceData(body), len(body))
	var elements [][]byte
	n := 0
	gjson.Parse(json).ForEach(func(_, v gjson.Result) bool {
		if n++; n <= max {
			elements = append(elements, body[v.Index:v.Index+len(v.Raw)])
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

func splitLines(body []byte, max int) ([][]byte, error) {
	var lines [][]byte
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
		if len(lines) == max {
			return nil, &BatchTooLargeError{Count: max + 1 + bytes.Count(body, []byte("\n")), Max: max}
		}
		lines = append(lines, line)
	}
	if len(lines) == 0 {
		return nil, &MalformedError{Reason: "the NDJSON batch has no lines; send one JSON ping per line"}
	}
	return lines, nil
}

// Join builds the body of a batch of the given elements, in the batch's
// framing: a JSON array, or NDJSON lines.
func (b Batch) Join(elements [][]byte) []byte {
	if b.Framing == Lines {
		return append(bytes.Join(elements, []byte("\n")), '\n')
	}
	out := append([]byte("["), bytes.Join(elements, []byte(","))...)
	return append(out, ']')
}
