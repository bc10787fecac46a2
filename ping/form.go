package ping

import (
	"encoding/json"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// SplitForm returns the ping of a request that carries its fields form
// encoded, as the OsmAnd protocol does and Traccar reads it: from the URL's
// query, or, only when the URL has none, from the body (a POST of
// application/x-www-form-urlencoded). It is a batch of one, like a single
// JSON object: its element is the fields as a JSON object, in their order,
// each value a JSON number when it is written as one, true or false, or
// else a string, so that the one parser reads every framing. A field given
// several times is its value if they are all the same (for one p reads as
// a number, the same number however written), else the list of its values.
// A request without fields is told the ones p reads.
func (p Parser) SplitForm(query string, body []byte) (Batch, error) {
	fields := query
	if fields == "" {
		fields = string(body)
	}
	if strings.TrimSpace(fields) == "" {
		return Batch{}, &MalformedError{Reason: "the request has neither a query string nor a form body; " +
			"send the fields as ?" + p.formFields() + " (use a matcher to limit which requests telemetry_dedup examines)"}
	}
	object, err := formObject(fields, p.numberFields(), p.splitPair)
	if err != nil {
		return Batch{}, err
	}
	return Batch{Framing: Form, Elements: [][]byte{object}, sent: []byte(fields)}, nil
}

// numberFields are the fields p reads as numbers, where a value given
// again as another spelling of the same number (52.5 and 52.50, 12 and
// 12.0) is the same value to every parser, Traccar's Double.parseDouble
// and Go's strconv.ParseFloat alike. An id or a time is no such field:
// 4711 and 4711.0 are two devices to Traccar.
func (p Parser) numberFields() []string {
	return []string{p.LatPath, p.LonPath, p.AccuracyPath, p.SpeedPath, p.AccuracyFallback}
}

// formFields is a query string of the fields p reads, the first of each
// where there are several, with their values left out:
// id=...&lat=...&lon=...&timestamp=... for OsmAnd's. An asset taken from
// the request, not a field, is not among them.
func (p Parser) formFields() string {
	var names []string
	if len(p.AssetPaths) > 0 {
		names = append(names, p.AssetPaths[0])
	}
	names = append(names, p.LatPath, p.LonPath)
	if len(p.TimePaths) > 0 {
		names = append(names, p.TimePaths[0])
	}
	return strings.Join(names, "=...&") + "=..."
}

// FormLine reads a form ping written out on one line, as a log or a
// capture keeps it: a query string, a form body, or the whole URL the
// tracker requested (its query is the fields). The element is SplitForm's.
func (p Parser) FormLine(line string) ([]byte, error) {
	line = strings.TrimSpace(line)
	if _, query, isURL := strings.Cut(line, "?"); isURL {
		line = query
	}
	batch, err := p.SplitForm(line, nil)
	if err != nil {
		return nil, err
	}
	return batch.Elements[0], nil
}

// splitPair sets LatPath and LonPath in values as Traccar's
// OsmAndProtocolDecoder sets the position: the fields in the order they
// first come, each value in turn, lat and lon setting their coordinate and
// PairField ("lat,lon", more parts ignored) both, the last one deciding.
// A request with neither is one at the device's last known place.
func (p Parser) splitPair(keys []string, values map[string][]string) []string {
	if _, ok := values[p.PairField]; p.PairField == "" || !ok {
		return keys
	}
	lat, lon := values[p.LatPath], values[p.LonPath]
	for _, key := range keys {
		switch key {
		case p.LatPath:
			lat = values[key]
		case p.LonPath:
			lon = values[key]
		case p.PairField:
			for _, v := range values[key] {
				parts := strings.Split(v, ",")
				for len(parts) > 0 && parts[len(parts)-1] == "" {
					parts = parts[:len(parts)-1] // as Java's split drops them
				}
				if len(parts) < 2 {
					return keys // Traccar fails such a request; it goes to it as it came
				}
				lat, lon = []string{javaNumber(parts[0])}, []string{javaNumber(parts[1])}
			}
		}
	}
	for _, f := range []struct {
		path  string
		value []string
	}{{p.LatPath, lat}, {p.LonPath, lon}} {
		if _, ok := values[f.path]; !ok && f.value != nil {
			keys = append(keys, f.path)
		}
		if f.value != nil {
			values[f.path] = f.value
		}
	}
	return keys
}

// formObject writes form fields, at least one, as a JSON object; numbers
// are the fields read as numbers, and expand adds fields read from others.
func formObject(fields string, numbers []string, expand func(keys []string, values map[string][]string) []string) ([]byte, error) {
	if strings.Contains(fields, ";") {
		// Netty, and so Traccar, splits fields on ';' as on '&'; Go and
		// most others do not: the two would read different fields.
		return nil, &MalformedError{Reason: "the form fields contain a ';', which parsers disagree on (a separator to some, " +
			"part of a value to others); percent-encode it as %3B"}
	}
	var keys []string
	values := map[string][]string{}
	for pair := range strings.SplitSeq(fields, "&") {
		if pair == "" {
			continue
		}
		k, v, _ := strings.Cut(pair, "=")
		key, err := url.QueryUnescape(k)
		if err != nil {
			return nil, &MalformedError{Reason: "the form field " + quote(k) + " is not validly percent-encoded"}
		}
		val, err := url.QueryUnescape(v)
		if err != nil {
			return nil, &MalformedError{Reason: "the value of the form field " + quote(key) + " is not validly percent-encoded"}
		}
		if !utf8.ValidString(key) || !utf8.ValidString(val) {
			return nil, &MalformedError{Reason: "the form field " + quote(key) + " is not valid UTF-8 once decoded; parsers disagree on what invalid bytes mean"}
		}
		if slices.Contains(numbers, key) {
			val = javaNumber(val)
		}
		if _, seen := values[key]; !seen {
			keys = append(keys, key)
		}
		values[key] = append(values[key], val)
	}
	keys = expand(keys, values)
	out := []byte{'{'}
	for i, key := range keys {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(appendJSONString(out, key), ':')
		vs := values[key]
		if allSame(vs) || slices.Contains(numbers, key) && sameNumber(vs) {
			// Every parser reads a field repeated with one value as that
			// value, Traccar's last and Go's first alike.
			out = appendFormValue(out, vs[0])
			continue
		}
		// A field given several values (OsmAnd's cell and wifi) is a list;
		// one the parser reads then names itself in the error.
		out = append(out, '[')
		for j, v := range vs {
			if j > 0 {
				out = append(out, ',')
			}
			out = appendFormValue(out, v)
		}
		out = append(out, ']')
	}
	return append(out, '}'), nil
}

// javaNumber is a number field's value as Traccar's Double.parseDouble
// reads it: without the characters up to a space around it (a form's +
// is a space), and without a leading +.
func javaNumber(v string) string {
	v = strings.TrimFunc(v, func(r rune) bool { return r <= ' ' })
	if rest, ok := strings.CutPrefix(v, "+"); ok && isJSONNumber(rest) {
		return rest
	}
	return v
}

func allSame(values []string) bool {
	for _, v := range values[1:] {
		if v != values[0] {
			return false
		}
	}
	return true
}

// sameNumber reports values that are all JSON numbers, and the same
// number however written.
func sameNumber(values []string) bool {
	first, err := strconv.ParseFloat(values[0], 64)
	if err != nil || !isJSONNumber(values[0]) {
		return false
	}
	for _, v := range values[1:] {
		if f, err := strconv.ParseFloat(v, 64); err != nil || f != first || !isJSONNumber(v) {
			return false
		}
	}
	return true
}

// appendFormValue writes a form value as a JSON number when it is written
// exactly as one (so "0123", ".5" and "1_000" stay strings, and an id keeps
// its text), as true or false, or as a string.
func appendFormValue(out []byte, v string) []byte {
	if v == "true" || v == "false" || isJSONNumber(v) {
		return append(out, v...)
	}
	return appendJSONString(out, v)
}

func appendJSONString(out []byte, s string) []byte {
	b, _ := json.Marshal(s) // a valid UTF-8 string always marshals
	return append(out, b...)
}

// quote writes s as a JSON string, for an error message about it.
func quote(s string) string { return string(appendJSONString(nil, s)) }

// isJSONNumber reports whether s is a number in JSON's grammar:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func isJSONNumber(s string) bool {
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && s[i] >= '1' && s[i] <= '9':
		i = digits(s, i)
	default:
		return false
	}
	if i < len(s) && s[i] == '.' {
		if j := digits(s, i+1); j > i+1 {
			i = j
		} else {
			return false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		j := digits(s, i)
		if j == i {
			return false
		}
		i = j
	}
	return i == len(s)
}

func digits(s string, i int) int {
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}
