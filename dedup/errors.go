package dedup

import (
	"errors"
	"fmt"
	"time"
)

// ConfigError names the option that is wrong and says what to do about it.
// The Caddyfile parser turns it into an error that points at the option's
// line.
type ConfigError struct {
	// Option is the Caddyfile subdirective (and JSON field) at fault.
	Option string
	// Problem explains what is wrong and how to fix it.
	Problem string
}

// Error names the option and says what to change.
func (e *ConfigError) Error() string { return e.Option + ": " + e.Problem }

// CheckSeconds refuses a duration option of a sender's clock or retries
// (max_past, max_future, session_idle, the retry ladder's offsets,
// outage_margin, stuck_after) above 0 and under a second: no sender
// measures one so finely, and in Caddy's JSON a bare number is
// nanoseconds, so a max_past of 86400 written for a day loaded as 86 µs
// and refused every ping 2 s old. example is a value to write instead, as
// the Caddyfile writes it.
func CheckSeconds(option string, d time.Duration, example string) error {
	if d > 0 && d < time.Second {
		return &ConfigError{Option: option, Problem: fmt.Sprintf(
			"%s is under a second; use at least 1s, e.g. %s (in JSON, a bare number is nanoseconds: write a string with its unit, such as \"10m\")", d, example)}
	}
	return nil
}

// DecideError is a Decide answered for some of its claims and failed for
// the others: a batch whose redeliveries the near cache answered while
// Redis could not be reached. Each answered claim keeps the verdict it
// would get alone; only the failed ones are left to on_store_error. Were
// the whole batch failed, a delivered ping the near cache knew would go
// upstream again, unchecked, every time a sender resent its batch
// during an outage.
type DecideError struct {
	// Err is why the failed claims have no verdict.
	Err error
	// Failed is, per claim, whether it has no verdict.
	Failed []bool
}

// Error is the failed claims' error.
func (e *DecideError) Error() string { return e.Err.Error() }

// Unwrap returns the failed claims' error.
func (e *DecideError) Unwrap() error { return e.Err }

// spreadFailure is the DecideError, over a call of n claims, of the part
// of it made of the claims at the indices at, which failed with err
// (wholly, or in part as a DecideError tells): a claim of the part has
// no verdict if the part's call gave it none, the others keep theirs.
func spreadFailure(err error, n int, at []int) *DecideError {
	failed := make([]bool, n)
	for j, i := range at {
		failed[i] = DecideFailed(err, j)
	}
	if partial, ok := errors.AsType[*DecideError](err); ok {
		err = partial.Err
	}
	return &DecideError{Err: err, Failed: failed}
}

// failedWhole is err as the error of a call that gave no verdict at all:
// it fails every claim, with the cause a partial failure gave. A
// DecideError naming some of them, beside no verdicts, had the handler
// read a verdict that was not there.
func failedWhole(err error) error {
	if partial, ok := errors.AsType[*DecideError](err); ok {
		return partial.Err
	}
	return err
}

// DecideFailed reports whether claim i of a Decide (or ClaimAll) that
// returned err has no verdict: every claim of a failed call, or those a
// DecideError names.
func DecideFailed(err error, i int) bool {
	if err == nil {
		return false
	}
	if partial, ok := errors.AsType[*DecideError](err); ok {
		return partial.Failed[i]
	}
	return true
}
