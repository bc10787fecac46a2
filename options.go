package telemetrydedup

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/geo"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// Option values and defaults that live in the handler rather than in dedup.
const (
	defaultMaxBody = 1 << 20 // 1 MiB
	// minMaxBody is the smallest max_body taken: a ping takes some 30 bytes
	// at the least, and max_body 1, read as one byte, answered every ping
	// 413.
	minMaxBody              = 64
	defaultDeadLetterMaxLen = 100_000

	onStoreErrorOpen   = "open"
	onStoreErrorClosed = "closed"
	nullIslandReject   = "reject"
	nullIslandAllow    = "allow"
	modeEnforce        = "enforce"
	modeShadow         = "shadow"
	onInvalidReject    = "reject"
	onInvalidDead      = "dead_letter"
	encodingJSON       = "json"
	encodingForm       = "form"
	encodingAuto       = "auto"
	// off empties a preset's event or state list.
	off = "off"
)

// settings are the handler's options with defaults applied and checked.
type settings struct {
	// parser reads JSON pings, formParser pings in form fields.
	parser, formParser ping.Parser
	// extracts and formExtracts remember what each parser read of the
	// latest pings, for the retries that repeat them byte for byte.
	extracts, formExtracts *ping.ExtractCache
	splitter               ping.Splitter
	// defaultsOverPreset lists the options written beside the preset with
	// the paths of a format without one, which override the preset's.
	defaultsOverPreset []string
	// misreadAnswers lists the answers given beside the preset that its
	// client does not read as meant.
	misreadAnswers []string
	// encoding says where a request's fields are: json, form or auto.
	encoding      string
	answers       answers
	assetTemplate string   // a placeholder template for the asset, instead of paths
	keyScope      keyScope // a placeholder template that scopes every key
	keyer         dedup.Keyer
	policy        dedup.Policy
	ttlFrom       string
	// onStoreError is what a ping becomes when the store cannot answer:
	// unchecked (forwarded) or unavailable (503).
	onStoreError dedup.Decision
	// upstreamBound is how long after its claim the upstream request of a
	// claimed ping is cut: in_flight_timeout less what settling or
	// releasing the claim may take, so that a claim older than
	// in_flight_timeout has always been finished.
	upstreamBound time.Duration
	release       bool
	shadow        bool
	// deadLetterInvalid sends the pings that cannot be keyed to the
	// store's dead letters instead of rejecting them.
	deadLetterInvalid bool
	deadLetterStream  string
	deadLetterMaxLen  int64
	maxBody           int64
	maxBatch          int
	// overlandBatchShort is set when preset overland's max_batch is below
	// the largest batch the app can be set to post.
	overlandBatchShort bool
	stuckRatio         float64
	stuckAfter         time.Duration
	stuckTrack         int
}

