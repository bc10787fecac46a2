// Package telemetrydedup is a Caddy HTTP handler that lets each observation
// of a moving asset through once. It keys every JSON ping by asset, device
// time bucket and H3 cell, claims the key atomically in a store, answers
// duplicates itself and passes first sightings on, body untouched.
package telemetrydedup

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// stores shares store clients across config reloads: a new config is
// provisioned before the old one is cleaned up, so the pool hands it the
// same memory store or Redis connections instead of new ones.
var stores = caddy.NewUsagePool()

// storeProvider is implemented by the modules in the
// http.handlers.telemetry_dedup.stores namespace.
type storeProvider interface {
	Store() dedup.Store
}

// Handler deduplicates moving-asset telemetry. Each JSON ping is keyed by
// asset + device-time bucket + H3 cell and the key is claimed atomically in
// the store: the first sighting goes to the next handler with its body
// unchanged; a redelivery, a re-observation in the same bucket, or the GPS
// jitter of a parked asset is answered 200 with X-Dedup: suppressed and
// never reaches the backend.
//
// Changing window, resolution or key_prefix starts a fresh key space: every
// key already in the store stops matching.
type Handler struct {
	// JSON path (gjson syntax, dots for nesting) of the asset id, a string
	// or number. Default: asset_id.
	Asset string `json:"asset,omitempty"`

	// JSON path of the device's own timestamp; arrival time is never
	// used. Default: occurred_at.
	Time string `json:"time,omitempty"`

	// How the timestamp is written: auto, rfc3339, unix or unix_ms. auto
	// reads strings as RFC 3339 and numbers as epoch seconds or, when too
	// large for seconds, milliseconds. RFC 3339 times need an offset.
	// Default: auto.
	TimeFormat string `json:"time_format,omitempty"`

	// JSON path of the latitude in degrees. Default: lat.
	Lat string `json:"lat,omitempty"`

	// JSON path of the longitude in degrees. Default: lon.
	Lon string `json:"lon,omitempty"`

	// Width of the tumbling time bucket: how much re-observation to
	// collapse. Part of the key contract. Default: 5m.
	Window caddy.Duration `json:"window,omitempty"`

	// H3 resolution of the position cell, 0 to 15; choose a cell wider than
	// the GPS jitter of a parked asset. Part of the key contract.
	// Default: 12 (edges of ~9 m).
	Resolution *int `json:"resolution,omitempty"`

	// Prefix of every key in the store. Part of the key contract.
	// Default: "dedup:".
	KeyPrefix *string `json:"key_prefix,omitempty"`

	// The sender's retry schedule: offsets of its attempts after the first
	// delivery. The key TTL is the last one plus outage_margin.
	// Default: 1m 5m 30m 2h 6h.
	RetryLadder []caddy.Duration `json:"retry_ladder,omitempty"`

	// Outage to survive beyond the sender's last retry. Default: 30m.
	OutageMargin *caddy.Duration `json:"outage_margin,omitempty"`

	// Key lifetime, instead of retry_ladder + outage_margin. It may not be
	// shorter than window, nor than ladder + margin when those are given.
	TTL caddy.Duration `json:"ttl,omitempty"`

	// Where claims are kept: a module in the
	// http.handlers.telemetry_dedup.stores namespace. Default: memory.
	StoreRaw json.RawMessage `json:"store,omitempty" caddy:"namespace=http.handlers.telemetry_dedup.stores inline_key=type"`

	// What to do when the store cannot be reached: "open" forwards the
	// ping unchecked (a duplicate is recoverable downstream, a lost
	// observation is not); "closed" answers 503. Default: open.
	OnStoreError string `json:"on_store_error,omitempty"`

	// Whether to release the claim when the next handler fails or the
	// upstream answers 5xx, so that the sender's retry is accepted.
	// Default: true.
	ReleaseOnFailure *bool `json:"release_on_failure,omitempty"`

	// How long a claim whose request is still waiting for its upstream
	// makes exact redeliveries wait (409). After this the claim counts as
	// settled even if its request vanished. Keep it above the upstream's
	// timeouts. Default: 30s.
	InFlightTimeout caddy.Duration `json:"in_flight_timeout,omitempty"`

	// Largest request body read, in bytes; larger ones are answered 413.
	// Default: 1048576 (1 MiB).
	MaxBody int64 `json:"max_body,omitempty"`

	// How far ahead of the server clock a device time may be. Later pings
	// are rejected: they would claim keys of buckets not yet lived.
	// Default: 5m.
	MaxFuture caddy.Duration `json:"max_future,omitempty"`

	// "reject" refuses the exact position (0, 0), which GPS modules report
	// before they have a fix; "allow" admits it. Default: reject.
	NullIsland string `json:"null_island,omitempty"`

	settings
	deduper     *dedup.Deduper
	storeErrors *throttledLog
	logger      *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.telemetry_dedup",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision resolves the options, loads the store and logs the TTL it
// derived and from what.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	var err error
	if h.settings, err = h.resolve(); err != nil {
		return err
	}
	h.storeErrors = newThrottledLog(h.logger, storeErrorLogEvery)

	if h.StoreRaw == nil {
		h.StoreRaw = caddyconfig.JSONModuleObject(MemoryStore{}, "type", "memory", nil)
	}
	mod, err := ctx.LoadModule(h, "StoreRaw")
	if err != nil {
		return fmt.Errorf("loading telemetry_dedup store: %v", err)
	}
	h.deduper = &dedup.Deduper{
		Store:           mod.(storeProvider).Store(),
		TTL:             h.ttl,
		InFlightTimeout: h.inFlightTimeout,
	}

	h.logger.Info("telemetry_dedup ready",
		zap.Stringer("ttl", h.ttl), zap.String("ttl_from", h.ttlFrom),
		zap.Stringer("window", h.keyer.Window), zap.Int("resolution", h.keyer.Resolution),
		zap.String("key_prefix", h.keyer.Prefix), zap.String("store", mod.(caddy.Module).CaddyModule().ID.Name()))
	return nil
}

