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
	"strings"
	"sync"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler deduplicates moving-asset telemetry. Each JSON ping is keyed by
// asset + device-time bucket + H3 cell and the key is claimed atomically in
// the store: the first sighting goes to the next handler with its body
// unchanged; a redelivery, a re-observation in the same bucket, or the GPS
// jitter of a parked asset is answered 200 with X-Dedup: suppressed and
// never reaches the backend.
//
// Changing key_prefix or key_scope, or shape between tumbling and sliding
// or session, starts a fresh key space: the keys already in the store stop
// matching, so redeliveries of pings seen before are admitted once more.
// So does changing window or resolution in tumbling, for most keys; in
// sliding and session they (and radius) can change and the keys stay.
type Handler struct {
	// Where the fields are in each JSON ping: plain dotted paths (dots for
	// nesting and array indexes; no gjson queries or modifiers). asset and
	// time take several paths, tried in order; the first that holds a
	// value (present and not null; for asset, not an empty or blank
	// string either) counts.

	// Paths of the asset id, a string or number. Or one Caddy placeholder
	// template, such as {http.request.uri.query.device}, to take the
	// identity from the request instead. Default: asset_id.
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

	// Path of the fix's horizontal accuracy, in metres, if the format
	// reports one. A value that is not a number of at least 0 counts as
	// not reported. Default: the preset's, else none.
	Accuracy string `json:"accuracy,omitempty"`

	// Path of the speed the device reports, in speed_unit. A value that is
	// not a number of at least 0 (iOS writes -1 for unknown) counts as not
	// reported. Default: the preset's, else none.
	Speed string `json:"speed,omitempty"`

	// The unit of speed: m/s, km/h, knots or mph; with a speed path (speed,
	// or the preset's). Default: the preset's, else m/s.
	SpeedUnit string `json:"speed_unit,omitempty"`

	// The fields that make a ping an event, which is never suppressed but
	// as its own exact redelivery: plain dotted paths, each alone (any
	// value but null, false and "") or as path=value|value... The first
	// that matches is the event. ["off"] for none. Default: the preset's.
	Event []string `json:"event,omitempty"`

	// Plain dotted paths of the fields whose values are the asset's state
	// (an ignition, a driver). In tumbling their values enter the key, so
	// that a change admits the ping. ["off"] for none. Default: the
	// preset's.
	State []string `json:"state,omitempty"`

	// The IANA time zone (Europe/Berlin) that timestamps without a UTC
	// offset are read in, for devices that write local time. Default: none;
	// such timestamps are rejected, never assumed UTC.
	TimeZone string `json:"time_zone,omitempty"`

	// Where the fields of a request are: json (the body), form (the URL
	// query, or when it has none an application/x-www-form-urlencoded
	// body, as the OsmAnd protocol sends them) or auto (form, unless the
	// Content-Type is JSON). Default: auto with preset osmand, else json.
	Encoding string `json:"encoding,omitempty"`

	// Plain dotted path of the array an object body holds its pings in,
	// such as Overland's locations: each element is a ping, and the other
	// members of the object go upstream as they came. "off" for none.
	// Default: the preset's (locations for overland), else none.
	Batch string `json:"batch,omitempty"`

	// A tracker's format, setting the paths, time format, events, states,
	// batch and answers: owntracks, overland, osmand, traccar or geojson.
	// Options given beside it win.
	Preset string `json:"preset,omitempty"`

	// The answers the handler gives itself, instead of the upstream's, as
	// the sender's client must read them. Default: the preset's, else 200
	// with an empty body for a suppression, 409 with Retry-After: 1 for an
	// in-flight redelivery, and 202 with a JSON body naming the field and
	// the rule for a dead-lettered ping.
	Answers *Answers `json:"answers,omitempty"`

	// The coordinate system of lat and lon: EPSG:4326 (WGS 84 degrees),
	// EPSG:3857 (Web Mercator metres) or a WGS 84 UTM zone, EPSG:326xx
	// (north) or EPSG:327xx (south). Positions are reprojected to WGS 84
	// before validation and keying; a projected one goes with no preset
	// but geojson (the apps' senders write degrees). Default: EPSG:4326.
	CRS string `json:"crs,omitempty"`

	// How the window is laid over an asset's pings: tumbling (a time bucket
	// in the key; stateless, one write), sliding (also compared with the
	// asset's last accepted ping, across bucket boundaries) or session
	// (same-place pings suppressed for as long as the burst lasts).
	// Default: tumbling.
	Shape string `json:"shape,omitempty"`

	// Width of the tumbling time bucket: how much re-observation to
	// collapse. In the sliding shape, how long the same place stays
	// suppressed after the last accepted ping; in session, how long after
	// an accepted ping off the asset's stay (a stop past its last accepted
	// fix) a fix at the stay is admitted. Part of the key contract.
	// Default: 5m.
	Window caddy.Duration `json:"window,omitempty"`

	// The device-time gap that ends a session (shape session only).
	// At least 1s. Default: 10m.
	SessionIdle caddy.Duration `json:"session_idle,omitempty"`

	// H3 resolution of the position cell, 0 to 15; choose a cell wider than
	// the GPS jitter of a parked asset. Part of the key contract.
	// Default: 12 (edges of ~9 m).
	Resolution *int `json:"resolution,omitempty"`

	// How far, in metres, a fix may lie from where its asset stays (an
	// anchor refined from the fixes judged to be there) and still be the
	// same place; a suppressed fix never lies farther than 1.5 radii from
	// the asset's last accepted ping (shapes sliding and session only; the
	// jitter a stay shows and a fix's own accuracy widen it). Default: 25.
	Radius float64 `json:"radius,omitempty"`

	// Retired: sliding and session no longer judge the place by H3 cell,
	// so there is no cell edge to hold a fix across; radius covers it. A
	// config that sets it still loads, with a warning.
	Hysteresis float64 `json:"hysteresis,omitempty"`

	// Prefix of every key in the store. Part of the key contract.
	// Default: "dedup:".
	KeyPrefix *string `json:"key_prefix,omitempty"`

	// A placeholder template whose value becomes part of every key, such
	// as {http.request.host} or {http.auth.user.id}, so that two tenants
	// with the same asset ids never suppress each other. A request where it
	// expands to nothing is rejected rather than put in a shared key space.
	// Part of the key contract. Default: none.
	KeyScope string `json:"key_scope,omitempty"`

	// The sender's retry schedule: offsets of its attempts after the first
	// delivery. The key TTL is the last one plus outage_margin.
	// The first at least 1s. Default: 1m 5m 30m 2h 6h.
	RetryLadder []caddy.Duration `json:"retry_ladder,omitempty"`

	// Outage to survive beyond the sender's last retry: 0, or at least 1s.
	// Default: 30m.
	OutageMargin *caddy.Duration `json:"outage_margin,omitempty"`

	// Key lifetime, instead of retry_ladder + outage_margin. It may not be
	// shorter than window, nor than ladder + margin when either is given.
	// Default: the last retry + outage_margin (6h30m), or window if that is
	// longer, or with shape session session_idle if that is longer still.
	// With shape session it may not be shorter than session_idle either.
	TTL caddy.Duration `json:"ttl,omitempty"`

	// Where claims are kept: a module in the
	// http.handlers.telemetry_dedup.stores namespace. Default: memory.
	StoreRaw json.RawMessage `json:"store,omitempty" caddy:"namespace=http.handlers.telemetry_dedup.stores inline_key=type"`

	// How many settled keys (in sliding and session: final seen pings) to
	// keep in process, so that duplicates of them (the repeat jitter of
	// parked assets, exact redeliveries) are answered without a store round
	// trip; 0 turns it off. Each key takes 64 bytes, allocated when the
	// config loads; at most 50000000 (3.2 GB). Default: 100000 with the redis store, off with the
	// memory store (which is in process already).
	NearCache *int `json:"near_cache,omitempty"`

	// What to do when the store cannot be reached: "open" forwards the
	// ping unchecked (a duplicate is recoverable downstream, a lost
	// observation is not); "closed" answers 503. Default: open.
	OnStoreError string `json:"on_store_error,omitempty"`

	// Whether to release the claim when the next handler fails or the
	// upstream answers anything but a 2xx, so that the sender's retry is
	// accepted.
	// Default: true.
	ReleaseOnFailure *bool `json:"release_on_failure,omitempty"`

	// How long a claim whose request is still waiting for its upstream
	// makes exact redeliveries wait (the in_flight answer: 409, or 503 with
	// a preset other than geojson). After this the claim counts as
	// settled even if its request vanished. The upstream request is cut
	// at in_flight_timeout less the store's timeout and 100ms after the
	// claim (and when Caddy exits past its grace_period), and the claim
	// released (settled with release_on_failure off), so that a claim
	// this old has always been finished.
	// Default: 30s.
	InFlightTimeout caddy.Duration `json:"in_flight_timeout,omitempty"`

	// "enforce" answers duplicates itself; "shadow" makes and records every
	// decision exactly as enforce would, but forwards every request,
	// marking what it would have suppressed with X-Dedup: would_suppress
	// (and would have rejected with would_reject). Default: enforce.
	Mode string `json:"mode,omitempty"`

	// What to do with a ping that is malformed or invalid: "reject" answers
	// 400 or 422; "dead_letter" appends it to a Redis stream (on the redis
	// store's server) and answers with the dead_lettered answer (202, or
	// the preset's: 200 with osmand), or, when the stream cannot be
	// written, 503 so that the sender sends it again rather than dropping
	// it on a 4xx. Default: reject.
	OnInvalid string `json:"on_invalid,omitempty"`

	// The Redis stream dead-lettered pings go to (on_invalid dead_letter
	// only). Default: key_prefix + "dead_letter".
	DeadLetterStream string `json:"dead_letter_stream,omitempty"`

	// Roughly how many entries the dead-letter stream keeps (XADD MAXLEN ~;
	// on_invalid dead_letter only). Each keeps at most 8 KiB of its body:
	// the stream takes up to about this many × 10 KiB of Redis's memory.
	// Default: 100000.
	DeadLetterMaxLen int64 `json:"dead_letter_maxlen,omitempty"`

	// Largest request body read, in bytes; larger ones are answered 413.
	// At least 64, and with preset owntracks at least 262144 (256 KiB, its
	// largest messages). Default: 1048576 (1 MiB).
	MaxBody int64 `json:"max_body,omitempty"`

	// Most pings in one batch body (a JSON array, or NDJSON); more are
	// answered 413. At most 65536. Default: 1000.
	MaxBatch int `json:"max_batch,omitempty"`

	// How far ahead of the server clock a device time may be. Later pings
	// are rejected: they would claim keys of buckets not yet lived.
	// At least 1s. Default: 5m.
	MaxFuture caddy.Duration `json:"max_future,omitempty"`

	// How far behind the server clock a device time may be. Older pings
	// are rejected: their clock was never set (1970, the GPS epoch, the
	// year 1). At least 1s. Default: 365d.
	MaxPast caddy.Duration `json:"max_past,omitempty"`

	// "reject" refuses the exact position (0, 0), which GPS modules report
	// before they have a fix; "allow" admits it. Default: reject.
	NullIsland string `json:"null_island,omitempty"`

	// An asset is listed as stuck (a device repeating a cached fix, or
	// with a frozen clock) when at least this share of its last 64 pings
	// was suppressed... Default: 0.95.
	StuckRatio float64 `json:"stuck_ratio,omitempty"`

	// ...and none was accepted for this long. Default: 3 × window, which a
	// parked asset never reaches: it is admitted again every window. With
	// shape tumbling or sliding it must be longer than the window; in any
	// shape, at least 1s.
	StuckAfter caddy.Duration `json:"stuck_after,omitempty"`

	// How many assets stuck detection remembers, least recently seen
	// forgotten first; this bounds its memory (about 245 bytes each). Only
	// assets that had a ping suppressed count: one whose every ping is
	// accepted cannot be stuck. Default: 10000.
	StuckTrack int `json:"stuck_track,omitempty"`

	// settings are the options above, with defaults applied and checked.
	settings    settings
	deduper     *dedup.Deduper
	reconciler  *dedup.Reconciler // nil for a store whose calls never fail
	deadLetters deadLetterSink
	// stuck is the tracker h holds, under stuckKey in stuckTrackers, with
	// its settings among stuckHolders'.
	stuck        *dedup.StuckTracker
	stuckKey     string
	stuckHolders *stuckHolders
	// storeData names the store's data (storeModule.keySpace), as the
	// stuck assets' rows and warnings say it.
	storeData string
	// claimErrors, settleErrors, releaseErrors, sentBackReleaseErrors,
	// letterErrors and sentBackLetterErrors log the store's failures, each
	// kind on its own line at most once per storeErrorLogEvery: each line
	// says what became of its own pings, and in an outage a flood of one
	// kind would hold back another's first line (the claims' would hide
	// the 503s of invalid pings).
	claimErrors, settleErrors, releaseErrors, sentBackReleaseErrors *throttledLog
	letterErrors, sentBackLetterErrors                              *throttledLog
	// upstreamCuts logs the upstream requests the handler cut at
	// upstreamBound, at most once per storeErrorLogEvery.
	upstreamCuts *throttledLog
	// storeUsers counts the requests in this handler and any other that
	// use the store's connection, for a store that must outlive the
	// config that cleans it up while they run (nil for any other).
	storeUsers *atomic.Int64
	// exiting is cancelled when Caddy exits: the upstream requests still
	// running are cut, and their claims released, before the process ends
	// them unfinished.
	exiting context.Context
	// keySpace names the store's data and how keys are made on it
	// (keySpaceOn): a handler inside another of the same key space on one
	// request passes it on (passNested), and nested warns of that once.
	keySpace string
	nested   *sync.Once
	logger   *zap.Logger
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
	h.exiting = exitingContext(ctx)
	if string(h.StoreRaw) == "null" {
		h.StoreRaw = nil // JSON's null: the default store, as when it is left out
	}
	var err error
	if h.settings, err = h.resolve(); err != nil {
		return err
	}
	s := &h.settings
	s.keyer.Cells = new(dedup.CellCache)
	s.extracts = ping.NewExtractCache(s.parser)
	if s.encoding != encodingJSON {
		s.formExtracts = ping.NewExtractCache(s.formParser)
	}
	h.nested = new(sync.Once)
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("registering telemetry_dedup metrics: %v", err)
	}
	s.storeErrorsAtZero()

	if h.StoreRaw == nil {
		h.StoreRaw = caddyconfig.JSONModuleObject(MemoryStore{}, "type", "memory", nil)
	}
	mod, err := ctx.LoadModule(h, "StoreRaw")
	if err != nil {
		return fmt.Errorf("loading telemetry_dedup store: %v", err)
	}
	if d, ok := mod.(drainer); ok {
		h.storeUsers = d.drainWithin(s.policy.InFlightTimeout) // the longest a request holds a claim open
	}
	if k, ok := mod.(keyPrefixed); ok {
		k.servesPrefix(s.keyer.Prefix)
	}
	storeName := mod.(caddy.Module).CaddyModule().ID.Name()
	store := mod.(storeModule)
	h.storeData = store.keySpace()
	h.keySpace = h.keySpaceOn(h.storeData)
	h.startThrottledLines()
	h.loadStuckTracker()
	var claims dedup.Store = newInstrumentedStore(store.Store(), storeName)
	if size := h.nearCacheSize(mod); size > 0 {
		claims = dedup.NewNearCache(claims, size, countNearCacheLookup)
	}
	h.deduper = &dedup.Deduper{Store: claims, Keyer: s.keyer, Policy: s.policy}
	if s.deadLetterInvalid {
		h.deadLetters = mod.(deadLetterer).DeadLetters(s.deadLetterStream, s.deadLetterMaxLen)
		if c, ok := mod.(deadLetterChecker); ok {
			go h.reportUnwritableStream(ctx, c, s.deadLetterStream)
		}
	}
	if rs, ok := mod.(reconciling); ok {
		h.reconciler = rs.Reconciler()
	}

	if h.Hysteresis != 0 {
		h.logger.Warn("hysteresis is retired and ignored: sliding and session judge the same place by the asset's stay, "+
			"within radius of its anchor, not by H3 cell; remove it, and set radius if the default does not fit",
			zap.Float64("hysteresis", h.Hysteresis), zap.Float64("radius", s.policy.Radius))
	}
	if len(s.defaultsOverPreset) > 0 {
		h.logger.Warn("options beside the preset give the fields of a format without one, and override the preset's: "+
			"its tracker's pings lacking them are refused as missing; remove them to read the preset's format",
			zap.String("preset", h.Preset), zap.Strings("options", s.defaultsOverPreset))
	}
	if len(s.misreadAnswers) > 0 {
		h.logger.Warn("answers given beside the preset are not what its client counts as meant: it will resend or drop those pings; "+
			"keep them only if that client never posts to this route",
			zap.String("preset", h.Preset), zap.Strings("answers", s.misreadAnswers))
	}
	if s.overlandBatchShort {
		h.logger.Warn("max_batch is below the largest batch Overland can be set to post: a phone whose Locations per Batch "+
			"is above it is answered 413 and resends that batch at every send interval, and nothing newer arrives "+
			"until its setting is lowered; raise max_batch to 1000, or keep every phone's setting at or below it",
			zap.Int("max_batch", s.maxBatch), zap.Int("overland_default", overlandDefaultBatch), zap.Int("overland_largest", overlandLargestBatch))
	}
	h.logger.Info("telemetry_dedup ready",
		zap.String("shape", string(s.policy.Shape)), zap.Stringer("window", s.keyer.Window),
		zap.Int("resolution", s.keyer.Resolution), zap.String("key_prefix", s.keyer.Prefix),
		zap.Stringer("ttl", s.policy.TTL), zap.String("ttl_from", s.ttlFrom),
		zap.String("store", storeName), zap.Bool("shadow", s.shadow))
	return nil
}