// resolve applies defaults and checks every option, returning a
// *dedup.ConfigError naming the option at fault. The Caddyfile parser runs
// it too, so a bad value is reported with its line before Caddy starts.
func (h *Handler) resolve() (settings, error) {
	var s settings
	var err error
	if err = h.resolveFormat(&s); err != nil {
		return s, err
	}
	if s.answers, err = h.resolveAnswers(); err != nil {
		return s, err
	}
	s.misreadAnswers = h.misreadAnswers()

	s.keyer = dedup.Keyer{Window: dedup.DefaultWindow, Resolution: dedup.DefaultResolution, Prefix: dedup.DefaultKeyPrefix}
	if h.Window != 0 {
		s.keyer.Window = time.Duration(h.Window)
	}
	if h.Resolution != nil {
		s.keyer.Resolution = *h.Resolution
	}
	if h.KeyPrefix != nil {
		s.keyer.Prefix = *h.KeyPrefix
	}
	if err := s.keyer.Check(); err != nil {
		return s, err
	}
	if h.KeyScope != "" {
		if err := checkTemplate("key_scope", h.KeyScope); err != nil {
			return s, err
		}
	}
	s.keyScope = parseKeyScope(h.KeyScope)

	if s.policy, s.ttlFrom, err = h.resolvePolicy(s.keyer); err != nil {
		return s, err
	}
	if s.upstreamBound, err = h.resolveUpstreamBound(s.policy.InFlightTimeout); err != nil {
		return s, err
	}

	failClosed, err := choice("on_store_error", h.OnStoreError, onStoreErrorOpen, onStoreErrorClosed)
	if err != nil {
		return s, err
	}
	if s.shadow, err = choice("mode", h.Mode, modeEnforce, modeShadow); err != nil {
		return s, err
	}
	s.onStoreError = decisionUnchecked
	if failClosed { // recorded so in shadow mode too, which forwards everything, a store outage included
		s.onStoreError = decisionUnavailable
	}
	s.release = h.ReleaseOnFailure == nil || *h.ReleaseOnFailure

	if s.deadLetterInvalid, err = choice("on_invalid", h.OnInvalid, onInvalidReject, onInvalidDead); err != nil {
		return s, err
	}
	if s.deadLetterInvalid {
		if err := h.checkStoreKeepsDeadLetters(); err != nil {
			return s, err
		}
	}
	if strings.ContainsAny(h.DeadLetterStream, "{}") {
		return s, &dedup.ConfigError{Option: "dead_letter_stream", Problem: fmt.Sprintf(
			"%q holds a brace: a placeholder is not expanded here (the stream's key is written as it is); "+
				"for an environment variable in a Caddyfile use {$NAME}, which Caddy expands when it reads the file", h.DeadLetterStream)}
	}
	if !s.deadLetterInvalid {
		// Like radius on tumbling: set, it would do nothing, and every
		// invalid ping would be rejected while its author believes it kept.
		for _, o := range []struct {
			option string
			set    bool
		}{{"dead_letter_stream", h.DeadLetterStream != ""}, {"dead_letter_maxlen", h.DeadLetterMaxLen != 0}} {
			if o.set {
				return s, &dedup.ConfigError{Option: o.option, Problem: "needs on_invalid dead_letter: with on_invalid reject " +
					"invalid pings are rejected and nothing is written to a stream; add on_invalid dead_letter or remove " + o.option}
			}
		}
	}
	s.deadLetterStream = cmp.Or(h.DeadLetterStream, s.keyer.Prefix+"dead_letter")
	s.deadLetterMaxLen = cmp.Or(h.DeadLetterMaxLen, defaultDeadLetterMaxLen)
	if h.DeadLetterMaxLen < 0 {
		return s, &dedup.ConfigError{Option: "dead_letter_maxlen", Problem: fmt.Sprintf("%d is negative; use a number of entries such as 100000", h.DeadLetterMaxLen)}
	}

	if h.MaxBody < 0 {
		return s, &dedup.ConfigError{Option: "max_body", Problem: fmt.Sprintf("%d is negative; use a number of bytes such as 1048576 (1 MiB)", h.MaxBody)}
	}
	s.maxBody = cmp.Or(h.MaxBody, defaultMaxBody)
	if s.maxBody < minMaxBody {
		return s, &dedup.ConfigError{Option: "max_body", Problem: fmt.Sprintf(
			"%d bytes holds no ping (the smallest a sender writes takes some 30 to 50); give a size with its unit, such as 64KiB or 1MiB, "+
				"or leave max_body out for the default %dMiB", s.maxBody, defaultMaxBody>>20)}
	}
	if err := checkMaxBody(h.Preset, s.maxBody); err != nil {
		return s, err
	}
	if h.MaxBatch < 0 {
		return s, &dedup.ConfigError{Option: "max_batch", Problem: fmt.Sprintf("%d is negative; use a number of pings such as 1000", h.MaxBatch)}
	}
	if h.MaxBatch > dedup.MaxClaims {
		return s, &dedup.ConfigError{Option: "max_batch", Problem: fmt.Sprintf("%d is more than one request's claims can be told apart by (%d); use a number of pings such as 1000", h.MaxBatch, dedup.MaxClaims)}
	}
	s.maxBatch = cmp.Or(h.MaxBatch, ping.DefaultMaxBatch)
	s.splitter.Max = s.maxBatch
	s.overlandBatchShort = h.Preset == "overland" && s.maxBatch < overlandLargestBatch
	if h.NearCache != nil && *h.NearCache < 0 {
		return s, &dedup.ConfigError{Option: "near_cache", Problem: fmt.Sprintf("%d is negative; use 0 (off) or a number of keys such as 100000", *h.NearCache)}
	}
	if h.NearCache != nil && *h.NearCache > dedup.MaxNearCache {
		return s, &dedup.ConfigError{Option: "near_cache", Problem: fmt.Sprintf(
			"%d keys would take %.1f GB of memory as soon as the config loads (%d bytes a key); use at most %d, sized by the keys a window of parked traffic touches, e.g. 100000",
			*h.NearCache, float64(*h.NearCache)*dedup.NearCacheEntryBytes/1e9, dedup.NearCacheEntryBytes, dedup.MaxNearCache)}
	}

	s.stuckRatio = cmp.Or(h.StuckRatio, dedup.DefaultStuckRatio)
	if !(s.stuckRatio > 0 && s.stuckRatio <= 1) { // also refuses NaN
		return s, &dedup.ConfigError{Option: "stuck_ratio", Problem: fmt.Sprintf("%v is not a share in (0, 1]; use e.g. 0.95", h.StuckRatio)}
	}
	s.stuckAfter = orDefault(h.StuckAfter, 3*s.keyer.Window)
	if s.stuckAfter < 0 {
		return s, &dedup.ConfigError{Option: "stuck_after", Problem: fmt.Sprintf("%s is negative; use a duration longer than the window, e.g. 15m", s.stuckAfter)}
	}
	if err := dedup.CheckSeconds("stuck_after", s.stuckAfter, "15m"); err != nil {
		return s, err
	}
	if s.policy.Shape != dedup.Session && s.stuckAfter <= s.keyer.Window {
		// A parked asset is admitted once a window (in tumbling and
		// sliding alike): it would be listed as stuck between two
		// admissions.
		return s, &dedup.ConfigError{Option: "stuck_after", Problem: fmt.Sprintf(
			"%s is not longer than the window %s, so every parked asset would be listed as stuck between two admissions; use e.g. %s",
			s.stuckAfter, s.keyer.Window, 3*s.keyer.Window)}
	}
	s.stuckTrack = cmp.Or(h.StuckTrack, dedup.DefaultStuckTrack)
	if s.stuckTrack < 0 {
		return s, &dedup.ConfigError{Option: "stuck_track", Problem: fmt.Sprintf("%d is negative; use a number of assets, e.g. 10000", h.StuckTrack)}
	}
	return s, nil
}

