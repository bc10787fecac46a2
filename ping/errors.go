package ping

import "fmt"

// Rule names the validation rule a ping broke. Rules appear in the JSON error
// body answered to the sender, so their values are part of the public
// interface.
type Rule string

// The rules a ping is checked against, in the order they are checked.
const (
	// RuleRequired: the field is missing or null.
	RuleRequired Rule = "required"
	// RuleType: the field has the wrong JSON type (a string where a number
	// belongs, an object as asset id), or an asset id that cannot be one:
	// longer than 256 bytes, or holding control characters.
	RuleType Rule = "type"
	// RuleTimeFormat: the timestamp cannot be read in the configured format.
	RuleTimeFormat Rule = "time_format"
	// RuleTimezone: the timestamp has no UTC offset. It is never assumed to
	// be UTC: a device reporting local time would be bucketed hours away.
	RuleTimezone Rule = "timezone"
	// RuleFinite: a coordinate is NaN or infinite.
	RuleFinite Rule = "finite"
	// RuleRange: latitude outside [-90, 90] or longitude outside [-180, 180].
	RuleRange Rule = "range"
	// RuleNullIsland: exactly (0, 0), a GPS module that has no fix yet.
	RuleNullIsland Rule = "null_island"
	// RuleFuture: the device time is further ahead of the server clock than
	// max_future; it would claim keys of buckets not yet lived.
	RuleFuture Rule = "max_future"
	// RulePast: the device time is further behind the server clock than
	// max_past: a clock that was never set (1970, 1980, the year 1).
	RulePast Rule = "max_past"
)

// MalformedError reports a request body that is not a JSON ping at all. The
// handler answers it with 400.
type MalformedError struct {
	// Reason says what is wrong with the body, for the sender.
	Reason string
	// FormEncoded says the body looks form encoded (field=value&...) and
	// Reason ends with FormEncodedFix, which a route that knows what reads
	// such bodies there replaces with its own.
	FormEncoded bool
}

// FormEncodedFix is the fix a body that looks form encoded is given where
// nothing knows the route it came to (the key and analyze commands, whose
// flags these name).
const FormEncodedFix = "for Traccar's OsmAnd protocol use preset osmand, else encoding form"

// Error is the Reason, for the sender.
func (e *MalformedError) Error() string { return e.Reason }

// JSONAsFormError is the error of a JSON body where encoding form reads
// form fields: as fields it is one field named after the whole body, and
// its ping would be rejected as missing fields it plainly holds.
func JSONAsFormError() error {
	return &MalformedError{Reason: "the request body is JSON, and encoding form reads form fields (the query string, or a form body): " +
		"send JSON with Content-Type: application/json and set encoding auto, which reads it as JSON, or encoding json"}
}

// InvalidPingError reports a well-formed body whose ping breaks a rule. The
// handler answers it with 422 and a JSON body carrying Field and Rule.
type InvalidPingError struct {
	// Field is the configured JSON path of the offending field, as the
	// sender wrote it (for example "position.latitude").
	Field string
	// Rule is the rule the field broke.
	Rule Rule
	// Detail says what was found and what is allowed.
	Detail string
}

// Error names the field and says what was found and what is allowed.
func (e *InvalidPingError) Error() string {
	return fmt.Sprintf("%s: %s", e.Field, e.Detail)
}

func invalid(field string, rule Rule, format string, args ...any) *InvalidPingError {
	return &InvalidPingError{Field: field, Rule: rule, Detail: fmt.Sprintf(format, args...)}
}

// ImplausibleError is a position that breaks a rule of where or when a fix
// can be (null_island, max_future, max_past) under a Parser with
// PassImplausible: its sender's backend stores it as it is, so it is not
// keyed but passed on. It is ErrNotAPing.
type ImplausibleError struct {
	*InvalidPingError
}

// Is makes an ImplausibleError ErrNotAPing.
func (e ImplausibleError) Is(target error) bool { return target == ErrNotAPing }

// Unwrap gives the rule it breaks, for whoever counts pings by rule
// (analyze).
func (e ImplausibleError) Unwrap() error { return e.InvalidPingError }
