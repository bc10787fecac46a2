package ping

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/geo"
)

// Ping is one observation as the device reported it, normalised: an aware
// UTC device time and a WGS 84 position in degrees.
type Ping struct {
	// Asset identifies the vehicle, tracker or phone. From Extract it may
	// share memory with the body; clone it to keep it longer than the body.
	Asset string
	// Time is the device's own timestamp, in UTC. Never the arrival time:
	// a delayed ping must land in the bucket it belongs to.
	Time time.Time
	// Lat is the latitude in degrees.
	Lat float64
	// Lon is the longitude in degrees.
	Lon float64

	// Accuracy is the fix's horizontal accuracy radius in metres, as the
	// device reported it; 0 when the ping carries none. A fix whose
	// uncertainty covers a distance is no evidence of a move that far.
	Accuracy float64
	// Speed is the speed over ground the device reported, in m/s; it means
	// something only when HasSpeed is set.
	Speed float64
	// HasSpeed reports a ping that carried a speed.
	HasSpeed bool
	// assetAt and timeAt are the indexes in the parser's AssetPaths and
	// TimePaths of the paths the asset id and time were read at, so that
	// Validate names the field the sender filled.
	assetAt, timeAt uint16 // beside HasSpeed: the three share a word
	// setBack is, for a device time written in local time that its zone's
	// clock passes twice (the hour it is set back), how much earlier the
	// time's other reading is: Time is the later one, until AtServerClock
	// tells them apart.
	setBack time.Duration

	// Event names what the ping reports besides its position (an alarm, a
	// manual publish, a region transition); empty for a plain position. A
	// ping with an event is never suppressed but as its own exact
	// redelivery.
	Event string
	// State is the value of the configured state fields (an ignition, say);
	// empty when none is configured. A change against the asset's last
	// accepted ping admits the ping.
	State string
	// StateFields are the paths of the state fields the parser reads, in
	// order, joined by &, of which State holds those the ping carries:
	// each is compared on its own, whichever others a ping carries.
	StateFields string
}

