package telemetrydedup

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("telemetry_dedup", parseCaddyfile)
	// After authentication, so unauthenticated pings never claim keys, and
	// ahead of every handler that answers or proxies (respond, route,
	// reverse_proxy, ...).
	httpcaddyfile.RegisterDirectiveOrder("telemetry_dedup", httpcaddyfile.After, "forward_auth")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Handler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens:
//
//	telemetry_dedup [<matcher>] {
//		preset         owntracks|overland|osmand|traccar|geojson
//		asset          <json path>...|<placeholder template>
//		time           <json path>...
//		time_format    auto|rfc3339|unix|unix_ms
//		time_zone      <IANA zone>
//		lat            <json path>
//		lon            <json path>
//		accuracy       <json path>
//		speed          <json path> [m/s|km/h|knots|mph]
//		event          <path>[=<value>|<value>...]...|off
//		state          <path>...|off
//		encoding       json|form|auto
//		batch          <json path>|off
//		answers        { suppressed|in_flight|dead_lettered <status> ... }
//		crs            EPSG:4326|EPSG:3857|EPSG:326xx|EPSG:327xx
//		shape          tumbling|sliding|session
//		window         <duration>
//		session_idle   <duration>
//		resolution     <0..15>
//		radius         <metres>
//		hysteresis     <metres>
//		key_prefix     <prefix>
//		key_scope      <placeholder template>
//		retry_ladder   <duration>...
//		outage_margin  <duration>
//		ttl            <duration>
//		store          memory|redis [<url>] { ... }
//		near_cache     off|<entries>
//		on_store_error open|closed
//		release_on_failure on|off
//		in_flight_timeout <duration>
//		mode           enforce|shadow
//		on_invalid     reject|dead_letter
//		dead_letter_stream <key>
//		dead_letter_maxlen <entries>
//		max_body       <size>
//		max_batch      <pings>
//		max_future     <duration>
//		max_past       <duration>
//		null_island    reject|allow
//		stuck_ratio    <share>
//		stuck_after    <duration>
//		stuck_track    <assets>
//	}
//
// The list is caddyfileOptions; a test holds this comment and the README to
// it.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume directive name
	if d.NextArg() {
		return d.Errf("unexpected argument %q: telemetry_dedup takes at most a matcher, and its options in a block", d.Val())
	}
	// option -> where it was written, to report semantic errors there: the
	// file too, since an option may come from an imported file.
	lines := make(map[string]optionAt)
	var previous string
	for d.NextBlock(0) {
		name := d.Val()
		if o, ok := caddyfileOption(previous); ok && name == "{" {
			return noBlockError(d, previous, o.syntax)
		}
		previous = name
		option, ok := caddyfileOption(name)
		if !ok {
			return d.Errf("unrecognized telemetry_dedup option %q%s; the options are %s", name, misplacedHandlerOption(name), strings.Join(caddyfileOptionNames(), ", "))
		}
		if at, seen := lines[name]; seen {
			return d.Errf("%s already specified on line %d; give each option once", name, at.line)
		}
		lines[name] = optionAt{d.File(), d.Line()}
		if name == "speed" {
			lines["speed_unit"] = lines[name] // JSON's speed_unit is written on the speed line
		}
		if err := option.parse(h, d); err != nil {
			return withSyntax(d, err, name, option.syntax)
		}
	}
	if _, err := h.resolve(); err != nil {
		return optionError(d, lines, err)
	}
	return nil
}

// misplacedHandlerOption says where an option the telemetry_dedup block
// does not know goes, if it belongs to another block: "" if it does not.
func misplacedHandlerOption(name string) string {
	switch {
	case name == "speed_unit":
		return " (JSON's speed_unit): the unit goes on the speed line, speed <json path> km/h"
	case name == "max_keys":
		return ": it is the memory store's, store memory { max_keys <n> }"
	case slices.Contains(redisOptionNames, name):
		return fmt.Sprintf(": it is the redis store's, store redis [<url>] { %s ... }", name)
	case name == "suppressed" || name == "in_flight" || name == "dead_lettered":
		return fmt.Sprintf(": it is an answer, answers { %s <status> ... }", name)
	case slices.Contains(redisTLSOptionNames, name):
		return ": " + tlsOptionPlace(name)
	}
	return ""
}