// checkStoreKeepsDeadLetters makes sure on_invalid dead_letter has a store
// that can keep them.
func (h *Handler) checkStoreKeepsDeadLetters() error {
	mod, err := storeModuleOf(h.StoreRaw)
	if err != nil {
		return err
	}
	if _, ok := mod.(deadLetterer); !ok {
		return &dedup.ConfigError{Option: "on_invalid", Problem: fmt.Sprintf(
			"dead_letter needs a store that keeps dead letters, and store %s does not: use store redis <url> (a Redis stream), or on_invalid reject",
			mod.CaddyModule().ID.Name())}
	}
	return nil
}

// resolveFormat builds how requests are read from the preset and the
// options beside it: the parsers of JSON and of form-encoded pings (one
// and the same unless the preset has both), the batch wrapper, the
// encoding, and the asset template if the asset is one.
func (h *Handler) resolveFormat(s *settings) error {
	preset := ping.Preset{Parser: ping.NewParser()}
	if h.Preset != "" {
		var err error
		if preset, err = ping.ParsePreset(h.Preset); err != nil {
			return &dedup.ConfigError{Option: "preset", Problem: err.Error()}
		}
	}
	s.defaultsOverPreset = h.defaultsOverPreset(preset)
	form := preset.Parser
	if preset.Form != nil {
		form = *preset.Form
	}
	form.FromForm = true
	var err error
	if s.parser, s.assetTemplate, err = h.applyFieldOptions(preset.Parser); err != nil {
		return err
	}
	if s.formParser, _, err = h.applyFieldOptions(form); err != nil {
		return err
	}
	s.splitter.Wrapper = cmp.Or(h.Batch, preset.Wrapper)
	s.splitter.Collection = preset.Collection
	if h.Batch == off {
		s.splitter.Wrapper = ""
	}
	if s.splitter.Wrapper != "" {
		if err := ping.CheckPlainPath(s.splitter.Wrapper); err != nil {
			return &dedup.ConfigError{Option: "batch", Problem: err.Error()}
		}
	}
	s.encoding = encodingJSON
	if preset.Form != nil {
		s.encoding = encodingAuto
	}
	switch h.Encoding {
	case "":
	case encodingJSON, encodingForm, encodingAuto:
		s.encoding = h.Encoding
	default:
		return &dedup.ConfigError{Option: "encoding", Problem: fmt.Sprintf("%q is not allowed; use json, form or auto", h.Encoding)}
	}
	if s.encoding == encodingForm && h.Batch != "" && h.Batch != off {
		return &dedup.ConfigError{Option: "batch", Problem: "splits JSON bodies, and encoding form reads none: " +
			"a form ping is one request; remove batch, or use encoding auto for senders of both"}
	}
	if s.encoding == encodingForm && s.splitter.Wrapper != "" {
		return &dedup.ConfigError{Option: "encoding", Problem: fmt.Sprintf("form reads no JSON body, and preset %s's senders post their pings as a JSON batch (%q): "+
			"every one would be refused 400; remove encoding, or use encoding auto for senders of both", h.Preset, s.splitter.Wrapper)}
	}
	if s.encoding == encodingForm && h.Preset != "" && preset.Form == nil {
		return &dedup.ConfigError{Option: "encoding", Problem: fmt.Sprintf("form reads no JSON body, and preset %s's senders post each ping as JSON: "+
			"every one would be refused 400; remove encoding, or use encoding auto for senders of both", h.Preset)}
	}
	return nil
}

