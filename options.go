package telemetrydedup

import (
	"cmp"
	"fmt"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
)

// Option defaults that live in the handler rather than in dedup.
const (
	defaultMaxBody = 1 << 20 // 1 MiB

	onStoreErrorOpen   = "open"
	onStoreErrorClosed = "closed"
	nullIslandReject   = "reject"
	nullIslandAllow    = "allow"
)

// settings are the handler's options with defaults applied and checked.
type settings struct {
	parser          dedup.Parser
	keyer           dedup.Keyer
	ttl             time.Duration
	ttlFrom         string
	inFlightTimeout time.Duration
	failClosed      bool
	release         bool
	maxBody         int64
}

// resolve applies defaults and checks every option, returning a
// *dedup.ConfigError naming the option at fault. The Caddyfile parser runs
// it too, so a bad value is reported with its line before Caddy starts.
func (h *Handler) resolve() (settings, error) {
	var s settings
	var err error
	if s.parser, err = h.resolveParser(); err != nil {
		return s, err
	}

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

	if s.ttl, s.ttlFrom, err = h.ttlPolicy(s.keyer.Window).Resolve(); err != nil {
		return s, err
	}
	s.inFlightTimeout = orDefault(h.InFlightTimeout, dedup.DefaultInFlightTimeout)
	if s.inFlightTimeout < 0 || s.inFlightTimeout >= s.ttl {
		return s, &dedup.ConfigError{Option: "in_flight_timeout", Problem: fmt.Sprintf(
			"%s must be positive and shorter than the key TTL %s; set it just above your upstream's timeout", s.inFlightTimeout, s.ttl)}
	}

	switch h.OnStoreError {
	case "", onStoreErrorOpen:
	case onStoreErrorClosed:
		s.failClosed = true
	default:
		return s, &dedup.ConfigError{Option: "on_store_error", Problem: fmt.Sprintf(
			"%q is not allowed; use open (forward unchecked, the default) or closed (answer 503)", h.OnStoreError)}
	}
	s.release = h.ReleaseOnFailure == nil || *h.ReleaseOnFailure

	if h.MaxBody < 0 {
		return s, &dedup.ConfigError{Option: "max_body", Problem: fmt.Sprintf("%d is negative; use a size such as 1MiB", h.MaxBody)}
	}
	s.maxBody = cmp.Or(h.MaxBody, defaultMaxBody)
	return s, nil
}

func (h *Handler) resolveParser() (dedup.Parser, error) {
	p := dedup.NewParser()
	for _, f := range []struct {
		dst *string
		val string
	}{{&p.AssetPath, h.Asset}, {&p.TimePath, h.Time}, {&p.LatPath, h.Lat}, {&p.LonPath, h.Lon}} {
		if f.val != "" {
			*f.dst = f.val
		}
	}
	if h.TimeFormat != "" {
		tf, err := dedup.ParseTimeFormat(h.TimeFormat)
		if err != nil {
			return p, &dedup.ConfigError{Option: "time_format", Problem: err.Error()}
		}
		p.TimeFormat = tf
	}
	p.MaxFuture = orDefault(h.MaxFuture, dedup.DefaultMaxFuture)
	if p.MaxFuture < 0 {
		return p, &dedup.ConfigError{Option: "max_future", Problem: fmt.Sprintf("%s is negative; use a duration such as 5m", p.MaxFuture)}
	}
	switch h.NullIsland {
	case "", nullIslandReject:
	case nullIslandAllow:
		p.AllowNullIsland = true
	default:
		return p, &dedup.ConfigError{Option: "null_island", Problem: fmt.Sprintf("%q is not allowed; use reject (the default) or allow", h.NullIsland)}
	}
	return p, nil
}

func (h *Handler) ttlPolicy(window time.Duration) dedup.TTLPolicy {
	p := dedup.TTLPolicy{Window: window, TTL: time.Duration(h.TTL)}
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

func orDefault[D ~int64](d D, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return time.Duration(d)
}
