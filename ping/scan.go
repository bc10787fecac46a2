package ping

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// notJSON says where body stops being JSON, and what the sender most
// likely meant when it is not JSON at all. Only a rejected body pays for
// the second reading that finds the place.
func notJSON(body []byte) error {
	reason := "the request body is not valid JSON"
	var syntax *json.SyntaxError
	if err := json.Unmarshal(body, new(json.RawMessage)); errors.As(err, &syntax) {
		line := 1 + bytes.Count(body[:syntax.Offset], []byte("\n"))
		column := syntax.Offset - int64(bytes.LastIndexByte(body[:syntax.Offset], '\n')+1)
		reason += fmt.Sprintf(": %v (line %d, column %d)", syntax, line, column)
	}
	trimmed := bytes.TrimSpace(body)
	firstLine, rest, severalLines := bytes.Cut(trimmed, []byte("\n"))
	switch {
	case severalLines && json.Valid(firstLine) && len(bytes.TrimSpace(rest)) > 0:
		reason += "; it holds several JSON values, one a line: send them as NDJSON, with Content-Type: application/x-ndjson"
	case looksFormEncoded(trimmed):
		return &MalformedError{Reason: reason + "; it looks form encoded (field=value&...): " + FormEncodedFix, FormEncoded: true}
	}
	return &MalformedError{Reason: reason}
}

// looksFormEncoded reports a body of field=value pairs joined by &, each
// field a name and no value holding another = (which a form encodes): an
// XML or GPX body's attributes, or base64 padded with =, are not told to
// use a form reader. Empty pieces (a trailing &) are passed over, as the
// form reader passes them over.
func looksFormEncoded(body []byte) bool {
	pairs := 0
	for pair := range bytes.SplitSeq(body, []byte("&")) {
		if len(pair) == 0 {
			continue
		}
		field, value, ok := bytes.Cut(pair, []byte("="))
		if !ok || len(field) == 0 || bytes.IndexByte(value, '=') >= 0 || bytes.ContainsFunc(field, notFieldNameRune) {
			return false
		}
		pairs++
	}
	return pairs > 0
}

// notFieldNameRune reports a rune no form field's name in a sender's
// query string or body holds: names are letters, digits, _ - . [ ] and
// percent escapes.
func notFieldNameRune(r rune) bool {
	return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_-.[]%", r))
}

// checkNesting rejects a body whose objects and arrays nest deeper than
// MaxNesting, in one linear scan that skips strings (brackets in them do not
// count) and keeps no stack: gjson's validator recurses once per level, so a
// megabyte of "[" must never reach it. On the way it rejects the escapes of
// lone surrogates (see checkSurrogate), in every string of the body.
func checkNesting(body []byte) error {
	depth := 0
	for i := 0; i < len(body); i++ {
		switch body[i] {
		case '"':
			// Skip the string: a backslash escapes the next byte, so \" does
			// not end it and \\" does.
			for i++; i < len(body) && body[i] != '"'; i++ {
				if body[i] != '\\' {
					continue
				}
				if i++; i < len(body) && body[i] == 'u' {
					n, err := checkSurrogate(body, i-1)
					if err != nil {
						return err
					}
					i += n
				}
			}
		case '{', '[':
			if depth++; depth > MaxNesting {
				return &MalformedError{Reason: fmt.Sprintf("the request body nests objects and arrays more than %d levels deep; "+
					"a ping needs a few levels at most", MaxNesting)}
			}
		case '}', ']':
			if depth--; depth < 0 {
				return notJSON(body) // a bracket closed that was never opened
			}
		}
	}
	return nil
}

// checkSurrogate checks the \u escape at body[i] and returns how many bytes
// after its 'u' it covers: 4, or 10 for a surrogate pair (0 for an escape
// that is not four hex digits, which the JSON validator refuses). A
// surrogate escape without its partner (\ud800 alone, or a low \udc00
// first) encodes no character: gjson reads it as U+FFFD, other parsers
// refuse it or keep it, so "\ud800", "\udbff" and a real U+FFFD would be
// one asset to us and three to the backend. It is refused like invalid
// UTF-8.
func checkSurrogate(body []byte, i int) (int, error) {
	r, ok := hex4(body, i+2)
	switch {
	case !ok:
		return 0, nil
	case r < 0xd800 || r > 0xdfff:
		return 4, nil
	case r < 0xdc00: // a high surrogate: a low one must follow
		if i+7 < len(body) && body[i+6] == '\\' && body[i+7] == 'u' {
			if low, ok := hex4(body, i+8); ok && low >= 0xdc00 && low <= 0xdfff {
				return 10, nil
			}
		}
	}
	return 0, &MalformedError{Reason: fmt.Sprintf("the request body holds the escape %s, half of a UTF-16 surrogate pair without "+
		"its other half: it encodes no character, and parsers disagree on what it means; send the character itself, "+
		"or both halves of its pair", body[i:i+6])}
}