// optionOfHandler is the error of an option a store's block does not know
// that is telemetry_dedup's own, saying where it goes; nil for any other.
func optionOfHandler(d *caddyfile.Dispenser, store, name string) error {
	if _, ok := caddyfileOption(name); !ok {
		return nil
	}
	return d.Errf("%s is a telemetry_dedup option, not the %s store's: write it in the telemetry_dedup block, beside store", name, store)
}

// option is one subdirective of the telemetry_dedup block: its name, its
// arguments as the docs show them, and how it is read.
type option struct {
	name, syntax string
	parse        func(h *Handler, d *caddyfile.Dispenser) error
}

// caddyfileOptions is the one list of the block's subdirectives.
var caddyfileOptions = []option{
	{"preset", "owntracks|overland|osmand|traccar|geojson", func(h *Handler, d *caddyfile.Dispenser) error { return oneArg(d, &h.Preset) }},
	{"asset", "<json path>...|<placeholder template>", func(h *Handler, d *caddyfile.Dispenser) error {
		return someArgs(d, &h.Asset, "a JSON path (or several, tried in order), or one placeholder template")
	}},
	{"time", "<json path>...", func(h *Handler, d *caddyfile.Dispenser) error {
		return someArgs(d, &h.Time, "a JSON path (or several, tried in order)")
	}},
	{"time_format", "auto|rfc3339|unix|unix_ms", func(h *Handler, d *caddyfile.Dispenser) error { return oneArg(d, &h.TimeFormat) }},
	{"time_zone", "<IANA zone>", func(h *Handler, d *caddyfile.Dispenser) error { return oneArg(d, &h.TimeZone) }},
	{"lat", "<json path>", func(h *Handler, d *caddyfile.Dispenser) error { return oneArg(d, &h.Lat) }},
	{"lon", "<json path>", func(h *Handler, d *caddyfile.Dispenser) error { return oneArg(d, &h.Lon) }},
	{"accuracy", "<json path>", func(h *Handler, d *caddyfile.Dispenser) error { return oneArg(d, &h.Accuracy) }},
	{"speed", "<json path> [m/s|km/h|knots|mph]", func(h *Handler, d *caddyfile.Dispenser) error {
		args := d.RemainingArgs()
		if len(args) == 0 || len(args) > 2 || slices.Contains(args, "") {
			return d.Err("speed needs a JSON path and optionally its unit, neither empty, e.g. speed vel km/h")
		}
		h.Speed = args[0]
		if len(args) == 2 {
			h.SpeedUnit = args[1]
		}
		return nil
	}},
	{"event", "<path>[=<value>|<value>...]...|off", func(h *Handler, d *caddyfile.Dispenser) error {
		return someArgs(d, &h.Event, "the fields that make a ping an event, e.g. event position.attributes.alarm t=u|r, or off")
	}},
	{"state", "<path>...|off", func(h *Handler, d *caddyfile.Dispenser) error {
		return someArgs(d, &h.State, "the fields whose values are the asset's state, e.g. state position.attributes.ignition, or off")
	}},
	{"encoding", "json|form|auto", func(h *Handler, d *caddyfile.Dispenser) error { return oneArg(d, &h.Encoding) }},
	{"batch", "<json path>|off", func(h *Handler, d *caddyfile.Dispenser) error { return oneArg(d, &h.Batch) }},
	{"answers", "{ suppressed|in_flight|dead_lettered <status> ... }", (*Handler).unmarshalAnswers},
	{"crs", "EPSG:4326|EPSG:3857|EPSG:326xx|EPSG:327xx", func(h *Handler, d *caddyfile.Dispenser) error { return oneArg(d, &h.CRS) }},
	{"shape", "tumbling|sliding|session", func(h *Handler, d *caddyfile.Dispenser) error { return oneArg(d, &h.Shape) }},
	{"window", "<duration>", func(h *Handler, d *caddyfile.Dispenser) error { return positiveDurationArg(d, &h.Window) }},
	{"session_idle", "<duration>", func(h *Handler, d *caddyfile.Dispenser) error { return positiveDurationArg(d, &h.SessionIdle) }},
	{"resolution", "<0..15>", func(h *Handler, d *caddyfile.Dispenser) error {
		return intPtrArg(d, &h.Resolution, 0, "a whole number from 0 to 15, e.g. resolution 12")
	}},
	{"radius", "<metres>", func(h *Handler, d *caddyfile.Dispenser) error {
		return positiveFloatArg(d, &h.Radius, "m", "a distance in metres above your receivers' parked jitter, e.g. radius 25")
	}},
	{"hysteresis", "<metres>", func(h *Handler, d *caddyfile.Dispenser) error {
		return floatArg(d, &h.Hysteresis, "m", "a distance in metres; hysteresis is retired: remove it, and set radius if needed")
	}},
	{"key_prefix", "<prefix>", func(h *Handler, d *caddyfile.Dispenser) error {
		h.KeyPrefix = new(string)
		return anyArg(d, h.KeyPrefix) // "" too: keys of the bare hash
	}},
	{"key_scope", "<placeholder template>", func(h *Handler, d *caddyfile.Dispenser) error { return oneArg(d, &h.KeyScope) }},
	{"retry_ladder", "<duration>...", (*Handler).unmarshalRetryLadder},
	{"outage_margin", "<duration>", func(h *Handler, d *caddyfile.Dispenser) error {
		h.OutageMargin = new(caddy.Duration)
		return durationArg(d, h.OutageMargin)
	}},
	{"ttl", "<duration>", func(h *Handler, d *caddyfile.Dispenser) error { return positiveDurationArg(d, &h.TTL) }},
	{"store", "memory|redis [<url>] { ... }", (*Handler).unmarshalStore},
	{"near_cache", "off|<entries>", func(h *Handler, d *caddyfile.Dispenser) error {
		return countOrOffArg(d, &h.NearCache, "off, or a number of keys such as 100000")
	}},
	{"on_store_error", "open|closed", func(h *Handler, d *caddyfile.Dispenser) error { return oneArg(d, &h.OnStoreError) }},
	{"release_on_failure", "on|off", func(h *Handler, d *caddyfile.Dispenser) error {
		return onOffArg(d, &h.ReleaseOnFailure, "on (the default) or off")
	}},
	{"in_flight_timeout", "<duration>", func(h *Handler, d *caddyfile.Dispenser) error { return positiveDurationArg(d, &h.InFlightTimeout) }},
	{"mode", "enforce|shadow", func(h *Handler, d *caddyfile.Dispenser) error { return oneArg(d, &h.Mode) }},
	{"on_invalid", "reject|dead_letter", func(h *Handler, d *caddyfile.Dispenser) error { return oneArg(d, &h.OnInvalid) }},
	{"dead_letter_stream", "<key>", func(h *Handler, d *caddyfile.Dispenser) error { return oneArg(d, &h.DeadLetterStream) }},
	{"dead_letter_maxlen", "<entries>", func(h *Handler, d *caddyfile.Dispenser) error {
		return int64Arg(d, &h.DeadLetterMaxLen, 1, "a positive number of entries, e.g. 100000")
	}},
	{"max_body", "<size>", func(h *Handler, d *caddyfile.Dispenser) error {
		return sizeArg(d, &h.MaxBody, "a size such as 1MiB or 64KB")
	}},
	{"max_batch", "<pings>", func(h *Handler, d *caddyfile.Dispenser) error {
		return intArg(d, &h.MaxBatch, 1, "a positive number of pings such as 1000")
	}},
	{"max_future", "<duration>", func(h *Handler, d *caddyfile.Dispenser) error { return positiveDurationArg(d, &h.MaxFuture) }},
	{"max_past", "<duration>", func(h *Handler, d *caddyfile.Dispenser) error { return positiveDurationArg(d, &h.MaxPast) }},
	{"null_island", "reject|allow", func(h *Handler, d *caddyfile.Dispenser) error { return oneArg(d, &h.NullIsland) }},
	{"stuck_ratio", "<share>", func(h *Handler, d *caddyfile.Dispenser) error {
		return positiveFloatArg(d, &h.StuckRatio, "", "a share above 0 and at most 1, e.g. stuck_ratio 0.95")
	}},
	{"stuck_after", "<duration>", func(h *Handler, d *caddyfile.Dispenser) error { return positiveDurationArg(d, &h.StuckAfter) }},
	{"stuck_track", "<assets>", func(h *Handler, d *caddyfile.Dispenser) error {
		return intArg(d, &h.StuckTrack, 1, "a positive number of assets, e.g. stuck_track 10000")
	}},
}

