package ping

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"
)

// TimeFormat says how the device timestamp is written in a ping.
type TimeFormat string

// The accepted time formats.
const (
	// TimeAuto reads a JSON string as RFC 3339 and a JSON number as epoch
	// seconds, or epoch milliseconds when it is too large to be seconds.
	TimeAuto TimeFormat = "auto"
	// TimeRFC3339 reads a JSON string such as 2026-08-08T12:00:00Z or
	// 2026-08-08T14:00:00.250+02:00. An offset is required.
	TimeRFC3339 TimeFormat = "rfc3339"
	// TimeUnix reads a JSON number of seconds since the epoch (fractions
	// allowed).
	TimeUnix TimeFormat = "unix"
	// TimeUnixMilli reads a JSON number of milliseconds since the epoch.
	TimeUnixMilli TimeFormat = "unix_ms"
)

// TimeFormats lists every accepted TimeFormat, for error messages.
var TimeFormats = []TimeFormat{TimeAuto, TimeRFC3339, TimeUnix, TimeUnixMilli}

// ParseTimeFormat returns the TimeFormat named s, or an error listing the
// accepted names.
func ParseTimeFormat(s string) (TimeFormat, error) {
	return ParseName("time_format", s, TimeFormats)
}

// autoMillisAbove separates epoch seconds from epoch milliseconds in auto
// mode: 1e11 seconds is the year 5138, while 1e11 milliseconds is 1973, so
// no real device clock is ambiguous.
const autoMillisAbove = 1e11

// offsetLayouts are the timestamp layouts that carry a UTC offset: RFC 3339
// itself, and the "+0000" form without a colon that Java-based trackers
// (Traccar among them) emit.
var offsetLayouts = []string{time.RFC3339Nano, "2006-01-02T15:04:05.999999999Z0700"}

// naiveLayouts are the same timestamps without an offset. They only serve to
// tell the sender that the offset is missing rather than that the text is
// unreadable.
var naiveLayouts = []string{"2006-01-02T15:04:05.999999999", "2006-01-02 15:04:05.999999999"}

// parseTime reads the device time from v according to f. field is the
// configured path, for errors.
func parseTime(v gjson.Result, f TimeFormat, field string) (time.Time, error) {
	switch v.Type {
	case gjson.String:
		if f == TimeUnix || f == TimeUnixMilli {
			return time.Time{}, invalid(field, RuleType, "time_format %s expects a JSON number, got the string %q", f, v.Str)
		}
		return parseOffsetTime(v.Str, field)
	case gjson.Number:
		if f == TimeRFC3339 {
			return time.Time{}, invalid(field, RuleType, "time_format rfc3339 expects a string such as \"2026-08-08T12:00:00Z\", got the number %s", v.Raw)
		}
		return parseEpoch(v, f, field)
	default:
		return time.Time{}, invalid(field, RuleType, "expected a timestamp, got %s", describe(v))
	}
}

func parseOffsetTime(s, field string) (time.Time, error) {
	if t, ok := offsetTime(s); ok {
		return t, nil
	}
	for _, layout := range naiveLayouts {
		if _, err := time.Parse(layout, s); err == nil {
			return time.Time{}, invalid(field, RuleTimezone,
				"%q has no UTC offset; send it as %sZ or with the device's offset (e.g. +02:00), it is never assumed to be UTC",
				s, strings.Replace(s, " ", "T", 1))
		}
	}
	if len(s) > 10 && s[10] == ' ' {
		// RFC 3339 lets a space stand for the T (§5.6), and Python's str()
		// writes one; Traccar reads none (its OsmAnd decoder takes a time
		// without a T as local and fails on the offset), so keyed here,
		// the ping would be judged at an instant its backend never stores.
		if withT := s[:10] + "T" + s[11:]; isOffsetTime(withT) {
			return time.Time{}, invalid(field, RuleTimeFormat,
				"%q has a space for the T, which Traccar and most receivers do not read; send it as %q", s, withT)
		}
	}
	if mended, ok := plusAsSpace(s); ok {
		// A + in a query string or a form body is a space (to Traccar's
		// decoder too): the sender wrote RFC 3339, and only the escape is
		// missing.
		return time.Time{}, invalid(field, RuleTimeFormat,
			"%q has a space where its offset's + was: in a query string or a form body a + reads as a space, so write it %%2B there (%s); "+
				"in JSON, write the + itself", s, strings.Replace(mended, "+", "%2B", 1))
	}
	return time.Time{}, invalid(field, RuleTimeFormat, "%q is not an RFC 3339 timestamp such as \"2026-08-08T12:00:00Z\"", s)
}