// hex4 reads the four hex digits at body[i:].
func hex4(body []byte, i int) (rune, bool) {
	if i+4 > len(body) {
		return 0, false
	}
	var r rune
	for _, c := range body[i : i+4] {
		switch {
		case '0' <= c && c <= '9':
			r = r<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// keyCheck is one step of a configured path: the object at prefix (the
// body itself for "") and the key name the path reads from it, unescaped;
// name is empty when the step is not a plain key (a wildcard, a query, ...).
type keyCheck struct {
	prefix, name string
	child        string // the prefix of the object the step leads to, if the path goes on
	value        string // the raw value of the key name, once found
	seen         string // the first key found equal to name ignoring case
	fold         byte   // name's first byte in lower case, 0 if not ASCII: a quick test before strings.EqualFold
	found        bool
	read         bool // the object at prefix has been read
}

// parsePlan is what Extract works out once per configuration rather than
// on every ping: the steps of every configured path (the objects to read for
// duplicate keys), and which step yields each field's value.
type parsePlan struct {
	checks []keyCheck // grouped by prefix
	// assets and times hold, per configured path, the index in checks of
	// the path's last step, or -1 when the scan cannot follow the path and
	// gjson looks it up.
	assets, times  []int
	lat, lon, kind int
	fields         []int  // the leaves of Parser.fieldPaths, in its order
	stateFields    string // Ping.StateFields
	// read is every path the parser reads, with its leaf: first the
	// deciding ones, which decide whether the body is a ping at all (the
	// kind, and the skips that compare a value), then the rest.
	read     []pathLeaf
	deciding int
}

// pathLeaf is a configured path and the index in checks of its last step.
type pathLeaf struct {
	path string
	leaf int
}

// stateFields is Ping.StateFields of p's pings.
func (p *Parser) stateFields() string { return strings.Join(p.States, "&") }

func (p *Parser) makePlan() *parsePlan {
	var checks []keyCheck
	for _, path := range p.paths() {
		checks = appendKeyChecks(checks, path)
	}
	plan := &parsePlan{checks: checks, lat: leafOf(checks, p.LatPath), lon: leafOf(checks, p.LonPath), kind: leafOf(checks, p.KindPath),
		stateFields: p.stateFields()}
	for _, path := range p.AssetPaths {
		plan.assets = append(plan.assets, leafOf(checks, path))
	}
	for _, path := range p.TimePaths {
		plan.times = append(plan.times, leafOf(checks, path))
	}
	for _, path := range p.fieldPaths() {
		plan.fields = append(plan.fields, leafOf(checks, path))
	}
	for _, path := range p.decidingPaths() {
		plan.read = append(plan.read, pathLeaf{path, leafOf(checks, path)})
	}
	plan.deciding = len(plan.read)
	// Not the accuracy fallback, the last path: read only when the
	// accuracy is absent, given twice with two values it reads as no
	// accuracy, and refusing the ping would lose a fix over a field the
	// backend does not key on (Traccar keeps OsmAnd's hdop as an
	// attribute).
	read := p.paths()
	for _, path := range read[:len(read)-1] {
		if path != "" {
			plan.read = append(plan.read, pathLeaf{path, leafOf(checks, path)})
		}
	}
	return plan
}

// decidingPaths are the paths whose values decide whether a body is a ping:
// the kind, and the skips that compare a value (a field's mere presence
// decides as well when it holds a list).
func (p *Parser) decidingPaths() []string {
	var paths []string
	if p.KindPath != "" {
		paths = append(paths, p.KindPath)
	}
	for _, m := range p.Skip {
		if !m.Absent {
			paths = append(paths, m.Path)
		}
	}
	return paths
}

func (p *Parser) paths() []string {
	paths := append(append([]string(nil), p.AssetPaths...), p.TimePaths...)
	return append(append(paths, p.LatPath, p.LonPath, p.KindPath), p.fieldPaths()...)
}

// leafOf returns the index of path's last step in checks, or -1 if a step
// is not a plain key name.
func leafOf(checks []keyCheck, path string) int {
	prefix := ""
	for start := 0; start < len(path); {
		end, plain, escaped := componentEnd(path, start)
		if !plain {
			return -1
		}
		if end < len(path) {
			prefix, start = path[:end], end+1
			continue
		}
		name := path[start:end]
		if escaped {
			name = unescapePathComponent(name)
		}
		for i, c := range checks {
			if c.prefix == prefix && c.name == name {
				return i
			}
		}
	}
	return -1
}

// scan reads the objects a configured path passes through (the body
// itself, and each intermediate object of a nested path), once each, and
// rejects one that has a key twice. gjson reads the first of two equal keys,
// Go's encoding/json and many backends the last: {"lat":1,"lat":91} would be
// validated as 1 and stored as 91. Names are compared after JSON unescaping,
// so "l\u0061t" is "lat". The key a path reads must moreover be there only
// once ignoring letter case, because encoding/json also matches struct fields
// case-insensitively (last one wins): {"lat":1,"LAT":91} would be read as 91.
//
// The rest of the body is skipped, never parsed. A nested object on a path
// is read where it is met in its parent rather than looked up again; the
// recursion is as deep as the configured paths, never deeper, whatever the
// body. On the way it notes each step's raw value, so that Extract need not
// look the fields up again. body must be valid JSON; the steps are copied
// into buf, which the returned checks use.
func (plan *parsePlan) scan(body string, buf []keyCheck) ([]keyCheck, error) {
	checks := append(buf[:0], plan.checks...)
	if len(checks) == 0 {
		return checks, nil
	}
	start := strings.IndexByte(body, '{') // valid JSON: only whitespace before it
	if _, err := readObject(body, start, checks, ""); err != nil {
		return checks, err
	}
	// Objects reached through an array index (a path such as "a.0.b") were
	// not met on the way: gjson finds them. Their groups come after their
	// parents', and a group read here reads its own children.
	for i := range checks {
		c := &checks[i]
		if c.read || c.prefix == "" {
			continue
		}
		for _, parent := range checks[:i] {
			if parent.child == c.prefix && strings.HasPrefix(parent.value, "[") {
				if obj := gjson.Get(body, c.prefix); obj.IsObject() {
					if _, err := readObject(obj.Raw, 0, checks, c.prefix); err != nil {
						return checks, err
					}
				}
				break
			}
		}
	}
	return checks, nil
}

// value returns the field at path: from the scan when the scan read the
// object holding it (an empty value: the key is not there), from gjson when
// the path goes where the scan does not.
func value(root gjson.Result, checks []keyCheck, leaf int, path string) gjson.Result {
	if leaf >= 0 && checks[leaf].read {
		if v := checks[leaf].value; v != "" {
			return gjson.Parse(v)
		}
		return gjson.Result{}
	}
	return root.Get(path)
}

// appendKeyChecks adds the steps of path to checks, once each, grouped by
// prefix. Only plain dotted paths are followed (escaped dots allowed): at
// the first step with gjson syntax beyond that (wildcards, #, @, |, ...) the
// object it is applied to is still checked, and the walk stops.
func appendKeyChecks(checks []keyCheck, path string) []keyCheck {
	prefix := ""
	for start := 0; start < len(path); {
		end, plain, escaped := componentEnd(path, start)
		name := ""
		if plain {
			name = path[start:end]
			if escaped {
				name = unescapePathComponent(name)
			}
		}
		c := keyCheck{prefix: prefix, name: name}
		if name != "" {
			c.fold = foldASCII(name[0])
		}
		if plain && end < len(path) {
			c.child = path[:end]
		}
		checks = insertKeyCheck(checks, c)
		if c.child == "" {
			break
		}
		prefix = c.child
		start = end + 1
	}
	return checks
}

// componentEnd returns where the path component starting at start ends (at
// an unescaped dot or the end of path), whether it is a plain key name, and
// whether it holds backslash escapes.
func componentEnd(path string, start int) (end int, plain, escaped bool) {
	plain = true
	for end = start; end < len(path); end++ {
		switch path[end] {
		case '\\':
			end++
			escaped = true
		case '.':
			return end, plain && end > start, escaped
		case '*', '?', '#', '@', '|', '!', '(', '[', '{':
			plain = false
		}
	}
	if end > len(path) {
		end = len(path) // a trailing backslash
	}
	return end, plain && end > start, escaped
}

func unescapePathComponent(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// insertKeyCheck adds c after the last check of the same prefix, unless it
// is there already.
func insertKeyCheck(checks []keyCheck, c keyCheck) []keyCheck {
	at := len(checks)
	for i := range checks {
		have := &checks[i]
		if have.prefix != c.prefix {
			continue
		}
		if have.name == c.name {
			if have.child == "" {
				have.child = c.child // the path goes on from here after all
			}
			return checks
		}
		at = i + 1
	}
	if at == len(checks) {
		return append(checks, c)
	}
	checks = append(checks, keyCheck{})
	copy(checks[at+1:], checks[at:])
	checks[at] = c
	return checks
}

// smallObjectKeys is how many key names of an object are compared one by
// one before a map takes over.
const smallObjectKeys = 16

// readObject reads the keys of the object at raw[i] (a '{'), which is at
// prefix, in one pass: it reports the first key that is there twice, or
// that equals, ignoring case, the name a check of prefix reads while
// another key does too. It reads the objects the paths go on to as it meets
// them, and returns the index after the object.
func readObject(raw string, i int, checks []keyCheck, prefix string) (int, error) {
	lo, hi := 0, 0 // the checks of this object
	for lo < len(checks) && checks[lo].prefix != prefix {
		lo++
	}
	for hi = lo; hi < len(checks) && checks[hi].prefix == prefix; hi++ {
		checks[hi].read = true
	}
	group := checks[lo:hi]

	var small [smallObjectKeys]string
	names := small[:0]
	var set map[string]struct{}
	for i++; ; {
		i = skipSpace(raw, i)
		if i >= len(raw) || raw[i] != '"' {
			return i + 1, nil // the closing '}'
		}
		start := i
		var escaped bool
		i, escaped = skipString(raw, i)
		name := raw[start+1 : i-1]
		if escaped {
			name = gjson.Parse(raw[start:i]).Str
		}

		dup := false
		if set != nil {
			_, dup = set[name]
			set[name] = struct{}{}
		} else {
			for _, n := range names {
				if n == name {
					dup = true
					break
				}
			}
			if len(names) < cap(names) {
				names = append(names, name)
			} else {
				set = make(map[string]struct{}, 4*smallObjectKeys)
				for _, n := range names {
					set[n] = struct{}{}
				}
				set[name] = struct{}{}
			}
		}
		if dup {
			return i, &MalformedError{Reason: fmt.Sprintf("duplicate key %q in %s: JSON parsers disagree on which of the two "+
				"counts; send each key once", name, objectName(prefix))}
		}

		var read *keyCheck // the check whose name this is, exactly
		fold := byte(0)
		if name != "" {
			fold = foldASCII(name[0])
		}
		for j := range group {
			c := &group[j]
			if c.name == "" || (c.fold != fold && c.fold != 0 && fold != 0) || !strings.EqualFold(name, c.name) {
				continue
			}
			if c.found {
				return i, &MalformedError{Reason: fmt.Sprintf("duplicate key %q in %s: it differs from %q only in letter case, "+
					"and parsers that match keys ignoring case read the last one; send each key once", name, objectName(prefix), c.seen)}
			}
			c.seen, c.found = name, true
			if name == c.name {
				read = c
			}
		}

		i = skipSpace(raw, i) + 1 // past the ':'
		i = skipSpace(raw, i)
		start = i
		if read != nil && read.child != "" && i < len(raw) && raw[i] == '{' {
			var err error
			if i, err = readObject(raw, i, checks, read.child); err != nil {
				return i, err
			}
		} else {
			i = skipValue(raw, i)
		}
		if read != nil {
			read.value = raw[start:i]
		}
		if i = skipSpace(raw, i); i < len(raw) && raw[i] == ',' {
			i++
		}
	}
}

// foldASCII returns an ASCII byte in lower case, and 0 for the first byte
// of a multi-byte character, which may still fold to ASCII (the Kelvin sign
// is a k, the long s an s).
func foldASCII(c byte) byte {
	switch {
	case c >= utf8.RuneSelf:
		return 0
	case 'A' <= c && c <= 'Z':
		return c + 'a' - 'A'
	}
	return c
}

func skipSpace(raw string, i int) int {
	for i < len(raw) && raw[i] <= ' ' {
		i++
	}
	return i
}

// skipString returns the index after the string starting at raw[i] (a '"')
// and whether it holds escapes.
func skipString(raw string, i int) (int, bool) {
	escaped := false
	for i++; i < len(raw); i++ {
		switch raw[i] {
		case '\\':
			i++
			escaped = true
		case '"':
			return i + 1, escaped
		}
	}
	return i, escaped
}

// skipValue returns the index after the JSON value starting at raw[i],
// without parsing it (gjson's ForEach would convert every number and string
// only for them to be thrown away).
func skipValue(raw string, i int) int {
	if i >= len(raw) {
		return i
	}
	switch raw[i] {
	case '"':
		i, _ = skipString(raw, i)
		return i
	case '{', '[':
		depth := 0
		for i < len(raw) {
			switch raw[i] {
			case '"':
				i, _ = skipString(raw, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	}
	for i < len(raw) { // a number, true, false or null
		switch raw[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
}

// objectName says which object a duplicate key is in, for the sender.
func objectName(prefix string) string {
	if prefix == "" {
		return "the ping object"
	}
	return fmt.Sprintf("the object at %q", prefix)
}