func caddyfileOption(name string) (option, bool) {
	for _, o := range caddyfileOptions {
		if o.name == name {
			return o, true
		}
	}
	return option{}, false
}

func caddyfileOptionNames() []string {
	names := make([]string, len(caddyfileOptions))
	for i, o := range caddyfileOptions {
		names[i] = o.name
	}
	return names
}

func (h *Handler) unmarshalRetryLadder(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) == 0 {
		return d.Err("retry_ladder needs the sender's retry offsets after the first delivery, e.g. retry_ladder 1m 5m 30m 2h 6h")
	}
	for _, a := range args {
		dur, err := caddy.ParseDuration(a)
		if err != nil {
			return d.Errf("retry_ladder %q: %v; use durations such as 1m 5m 30m 2h 6h", a, err)
		}
		h.RetryLadder = append(h.RetryLadder, caddy.Duration(dur))
	}
	return nil
}

// unmarshalAnswers parses the answers block:
//
//	answers {
//		suppressed    <status> [<content type> [<body>]]
//		in_flight     <status> [<retry after seconds>]
//		dead_lettered <status> [<content type> [<body>]]
//	}
func (h *Handler) unmarshalAnswers(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.Errf("answers takes no arguments, only a block: answers { suppressed 200 application/json [] }")
	}
	h.Answers = new(Answers)
	var previous string
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		kind, args := d.Val(), d.RemainingArgs()
		if kind == "{" && previous != "" {
			return noBlockError(d, "answer "+previous, "")
		}
		previous = kind
		var dst **Answer
		maxArgs := 3
		switch kind {
		case "suppressed":
			dst = &h.Answers.Suppressed
		case "dead_lettered":
			dst = &h.Answers.DeadLettered
		case "in_flight":
			dst, maxArgs = &h.Answers.InFlight, 2
		default:
			return d.Errf("unknown answer %q; the answers are suppressed, in_flight and dead_lettered", kind)
		}
		if *dst != nil {
			return d.Errf("answer %s already given; give each once", kind)
		}
		if len(args) == 0 || len(args) > maxArgs {
			return d.Errf("answer %s: use %s", kind, answerSyntax(kind))
		}
		a := new(Answer)
		var err error
		if a.Status, err = strconv.Atoi(args[0]); err != nil {
			return d.Errf("answer %s: status %q is not a number; use %s", kind, args[0], answerSyntax(kind))
		}
		switch {
		case kind == "in_flight" && len(args) == 2:
			if a.RetryAfter, err = strconv.Atoi(args[1]); err != nil || a.RetryAfter < 1 {
				return d.Errf("answer in_flight: retry after %q must be a whole number of seconds of at least 1 "+
					"(OwnTracks Android resends a 503 with Retry-After: 0 at once)", args[1])
			}
		case len(args) >= 2:
			if args[1] == "" {
				return d.Errf("answer %s: the content type is empty (a quoted {$VARIABLE} that is not set?); give one, such as application/json, "+
					"or leave out the content type and the body", kind)
			}
			a.ContentType = args[1]
			if len(args) == 3 {
				a.Body = &args[2]
			}
		}
		if err := a.check(kind); err != nil {
			return d.Err(err.Error())
		}
		*dst = a
	}
	if *h.Answers == (Answers{}) {
		return d.Err("answers needs a block with at least one answer, e.g. answers {\n\tsuppressed 200 application/json []\n}")
	}
	return nil
}