// atExit is cancelled when Caddy exits, its cause a passed deadline, which
// the requests cut inherit (see upstreamContext). It is the process's, not
// a config's: the requests of a config a reload replaced may still run
// when Caddy exits, and would end unfinished with their claims pending.
var atExit, cutAtExit = context.WithCancelCause(context.Background())

// exitingContext is cancelled when the config of ctx is unloaded because
// Caddy exits, not when a reload replaces it: Caddy cancels a config's
// context before it cleans its modules up, so the requests cut then have
// their claims released while the store still answers.
func exitingContext(ctx caddy.Context) context.Context {
	context.AfterFunc(ctx, func() {
		if caddy.Exiting() {
			cutAtExit(context.DeadlineExceeded)
		}
	})
	return atExit
}

// reportUnwritableStream logs, as an error, a dead-letter stream that Redis
// says can never be written, and what the senders of the pings that cannot
// be keyed get until it is fixed. It does not fail the load (Provision
// does no network I/O that can fail the config, and an outage at start is
// on_store_error's), and it runs beside the load, as the store's own
// startup check does, so that a hung Redis delays no reload.
func (h *Handler) reportUnwritableStream(ctx context.Context, c deadLetterChecker, stream string) {
	if err := c.checkDeadLetterStream(ctx, stream); err != nil {
		h.logger.Error(h.settings.unwritableStreamLine(), zap.String("dead_letter_stream", stream), zap.Error(err),
			zap.String("store", h.storeData), zap.String("key_prefix", h.settings.keyer.Prefix))
	}
}

