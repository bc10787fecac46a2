package telemetrydedup

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

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
//		preset         owntracks|traccar|geojson
//		asset          <json path>...|<placeholder template>
//		time           <json path>...
//		time_format    auto|rfc3339|unix|unix_ms
//		lat            <json path>
//		lon            <json path>
//		crs            EPSG:4326|EPSG:3857|EPSG:326xx|EPSG:327xx
//		shape          tumbling|sliding|session
//		window         <duration>
//		session_idle   <duration>
//		resolution     <0..15>
//		hysteresis     <metres>
//		key_prefix     <prefix>
//		key_scope      <placeholder template>
//		retry_ladder   <duration>...
//		outage_margin  <duration>
//		ttl            <duration>
//		store memory|redis [<url>] { ... }
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
//		null_island    reject|allow
//		stuck_ratio    <share>
//		stuck_after    <duration>
//		stuck_track    <assets>
//	}
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume directive name
	if d.NextArg() {
		return d.Errf("unexpected argument %q: telemetry_dedup takes at most a matcher, and its options in a block", d.Val())
	}
	lines := make(map[string]int) // option -> line, to report semantic errors where they were written
	for d.NextBlock(0) {
		option := d.Val()
		if _, seen := lines[option]; seen {
			return d.Errf("%s already specified on line %d; give each option once", option, lines[option])
		}
		lines[option] = d.Line()
		if err := h.unmarshalOption(d, option); err != nil {
			return err
		}
	}
	if _, err := h.resolve(); err != nil {
		return optionError(d, lines, err)
	}
	return nil
}

// optionNames lists the block's options, for the unknown-option error.
var optionNames = []string{
	"preset", "asset", "time", "time_format", "lat", "lon", "crs",
	"shape", "window", "session_idle", "resolution", "hysteresis", "key_prefix", "key_scope",
	"retry_ladder", "outage_margin", "ttl", "store", "near_cache", "on_store_error", "release_on_failure",
	"in_flight_timeout", "mode", "on_invalid", "dead_letter_stream", "dead_letter_maxlen",
	"max_body", "max_batch", "max_future", "null_island", "stuck_ratio", "stuck_after", "stuck_track",
}