// Default field paths and rules, as documented for the Caddyfile.
const (
	DefaultAssetPath  = "asset_id"
	DefaultTimePath   = "occurred_at"
	DefaultLatPath    = "lat"
	DefaultLonPath    = "lon"
	DefaultTimeFormat = TimeAuto
	DefaultMaxFuture  = 5 * time.Minute
	// DefaultMaxPast is how far behind the server clock a device time may
	// be: a year is more than any device keeps pings for while offline,
	// and far less than the clocks that were never set (1970, the GPS
	// epoch of 1980, a GPS week rollover ~20 years back, the year 1).
	DefaultMaxPast = 365 * 24 * time.Hour
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
	// tried in order for the asset id; the first that holds a value
	// (present, not null, and not an empty or blank string) counts. Empty
	// means the caller fills Ping.Asset itself before Validate.
	AssetPaths []string
	// TimePaths are tried in order for the device timestamp, as AssetPaths
	// are.
	TimePaths []string
	// LatPath and LonPath hold the position: latitude and longitude in
	// degrees, or northing (y) and easting (x) in a projected CRS.
	LatPath, LonPath string
	// PairField, of form fields, holds the position in one value, "lat,lon"
	// (OsmAnd's location), read as LatPath and LonPath when the request
	// carries neither, as Traccar's OsmAndProtocolDecoder reads it.
	PairField string
	// TimeFormat says how the device time is written.
	TimeFormat TimeFormat
	// CRS is the coordinate system of the position; WGS84 (the zero
	// value) needs no reprojection.
	CRS geo.CRS
	// KindPath and Kind, when set, make only bodies whose KindPath holds
	// the string Kind pings; any other body is ErrNotAPing.
	KindPath, Kind string
	// Skip lists the records that are not positions although their kind
	// says so (an Overland visit, a Traccar position without a fix): a
	// body any of them matches is ErrNotAPing.
	Skip []Match
	// SkipEmpty makes an empty body ErrNotAPing instead of malformed: an
	// OwnTracks app posts one when a friend is deleted.
	SkipEmpty bool
	// EmptyFix, when set, is what the error for an empty body tells its
	// sender to change: Traccar's forwarder sends none with its default
	// forward.type.
	EmptyFix string
	// FromForm says the pings are form fields written as objects
	// (SplitForm), where an array is a field given several different
	// values: one the parser reads is a type error that says so, and that
	// parsers disagree on which counts.
	FromForm bool
	// AssetAliases says the AssetPaths name one field, as OsmAnd's id and
	// deviceid do, rather than places tried in order: Traccar's decoder
	// applies each in turn, so the one given last counts there, where the
	// first path counts here. A ping that gives them different values is
	// refused, as a field given twice with different values is.
	AssetAliases bool

	// AccuracyPath, SpeedPath and SpeedUnit say where the fix's accuracy
	// (metres) and the reported speed are, if the format has them.
	AccuracyPath, SpeedPath string
	SpeedUnit               SpeedUnit
	// AccuracyFallback, when set, is read for the accuracy of a ping that
	// has none at AccuracyPath.
	AccuracyFallback string
	// Events lists the fields that make a ping an event (an alarm, a
	// manual publish): the first that matches becomes Ping.Event.
	Events []Match
	// EventDetails are plain paths of what an event says beyond its name
	// (a point of interest, a tag, the regions it is in): those present
	// join Ping.Event, so that another message at the same fix (a user
	// naming a place where they just published) is not taken for the
	// first one's redelivery.
	EventDetails []string
	// States are plain paths of fields whose values are the asset's state
	// (an ignition): those present become Ping.State.
	States []string
	// ClearedWhenAbsent are those of States whose absence is a state of
	// its own, the field's condition over: a position without an alarm
	// says the alarm has ended, where a position without an ignition says
	// nothing of it.
	ClearedWhenAbsent []string

	// TimeZone, when set, reads timestamps without a UTC offset as local
	// times of this zone instead of refusing them.
	TimeZone *time.Location
	// MaxFuture is how far ahead of the server clock a device time may be.
	MaxFuture time.Duration
	// MaxPast is how far behind the server clock a device time may be;
	// zero means no bound.
	MaxPast time.Duration
	// AllowNullIsland admits the exact position (0, 0), which is rejected by
	// default because it is what a GPS module reports before it has a fix.
	AllowNullIsland bool
	// PassImplausible makes a position at (0, 0) or with a device time
	// beyond MaxFuture or MaxPast an ImplausibleError instead of an
	// InvalidPingError: for a sender whose backend stores whatever a device
	// reports and that cannot send it otherwise (Traccar keeps positions
	// whatever their time; its forwarder drops a refused one, and Traccar
	// Client retries it forever at the head of its queue; the OwnTracks
	// Recorder keeps any tst, OwnTracks Android resends a refused location
	// at the head of its queue, and iOS deletes it; Overland resends a
	// batch it was refused, and deletes a fix left out of one its backend
	// took).
	PassImplausible bool

	plan *parsePlan // see Prepared
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
		MaxPast:    DefaultMaxPast,
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
	ping = p.AtServerClock(ping, now)
	return ping, p.Validate(ping, now)
}

// AtServerClock reads a device time written in local time in the hour its
// zone's clock is set back (time_zone Europe/Berlin, "2026-10-25 02:30:00":
// 00:30Z in summer time, then 01:30Z) as the later instant, unless that is
// ahead of now, the server clock, by more than a live device's clock is
// (the lesser of max_future and its default, 5m): a live device in the
// first pass of the hour means the earlier. Read always as the later,
// every ping of that hour's first pass was refused as from the future,
// every year; told apart by max_future alone, one of 1h or more read the
// first pass in the second pass's buckets, and a parked device's second
// pass was all suppressed. A retry of such a ping keeps the earlier
// reading until the later one is within that of the server clock; after
// that it is read as the later (README, time_zone).
func (p Parser) AtServerClock(ping Ping, now time.Time) Ping {
	if ping.setBack != 0 && ping.Time.Sub(now) > min(p.MaxFuture, DefaultMaxFuture) {
		ping.Time, ping.setBack = ping.Time.Add(-ping.setBack), 0
	}
	return ping
}

// Extract reads the configured fields of body, reprojected to WGS 84, and
// checks their types, but not the rules of Validate.
//
// Before reading anything it makes sure that the body means the same to
// every JSON parser, the backend's included: valid UTF-8, nested at most
// MaxNesting deep, and no duplicate key in any object a configured path
// passes through. Any of these gives a *MalformedError.
func (p Parser) Extract(body []byte) (Ping, error) {
	if len(body) == 0 && p.SkipEmpty {
		return Ping{}, ErrNotAPing
	}
	if len(body) == 0 && p.EmptyFix != "" {
		return Ping{}, &MalformedError{Reason: "the request body is empty: " + p.EmptyFix}
	}
	if err := checkObject(body); err != nil {
		return Ping{}, err
	}
	plan := p.plan
	if plan == nil {
		plan = p.makePlan()
	}
	// The body is read in place, not copied; the caller must not change it
	// while the ping is in use (see Ping.Asset).
	json := unsafe.String(unsafe.SliceData(body), len(body))
	var ping Ping
	var err error
	if len(plan.checks) > smallPlan {
		ping, err = p.extractLarge(json, plan)
	} else {
		var buf [smallPlan]keyCheck
		ping, err = p.extract(json, plan, buf[:])
	}
	return ping, err
}

