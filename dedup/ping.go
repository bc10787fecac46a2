package dedup

import (
	"math"
	"time"

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

// Parser reads pings out of JSON request bodies and validates them. The zero
// value is not ready for use; fill every path, or call NewParser for the
// defaults.
type Parser struct {
	// AssetPath, TimePath, LatPath and LonPath are gjson paths
	// (dot-separated, e.g. "position.latitude").
	AssetPath, TimePath, LatPath, LonPath string
	// TimeFormat says how the device time is written.
	TimeFormat TimeFormat
	// MaxFuture is how far ahead of the server clock a device time may be.
	MaxFuture time.Duration
	// AllowNullIsland admits the exact position (0, 0), which is rejected by
	// default because it is what a GPS module reports before it has a fix.
	AllowNullIsland bool
}

// NewParser returns a Parser with the default paths and rules.
func NewParser() Parser {
	return Parser{
		AssetPath:  DefaultAssetPath,
		TimePath:   DefaultTimePath,
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
	if err := checkObject(body); err != nil {
		return Ping{}, err
	}
	fields := gjson.GetManyBytes(body, p.AssetPath, p.TimePath, p.LatPath, p.LonPath)

	var ping Ping
	var err error
	if ping.Asset, err = p.asset(fields[0]); err != nil {
		return Ping{}, err
	}
	if ping.Time, err = p.time(fields[1]); err != nil {
		return Ping{}, err
	}
	if ping.Lat, err = number(fields[2], p.LatPath); err != nil {
		return Ping{}, err
	}
	if ping.Lon, err = number(fields[3], p.LonPath); err != nil {
		return Ping{}, err
	}
	return ping, p.Validate(ping, now)
}

// Validate checks a ping that did not come from Parse (or came from Parse
// and had its fields replaced) against the coordinate and time rules.
func (p Parser) Validate(ping Ping, now time.Time) error {
	if ping.Asset == "" {
		return invalid(p.AssetPath, RuleRequired, "the asset id is empty")
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
		return invalid(p.TimePath, RuleFuture,
			"device time %s is %s ahead of the server clock; at most %s is allowed (max_future)",
			ping.Time.Format(time.RFC3339Nano), ahead.Round(time.Second), p.MaxFuture)
	}
	return nil
}

func checkObject(body []byte) error {
	if len(body) == 0 {
		return &MalformedError{Reason: "the request body is empty; telemetry_dedup expects one JSON ping per request " +
			"(use a matcher such as `telemetry_dedup POST /ingest` to limit which requests it examines)"}
	}
	if !gjson.ValidBytes(body) {
		return &MalformedError{Reason: "the request body is not valid JSON"}
	}
	if !gjson.ParseBytes(body).IsObject() {
		return &MalformedError{Reason: "the request body must be a JSON object holding one ping"}
	}
	return nil
}

func (p Parser) asset(v gjson.Result) (string, error) {
	switch v.Type {
	case gjson.String:
		if v.Str == "" {
			return "", invalid(p.AssetPath, RuleRequired, "the asset id is empty")
		}
		return v.Str, nil
	case gjson.Number:
		return v.Raw, nil
	case gjson.Null:
		if !v.Exists() {
			return "", invalid(p.AssetPath, RuleRequired, "missing; every ping needs an asset id at %q", p.AssetPath)
		}
		return "", invalid(p.AssetPath, RuleRequired, "the asset id is null")
	default:
		return "", invalid(p.AssetPath, RuleType, "expected a string or number asset id, got %s", describe(v))
	}
}

func (p Parser) time(v gjson.Result) (time.Time, error) {
	if v.Type == gjson.Null {
		return time.Time{}, invalid(p.TimePath, RuleRequired,
			"missing; every ping needs the device's own timestamp at %q (arrival time is never used)", p.TimePath)
	}
	return parseTime(v, p.TimeFormat, p.TimePath)
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
