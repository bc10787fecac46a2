// Package telemetrydedup is a Caddy HTTP handler that lets each observation
// of a moving asset through once. It keys every JSON ping by asset, device
// time bucket and H3 cell, claims the key atomically in a store, answers
// duplicates itself and passes first sightings on, body untouched.
package telemetrydedup

import (
	"context"
	"encoding/json"
	"errors"
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
	// Where the fields are in each JSON ping: gjson paths (dots for
	// nesting). asset and time take several paths, tried in order; the
	// first present one counts.

	// Paths of the asset id, a string or number. Or one Caddy placeholder
	// template, such as
	// {http.request.header.X-Limit-U}/{http.request.header.X-Limit-D}, to
	// take the identity from the request instead. Default: asset_id.
	Asset []string `json:"asset,omitempty"`

	// Paths of the device's own timestamp; arrival time is never used.
	// Default: occurred_at.
	Time []string `json:"time,omitempty"`

	// How the timestamp is written: auto, rfc3339, unix or unix_ms. auto
	// reads strings as RFC 3339 and numbers as epoch seconds or, when too
	// large for seconds, milliseconds. RFC 3339 times need an offset.
	// Default: auto.
	TimeFormat string `json:"time_format,omitempty"`

	// Path of the latitude in degrees (the northing in a projected crs).
	// Default: lat.
	Lat string `json:"lat,omitempty"`

	// Path of the longitude in degrees (the easting in a projected crs).
	// Default: lon.
	Lon string `json:"lon,omitempty"`

	// A tracker's format, setting the paths and time format above:
	// owntracks, traccar or geojson. Options given beside it win.
	Preset string `json:"preset,omitempty"`

	// The coordinate system of lat and lon: EPSG:4326 (WGS 84 degrees),
	// EPSG:3857 (Web Mercator metres) or a WGS 84 UTM zone, EPSG:326xx
	// (north) or EPSG:327xx (south). Positions are reprojected to WGS 84
	// before validation and keying. Default: EPSG:4326.
	CRS string `json:"crs,omitempty"`

	// How the window is laid over an asset's pings: tumbling (a time bucket
	// in the key; stateless, one write), sliding (also compared with the
	// asset's last accepted ping, across bucket boundaries) or session
	// (same-place pings suppressed for as long as the burst lasts).
	// Default: tumbling.
	Shape string `json:"shape,omitempty"`

	// Width of the tumbling time bucket: how much re-observation to
	// collapse. In the sliding shape, how long the same place stays
	// suppressed after the last accepted ping. Part of the key contract.
	// Default: 5m.
	Window caddy.Duration `json:"window,omitempty"`

	// The device-time gap that ends a session (shape session only).
	// Default: 10m.
	SessionIdle caddy.Duration `json:"session_idle,omitempty"`

	// H3 resolution of the position cell, 0 to 15; choose a cell wider than
	// the GPS jitter of a parked asset. Part of the key contract.
	// Default: 12 (edges of ~9 m).
	Resolution *int `json:"resolution,omitempty"`

	// Metres within which a fix in a neighbouring cell still counts as the
	// last accepted fix's place, so a parked asset on a cell edge does not
	// flap (shapes sliding and session only). Default: 0 (off).
	Hysteresis float64 `json:"hysteresis,omitempty"`

	// Prefix of every key in the store. Part of the key contract.
	// Default: "dedup:".
	KeyPrefix *string `json:"key_prefix,omitempty"`

	// A placeholder template whose value becomes part of every key, such
	// as {http.request.host} or {http.auth.user.id}, so that two tenants
	// with the same asset ids never suppress each other. A request where it
	// expands to nothing is rejected rather than put in a shared key space.
	KeyScope string `json:"key_scope,omitempty"`

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

	// How many settled keys to keep in process, so that duplicates of them
	// (the repeat jitter of parked assets) are answered without a store
	// round trip; 0 turns it off. Tumbling only. Default: 100000 with the
	// redis store, off with the memory store (which is in process already).
	NearCache *int `json:"near_cache,omitempty"`

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

	// "enforce" answers duplicates itself; "shadow" makes and records every
	// decision exactly as enforce would, but forwards every request,
	// marking what it would have suppressed with X-Dedup: would_suppress
	// (and would have rejected with would_reject). Default: enforce.
	Mode string `json:"mode,omitempty"`

	// What to do with a ping that is malformed or invalid: "reject" answers
	// 400 or 422; "dead_letter" appends it to a Redis stream (on the redis
	// store's server) and answers 202. Default: reject.
	OnInvalid string `json:"on_invalid,omitempty"`

	// The Redis stream dead-lettered pings go to. Default: key_prefix +
	// "dead_letter".
	DeadLetterStream string `json:"dead_letter_stream,omitempty"`

	// Roughly how many entries the dead-letter stream keeps (XADD MAXLEN ~).
	// Default: 100000.
	DeadLetterMaxLen int64 `json:"dead_letter_maxlen,omitempty"`

	// Largest request body read, in bytes; larger ones are answered 413.
	// Default: 1048576 (1 MiB).
	MaxBody int64 `json:"max_body,omitempty"`

	// Most pings in one batch body (a JSON array, or NDJSON); more are
	// answered 413. Default: 1000.
	MaxBatch int `json:"max_batch,omitempty"`

	// How far ahead of the server clock a device time may be. Later pings
	// are rejected: they would claim keys of buckets not yet lived.
	// Default: 5m.
	MaxFuture caddy.Duration `json:"max_future,omitempty"`

	// "reject" refuses the exact position (0, 0), which GPS modules report
	// before they have a fix; "allow" admits it. Default: reject.
	NullIsland string `json:"null_island,omitempty"`

	// An asset is listed as stuck (a device repeating a cached fix, or
	// with a frozen clock) when at least this share of its last 64 pings
	// was suppressed... Default: 0.95.
	StuckRatio float64 `json:"stuck_ratio,omitempty"`

	// ...and none was accepted for this long. Default: 3 × window, which a
	// parked asset never reaches: it is admitted again every window.
	StuckAfter caddy.Duration `json:"stuck_after,omitempty"`

	// How many assets stuck detection remembers, least recently seen
	// forgotten first; this bounds its memory (about 200 bytes each).
	// Default: 10000.
	StuckTrack int `json:"stuck_track,omitempty"`

	settings
	deduper     *dedup.Deduper
	deadLetters *deadLetters
	stuck       *dedup.StuckTracker
	stuckKey    string
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
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("registering telemetry_dedup metrics: %v", err)
	}
	if h.stuck, h.stuckKey, err = loadStuckTracker(h.settings); err != nil {
		return err
	}

	if h.StoreRaw == nil {
		h.StoreRaw = caddyconfig.JSONModuleObject(MemoryStore{}, "type", "memory", nil)
	}
	mod, err := ctx.LoadModule(h, "StoreRaw")
	if err != nil {
		return fmt.Errorf("loading telemetry_dedup store: %v", err)
	}
	store := mod.(storeProvider)
	storeName := mod.(caddy.Module).CaddyModule().ID.Name()
	var claims dedup.Store = newInstrumentedStore(store.Store(), storeName)
	if size := h.nearCacheSize(storeName); size > 0 {
		claims = dedup.NewNearCache(claims, size, countNearCacheLookup)
	}
	h.deduper = &dedup.Deduper{Store: claims, Keyer: h.keyer, Policy: h.policy}
	if h.deadLetter {
		if h.deadLetters, err = newDeadLetters(store, h.deadLetterStream, h.deadLetterMaxLen); err != nil {
			return err
		}
	}

	h.logger.Info("telemetry_dedup ready",
		zap.String("shape", string(h.policy.Shape)), zap.Stringer("window", h.keyer.Window),
		zap.Int("resolution", h.keyer.Resolution), zap.String("key_prefix", h.keyer.Prefix),
		zap.Stringer("ttl", h.policy.TTL), zap.String("ttl_from", h.ttlFrom),
		zap.String("store", storeName), zap.Bool("shadow", h.shadow))
	return nil
}