// ServeHTTP runs the four layers for one request: normalise, quantise,
// claim, record.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)

	// 1. Normalise: a bounded read, restored for the next handler, and the
	// configured fields parsed and validated.
	body, err := readBody(r, h.maxBody)
	if err != nil {
		return h.reject(w, repl, err)
	}
	ping, err := h.parser.Parse(body, time.Now())
	if err != nil {
		return h.reject(w, repl, err)
	}

	// 2. Quantise.
	obs := h.keyer.Observe(ping)
	setObservation(repl, obs)

	// 3. Claim, in one store round trip.
	claim, err := h.deduper.Claim(r.Context(), obs)
	if err != nil {
		return h.storeFailed(w, r, next, repl, obs, err)
	}

	// 4. Record, and answer or forward.
	h.record(repl, obs, string(claim.Decision), string(claim.Reason))
	switch claim.Decision {
	case dedup.Suppressed:
		writeSuppressed(w, claim.Reason)
		return nil
	case dedup.InFlight:
		writeInFlight(w, claim.Reason)
		return nil
	default:
		return h.forward(w, r, next, claim)
	}
}

// forward passes a first sighting on and lets the upstream's real answer
// settle or release its claim. The upstream request is detached from the
// sender's cancellation: a sender that hangs up does not undo an upstream
// that went on to store the observation.
func (h *Handler) forward(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, claim dedup.Claim) error {
	w.Header().Set(headerDecision, string(dedup.Accepted))
	rec := caddyhttp.NewResponseRecorder(w, nil, nil) // never buffers: only watches the status
	detached := context.WithoutCancel(r.Context())

	defer func() {
		// reverse_proxy aborts a broken response stream with a panic. If the
		// upstream had answered below 500 by then, it has the observation.
		if p := recover(); p != nil {
			h.finish(detached, claim, rec.Status() == 0 || rec.Status() >= 500)
			panic(p)
		}
	}()
	err := next.ServeHTTP(rec, r.WithContext(detached))
	h.finish(detached, claim, err != nil || rec.Status() >= 500)
	return err
}

// finish settles the claim, or releases it when the upstream failed and
// release_on_failure is on.
func (h *Handler) finish(ctx context.Context, claim dedup.Claim, failed bool) {
	if !failed || !h.release {
		if err := h.deduper.Settle(ctx, claim); err != nil {
			h.storeErrors.log("settling a claim failed; exact redeliveries wait for in_flight_timeout instead", err)
		}
		return
	}
	released, err := h.deduper.Release(ctx, claim)
	if err != nil {
		// The key stays; the sender's retries get 409 until in_flight_timeout,
		// then count as duplicates. Rare, and worth a line of its own.
		h.logger.Error("releasing the claim of a failed request failed; its retries may be suppressed", zap.Error(err))
		return
	}
	if c := h.logger.Check(zapcore.DebugLevel, "released claim after upstream failure"); c != nil {
		c.Write(zap.Bool("released", released))
	}
}

// storeFailed applies on_store_error when the store cannot answer.
func (h *Handler) storeFailed(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, repl *caddy.Replacer, obs dedup.Observation, err error) error {
	h.storeErrors.log("dedup store unavailable; applying on_store_error", err)
	if h.failClosed {
		h.record(repl, obs, decisionUnavailable, reasonStoreError)
		writeUnavailable(w)
		return nil
	}
	h.record(repl, obs, decisionUnchecked, reasonStoreError)
	w.Header().Set(headerDecision, decisionUnchecked)
	return next.ServeHTTP(w, r)
}

// reject answers a ping that cannot be keyed: 400, 413 or 422 with a JSON
// body naming the problem.
func (h *Handler) reject(w http.ResponseWriter, repl *caddy.Replacer, err error) error {
	rej, ok := rejectionFor(err)
	if !ok {
		return err
	}
	h.record(repl, dedup.Observation{}, decisionRejected, rej.reason())
	writeRejection(w, rej)
	return nil
}

// record sets the decision placeholders and logs the decision at debug
// level: per-request info logs are noise at telemetry rates.
func (h *Handler) record(repl *caddy.Replacer, obs dedup.Observation, decision, reason string) {
	repl.Set(placeholderDecision, decision)
	repl.Set(placeholderReason, reason)
	if c := h.logger.Check(zapcore.DebugLevel, "telemetry_dedup decision"); c != nil {
		c.Write(zap.String("decision", decision), zap.String("reason", reason),
			zap.String("asset", obs.Asset), zap.String("key", obs.Key))
	}
}

// Placeholders set on every request the handler sees.
const (
	placeholderDecision = "http.telemetry_dedup.decision"
	placeholderReason   = "http.telemetry_dedup.reason"
	placeholderKey      = "http.telemetry_dedup.key"
	placeholderAsset    = "http.telemetry_dedup.asset"
	placeholderBucket   = "http.telemetry_dedup.bucket"
	placeholderCell     = "http.telemetry_dedup.cell"
)

func setObservation(repl *caddy.Replacer, obs dedup.Observation) {
	repl.Set(placeholderKey, obs.Key)
	repl.Set(placeholderAsset, obs.Asset)
	repl.Set(placeholderBucket, strconv.FormatInt(obs.Bucket, 10))
	repl.Set(placeholderCell, obs.Cell.String())
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ caddyfile.Unmarshaler       = (*Handler)(nil)
)
