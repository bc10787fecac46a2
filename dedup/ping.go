package dedup

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// Ping is one observation as the device reported it, normalised: an aware
// UTC device time and a WGS 84 position in degrees.
type Ping struct {
	// Asset identifies the vehicle, tracker or phone.
	Asset string
	// Time is the device's own timestamp, in UTC. Never the arrival time:
	// a delayed ping must land in the bucket it belongs to.
	Time time.Time
	// Lat is the latitude in degrees.
	Lat float64
	// Lon is the longitude in degrees.
	Lon float64
}

// Default field paths and rules, as documented for the Caddyfile.
const (
	DefaultAssetPath  = "asset_id"
	DefaultTimePath   = "occurred_at"
	DefaultLatPath    = "lat"
	DefaultLonPath    = "lon"
	DefaultTimeFormat = TimeAuto
	DefaultMaxFuture  = 5 * time.Minute
)

// Limits on a body and its asset id, beyond being a JSON object.
const (
	// MaxNesting is how deeply objects and arrays may nest in a body. A ping
	// needs a few levels; thousands only serve to exhaust a recursive
	// parser's stack.
	MaxNesting = 64
	// MaxAssetBytes is the longest asset id accepted, in bytes. An id that
	// long is not a device id, and it would be copied into every key, log
	// line and placeholder.
	MaxAssetBytes = 256
)

// ErrNotAPing is returned for a body that is well-formed but, by the
// configured kind filter, not a position at all (an OwnTracks "card" or
// "transition", say). The handler passes it on untouched.
var ErrNotAPing = errors.New("not a position message")

// Parser reads pings out of JSON request bodies and validates them. The zero
// value is not ready for use; call NewParser for the defaults, or
// ParsePreset for a tracker's format.
type Parser struct {
	// AssetPaths are gjson paths (dot-separated, e.g. "device.uniqueId")
	// tried in order for the asset id; the first present one counts. Empty
	// means the caller fills Ping.Asset itself before Validate.
	AssetPaths []string
	// TimePaths are tried in order for the device timestamp.
	TimePaths []string
	// LatPath and LonPath hold the position: latitude and longitude in
	// degrees, or northing (y) and easting (x) in a projected CRS.
	LatPath, LonPath string
	// TimeFormat says how the device time is written.
	TimeFormat TimeFormat
	// CRS is the coordinate system of the position; WGS84 (the zero
	// value) needs no reprojection.
	CRS CRS
	// KindPath and Kind, when set, make only bodies whose KindPath holds
	// the string Kind pings; any other body is ErrNotAPing.
	KindPath, Kind string
	// MaxFuture is how far ahead of the server clock a device time may be.
	MaxFuture time.Duration
	// AllowNullIsland admits the exact position (0, 0), which is rejected by
	// default because it is what a GPS module reports before it has a fix.
	AllowNullIsland bool
}

// NewParser returns a Parser with the default paths and rules.
func NewParser() Parser {
	return Parser{
		AssetPaths: []string{DefaultAssetPath},
		TimePaths:  []string{DefaultTimePath},
		LatPath:    DefaultLatPath,
		LonPath:    DefaultLonPath,
		TimeFormat: DefaultTimeFormat,
		MaxFuture:  DefaultMaxFuture,
	}
}

// Parse extracts and validates the ping in body. now is the server clock,
// used for the max_future rule. A body that is not a JSON object gives a
// *MalformedError; a ping that breaks a rule gives an *InvalidPingError.
func (p Parser) Parse(body []byte, now time.Time) (Ping, error) {
	ping, err := p.Extract(body)
	if err != nil {
		return Ping{}, err
	}
	return ping, p.Validate(ping, now)
}

// Extract reads the configured fields of body, reprojected to WGS 84, and
// checks their types, but not the rules of Validate.
//
// Before reading anything it makes sure that the body means the same to
// every JSON parser, the backend's included: valid UTF-8, nested at most
// MaxNesting deep, and no duplicate key in any object a configured path
// passes through. Any of these gives a *MalformedError.
func (p Parser) Extract(body []byte) (Ping, error) {
	if err := checkObject(body); err != nil {
		return Ping{}, err
	}
	// One copy, which every gjson result below may alias; the asset is
	// cloned, so a remembered id never pins the whole body.
	json := string(body)
	if err := p.checkDuplicateKeys(json); err != nil {
		return Ping{}, err
	}
	root := gjson.Parse(json)
	if p.KindPath != "" && root.Get(p.KindPath).String() != p.Kind {
		return Ping{}, ErrNotAPing
	}
	var ping Ping
	var err error
	if len(p.AssetPaths) > 0 {
		if ping.Asset, err = p.asset(first(root, p.AssetPaths)); err != nil {
			return Ping{}, err
		}
	}
	if ping.Time, err = p.time(first(root, p.TimePaths)); err != nil {
		return Ping{}, err
	}
	y, err := number(root.Get(p.LatPath), p.LatPath)
	if err != nil {
		return Ping{}, err
	}
	x, err := number(root.Get(p.LonPath), p.LonPath)
	if err != nil {
		return Ping{}, err
	}
	if ping.Lat, ping.Lon, err = p.CRS.ToWGS84(x, y); err != nil {
		return Ping{}, p.axisError(err)
	}
	return ping, nil
}