// defaultsOverPreset lists, as "option path (the preset reads path)",
// the options written beside a preset that give the path a format without
// one reads where the preset reads another. Caddyfile.example spells
// those defaults out, and a preset added above them was overridden by
// them without a word: every location of the tracker was refused as
// missing asset_id.
func (h *Handler) defaultsOverPreset(preset ping.Preset) []string {
	if h.Preset == "" {
		return nil
	}
	parsers := []ping.Parser{preset.Parser}
	if preset.Form != nil {
		parsers = append(parsers, *preset.Form)
	}
	generic := ping.NewParser()
	var found []string
	over := func(option string, written, def []string, presets func(ping.Parser) []string) {
		if !slices.Equal(written, def) {
			return
		}
		var read []string
		for _, p := range parsers {
			if paths := presets(p); !slices.Equal(paths, def) {
				read = append(read, paths...)
			}
		}
		if len(read) > 0 {
			found = append(found, fmt.Sprintf("%s %s (the preset reads %s)", option, strings.Join(written, " "), strings.Join(read, " or ")))
		}
	}
	over("asset", h.Asset, generic.AssetPaths, func(p ping.Parser) []string { return p.AssetPaths })
	over("time", h.Time, generic.TimePaths, func(p ping.Parser) []string { return p.TimePaths })
	over("lat", []string{h.Lat}, []string{generic.LatPath}, func(p ping.Parser) []string { return []string{p.LatPath} })
	over("lon", []string{h.Lon}, []string{generic.LonPath}, func(p ping.Parser) []string { return []string{p.LonPath} })
	return found
}