func (h *Handler) unmarshalOption(d *caddyfile.Dispenser, option string) error {
	switch option {
	case "preset":
		return oneArg(d, &h.Preset)
	case "asset":
		h.Asset = d.RemainingArgs()
		if len(h.Asset) == 0 {
			return d.Err("asset needs a JSON path (or several, tried in order), or one placeholder template")
		}
	case "time":
		h.Time = d.RemainingArgs()
		if len(h.Time) == 0 {
			return d.Err("time needs a JSON path (or several, tried in order)")
		}
	case "crs":
		return oneArg(d, &h.CRS)
	case "shape":
		return oneArg(d, &h.Shape)
	case "session_idle":
		return durationArg(d, &h.SessionIdle)
	case "hysteresis":
		var s string
		if err := oneArg(d, &s); err != nil {
			return err
		}
		m, err := strconv.ParseFloat(strings.TrimSuffix(s, "m"), 64)
		if err != nil || math.IsNaN(m) || math.IsInf(m, 0) {
			return d.Errf("hysteresis %q: use a distance in metres, e.g. hysteresis 5", s)
		}
		h.Hysteresis = m
	case "key_scope":
		return oneArg(d, &h.KeyScope)
	case "mode":
		return oneArg(d, &h.Mode)
	case "on_invalid":
		return oneArg(d, &h.OnInvalid)
	case "dead_letter_stream":
		return oneArg(d, &h.DeadLetterStream)
	case "dead_letter_maxlen":
		var n int
		if err := intArg(d, &n, 1, "a positive number of entries, e.g. 100000"); err != nil {
			return err
		}
		h.DeadLetterMaxLen = int64(n)
	case "time_format":
		return oneArg(d, &h.TimeFormat)
	case "lat":
		return oneArg(d, &h.Lat)
	case "lon":
		return oneArg(d, &h.Lon)
	case "window":
		return durationArg(d, &h.Window)
	case "resolution":
		var n int
		if err := intArg(d, &n, 0, "a whole number from 0 to 15, e.g. resolution 12"); err != nil {
			return err
		}
		h.Resolution = &n
	case "key_prefix":
		var s string
		if err := oneArg(d, &s); err != nil {
			return err
		}
		h.KeyPrefix = &s
	case "retry_ladder":
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
	case "outage_margin":
		var m caddy.Duration
		if err := durationArg(d, &m); err != nil {
			return err
		}
		h.OutageMargin = &m
	case "ttl":
		return durationArg(d, &h.TTL)
	case "store":
		return h.unmarshalStore(d)
	case "near_cache":
		var s string
		if err := oneArg(d, &s); err != nil {
			return err
		}
		n, err := strconv.Atoi(s)
		if s == "off" {
			n, err = 0, nil
		}
		if err != nil || n < 0 {
			return d.Errf("near_cache %q: use off, or a number of keys such as 100000", s)
		}
		h.NearCache = &n
	case "on_store_error":
		return oneArg(d, &h.OnStoreError)
	case "release_on_failure":
		var s string
		if err := oneArg(d, &s); err != nil {
			return err
		}
		if s != "on" && s != "off" {
			return d.Errf("release_on_failure %q: use on (the default) or off", s)
		}
		release := s == "on"
		h.ReleaseOnFailure = &release
	case "in_flight_timeout":
		return durationArg(d, &h.InFlightTimeout)
	case "max_body":
		var s string
		if err := oneArg(d, &s); err != nil {
			return err
		}
		size, err := humanize.ParseBytes(s)
		if err != nil || size == 0 || size > math.MaxInt64 {
			return d.Errf("max_body %q: use a size such as 1MiB or 64KB", s)
		}
		h.MaxBody = int64(size)
	case "max_batch":
		return intArg(d, &h.MaxBatch, 1, "a positive number of pings such as 1000")
	case "max_future":
		return durationArg(d, &h.MaxFuture)
	case "null_island":
		return oneArg(d, &h.NullIsland)
	case "stuck_ratio":
		var s string
		if err := oneArg(d, &s); err != nil {
			return err
		}
		ratio, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(ratio) {
			return d.Errf("stuck_ratio %q: use a share between 0 and 1, e.g. stuck_ratio 0.95", s)
		}
		h.StuckRatio = ratio
	case "stuck_after":
		return durationArg(d, &h.StuckAfter)
	case "stuck_track":
		return intArg(d, &h.StuckTrack, 1, "a positive number of assets, e.g. stuck_track 10000")
	default:
		return d.Errf("unrecognized telemetry_dedup option %q; the options are %s", option, strings.Join(optionNames, ", "))
	}
	return nil
}

// unmarshalStore parses `store memory {...}` or `store redis <url> {...}`
// through the store module's own UnmarshalCaddyfile.
func (h *Handler) unmarshalStore(d *caddyfile.Dispenser) error {
	if !d.NextArg() {
		return d.Err("store needs a type: memory or redis")
	}
	name := d.Val()
	if name != "memory" && name != "redis" {
		return d.Errf("unknown store %q: use memory (the default) or redis <url>", name)
	}
	unm, err := caddyfile.UnmarshalModule(d, "http.handlers.telemetry_dedup.stores."+name)
	if err != nil {
		return err
	}
	h.StoreRaw = caddyconfig.JSONModuleObject(unm, "type", name, nil)
	return nil
}

func oneArg(d *caddyfile.Dispenser, dst *string) error {
	if !d.AllArgs(dst) {
		return d.ArgErr()
	}
	return nil
}

// intArg reads the one whole-number argument of the current option, at
// least minimum.
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

func durationArg(d *caddyfile.Dispenser, dst *caddy.Duration) error {
	dur, err := parseDurationArg(d)
	*dst = caddy.Duration(dur)
	return err
}

// parseDurationArg reads the one duration argument of the current option.
func parseDurationArg(d *caddyfile.Dispenser) (time.Duration, error) {
	option := d.Val()
	var s string
	if !d.AllArgs(&s) {
		return 0, d.ArgErr()
	}
	dur, err := caddy.ParseDuration(s)
	if err != nil {
		return 0, d.Errf("%s %q: %v; use a duration such as 30s, 5m or 6h30m", option, s, err)
	}
	return dur, nil
}

// optionError reports a semantic error at the line of the option it names,
// in the same form as the dispenser's own errors.
func optionError(d *caddyfile.Dispenser, lines map[string]int, err error) error {
	var ce *dedup.ConfigError
	if errors.As(err, &ce) {
		if line, ok := lines[ce.Option]; ok {
			return fmt.Errorf("%w, at %s:%d", err, d.File(), line)
		}
	}
	return d.WrapErr(err)
}