// Validate checks a ping against the coordinate and time rules. Coordinates
// are checked before anything quantises them: H3 turns a latitude of 91 into
// a valid-looking cell that no real position maps to.
func (p Parser) Validate(ping Ping, now time.Time) error {
	if ping.Asset == "" {
		return invalid(p.assetField(), RuleRequired, "the asset id is empty")
	}
	if err := p.checkAsset(ping.Asset); err != nil {
		return err
	}
	if err := checkCoordinate(ping.Lat, 90, p.LatPath); err != nil {
		return err
	}
	if err := checkCoordinate(ping.Lon, 180, p.LonPath); err != nil {
		return err
	}
	if ping.Lat == 0 && ping.Lon == 0 && !p.AllowNullIsland {
		return invalid(p.LatPath, RuleNullIsland,
			"position (0, 0) is what a GPS module reports before it has a fix; set null_island allow if your assets really are there")
	}
	if ahead := ping.Time.Sub(now); ahead > p.MaxFuture {
		return invalid(p.TimePaths[0], RuleFuture,
			"device time %s is %s ahead of the server clock; at most %s is allowed (max_future)",
			ping.Time.Format(time.RFC3339Nano), ahead.Round(time.Second), p.MaxFuture)
	}
	return nil
}

// checkObject makes sure body is one JSON object that every parser reads
// alike, cheapest checks first, and the recursive validator last.
func checkObject(body []byte) error {
	if len(body) == 0 {
		return &MalformedError{Reason: "the request body is empty; telemetry_dedup expects one JSON ping per request " +
			"(use a matcher such as `telemetry_dedup POST /ingest` to limit which requests it examines)"}
	}
	if !utf8.Valid(body) {
		return &MalformedError{Reason: "the request body is not valid UTF-8; send the JSON ping UTF-8 encoded " +
			"(RFC 8259), as parsers disagree on what invalid bytes mean"}
	}
	if err := checkNesting(body); err != nil {
		return err
	}
	if !gjson.ValidBytes(body) {
		return notJSON()
	}
	// Valid JSON starts with its value after optional whitespace.
	for _, c := range body {
		if c == '{' {
			return nil
		}
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			break
		}
	}
	return &MalformedError{Reason: "the request body must be a JSON object holding one ping"}
}

func notJSON() error { return &MalformedError{Reason: "the request body is not valid JSON"} }

// checkNesting rejects a body whose objects and arrays nest deeper than
// MaxNesting, in one linear scan that skips strings (brackets in them do not
// count) and keeps no stack: gjson's validator recurses once per level, so a
// megabyte of "[" must never reach it.
func checkNesting(body []byte) error {
	depth := 0
	for i := 0; i < len(body); i++ {
		switch body[i] {
		case '"':
			// Skip the string: a backslash escapes the next byte, so \" does
			// not end it and \\" does.
			for i++; i < len(body) && body[i] != '"'; i++ {
				if body[i] == '\\' {
					i++
				}
			}
		case '{', '[':
			if depth++; depth > MaxNesting {
				return &MalformedError{Reason: fmt.Sprintf("the request body nests objects and arrays more than %d levels deep; "+
					"a ping needs a few levels at most", MaxNesting)}
			}
		case '}', ']':
			if depth--; depth < 0 {
				return notJSON() // a bracket closed that was never opened
			}
		}
	}
	return nil
}