// zoneOfEpochTimes says why time_zone is refused beside a time format of
// epoch numbers, naming where that format came from: the time_format
// written, or else the preset's.
func (h *Handler) zoneOfEpochTimes(format ping.TimeFormat) string {
	if h.TimeFormat == "" && h.Preset != "" {
		return fmt.Sprintf("preset %s reads its time as epoch numbers (%s), which have no zone to name; remove time_zone", h.Preset, format)
	}
	return fmt.Sprintf("time_format %s reads epoch numbers, which have no zone to name; remove time_zone, "+
		"or use time_format auto for timestamps written without an offset", format)
}

// applyFieldOptions sets the path and rule options on a preset's parser,
// and returns the asset template if the asset is one.
func (h *Handler) applyFieldOptions(p ping.Parser) (ping.Parser, string, error) {
	var template string
	switch {
	case len(h.Asset) == 1 && strings.ContainsAny(h.Asset[0], "{}"):
		if err := checkTemplate("asset", h.Asset[0]); err != nil {
			return p, "", err
		}
		p.AssetPaths, template = nil, h.Asset[0]
	case len(h.Asset) > 0:
		for _, a := range h.Asset {
			if strings.Contains(a, "{") {
				return p, "", &dedup.ConfigError{Option: "asset", Problem: fmt.Sprintf(
					"%q is a placeholder template; give it alone, not beside JSON paths", a)}
			}
			if err := ping.CheckPlainPath(a); err != nil {
				return p, "", &dedup.ConfigError{Option: "asset", Problem: err.Error()}
			}
		}
		p.AssetPaths = h.Asset
	}
	if len(h.Asset) > 0 {
		p.AssetAliases = false // the operator's paths are tried in order
	}
	if len(h.Time) > 0 {
		p.TimePaths = h.Time
	}
	p.LatPath = cmp.Or(h.Lat, p.LatPath)
	p.LonPath = cmp.Or(h.Lon, p.LonPath)
	if err := h.checkPositionPaths(); err != nil {
		return p, "", err
	}
	if h.TimeFormat != "" {
		tf, err := ping.ParseTimeFormat(h.TimeFormat)
		if err != nil {
			return p, "", &dedup.ConfigError{Option: "time_format", Problem: err.Error()}
		}
		if times, ok := presetTimes[h.Preset]; ok && !slices.Contains(times.read, tf) {
			return p, "", &dedup.ConfigError{Option: "time_format", Problem: fmt.Sprintf(
				"%s cannot read what preset %s's senders write, %s, and every ping of theirs would be refused or read as another time; "+
					"use %s, or leave time_format out", tf, h.Preset, times.written, joinFormats(times.read))}
		}
		p.TimeFormat = tf
	}
	if h.TimeZone != "" {
		loc, err := ping.ParseTimeZone(h.TimeZone)
		if err != nil {
			return p, "", &dedup.ConfigError{Option: "time_zone", Problem: err.Error()}
		}
		if p.TimeFormat == ping.TimeUnix || p.TimeFormat == ping.TimeUnixMilli {
			return p, "", &dedup.ConfigError{Option: "time_zone", Problem: h.zoneOfEpochTimes(p.TimeFormat)}
		}
		p.TimeZone = loc
	}
	if h.CRS != "" {
		crs, err := geo.ParseCRS(h.CRS)
		if err != nil {
			return p, "", &dedup.ConfigError{Option: "crs", Problem: err.Error()}
		}
		if !crs.IsWGS84() && h.Preset != "" && h.Preset != "geojson" {
			// Read as metres, every fix of every device lands a few
			// metres off (0, 0): a car driving on is answered "jitter",
			// which its app takes as delivered, and its track is lost.
			return p, "", &dedup.ConfigError{Option: "crs", Problem: fmt.Sprintf(
				"%s: preset %s's senders always write WGS 84 degrees; remove crs", h.CRS, h.Preset)}
		}
		p.CRS = crs
	}
	if err := h.applyReportedFields(&p); err != nil {
		return p, "", err
	}
	p.MaxFuture = orDefault(h.MaxFuture, ping.DefaultMaxFuture)
	if p.MaxFuture < 0 {
		return p, "", &dedup.ConfigError{Option: "max_future", Problem: fmt.Sprintf("%s is negative; use a duration such as 5m", p.MaxFuture)}
	}
	if err := dedup.CheckSeconds("max_future", p.MaxFuture, "5m"); err != nil {
		return p, "", err
	}
	p.MaxPast = orDefault(h.MaxPast, ping.DefaultMaxPast)
	if p.MaxPast < 0 {
		return p, "", &dedup.ConfigError{Option: "max_past", Problem: fmt.Sprintf("%s is negative; use a duration such as 365d", p.MaxPast)}
	}
	if err := dedup.CheckSeconds("max_past", p.MaxPast, "365d"); err != nil {
		return p, "", err
	}
	var err error
	if p.AllowNullIsland, err = choice("null_island", h.NullIsland, nullIslandReject, nullIslandAllow); err != nil {
		return p, "", err
	}
	return p.Prepared(), template, nil
}