// unwritableStreamLine is the load's line for a dead-letter stream that
// can never be written: what the senders of the pings that cannot be
// keyed get, which enforce mode answers and shadow mode only records.
func (s *settings) unwritableStreamLine() string {
	if s.shadow {
		return "dead_letter_stream can never be written: shadow mode forwards the pings that cannot be keyed all the same, " +
			"recorded unavailable (enforce would answer them 503), and keeps none of them in the stream until it is fixed"
	}
	return "dead_letter_stream can never be written: every ping that cannot be keyed is answered 503, " +
		"and a batch holding one is sent back whole, until it is fixed"
}

// nearCacheSize is the near cache's size: as configured, or the store's
// default.
func (h *Handler) nearCacheSize(store any) int {
	switch nc, ok := store.(nearCacher); {
	case h.NearCache != nil:
		return *h.NearCache
	case ok:
		return nc.DefaultNearCache()
	}
	return 0
}

// Cleanup writes the warnings held back, and gives the shared stuck
// tracker back; the store module gives back its own client.
func (h *Handler) Cleanup() error {
	for _, kind := range h.throttledLines() {
		if kind != nil { // nil until provisioned
			kind.flush()
		}
	}
	return h.releaseStuckTracker()
}

// startThrottledLines makes the handler's throttled warnings, each naming
// the store's data, the key_prefix and the mode: a site's hung Redis was a
// bare "context deadline exceeded", with nothing to say which of several
// sites it was.
func (h *Handler) startThrottledLines() {
	logger := h.logger.With(zap.String("store", h.storeData), zap.String("key_prefix", h.settings.keyer.Prefix),
		zap.String("mode", h.settings.mode()))
	h.claimErrors = newThrottledLog(logger)
	h.settleErrors = newThrottledLog(logger)
	h.releaseErrors = newThrottledLog(logger)
	h.sentBackReleaseErrors = newThrottledLog(logger)
	h.letterErrors = newThrottledLog(logger)
	h.sentBackLetterErrors = newThrottledLog(logger)
	h.upstreamCuts = newThrottledLog(logger)
}