// givenSeveralTimes refuses a form field the parser reads, required or
// not, that was given several different values (SplitForm writes them as a
// list): Traccar's OsmAnd decoder applies each value in turn, so the last
// counts there, where Go's url.Values.Get takes the first, and the ping
// would be judged as one thing and stored as another. Read as not
// reported instead, a speed or an alarm would be lost, and a valid flag
// would make the fix go unkeyed.
func givenSeveralTimes(root gjson.Result, checks []keyCheck, read []pathLeaf) error {
	for _, r := range read {
		v := value(root, checks, r.leaf, r.path)
		if !v.IsArray() {
			continue
		}
		var values []string
		v.ForEach(func(_, e gjson.Result) bool {
			values = append(values, asSent(e))
			return true
		})
		return invalid(r.path, RuleType, "given %d times with different values (%s), and parsers disagree on which counts "+
			"(Traccar's the last, Go's the first): send it once", len(values), strings.Join(values, ", "))
	}
	return nil
}

// asSent quotes a value as the sender wrote it: 4711 and 4711.0 are one
// number to gjson's String, and an error that called them different
// values, quoting "4711" twice, showed the sender nothing to fix.
func asSent(v gjson.Result) string {
	if v.Type == gjson.String {
		return strconv.Quote(v.Str)
	}
	return strconv.Quote(v.Raw)
}

// aliasesAgree refuses a ping that gives the names of its asset id
// (AssetAliases) different values: id=a&deviceid=b was keyed as a and
// stored by Traccar as b, so one device's pings were judged against
// another's.
func (p *Parser) aliasesAgree(root gjson.Result, checks []keyCheck, plan *parsePlan) error {
	given := -1
	var v0 gjson.Result
	for i, path := range p.AssetPaths {
		v := value(root, checks, plan.assets[i], path)
		switch {
		case !v.Exists():
		case given < 0:
			given, v0 = i, v
		case v.Raw != v0.Raw:
			return invalid(p.AssetPaths[given], RuleType, "given as both %s (%s) and %s (%s), two names of the asset id, "+
				"and parsers disagree on which counts (Traccar's the one given last, here %s): send one",
				p.AssetPaths[given], asSent(v0), path, asSent(v),
				givenLast(root, p.AssetPaths[given], path))
		}
	}
	return nil
}

// givenLast is whichever of paths a and b comes later in the body: a form
// body's fields are in the order of their first appearance, the order in
// which Traccar's decoder applies them, so the later one is what it keeps.
func givenLast(root gjson.Result, a, b string) string {
	if root.Get(b).Index > root.Get(a).Index {
		return b
	}
	return a
}

// The scan's steps live on the stack, in a buffer that fits the plan: the
// presets with events and states need more steps than the plain formats.
// The large buffer has a frame of its own, entered only by the plans that
// need it: in Extract's frame it would deepen every ping's stack by 4 KB,
// enough to outgrow the 8 KB a request's goroutine has after the collector
// shrinks it, and a stack that outgrows its size is copied whole.
const (
	smallPlan = 16
	largePlan = 48
)

//go:noinline
func (p *Parser) extractLarge(json string, plan *parsePlan) (Ping, error) {
	var buf [largePlan]keyCheck
	return p.extract(json, plan, buf[:])
}