// checkPositionPaths refuses a path to the time or the position that is
// not a plain dotted path (the asset's are checked with its template): a
// gjson query or modifier (@this, #(...)) reads a value other parsers
// would not, or none, and would fail every ping.
func (h *Handler) checkPositionPaths() error {
	for _, o := range []struct {
		option string
		paths  []string
	}{{"time", h.Time}, {"lat", []string{h.Lat}}, {"lon", []string{h.Lon}}} {
		for _, path := range o.paths {
			if path == "" && o.option != "time" {
				continue // lat or lon left out: the preset's or the default
			}
			if err := ping.CheckPlainPath(path); err != nil {
				return &dedup.ConfigError{Option: o.option, Problem: err.Error()}
			}
		}
	}
	return nil
}

// applyReportedFields sets what the ping reports beside its position:
// accuracy, speed, events and states.
func (h *Handler) applyReportedFields(p *ping.Parser) error {
	if h.Accuracy != "" {
		p.AccuracyPath, p.AccuracyFallback = h.Accuracy, ""
	}
	p.SpeedPath = cmp.Or(h.Speed, p.SpeedPath)
	for _, o := range [][2]string{{"accuracy", h.Accuracy}, {"speed", h.Speed}} {
		if o[1] == "" {
			continue
		}
		if err := ping.CheckPlainPath(o[1]); err != nil {
			return &dedup.ConfigError{Option: o[0], Problem: err.Error()}
		}
	}
	if h.SpeedUnit != "" {
		unit, err := ping.ParseSpeedUnit(h.SpeedUnit)
		if err != nil {
			return &dedup.ConfigError{Option: "speed_unit", Problem: err.Error()}
		}
		if p.SpeedPath == "" {
			// JSON only: the Caddyfile writes the unit on the speed line.
			return &dedup.ConfigError{Option: "speed_unit", Problem: fmt.Sprintf(
				"%s: no speed is read, so it converts nothing; give speed its path too", h.SpeedUnit)}
		}
		p.SpeedUnit = unit
	}
	for option, values := range map[string][]string{"event": h.Event, "state": h.State} {
		if len(values) > 1 && slices.Contains(values, off) {
			return &dedup.ConfigError{Option: option, Problem: fmt.Sprintf(
				"%q: off clears the preset's and goes alone (%s off); to replace the preset's, list only the new ones", strings.Join(values, " "), option)}
		}
	}
	if h.Event != nil {
		p.Events = nil
		for _, e := range offOr(h.Event) {
			m, err := ping.ParseMatch(e)
			if err != nil {
				return &dedup.ConfigError{Option: "event", Problem: err.Error()}
			}
			p.Events = append(p.Events, m)
		}
	}
	if h.State != nil {
		p.States = offOr(h.State)
		for _, path := range p.States {
			if err := ping.CheckPlainPath(path); err != nil {
				return &dedup.ConfigError{Option: "state", Problem: err.Error()}
			}
		}
		if len(p.States) > dedup.MaxStateFields {
			return &dedup.ConfigError{Option: "state", Problem: fmt.Sprintf("%d fields are more than the %d each compared on its own; "+
				"keep those whose change the backend must see at once", len(p.States), dedup.MaxStateFields)}
		}
	}
	return nil
}