// throttledLines are the handler's warnings, each kind throttled on its
// own: the store's errors and the upstream's cuts.
func (h *Handler) throttledLines() []*throttledLog {
	return []*throttledLog{h.claimErrors, h.settleErrors, h.releaseErrors, h.sentBackReleaseErrors, h.letterErrors, h.sentBackLetterErrors,
		h.upstreamCuts}
}

// ServeHTTP runs the four layers for every ping of the request, whether it
// came alone or in a batch, then answers or forwards it.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	earlier := earlierOutcome(repl)
	if earlier != nil && earlier.judgedIn(h.keySpace) {
		return h.passNested(w, r, next, !h.settings.shadow && !earlier.enforced())
	}
	if h.storeUsers != nil {
		h.storeUsers.Add(1)
		defer h.storeUsers.Add(-1)
	}

	// 1. Normalise: a bounded read, restored for the next handler, split
	// into its pings, each parsed, reprojected and validated.
	req := h.normalise(r, repl)
	// 2. Quantise: bucket, cell and key of each valid ping.
	h.quantise(req)
	// 3. Claim: all of them in one store round trip.
	h.claim(req)
	// 4. Record each outcome: metrics, dead letters, stuck assets,
	// placeholders, debug log.
	outcome := h.record(r, repl, req, earlier)
	if earlier != nil && !h.quietIn(earlier) {
		clearAnswerHeaders(w.Header())
	}

	outer := outcome.enter(h) // an outer handler's, of another key space
	defer outcome.leave(outer)
	if req.unsure != nil {
		return h.respondUnsure(w, r, next, req)
	}
	return h.respond(w, r, next, req)
}