// nearCacheSize is the near cache's size: as configured, or by default on
// in front of Redis only, and never for the track shapes, which it cannot
// serve.
func (h *Handler) nearCacheSize(store string) int {
	switch {
	case h.policy.Shape != dedup.Tumbling:
		return 0
	case h.NearCache != nil:
		return *h.NearCache
	case store == "redis":
		return dedup.DefaultNearCache
	}
	return 0
}

// Cleanup gives the shared stuck tracker back; the store module gives back
// its own client.
func (h *Handler) Cleanup() error {
	if h.stuckKey == "" {
		return nil
	}
	_, err := stuckTrackers.Delete(h.stuckKey)
	return err
}

// ServeHTTP runs the four layers for one request: normalise, quantise,
// claim, record.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)

	// 1. Normalise: a bounded read, restored for the next handler, and the
	// configured fields parsed, reprojected and validated. A JSON array or
	// NDJSON body is a batch of pings, each decided on its own.
	body, err := readBody(r, h.maxBody)
	if err != nil {
		return h.reject(w, r, next, repl, body, err)
	}
	if elements, isBatch, err := dedup.SplitBatch(body, isNDJSON(r), h.maxBatch); err != nil {
		return h.reject(w, r, next, repl, body, err)
	} else if isBatch {
		return h.serveBatch(w, r, next, repl, elements)
	}
	ping, scope, err := h.normalise(body, repl)
	switch {
	case errors.Is(err, dedup.ErrNotAPing):
		h.record(repl, decisionSkipped, reasonNotAPing)
		return passOn(w, r, next, decisionSkipped, "")
	case err != nil:
		return h.reject(w, r, next, repl, body, err)
	}

	// 2. Quantise.
	obs := h.observe(ping, scope)
	setObservation(repl, ping.Asset, obs)

	// 3. Claim, in one store round trip.
	claim, verdict, err := h.deduper.Claim(r.Context(), obs)
	repl.Set(placeholderKey, claim.Key())
	if err != nil {
		return h.storeFailed(w, r, next, repl, err)
	}

	// 4. Record, and answer or forward.
	h.record(repl, string(verdict.Decision), string(verdict.Reason))
	h.watchForStuck(obs.Asset, verdict)
	switch {
	case verdict.Decision == dedup.Accepted:
		return h.forward(w, r, next, claim)
	case h.shadow:
		return passOn(w, r, next, decisionWouldSuppress, string(verdict.Reason))
	case verdict.Decision == dedup.InFlight:
		writeInFlight(w, verdict.Reason)
	default:
		writeSuppressed(w, verdict.Reason)
	}
	return nil
}

