package dedup

import (
	"fmt"
	"slices"
	"time"
)

// DefaultRetryLadder is a typical webhook provider's retry schedule: the
// offsets of its attempts after the first delivery.
var DefaultRetryLadder = []time.Duration{
	time.Minute, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour, 6 * time.Hour,
}

// DefaultOutageMargin is the outage, beyond the last retry, that a key should
// survive without admitting a redelivery.
const DefaultOutageMargin = 30 * time.Minute

// maxTTL bounds every lifetime: ten years is longer than any retry ladder,
// and far from overflowing a time.Duration.
const maxTTL = 10 * 365 * 24 * time.Hour

// TTLPolicy is how long a claimed key lives. The window says how much
// re-observation to collapse; the TTL says how long a redelivery can still
// arrive. They answer different questions: a TTL derived from the window
// expires the key before a sender's later retries and admits them all.
type TTLPolicy struct {
	// Window is the tumbling bucket width; the TTL may never be shorter.
	Window time.Duration
	// RetryLadder holds the sender's retry offsets after the first delivery.
	// Nil means DefaultRetryLadder.
	RetryLadder []time.Duration
	// OutageMargin is added to the last retry. Nil means DefaultOutageMargin.
	OutageMargin *time.Duration
	// TTL, when non-zero, is used instead of ladder + margin.
	TTL time.Duration
	// SessionIdle, in the session shape, is the silence that ends a
	// session; the TTL may never be shorter: an asset's track expiring
	// within a session would admit its next ping after a shorter silence
	// as a new session's first. Zero in the other shapes.
	SessionIdle time.Duration
}

// Resolve returns the TTL and a sentence saying where it came from, for the
// provisioning log. An explicit TTL shorter than the window, than
// SessionIdle, or than an explicitly given ladder + margin, is an error.
func (p TTLPolicy) Resolve() (time.Duration, string, error) {
	ladder, margin := p.RetryLadder, DefaultOutageMargin
	if ladder == nil {
		ladder = DefaultRetryLadder
	}
	if p.OutageMargin != nil {
		margin = *p.OutageMargin
	}
	if err := checkLadder(ladder); err != nil {
		return 0, "", err
	}
	if margin < 0 {
		return 0, "", &ConfigError{Option: "outage_margin", Problem: fmt.Sprintf("%s is negative; use 0 or more", margin)}
	}
	if err := CheckSeconds("outage_margin", margin, "30m"); err != nil {
		return 0, "", err
	}
	if margin > maxTTL-ladder[len(ladder)-1] {
		// The option to change: the margin only if it was given and the
		// ladder alone fits.
		option := "outage_margin"
		if p.OutageMargin == nil || ladder[len(ladder)-1] > maxTTL {
			option = "retry_ladder"
		}
		return 0, "", &ConfigError{Option: option, Problem: fmt.Sprintf(
			"last retry %s + outage margin %s is longer than %s; no sender retries that long", ladder[len(ladder)-1], margin, maxTTL)}
	}
	horizon := ladder[len(ladder)-1] + margin

	if p.TTL == 0 {
		from := fmt.Sprintf("last retry %s + outage margin %s", ladder[len(ladder)-1], margin)
		switch {
		case p.SessionIdle > max(horizon, p.Window):
			return p.SessionIdle, "session_idle, which outlasts " + from, nil
		case p.Window > horizon:
			return p.Window, "the window, which outlasts " + from, nil
		}
		return horizon, from, nil
	}
	if p.TTL > maxTTL {
		return 0, "", &ConfigError{Option: "ttl", Problem: fmt.Sprintf("%s is longer than %s; no sender retries that long", p.TTL, maxTTL)}
	}
	if p.TTL < p.Window {
		return 0, "", &ConfigError{Option: "ttl", Problem: fmt.Sprintf(
			"%s is shorter than the window %s: keys would expire while their bucket is still current and re-observations "+
				"would be admitted; use at least the window, and preferably the sender's last retry + outage margin", p.TTL, p.Window)}
	}
	if p.TTL < p.SessionIdle {
		return 0, "", &ConfigError{Option: "ttl", Problem: fmt.Sprintf(
			"%s is shorter than session_idle %s: an asset's track would expire within a session, and its next ping "+
				"after a shorter silence would be admitted as a new session; use at least %s", p.TTL, p.SessionIdle, p.SessionIdle)}
	}
	ladderGiven := p.RetryLadder != nil || p.OutageMargin != nil
	if ladderGiven && p.TTL < horizon {
		return 0, "", &ConfigError{Option: "ttl", Problem: fmt.Sprintf(
			"%s is shorter than the retry ladder's last attempt %s + outage margin %s = %s: redeliveries after the key "+
				"expires would be admitted as new; raise ttl to at least %s or drop it to derive the TTL from the ladder",
			p.TTL, ladder[len(ladder)-1], margin, horizon, horizon)}
	}
	return p.TTL, "explicit ttl", nil
}

func checkLadder(ladder []time.Duration) error {
	if len(ladder) == 0 {
		return &ConfigError{Option: "retry_ladder", Problem: "is empty; list the sender's retry offsets after the first delivery, e.g. 1m 5m 30m 2h 6h"}
	}
	if ladder[0] <= 0 {
		return &ConfigError{Option: "retry_ladder", Problem: fmt.Sprintf("offset %s is not positive; offsets count from the first delivery", ladder[0])}
	}
	if err := CheckSeconds("retry_ladder", ladder[0], "1m 5m 30m 2h 6h"); err != nil {
		return err
	}
	if !slices.IsSorted(ladder) || len(slices.Compact(slices.Clone(ladder))) != len(ladder) {
		return &ConfigError{Option: "retry_ladder", Problem: fmt.Sprintf(
			"%v is not strictly increasing; list each attempt's offset after the first delivery, not the gaps between attempts", ladder)}
	}
	return nil
}