// keySpaceOn names where the handler's keys live on the store's data, and
// how they are made: the key_prefix, the key_scope, and the layout
// (tumbling's resolution; sliding and session share theirs). Two handlers
// of one name meet each other's claims; a shadow trial that differs in any
// of these meets none of the live handler's. Tumbling's window is not in
// the name: a key holds its bucket's start, and the buckets of two windows
// start together (every 10 minutes for 5m and 10m), so a trial of another
// window made the live handler's keys, and in front of it had the live
// handler answer 409 to every such ping, forever.
func (h *Handler) keySpaceOn(data string) string {
	s := &h.settings
	layout := "track"
	if s.policy.Shape == dedup.Tumbling {
		layout = fmt.Sprintf("tumbling %d", s.keyer.Resolution)
	}
	return strings.Join([]string{data, s.keyer.Prefix, h.KeyScope, layout}, "\x00")
}

// passNested passes on a request that another telemetry_dedup handler of
// the same key space (keySpaceOn) is judging: this one runs
// inside it (one at the site's top and one in a handle or route, or two in
// one route). Judged again, every ping found its own claim in flight and
// was answered 409, which the outer handler took for a failed upstream: it
// released the claim, and the sender's retry met the same 409, forever.
// The outer handler has judged the pings, so this one lets them through as
// they are. One of another key space meets none of the outer one's claims,
// and judges: a shadow trial in front of the live handler, say. unenforced
// says no enforcing handler judges the request while this one enforces:
// a shadow trial of its key space runs in front of it, and nothing is
// deduplicated, which the warning says.
func (h *Handler) passNested(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, unenforced bool) error {
	h.nested.Do(func() {
		consequence := "this one passes such requests on unjudged, since the outer one has judged their pings"
		if unenforced {
			consequence = "this enforcing one passes such requests on unjudged, and the outer one is in mode shadow: " +
				"nothing is deduplicated"
		}
		h.logger.Warn("telemetry_dedup runs inside another telemetry_dedup of the same store and keys on the same request; "+
			consequence+": remove one of them "+
			"(two in one route, or one at the site's top and one in a handle or route), or give them key spaces of their own "+
			"(a key_prefix each: a trial of another window needs one too, as tumbling keys of two windows meet where their buckets start together)",
			zap.String("key_prefix", h.settings.keyer.Prefix))
	})
	return next.ServeHTTP(w, r)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ caddyfile.Unmarshaler       = (*Handler)(nil)
)
