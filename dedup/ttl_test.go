package dedup

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestTTLPolicy(t *testing.T) {
	margin := func(d time.Duration) *time.Duration { return &d }
	tests := []struct {
		name   string
		policy TTLPolicy
		want   time.Duration
		option string // non-empty: the error must name this option
	}{
		{"defaults: 6h + 30m", TTLPolicy{Window: DefaultWindow}, 6*time.Hour + 30*time.Minute, ""},
		{"own ladder and margin", TTLPolicy{Window: time.Minute, RetryLadder: []time.Duration{10 * time.Second, time.Minute, 24 * time.Hour}, OutageMargin: margin(time.Hour)}, 25 * time.Hour, ""},
		{"zero margin", TTLPolicy{Window: time.Minute, RetryLadder: []time.Duration{time.Minute, time.Hour}, OutageMargin: margin(0)}, time.Hour, ""},
		{"window longer than the ladder", TTLPolicy{Window: 2 * time.Hour, RetryLadder: []time.Duration{time.Minute}, OutageMargin: margin(0)}, 2 * time.Hour, ""},
		{"explicit ttl alone", TTLPolicy{Window: DefaultWindow, TTL: time.Hour}, time.Hour, ""},
		{"explicit ttl covering the ladder", TTLPolicy{Window: DefaultWindow, RetryLadder: []time.Duration{time.Minute, time.Hour}, TTL: 2 * time.Hour}, 2 * time.Hour, ""},
		{"ttl shorter than the window", TTLPolicy{Window: DefaultWindow, TTL: time.Minute}, 0, "ttl"},
		{"ttl shorter than ladder + margin", TTLPolicy{Window: DefaultWindow, RetryLadder: DefaultRetryLadder, TTL: 6 * time.Hour}, 0, "ttl"},
		{"ttl shorter than default ladder + given margin", TTLPolicy{Window: DefaultWindow, OutageMargin: margin(time.Hour), TTL: 6 * time.Hour}, 0, "ttl"},
		{"ladder out of order", TTLPolicy{Window: DefaultWindow, RetryLadder: []time.Duration{time.Hour, time.Minute}}, 0, "retry_ladder"},
		{"ladder of gaps, repeated", TTLPolicy{Window: DefaultWindow, RetryLadder: []time.Duration{time.Minute, time.Minute}}, 0, "retry_ladder"},
		{"empty ladder", TTLPolicy{Window: DefaultWindow, RetryLadder: []time.Duration{}}, 0, "retry_ladder"},
		{"negative margin", TTLPolicy{Window: DefaultWindow, OutageMargin: margin(-time.Minute)}, 0, "outage_margin"},
		{"session_idle outlasting the ladder", TTLPolicy{Window: DefaultWindow, SessionIdle: 8 * time.Hour}, 8 * time.Hour, ""},
		{"session_idle within the ladder", TTLPolicy{Window: DefaultWindow, SessionIdle: time.Hour}, 6*time.Hour + 30*time.Minute, ""},
		{"ttl shorter than session_idle", TTLPolicy{Window: DefaultWindow, TTL: time.Hour, SessionIdle: 2 * time.Hour}, 0, "ttl"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, why, err := tt.policy.Resolve()
			if tt.option != "" {
				var ce *ConfigError
				if !errors.As(err, &ce) || ce.Option != tt.option {
					t.Fatalf("got %v, want an error about %s", err, tt.option)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %v (%s), %v; want %v", got, why, err, tt.want)
			}
			if why == "" {
				t.Fatal("no explanation of where the TTL came from")
			}
		})
	}
}

func TestTTLErrorExplainsTheRetryHorizon(t *testing.T) {
	_, _, err := TTLPolicy{Window: DefaultWindow, RetryLadder: DefaultRetryLadder, TTL: 6 * time.Hour}.Resolve()
	if err == nil || !strings.Contains(err.Error(), "6h30m0s") {
		t.Fatalf("error %v does not say which TTL would cover the ladder", err)
	}
}
