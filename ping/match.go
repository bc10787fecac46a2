package ping

import (
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/tidwall/gjson"
)

// Match picks pings by one of their fields: the events a ping reports, the
// records of a batch that are not positions.
type Match struct {
	// Path is the field's plain dotted path (no gjson queries or
	// wildcards), e.g. position.attributes.alarm.
	Path string
	// Values the field must hold, as text: a string's value, a number as
	// written, true or false. Empty: any value but null, false and "".
	Values []string
	// Absent makes the match hold when the field is missing (or null)
	// instead.
	Absent bool
	// Except makes the match hold when the field is present and holds
	// none of Values, compared ignoring letter case: how Java's
	// Boolean.parseBoolean, and so Traccar, reads a flag.
	Except bool
	// Negative makes the match hold when the field is a number below 0:
	// how iOS marks a fix whose coordinates are invalid (CLLocation's
	// horizontalAccuracy).
	Negative bool
}

// ParseMatch reads a match as the Caddyfile writes it: "path" (any value
// but null, false and "") or "path=value|value...".
func ParseMatch(s string) (Match, error) {
	path, values, hasValues := strings.Cut(s, "=")
	m := Match{Path: path}
	if hasValues {
		m.Values = strings.Split(values, "|")
		for _, v := range m.Values {
			if v == "" {
				return m, fmt.Errorf("%q names an empty value; write path=value|value, e.g. t=u|r", s)
			}
		}
	}
	return m, CheckPlainPath(path)
}

// String writes the match as ParseMatch reads it (an Except or Negative
// match, which only a preset makes, as path!=value|value... or path<0).
func (m Match) String() string {
	if m.Negative {
		return m.Path + "<0"
	}
	if m.Except {
		return m.Path + "!=" + strings.Join(m.Values, "|")
	}
	if len(m.Values) == 0 {
		return m.Path
	}
	return m.Path + "=" + strings.Join(m.Values, "|")
}

// CheckPlainPath reports a path that is not a plain dotted path: a field
// matched or read for its value must be found by a path that every JSON
// parser follows alike, and that the duplicate-key scan walks.
func CheckPlainPath(path string) error {
	if path == "" {
		return fmt.Errorf("the path is empty; give a plain dotted path such as position.attributes.alarm")
	}
	for start := 0; ; start++ {
		end, plain, _ := componentEnd(path, start)
		if !plain {
			return fmt.Errorf("%q is not a plain dotted path such as position.attributes.alarm; gjson queries, "+
				"wildcards, modifiers and empty names are not allowed here", path)
		}
		if end >= len(path) {
			return nil
		}
		start = end
	}
}

// text returns a field's value as a match compares it, and whether it has
// one (present and not null).
func text(v gjson.Result) (string, bool) {
	switch v.Type {
	case gjson.String:
		return v.Str, true
	case gjson.True:
		return "true", true
	case gjson.False:
		return "false", true
	case gjson.Null:
		return "", false
	default: // numbers as written; objects and arrays as their JSON
		return v.Raw, true
	}
}

// matches reports whether the field value v meets m.
func (m Match) matches(v gjson.Result) bool {
	s, ok := text(v)
	switch {
	case m.Absent:
		return !ok
	case m.Negative:
		return v.Type == gjson.Number && v.Num < 0
	case m.Except:
		return ok && !slices.ContainsFunc(m.Values, func(value string) bool { return strings.EqualFold(s, value) })
	case len(m.Values) == 0:
		return ok && s != "" && v.Type != gjson.False
	}
	for _, want := range m.Values {
		if ok && s == want {
			return true
		}
	}
	return false
}

// field writes path=value for Ping.Event and Ping.State, the value
// query-escaped so that no value can spell two fields.
func field(path, value string) string {
	return path + "=" + url.QueryEscape(value)
}