// normalise turns a body into a validated ping and the key scope it belongs
// to.
func (h *Handler) normalise(body []byte, repl *caddy.Replacer) (ping dedup.Ping, scope string, err error) {
	if ping, err = h.parser.Extract(body); err != nil {
		return ping, "", err
	}
	if h.assetTemplate != "" {
		if ping.Asset, err = expandTemplate(repl, "asset", h.assetTemplate); err != nil {
			return ping, "", err
		}
	}
	if h.keyScope != "" {
		if scope, err = expandTemplate(repl, "key_scope", h.keyScope); err != nil {
			return ping, "", err
		}
	}
	return ping, scope, h.parser.Validate(ping, time.Now())
}

// observe quantises a ping in its key scope: the scope becomes part of the
// identity the keys are made of.
func (h *Handler) observe(ping dedup.Ping, scope string) dedup.Observation {
	ping.Asset = dedup.ScopedAsset(scope, ping.Asset)
	return h.keyer.Observe(ping)
}

// forward passes a first sighting on and lets the upstream's real answer
// settle or release its claim. The upstream request is detached from the
// sender's cancellation: a sender that hangs up does not undo an upstream
// that went on to store the observation.
func (h *Handler) forward(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, claims ...*dedup.Claim) error {
	if w.Header().Get(headerDecision) == "" {
		w.Header().Set(headerDecision, string(dedup.Accepted))
	}
	rec := caddyhttp.NewResponseRecorder(w, nil, nil) // never buffers: only watches the status
	detached := context.WithoutCancel(r.Context())
	metrics.inFlight.Inc()
	defer metrics.inFlight.Dec()

	defer func() {
		// reverse_proxy aborts a broken response stream with a panic. If the
		// upstream had answered below 500 by then, it has the observation.
		if p := recover(); p != nil {
			h.finish(detached, claims, rec.Status() == 0 || rec.Status() >= 500)
			panic(p)
		}
	}()
	err := next.ServeHTTP(rec, r.WithContext(detached))
	h.finish(detached, claims, err != nil || rec.Status() >= 500)
	return err
}

// finish settles the claims of a forwarded request, or releases them when
// the upstream failed and release_on_failure is on.
func (h *Handler) finish(ctx context.Context, claims []*dedup.Claim, failed bool) {
	if len(claims) == 0 { // a shadow-mode batch with nothing new
		return
	}
	if !failed || !h.release {
		if err := h.deduper.Settle(ctx, claims...); err != nil {
			h.storeErrors.log("settling a claim failed; exact redeliveries wait for in_flight_timeout instead", err)
		}
		return
	}
	released, err := h.deduper.Release(ctx, claims...)
	if err != nil {
		metrics.releases.WithLabelValues(releaseError).Add(float64(len(claims)))
		// The claims stay; the sender's retries get 409 until
		// in_flight_timeout, then count as duplicates. Rare, and worth a line
		// of its own.
		h.logger.Error("releasing the claims of a failed request failed; its retries may be suppressed",
			zap.String("key", claims[0].Key()), zap.Int("claims", len(claims)), zap.Error(err))
		return
	}
	metrics.releases.WithLabelValues(releaseReleased).Add(float64(released))
	metrics.releases.WithLabelValues(releaseNotHeld).Add(float64(len(claims) - released))
	if c := h.logger.Check(zapcore.DebugLevel, "released claims after upstream failure"); c != nil {
		c.Write(zap.String("key", claims[0].Key()), zap.Int("released", released), zap.Int("claims", len(claims)))
	}
}