func answerSyntax(kind string) string {
	if kind == "in_flight" {
		return "in_flight <status> [<retry after seconds>], e.g. in_flight 503 1"
	}
	return kind + " <status> [<content type> [<body>]], e.g. " + kind + " 200 application/json `{\"result\":\"ok\"}`"
}

// unmarshalStore parses `store <name> [<args>] {...}` through the store
// module's own UnmarshalCaddyfile.
func (h *Handler) unmarshalStore(d *caddyfile.Dispenser) error {
	if !d.NextArg() {
		return d.Errf("store needs a type: %s", storeNames())
	}
	name := d.Val()
	if _, err := caddy.GetModule(storesNamespace + "." + name); err != nil {
		return d.Errf("unknown store %q: use %s", name, storeNames())
	}
	unm, err := caddyfile.UnmarshalModule(d, storesNamespace+"."+name)
	if err != nil {
		return err
	}
	h.StoreRaw = caddyconfig.JSONModuleObject(unm, "type", name, nil)
	return nil
}

// The argument helpers below read the arguments of the current option and
// say, on a bad one, what to use instead.

// argCountError is an option given no value, or more than one where it
// takes one; the block's loop answers it with the option's syntax.
type argCountError struct{ option string }

func (e *argCountError) Error() string { return e.option + " takes exactly one value" }

