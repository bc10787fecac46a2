package ping

import (
	"math"
	"slices"
	"strings"

	"github.com/tidwall/gjson"
)

// SpeedUnit is the unit a ping's speed is written in.
type SpeedUnit string

// The speed units trackers use.
const (
	MetresPerSecond   SpeedUnit = "m/s"
	KilometresPerHour SpeedUnit = "km/h"
	Knots             SpeedUnit = "knots"
	MilesPerHour      SpeedUnit = "mph"
)

// SpeedUnits lists every SpeedUnit, for error messages.
var SpeedUnits = []SpeedUnit{MetresPerSecond, KilometresPerHour, Knots, MilesPerHour}

// ParseSpeedUnit returns the SpeedUnit named s, or an error listing them.
func ParseSpeedUnit(s string) (SpeedUnit, error) {
	return ParseName("speed unit", s, SpeedUnits)
}

// metresPerSecond is how many m/s one unit is; m/s when unset.
func (u SpeedUnit) metresPerSecond() float64 {
	switch u {
	case KilometresPerHour:
		return 1 / 3.6
	case Knots:
		return 1852.0 / 3600
	case MilesPerHour:
		return 0.44704
	}
	return 1
}

// fieldPaths are the paths of the fields beside asset, time and position,
// in the order the parse plan keeps their leaves: accuracy, speed, the
// events, the states, the records that are not positions, the events'
// details.
func (p *Parser) fieldPaths() []string {
	paths := []string{p.AccuracyPath, p.SpeedPath}
	for _, m := range p.Events {
		paths = append(paths, m.Path)
	}
	paths = append(paths, p.States...)
	for _, m := range p.Skip {
		paths = append(paths, m.Path)
	}
	return append(append(paths, p.EventDetails...), p.AccuracyFallback)
}

// fieldValue returns the value of the i-th of fieldPaths, read through the
// scan like every other field. (Separate arguments rather than a struct:
// escape analysis would move the scan's buffer to the heap.)
func fieldValue(root gjson.Result, checks []keyCheck, plan *parsePlan, i int, path string) gjson.Result {
	if path == "" {
		return gjson.Result{}
	}
	return value(root, checks, plan.fields[i], path)
}

// skipped reports a record that a Skip match says is not a position.
func (p *Parser) skipped(root gjson.Result, checks []keyCheck, plan *parsePlan) bool {
	at := 2 + len(p.Events) + len(p.States)
	for i, m := range p.Skip {
		if m.matches(fieldValue(root, checks, plan, at+i, m.Path)) {
			return true
		}
	}
	return false
}

// readFields fills the accuracy, speed, event and state of ping. Accuracy
// and speed are what the device reports when it reports them: a value that
// is not a finite number of at least 0 (speed -1 is "unknown" on iOS) counts
// as not reported, rather than refusing a position for a field nothing
// keys on.
func (p *Parser) readFields(ping *Ping, root gjson.Result, checks []keyCheck, plan *parsePlan) {
	accuracy := fieldValue(root, checks, plan, 0, p.AccuracyPath)
	if !accuracy.Exists() {
		// The fallback is the last of fieldPaths.
		accuracy = fieldValue(root, checks, plan, len(plan.fields)-1, p.AccuracyFallback)
	}
	if acc, ok := measure(accuracy); ok {
		ping.Accuracy = acc
	}
	if speed, ok := measure(fieldValue(root, checks, plan, 1, p.SpeedPath)); ok {
		ping.Speed, ping.HasSpeed = speed*p.SpeedUnit.metresPerSecond(), true
	}
	for i, m := range p.Events {
		if v := fieldValue(root, checks, plan, 2+i, m.Path); m.matches(v) {
			s, _ := text(v)
			ping.Event = field(m.Path, s) + p.eventDetails(root, checks, plan)
			break
		}
	}
	if len(p.States) == 0 {
		return
	}
	var state []string
	for i, path := range p.States {
		if s, ok := text(fieldValue(root, checks, plan, 2+len(p.Events)+i, path)); ok || slices.Contains(p.ClearedWhenAbsent, path) {
			state = append(state, field(path, s))
		}
	}
	ping.State, ping.StateFields = strings.Join(state, "&"), plan.stateFields
}

// eventDetails writes the event's details that are present as
// &path=value..., for Ping.Event.
func (p *Parser) eventDetails(root gjson.Result, checks []keyCheck, plan *parsePlan) string {
	at := 2 + len(p.Events) + len(p.States) + len(p.Skip)
	var details strings.Builder
	for i, path := range p.EventDetails {
		if s, ok := text(fieldValue(root, checks, plan, at+i, path)); ok && s != "" {
			details.WriteString("&" + field(path, s))
		}
	}
	return details.String()
}

func measure(v gjson.Result) (float64, bool) {
	if v.Type != gjson.Number || math.IsNaN(v.Num) || math.IsInf(v.Num, 0) || v.Num < 0 {
		return 0, false
	}
	return v.Num, true
}