// storeFailed applies on_store_error when the store cannot answer.
func (h *Handler) storeFailed(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, repl *caddy.Replacer, err error) error {
	if !errors.Is(err, dedup.ErrBreakerOpen) { // the breaker logs its own transitions
		h.storeErrors.log("dedup store unavailable; applying on_store_error", err)
	}
	if h.failClosed && !h.shadow {
		h.record(repl, decisionUnavailable, reasonStoreError)
		writeUnavailable(w)
		return nil
	}
	h.record(repl, decisionUnchecked, reasonStoreError)
	return passOn(w, r, next, decisionUnchecked, "")
}

// reject answers a ping that cannot be keyed: 400, 413 or 422 with a JSON
// body naming the problem, or 202 once it is in the dead-letter stream.
func (h *Handler) reject(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, repl *caddy.Replacer, body []byte, err error) error {
	rej, ok := rejectionFor(err)
	if !ok {
		return err
	}
	decision := decisionRejected
	if h.deadLetters != nil && rej.deadLetterable() {
		if err := h.deadLetters.add(r, body, rej); err != nil {
			h.storeErrors.log("dead-lettering an invalid ping failed; rejecting it instead", err)
		} else {
			decision = decisionDeadLettered
		}
	}
	h.record(repl, decision, rej.reason())
	switch {
	case h.shadow:
		return passOn(w, r, next, decisionWouldReject, rej.reason())
	case decision == decisionDeadLettered:
		writeDeadLettered(w, rej)
	default:
		writeRejection(w, rej)
	}
	return nil
}

// passOn forwards the request without a claim, saying why in X-Dedup.
func passOn(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, decision, reason string) error {
	w.Header().Set(headerDecision, decision)
	if reason != "" {
		w.Header().Set(headerReason, reason)
	}
	return next.ServeHTTP(w, r)
}

// record counts the decision with its reason, sets the placeholders and
// logs it at debug level: per-request info logs are noise at telemetry
// rates.
func (h *Handler) record(repl *caddy.Replacer, decision, reason string) {
	metrics.decisions.WithLabelValues(decision, reason).Inc()
	repl.Set(placeholderDecision, decision)
	repl.Set(placeholderReason, reason)
	if c := h.logger.Check(zapcore.DebugLevel, "telemetry_dedup decision"); c != nil {
		asset, _ := repl.GetString(placeholderAsset)
		key, _ := repl.GetString(placeholderKey)
		c.Write(zap.String("decision", decision), zap.String("reason", reason), zap.String("asset", asset), zap.String("key", key))
	}
}

// watchForStuck feeds the stuck-asset tracker and warns, once per asset
// per hour, about an asset that looks stuck.
func (h *Handler) watchForStuck(asset string, v dedup.Verdict) {
	now := time.Now()
	if !h.stuck.Observe(asset, v, now) {
		return
	}
	a, _ := h.stuck.Lookup(asset, now)
	h.logger.Warn("asset looks stuck: nearly all its recent pings are suppressed and none was accepted for stuck_after; "+
		"is it repeating a cached fix or is its clock frozen?",
		zap.String("asset", asset), zap.Float64("ratio", a.Ratio), zap.Uint64("pings", a.Pings),
		zap.String("last_reason", string(a.LastReason)), zap.Time("since", a.Since))
}

// Outcomes of a release, as counted in releases_total.
const (
	releaseReleased = "released"
	releaseNotHeld  = "not_held"
	releaseError    = "error"
)

// Placeholders set on every request the handler sees.
const (
	placeholderDecision = "http.telemetry_dedup.decision"
	placeholderReason   = "http.telemetry_dedup.reason"
	placeholderKey      = "http.telemetry_dedup.key"
	placeholderAsset    = "http.telemetry_dedup.asset"
	placeholderBucket   = "http.telemetry_dedup.bucket"
	placeholderCell     = "http.telemetry_dedup.cell"
)

func setObservation(repl *caddy.Replacer, asset string, obs dedup.Observation) {
	repl.Set(placeholderAsset, asset)
	repl.Set(placeholderBucket, strconv.FormatInt(obs.Bucket, 10))
	repl.Set(placeholderCell, obs.Cell.String())
}

// expandTemplate fills the asset or key_scope template from the request. A
// placeholder that is unknown or empty is an invalid ping, not a shared
// empty identity.
func expandTemplate(repl *caddy.Replacer, option, template string) (string, error) {
	v, err := repl.ReplaceOrErr(template, true, true)
	if err != nil {
		return "", &dedup.InvalidPingError{Field: option, Rule: dedup.RuleRequired,
			Detail: fmt.Sprintf("the %s template %s could not be filled from this request: %v", option, template, err)}
	}
	return v, nil
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ caddyfile.Unmarshaler       = (*Handler)(nil)
)