// withSyntax answers an argCountError of option with the option's syntax,
// and, for a duration or a size, how to write one.
func withSyntax(d *caddyfile.Dispenser, err error, option, syntax string) error {
	var count *argCountError
	if syntax == "" || !errors.As(err, &count) || count.option != option {
		return err
	}
	var example string
	switch {
	case strings.Contains(syntax, "<duration>"):
		example = " (one word, such as 30s, 5m, 6h30m or 1d)"
	case strings.Contains(syntax, "<size>"):
		example = " (one word, such as 1MiB or 512KB)"
	}
	return d.Errf("%s takes one value: %s %s%s", option, option, syntax, example)
}

// anyArg reads the option's one value, empty or not.
func anyArg(d *caddyfile.Dispenser, dst *string) error {
	option := d.Val()
	if !d.AllArgs(dst) {
		return d.WrapErr(&argCountError{option})
	}
	return nil
}

// noBlockError reports a block opened after an option that takes none
// (preset owntracks {), which read as an option named "{".
func noBlockError(d *caddyfile.Dispenser, option, syntax string) error {
	if syntax == "" {
		return d.Errf("%s takes no block; write it on one line, or remove the braces", option)
	}
	return d.Errf("%s takes no block; write its value on its line (%s %s), or remove the braces", option, option, syntax)
}

// oneArg reads the option's one value, which may not be empty.
func oneArg(d *caddyfile.Dispenser, dst *string) error {
	option := d.Val()
	if err := anyArg(d, dst); err != nil {
		return err
	}
	if *dst == "" {
		// Read as left out, it took the default: a key_scope or a Redis
		// password ran without one.
		return d.Errf(`%s "": the value is empty (as a quoted {$VARIABLE} that is not set reads); write a value, or leave %s out for its default`, option, option)
	}
	return nil
}

// someArgs reads one or more arguments.
func someArgs(d *caddyfile.Dispenser, dst *[]string, use string) error {
	option := d.Val()
	if *dst = d.RemainingArgs(); len(*dst) == 0 {
		return d.Errf("%s needs %s", option, use)
	}
	return nil
}