// presetTimes are the time formats that read the times a preset's
// senders write, for the presets whose senders all write one kind.
var presetTimes = map[string]struct {
	read    []ping.TimeFormat
	written string
}{
	"owntracks": {[]ping.TimeFormat{ping.TimeAuto, ping.TimeUnix}, "epoch seconds (tst)"},
	"overland":  {[]ping.TimeFormat{ping.TimeAuto, ping.TimeRFC3339}, "ISO 8601 strings (properties.timestamp)"},
	"traccar":   {[]ping.TimeFormat{ping.TimeAuto, ping.TimeRFC3339}, "ISO 8601 strings (position.deviceTime)"},
}

func joinFormats(formats []ping.TimeFormat) string {
	names := make([]string, len(formats))
	for i, f := range formats {
		names[i] = string(f)
	}
	return strings.Join(names, " or ")
}

// offOr is a list option's values, none for "off".
func offOr(values []string) []string {
	if len(values) == 1 && values[0] == off {
		return nil
	}
	return values
}

// resolvePolicy builds how claims are judged: shape, TTL, timeouts.
func (h *Handler) resolvePolicy(k dedup.Keyer) (dedup.Policy, string, error) {
	pol := dedup.Policy{
		Shape:       dedup.Tumbling,
		Window:      k.Window,
		SessionIdle: orDefault(h.SessionIdle, dedup.DefaultSessionIdle),
		Radius:      cmp.Or(h.Radius, dedup.DefaultRadius),
	}
	if h.Shape != "" {
		shape, err := dedup.ParseShape(h.Shape)
		if err != nil {
			return pol, "", &dedup.ConfigError{Option: "shape", Problem: err.Error()}
		}
		pol.Shape = shape
	}
	if h.Radius != 0 && pol.Shape == dedup.Tumbling {
		return pol, "", &dedup.ConfigError{Option: "radius", Problem: "needs shape sliding or session: tumbling keys on the H3 cell " +
			"and keeps no stay to measure a distance from; choose the cell size with resolution instead"}
	}
	if h.SessionIdle != 0 && pol.Shape != dedup.Session {
		return pol, "", &dedup.ConfigError{Option: "session_idle", Problem: fmt.Sprintf("needs shape session: shape %s has no sessions to end; "+
			"add shape session or remove session_idle", pol.Shape)}
	}
	if err := pol.Check(); err != nil {
		return pol, "", err
	}
	ttl, ttlFrom, err := h.ttlPolicy(k.Window, pol).Resolve()
	if err != nil {
		return pol, "", err
	}
	pol.TTL = ttl
	pol.InFlightTimeout = orDefault(h.InFlightTimeout, dedup.DefaultInFlightTimeout)
	if pol.InFlightTimeout >= ttl && h.InFlightTimeout == 0 {
		return pol, "", &dedup.ConfigError{Option: h.ttlOption(), Problem: fmt.Sprintf(
			"gives keys a TTL of %s (%s), no longer than the default in_flight_timeout %s: a claim in flight would outlive its key; "+
				"give keys longer, or set in_flight_timeout below the TTL, just above your upstream's timeout", ttl, ttlFrom, pol.InFlightTimeout)}
	}
	if pol.InFlightTimeout < 0 || pol.InFlightTimeout >= ttl {
		return pol, "", &dedup.ConfigError{Option: "in_flight_timeout", Problem: fmt.Sprintf(
			"%s must be positive and shorter than the key TTL %s; set it just above your upstream's timeout", pol.InFlightTimeout, ttl)}
	}
	return pol, ttlFrom, nil
}