// extract reads the ping of json, a JSON object, by plan, with buf for the
// steps of the scan.
func (p *Parser) extract(json string, plan *parsePlan, buf []keyCheck) (Ping, error) {
	checks, err := plan.scan(json, buf)
	if err != nil {
		return Ping{}, err
	}
	root := gjson.Parse(json)
	// A list cannot decide a skip; a body skipped is not read any further,
	// and goes on as it came, whatever else it repeats.
	if p.FromForm {
		if err := givenSeveralTimes(root, checks, plan.read[:plan.deciding]); err != nil {
			return Ping{}, err
		}
	}
	if p.KindPath != "" && value(root, checks, plan.kind, p.KindPath).String() != p.Kind {
		return Ping{}, ErrNotAPing
	}
	if p.skipped(root, checks, plan) {
		return Ping{}, ErrNotAPing
	}
	if p.FromForm {
		if err := givenSeveralTimes(root, checks, plan.read[plan.deciding:]); err != nil {
			return Ping{}, err
		}
	}
	var ping Ping
	if len(p.AssetPaths) > 0 {
		if p.AssetAliases {
			if err := p.aliasesAgree(root, checks, plan); err != nil {
				return Ping{}, err
			}
		}
		v, at := first(root, checks, plan.assets, p.AssetPaths, noAssetID)
		if ping.Asset, err = p.asset(v, p.AssetPaths[at]); err != nil {
			return Ping{}, err
		}
		ping.assetAt = uint16(at)
	}
	v, at := first(root, checks, plan.times, p.TimePaths, isNull)
	if ping.Time, ping.setBack, err = p.time(v, p.TimePaths[at]); err != nil {
		return Ping{}, err
	}
	ping.timeAt = uint16(at)
	y, err := number(value(root, checks, plan.lat, p.LatPath), p.LatPath)
	if err != nil {
		return Ping{}, err
	}
	x, err := number(value(root, checks, plan.lon, p.LonPath), p.LonPath)
	if err != nil {
		return Ping{}, err
	}
	if ping.Lat, ping.Lon, err = p.CRS.ToWGS84(x, y); err != nil {
		return Ping{}, p.axisError(err)
	}
	p.readFields(&ping, root, checks, plan)
	return ping, nil
}

// Prepared returns p with the work that depends only on its configuration
// done once: a parser used for many pings should be prepared after its last
// field is set.
func (p Parser) Prepared() Parser {
	p.plan = p.makePlan()
	return p
}

// Validate checks a ping against the coordinate and time rules. Coordinates
// are checked before anything quantises them: H3 turns a latitude of 91 into
// a valid-looking cell that no real position maps to.
func (p Parser) Validate(ping Ping, now time.Time) error {
	if err := p.checkAsset(ping); err != nil {
		return err
	}
	if err := checkCoordinate(ping.Lat, 90, p.LatPath); err != nil {
		return err
	}
	if err := checkCoordinate(ping.Lon, 180, p.LonPath); err != nil {
		return err
	}
	return p.checkPlausible(ping, now)
}

// checkPlausible refuses a fix where or when none can be: at (0, 0), or at
// a device time beyond MaxFuture or MaxPast.
func (p *Parser) checkPlausible(ping Ping, now time.Time) error {
	var err *InvalidPingError
	switch {
	case ping.Lat == 0 && ping.Lon == 0 && !p.AllowNullIsland:
		err = invalid(p.LatPath, RuleNullIsland,
			"position (0, 0) is what a GPS module reports before it has a fix; set null_island allow if your assets really are there")
	case ping.Time.Sub(now) > p.MaxFuture:
		err = invalid(p.timeField(ping), RuleFuture,
			"device time %s is %s ahead of the server clock; at most %s is allowed (max_future)",
			ping.Time.Format(time.RFC3339Nano), span(now, ping.Time), readable(p.MaxFuture))
	case p.MaxPast > 0 && now.Sub(ping.Time) > p.MaxPast:
		err = invalid(p.timeField(ping), RulePast,
			"device time %s is %s behind the server clock; at most %s is allowed (max_past): is the device's clock set?",
			ping.Time.Format(time.RFC3339Nano), span(ping.Time, now), readable(p.MaxPast))
	default:
		return nil
	}
	if p.PassImplausible {
		return ImplausibleError{err}
	}
	return err
}