// plusAsSpace mends s, a time whose offset's + (and the + a hand-written
// query puts for the T, if any) reads as a space, into the timestamp the
// sender meant, if that is one.
func plusAsSpace(s string) (string, bool) {
	i := strings.LastIndexByte(s, ' ')
	if i <= 10 {
		return "", false
	}
	mended := s[:i] + "+" + s[i+1:]
	if s[10] == ' ' {
		mended = mended[:10] + "T" + mended[11:] // Traccar reads no space for the T
	}
	return mended, isOffsetTime(mended)
}

// offsetTime reads s as a timestamp with a UTC offset: one of
// offsetLayouts, or an RFC 3339 variant of one (rfc3339Variant).
func offsetTime(s string) (time.Time, bool) {
	if t, ok := parseOffsetLayouts(s); ok {
		return t, true
	}
	if norm, leap, ok := rfc3339Variant(s); ok {
		if t, ok := parseOffsetLayouts(norm); ok {
			if leap {
				// The last instant of the minute: the leap second stays in its
				// minute (and bucket), after every ping of that minute's 59th
				// second.
				t = t.Truncate(time.Second).Add(time.Second - time.Nanosecond)
			}
			return t, true
		}
	}
	return time.Time{}, false
}

// isOffsetTime reports whether offsetTime reads s.
func isOffsetTime(s string) bool {
	_, ok := offsetTime(s)
	return ok
}

func parseOffsetLayouts(s string) (time.Time, bool) {
	for _, layout := range offsetLayouts {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), offsetInRange(s)
		}
	}
	return time.Time{}, false
}

// offsetInRange reports whether the UTC offset ending s, which a layout of
// offsetLayouts parsed, has an hour of 00-23 and a minute of 00-59, as RFC
// 3339 requires: Go's parser takes +24:00 and +23:60, a whole day, which
// would key the ping into another day's bucket.
func offsetInRange(s string) bool {
	n := len(s)
	if s[n-1] == 'Z' {
		return true
	}
	hh, mm := s[n-4:n-2], s[n-2:] // +hhmm
	if s[n-3] == ':' {
		hh, mm = s[n-5:n-3], s[n-2:] // +hh:mm
	}
	return hh <= "23" && mm <= "59"
}

// rfc3339Variant rewrites what RFC 3339 allows and Go's parser refuses: a
// lower-case "t" and "z" (section 5.6) and a leap second, :60 (section
// 5.7), which it turns into :59 and reports, for the caller to move to the
// end of that second. ok is false when there is nothing to rewrite.
func rfc3339Variant(s string) (norm string, leap, ok bool) {
	if len(s) < len("2006-01-02T15:04:05Z") {
		return "", false, false
	}
	b := []byte(s)
	if b[10] == 't' {
		b[10], ok = 'T', true
	}
	if b[len(b)-1] == 'z' {
		b[len(b)-1], ok = 'Z', true
	}
	if b[16] == ':' && b[17] == '6' && b[18] == '0' {
		b[17], b[18], leap, ok = '5', '9', true, true
	}
	return string(b), leap, ok
}

func parseEpoch(v gjson.Result, f TimeFormat, field string) (time.Time, error) {
	n := v.Num
	if math.IsNaN(n) || math.IsInf(n, 0) || math.Abs(n) > 1e16 {
		return time.Time{}, invalid(field, RuleTimeFormat, "%s is not a usable epoch time", v.Raw)
	}
	millis := f == TimeUnixMilli || (f == TimeAuto && math.Abs(n) >= autoMillisAbove)
	if millis {
		if ms, err := strconv.ParseInt(v.Raw, 10, 64); err == nil {
			return time.UnixMilli(ms).UTC(), nil
		}
		// Not int64(n*1e6) nanoseconds: that overflows beyond ±9.2e12 ms
		// (the years 1677 and 2262), and 1e13 ms would become 1677.
		ms, frac := math.Modf(n)
		return time.UnixMilli(int64(ms)).Add(time.Duration(frac * 1e6)).UTC(), nil
	}
	if s, err := strconv.ParseInt(v.Raw, 10, 64); err == nil {
		return time.Unix(s, 0).UTC(), nil
	}
	sec, frac := math.Modf(n)
	return time.Unix(int64(sec), int64(frac*1e9)).UTC(), nil
}

// describe names the JSON type of v for error messages.
func describe(v gjson.Result) string {
	switch v.Type {
	case gjson.String:
		return fmt.Sprintf("the string %q", v.Str)
	case gjson.Number:
		return "the number " + v.Raw
	case gjson.True, gjson.False:
		return "a boolean"
	case gjson.JSON:
		if v.IsArray() {
			return "an array"
		}
		return "an object"
	default:
		return "null"
	}
}

// ParseName returns the one of names spelled s, or an error naming what
// was asked for (kind) and listing the names.
func ParseName[T ~string](kind, s string, names []T) (T, error) {
	if i := slices.Index(names, T(s)); i >= 0 {
		return names[i], nil
	}
	return "", fmt.Errorf("unknown %s %q: use one of %v", kind, s, names)
}