// finishMargin is what the bound on the upstream request leaves, beside the
// store's own timeout, for the proxy to return and the release to start.
const finishMargin = 100 * time.Millisecond

// minUpstreamTime is the least an upstream request may be given.
const minUpstreamTime = 100 * time.Millisecond

// resolveUpstreamBound works out how long after its claim the upstream
// request of a claimed ping may run: in_flight_timeout less the time to
// settle or release the claim (the store's timeout and finishMargin), so
// that the claim is finished before in_flight_timeout. The claim itself may
// take the store's timeout before the upstream request starts; if what is
// left for the upstream is less than minUpstreamTime, the options cannot
// agree.
func (h *Handler) resolveUpstreamBound(inFlight time.Duration) (time.Duration, error) {
	storeTimeout, err := storeTimeoutOf(h.StoreRaw)
	if err != nil {
		return 0, err
	}
	finish := storeTimeout + finishMargin
	if left := inFlight - storeTimeout - finish; left < minUpstreamTime {
		// Reported at the option that was written: the store's timeout when
		// in_flight_timeout is its default.
		option, subject := "in_flight_timeout", inFlight.String()
		if h.InFlightTimeout == 0 {
			option, subject = "store", "the default in_flight_timeout "+inFlight.String()
		}
		least := storeTimeout + finish + minUpstreamTime
		if storeTimeout == 0 { // the memory store: no store timeout to lower
			return 0, &dedup.ConfigError{Option: option, Problem: fmt.Sprintf(
				"%s leaves the upstream %s: settling or releasing the claim takes %s, before in_flight_timeout; "+
					"set in_flight_timeout to at least %s", subject, max(left, 0), finish, least)}
		}
		return 0, &dedup.ConfigError{Option: option, Problem: fmt.Sprintf(
			"%s leaves the upstream %s: the claim may take the store's timeout (%s), and settling or releasing it %s more, "+
				"all before in_flight_timeout; set in_flight_timeout to at least %s, or lower the store's timeout",
			subject, max(left, 0), storeTimeout, finish, least)}
	}
	return inFlight - finish, nil
}

// ttlOption names the option that set the key TTL: the one written, else
// the window it was derived from.
func (h *Handler) ttlOption() string {
	switch {
	case h.TTL != 0:
		return "ttl"
	case h.RetryLadder != nil:
		return "retry_ladder"
	case h.OutageMargin != nil:
		return "outage_margin"
	}
	return "window"
}

func (h *Handler) ttlPolicy(window time.Duration, pol dedup.Policy) dedup.TTLPolicy {
	p := dedup.TTLPolicy{Window: window, TTL: time.Duration(h.TTL)}
	if pol.Shape == dedup.Session {
		p.SessionIdle = pol.SessionIdle
	}
	if h.RetryLadder != nil {
		p.RetryLadder = make([]time.Duration, len(h.RetryLadder))
		for i, d := range h.RetryLadder {
			p.RetryLadder[i] = time.Duration(d)
		}
	}
	if h.OutageMargin != nil {
		m := time.Duration(*h.OutageMargin)
		p.OutageMargin = &m
	}
	return p
}

// mode is the handler's mode, as decisions_total labels it: a shadow
// trial in front of the live handler judges the same pings, and counted
// alike, its would-be suppressions read as suppressions of the live one.
func (s *settings) mode() string {
	if s.shadow {
		return modeShadow
	}
	return modeEnforce
}

// choice reads a two-valued option: empty or the default gives false, the
// alternative true, anything else an error listing both.
func choice(option, value, byDefault, alternative string) (bool, error) {
	switch value {
	case "", byDefault:
		return false, nil
	case alternative:
		return true, nil
	}
	return false, &dedup.ConfigError{Option: option, Problem: fmt.Sprintf("%q is not allowed; use %s (the default) or %s", value, byDefault, alternative)}
}

func orDefault[D ~int64](d D, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return time.Duration(d)
}