// intArg reads one whole number, at least minimum.
func intArg(d *caddyfile.Dispenser, dst *int, minimum int, use string) error {
	option := d.Val()
	var s string
	if err := oneArg(d, &s); err != nil {
		return err
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < minimum {
		return d.Errf("%s %q: use %s", option, s, use)
	}
	*dst = n
	return nil
}

func intPtrArg(d *caddyfile.Dispenser, dst **int, minimum int, use string) error {
	*dst = new(int)
	return intArg(d, *dst, minimum, use)
}

func int64Arg(d *caddyfile.Dispenser, dst *int64, minimum int, use string) error {
	var n int
	err := intArg(d, &n, minimum, use)
	*dst = int64(n)
	return err
}

// countOrOffArg reads off (0) or a whole number of at least 0.
func countOrOffArg(d *caddyfile.Dispenser, dst **int, use string) error {
	option := d.Val()
	var s string
	if err := oneArg(d, &s); err != nil {
		return err
	}
	n, err := strconv.Atoi(s)
	if s == "off" {
		n, err = 0, nil
	}
	if err != nil || n < 0 {
		return d.Errf("%s %q: use %s", option, s, use)
	}
	*dst = &n
	return nil
}

// floatArg reads one finite number, with an optional unit suffix.
func floatArg(d *caddyfile.Dispenser, dst *float64, unit, use string) error {
	option := d.Val()
	var s string
	if err := oneArg(d, &s); err != nil {
		return err
	}
	f, err := strconv.ParseFloat(strings.TrimSuffix(s, unit), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return d.Errf("%s %q: use %s", option, s, use)
	}
	*dst = f
	return nil
}

// positiveFloatArg is floatArg for an option whose 0 means its default in
// JSON: written out in a Caddyfile, 0 or less is a mistake, not a default.
func positiveFloatArg(d *caddyfile.Dispenser, dst *float64, unit, use string) error {
	option := d.Val()
	if err := floatArg(d, dst, unit, use); err != nil {
		return err
	}
	if *dst <= 0 {
		return notPositiveError(d, option, use)
	}
	return nil
}

// onOffArg reads on or off.
func onOffArg(d *caddyfile.Dispenser, dst **bool, use string) error {
	option := d.Val()
	var s string
	if err := oneArg(d, &s); err != nil {
		return err
	}
	if s != "on" && s != "off" {
		return d.Errf("%s %q: use %s", option, s, use)
	}
	on := s == "on"
	*dst = &on
	return nil
}

// sizeArg reads a positive size such as 1MiB.
func sizeArg(d *caddyfile.Dispenser, dst *int64, use string) error {
	option := d.Val()
	var s string
	if err := oneArg(d, &s); err != nil {
		return err
	}
	size, err := humanize.ParseBytes(s)
	if err != nil || size == 0 || size > math.MaxInt64 {
		return d.Errf("%s %q: use %s", option, s, use)
	}
	*dst = int64(size)
	return nil
}

func durationArg(d *caddyfile.Dispenser, dst *caddy.Duration) error {
	option := d.Val()
	var s string
	if err := oneArg(d, &s); err != nil {
		return err
	}
	dur, err := caddy.ParseDuration(s)
	if err != nil {
		return d.Errf("%s %q: %v; use a duration such as 30s, 5m, 6h30m or 1d", option, s, err)
	}
	*dst = caddy.Duration(dur)
	return nil
}

// positiveDurationArg is durationArg for an option whose 0 means its
// default in JSON: written out in a Caddyfile, 0 or less is a mistake.
func positiveDurationArg(d *caddyfile.Dispenser, dst *caddy.Duration) error {
	option := d.Val()
	if err := durationArg(d, dst); err != nil {
		return err
	}
	if *dst <= 0 {
		return notPositiveError(d, option, "a duration such as 30s, 5m, 6h30m or 1d")
	}
	return nil
}

// notPositiveError reports the value just read as not above 0.
func notPositiveError(d *caddyfile.Dispenser, option, use string) error {
	return d.Errf("%s %s: must be more than 0; use %s, or leave %s out for its default", option, d.Val(), use, option)
}

// optionAt is where an option was written.
type optionAt struct {
	file string
	line int
}

// errorf is an error at where the option was written, in the form of the
// dispenser's own errors.
func (at optionAt) errorf(format string, args ...any) error {
	return fmt.Errorf(format+", at %s:%d", append(args, at.file, at.line)...)
}

// optionError reports a semantic error at the line of the option it names,
// in the same form as the dispenser's own errors.
func optionError(d *caddyfile.Dispenser, lines map[string]optionAt, err error) error {
	var ce *dedup.ConfigError
	if errors.As(err, &ce) {
		if at, ok := lines[ce.Option]; ok {
			return at.errorf("%w", err)
		}
	}
	return d.WrapErr(err)
}
