package dedup

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