// checkObject makes sure body is one JSON object that every parser reads
// alike, cheapest checks first, and the recursive validator last.
func checkObject(body []byte) error {
	if len(body) == 0 {
		return &MalformedError{Reason: "the request body is empty; telemetry_dedup expects one JSON ping per request " +
			"(limit which requests it examines with a matcher: `@pings method POST`, then `telemetry_dedup @pings`)"}
	}
	if err := checkJSON(body); err != nil {
		return err
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

// checkJSON makes sure body is JSON that every parser reads alike: valid
// UTF-8, not nested past MaxNesting (checked before gjson's validator, which
// recurses), and valid.
func checkJSON(body []byte) error {
	if !utf8.Valid(body) {
		return &MalformedError{Reason: "the request body is not valid UTF-8; send the JSON ping UTF-8 encoded " +
			"(RFC 8259), as parsers disagree on what invalid bytes mean"}
	}
	if err := checkNesting(body); err != nil {
		return err
	}
	if !gjson.ValidBytes(body) {
		return notJSON(body)
	}
	return nil
}

// first returns the value at the first of paths that holds one, and the
// path's index. A value unset says is none leaves the next path to hold
// one: a null (what a serializer writes for an unset field, GeoJSON's
// "id": null), or, for an asset id, an empty or blank string (an
// OwnTracks app whose tracker id setting came out empty sends "tid":"",
// beside its topic). If no path holds one, it returns the first of
// those, for its error, or else a missing value and the first path.
func first(root gjson.Result, checks []keyCheck, leaves []int, paths []string, unset func(gjson.Result) bool) (gjson.Result, int) {
	var none gjson.Result
	noneAt := 0
	for i, path := range paths {
		v := value(root, checks, leaves[i], path)
		switch {
		case !v.Exists():
		case !unset(v):
			return v, i
		case !none.Exists():
			none, noneAt = v, i
		}
	}
	return none, noneAt
}

// isNull reports a null, which holds no value.
func isNull(v gjson.Result) bool { return v.Type == gjson.Null }

// noAssetID reports a value that names no device: a null, or an empty or
// blank string (see blank).
func noAssetID(v gjson.Result) bool {
	return v.Type == gjson.Null || v.Type == gjson.String && (v.Str == "" || blank(v.Str))
}

// assetField is the field ping's asset id was read at: "asset" when it
// came from a placeholder template.
func (p *Parser) assetField(ping Ping) string {
	if int(ping.assetAt) >= len(p.AssetPaths) {
		return "asset"
	}
	return p.AssetPaths[ping.assetAt]
}

// timeField is the field ping's device time was read at.
func (p *Parser) timeField(ping Ping) string {
	return p.TimePaths[min(int(ping.timeAt), len(p.TimePaths)-1)]
}

// asset reads the asset id v found at path.
func (p *Parser) asset(v gjson.Result, path string) (string, error) {
	switch v.Type {
	case gjson.String:
		if v.Str == "" {
			return "", invalid(path, RuleRequired, "the asset id is empty; send the device's id at %s", oneOf(p.AssetPaths))
		}
		return v.Str, nil
	case gjson.Number:
		// The number as written: 4711 and 4711.0 are different ids, and a
		// 30-digit id stays exact instead of being rounded to a float.
		return v.Raw, nil
	case gjson.Null:
		if !v.Exists() {
			return "", invalid(path, RuleRequired, "missing; every ping needs an asset id at %s", oneOf(p.AssetPaths))
		}
		return "", invalid(path, RuleRequired, "the asset id is null; send the device's id at %s", oneOf(p.AssetPaths))
	default:
		return "", invalid(path, RuleType, "expected a string or number asset id, got %s", describe(v))
	}
}

// PrintableAsset reports an asset id checkAsset lets through: neither
// empty nor blank, at most MaxAssetBytes, without a control character.
func PrintableAsset(asset string) bool {
	_, fault := assetFault(asset)
	return asset != "" && fault == ""
}

// assetFault is the rule a non-empty asset id breaks and how, "" if none.
func assetFault(asset string) (Rule, string) {
	if blank(asset) {
		return RuleRequired, fmt.Sprintf("the asset id %q is only blanks, which name no device; send the device's id", asset)
	}
	if len(asset) > MaxAssetBytes {
		return RuleType, fmt.Sprintf("the asset id is %d bytes long; at most %d are allowed: send the device's short id (or a hash of a long one)",
			len(asset), MaxAssetBytes)
	}
	for i := 0; i < len(asset); i++ {
		if r := controlAt(asset, i); r >= 0 {
			return RuleType, fmt.Sprintf("the asset id contains the control character %U at byte %d; asset ids must be printable", r, i)
		}
	}
	return "", ""
}

// checkAsset rejects an asset id that cannot be an id: empty or blank
// (RuleRequired: every sender whose id came out blank would share one
// asset), longer than MaxAssetBytes, or holding a control character,
// which would break the log lines and headers it is written to. The last
// two are RuleType: the value is not of the kind an asset id is.
func (p *Parser) checkAsset(ping Ping) error {
	asset := ping.Asset
	if asset == "" {
		return invalid(p.assetField(ping), RuleRequired, "the asset id is empty; send the device's id at %s", oneOf(p.AssetPaths))
	}
	if rule, fault := assetFault(asset); fault != "" {
		return invalid(p.assetField(ping), rule, "%s", fault)
	}
	return nil
}

// blank reports an id with nothing to see in it: only white space, format
// characters (U+200B zero width space, U+2060 word joiner, U+FEFF, the
// byte-order mark a device reading its id from an empty file saved with
// one sends), variation selectors and the letters that print as blank
// (the Hangul fillers, the blank braille pattern). Every sender whose id
// came out that way would share one asset, and suppress the others' pings.
func blank(s string) bool {
	for _, r := range s {
		if !unicode.IsSpace(r) && !unicode.Is(unicode.Cf, r) && !unicode.Is(unicode.Variation_Selector, r) && !slices.Contains(blankLetters, r) {
			return false
		}
	}
	return true
}

// blankLetters print as nothing, though Unicode counts them as letters or
// symbols: the Hangul fillers and the blank braille pattern.
var blankLetters = []rune{'\u115f', '\u1160', '\u3164', '\uffa0', '\u2800'}

// controlAt is the control character at byte i of s (an ASCII one, a C1
// one, U+0080 to U+009F, as UTF-8 writes it: U+009B is a terminal's CSI,
// or a bidirectional embedding, override or isolate, U+202A to U+202E and
// U+2066 to U+2069, which reorder how the rest of a log line shows), or -1.
// The marks U+200E and U+200F, which a right-to-left name may hold, pass.
func controlAt(s string, i int) rune {
	switch c := s[i]; {
	case c < 0x20 || c == 0x7f:
		return rune(c)
	case c == 0xc2 && i+1 < len(s) && s[i+1] >= 0x80 && s[i+1] <= 0x9f:
		return rune(s[i+1])
	case c == 0xe2 && i+2 < len(s) && s[i+1]&0xc0 == 0x80 && s[i+2]&0xc0 == 0x80:
		if r := rune(0x2000) | rune(s[i+1]&0x3f)<<6 | rune(s[i+2]&0x3f); r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069 {
			return r
		}
	}
	return -1
}

// time reads the device time v found at path; an error names that path,
// the one the sender filled.
// A local time also returns how much earlier its other reading is, in the
// hour its zone's clock is set back (Ping.setBack).
func (p *Parser) time(v gjson.Result, path string) (time.Time, time.Duration, error) {
	if v.Type == gjson.Null {
		return time.Time{}, 0, invalid(path, RuleRequired,
			"missing; every ping needs the device's own timestamp at %s (arrival time is never used)", oneOf(p.TimePaths))
	}
	t, err := parseTime(v, p.TimeFormat, path)
	if err != nil {
		return p.naiveTime(v, path, err)
	}
	return t, 0, nil
}

// naiveTime reads a timestamp without an offset in the configured time
// zone, or says how to name one.
func (p *Parser) naiveTime(v gjson.Result, path string, err error) (time.Time, time.Duration, error) {
	var ie *InvalidPingError
	if !errors.As(err, &ie) || ie.Rule != RuleTimezone {
		return time.Time{}, 0, err
	}
	if p.TimeZone != nil {
		return parseLocalTime(v.Str, p.TimeZone, path)
	}
	ie.Detail += "; or, if every device writes the local time of one zone, name it with time_zone (e.g. time_zone Europe/Berlin)"
	return time.Time{}, 0, ie
}

// axisError names the field of a projected coordinate the CRS refused.
func (p *Parser) axisError(err error) error {
	var ae *geo.AxisError
	if !errors.As(err, &ae) {
		return err
	}
	field := p.LonPath
	if ae.Axis == geo.AxisY {
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

// rangeHint says what a latitude v out of range at field most often is:
// a longitude, if it could be one.
func rangeHint(v, limit float64, field string) string {
	switch {
	case limit != 90 || math.Abs(v) > 180:
		return ""
	case strings.HasSuffix(field, ".1"): // the second of a coordinate array
		return "; are latitude and longitude swapped? GeoJSON writes [lon, lat]"
	}
	return "; are latitude and longitude swapped?"
}

func checkCoordinate(v, limit float64, field string) error {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return invalid(field, RuleFinite, "%v is not a finite number", v)
	}
	if v < -limit || v > limit {
		return invalid(field, RuleRange, "%v is outside [-%v, %v]%s", v, limit, limit, rangeHint(v, limit, field))
	}
	return nil
}