// first returns the value at the first of paths that is present, or the
// (missing) value of the first path.
func first(root gjson.Result, paths []string) gjson.Result {
	for _, path := range paths {
		if v := root.Get(path); v.Exists() {
			return v
		}
	}
	return gjson.Result{}
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

// checkDuplicateKeys rejects a body in which an object that a configured
// path passes through (the body itself, and each intermediate object of a
// nested path) has a key twice. gjson reads the first of two equal keys,
// Go's encoding/json and many backends the last: {"lat":1,"lat":91} would be
// validated as 1 and stored as 91. Names are compared after JSON unescaping,
// so "l\u0061t" is "lat". The key a path reads must moreover be there only
// once ignoring letter case, because encoding/json also matches struct fields
// case-insensitively (last one wins): {"lat":1,"LAT":91} would be read as 91.
//
// Each such object is read once, whatever the number of paths through it,
// and only those objects: the rest of the body is skipped, never parsed. A
// nested object on a path is read where it is met in its parent rather than
// looked up again; the recursion is as deep as the configured paths, never
// deeper, whatever the body. body must be valid JSON.
func (p Parser) checkDuplicateKeys(body string) error {
	var buf [16]keyCheck
	checks := buf[:0]
	for _, path := range p.AssetPaths {
		checks = appendKeyChecks(checks, path)
	}
	for _, path := range p.TimePaths {
		checks = appendKeyChecks(checks, path)
	}
	checks = appendKeyChecks(checks, p.LatPath)
	checks = appendKeyChecks(checks, p.LonPath)
	checks = appendKeyChecks(checks, p.KindPath)
	if len(checks) == 0 {
		return nil
	}
	start := strings.IndexByte(body, '{') // valid JSON: only whitespace before it
	if _, err := readObject(body, start, checks, ""); err != nil {
		return err
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
						return err
					}
				}
				break
			}
		}
	}
	return nil
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

func (p Parser) assetField() string {
	if len(p.AssetPaths) == 0 {
		return "asset"
	}
	return p.AssetPaths[0]
}

func (p Parser) asset(v gjson.Result) (string, error) {
	switch v.Type {
	case gjson.String:
		if v.Str == "" {
			return "", invalid(p.assetField(), RuleRequired, "the asset id is empty")
		}
		return strings.Clone(v.Str), nil
	case gjson.Number:
		// The number as written: 4711 and 4711.0 are different ids, and a
		// 30-digit id stays exact instead of being rounded to a float.
		return strings.Clone(v.Raw), nil
	case gjson.Null:
		if !v.Exists() {
			return "", invalid(p.assetField(), RuleRequired, "missing; every ping needs an asset id at %s", oneOf(p.AssetPaths))
		}
		return "", invalid(p.assetField(), RuleRequired, "the asset id is null")
	default:
		return "", invalid(p.assetField(), RuleType, "expected a string or number asset id, got %s", describe(v))
	}
}

// checkAsset rejects an asset id that cannot be an id: longer than
// MaxAssetBytes, or holding an ASCII control character, which would break
// the log lines and headers it is written to. Both are RuleType: the value is
// not of the kind an asset id is.
func (p Parser) checkAsset(asset string) error {
	if len(asset) > MaxAssetBytes {
		return invalid(p.assetField(), RuleType,
			"the asset id is %d bytes long; at most %d are allowed: send the device's short id (or a hash of a long one)",
			len(asset), MaxAssetBytes)
	}
	for i := 0; i < len(asset); i++ {
		if c := asset[i]; c < 0x20 || c == 0x7f {
			return invalid(p.assetField(), RuleType,
				"the asset id contains the control character %U at byte %d; asset ids must be printable", rune(c), i)
		}
	}
	return nil
}

func (p Parser) time(v gjson.Result) (time.Time, error) {
	if v.Type == gjson.Null {
		return time.Time{}, invalid(p.TimePaths[0], RuleRequired,
			"missing; every ping needs the device's own timestamp at %s (arrival time is never used)", oneOf(p.TimePaths))
	}
	return parseTime(v, p.TimeFormat, p.TimePaths[0])
}

// axisError names the field of a projected coordinate the CRS refused.
func (p Parser) axisError(err error) error {
	var ae *AxisError
	if !errors.As(err, &ae) {
		return err
	}
	field := p.LonPath
	if ae.Axis == AxisY {
		field = p.LatPath
	}
	return invalid(field, RuleRange, "%s", ae.Detail)
}

// oneOf quotes paths for an error message: "a" or one of "a", "b".
func oneOf(paths []string) string {
	if len(paths) == 1 {
		return `"` + paths[0] + `"`
	}
	return `one of "` + strings.Join(paths, `", "`) + `"`
}

func number(v gjson.Result, field string) (float64, error) {
	switch v.Type {
	case gjson.Number:
		return v.Num, nil
	case gjson.Null:
		return 0, invalid(field, RuleRequired, "missing; every ping needs a numeric %q", field)
	default:
		return 0, invalid(field, RuleType, "expected a number, got %s", describe(v))
	}
}

func checkCoordinate(v, limit float64, field string) error {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return invalid(field, RuleFinite, "%v is not a finite number", v)
	}
	if v < -limit || v > limit {
		return invalid(field, RuleRange, "%v is outside [-%v, %v]", v, limit, limit)
	}
	return nil
}
