package dedup

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

// SplitBatch returns the raw elements of a batch body: the elements of a
// JSON array, or the non-blank lines of NDJSON (ndjson set from the
// request's Content-Type). Each element is a slice of body, untouched, so a
// batch can be forwarded with some elements left out and the others byte
// for byte as sent. A body that is neither is not a batch. Elements are not
// checked here: each is a ping for Parser.Extract.
func SplitBatch(body []byte, ndjson bool, max int) (elements [][]byte, isBatch bool, err error) {
	if ndjson {
		elements, err = splitLines(body, max)
		return elements, true, err
	}
	if start := bytes.TrimLeft(body, " \t\r\n"); len(start) == 0 || start[0] != '[' {
		return nil, false, nil
	}
	if err := checkJSON(body); err != nil {
		return nil, true, err
	}
	json := unsafe.String(unsafe.SliceData(body), len(body))
	n := 0
	gjson.Parse(json).ForEach(func(_, v gjson.Result) bool {
		if n++; n <= max {
			elements = append(elements, body[v.Index:v.Index+len(v.Raw)])
		}
		return true
	})
	switch {
	case n > max:
		return nil, true, &BatchTooLargeError{Count: n, Max: max}
	case n == 0:
		return nil, true, &MalformedError{Reason: "the batch is an empty array; send at least one ping"}
	}
	return elements, true, nil
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

// JoinBatch builds a batch body of the given elements in the format of the
// original: a JSON array, or NDJSON lines.
func JoinBatch(elements [][]byte, ndjson bool) []byte {
	if ndjson {
		return append(bytes.Join(elements, []byte("\n")), '\n')
	}
	out := append([]byte("["), bytes.Join(elements, []byte(","))...)
	return append(out, ']')
}
