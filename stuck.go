package telemetrydedup

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
)

// stuckTrackers holds one tracker per key space (the store's data,
// key_prefix and mode), shared across config reloads like the stores, so
// that an asset's recent history survives a reload, one that changes the
// detection settings too.
var stuckTrackers = caddy.NewUsagePool()

// stuckTrackerValue lets a tracker live in the usage pool.
type stuckTrackerValue struct {
	*dedup.StuckTracker
	store, keyPrefix, mode string
	holders                *stuckHolders
}

// stuckHolders are the handlers sharing a tracker, each with its
// settings. The tracker runs with the largest of each setting among them:
// Caddy loads a config's servers in no set order, so "the newest loaded"
// changed from one load of the same config to the next; and during a
// reload both configs hold it, so that neither a new config's handler
// with smaller settings, loaded first, nor a new config Caddy rolls back
// shrinks or retunes the list the running one keeps.
type stuckHolders struct {
	mu   sync.Mutex
	list []stuckHolder
}

type stuckHolder struct {
	owner *Handler
	ratio float64
	after time.Duration
	track int
}

// add registers owner's settings and applies the holders' to t.
func (hs *stuckHolders) add(t *dedup.StuckTracker, owner *Handler, s settings) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	hs.list = append(hs.list, stuckHolder{owner, s.stuckRatio, s.stuckAfter, s.stuckTrack})
	hs.applyLocked(t)
}

// remove forgets owner's settings and applies those of the holders left.
func (hs *stuckHolders) remove(t *dedup.StuckTracker, owner *Handler) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	hs.list = slices.DeleteFunc(hs.list, func(h stuckHolder) bool { return h.owner == owner })
	hs.applyLocked(t)
}

func (hs *stuckHolders) applyLocked(t *dedup.StuckTracker) {
	if len(hs.list) > 0 {
		most := hs.settingsLocked()
		t.Configure(most.ratio, most.after, most.track)
	}
}

// settingsLocked are the settings the tracker runs with: the largest of
// each among the holders.
func (hs *stuckHolders) settingsLocked() (most stuckHolder) {
	for _, h := range hs.list {
		most.ratio, most.after, most.track = max(most.ratio, h.ratio), max(most.after, h.after), max(most.track, h.track)
	}
	return most
}

func (stuckTrackerValue) Destruct() error { return nil }

// loadStuckTracker has h hold the shared tracker of its key space on the
// store's data (storeModule.keySpace), with its settings among its
// holders' (stuckHolders), until releaseStuckTracker. Keyed by the
// settings too, a reload that raised stuck_after (or window, whose 3× is
// its default) started an empty tracker, and an asset still stuck was
// unlisted until 64 more pings.
func (h *Handler) loadStuckTracker() {
	s, store := h.settings, h.storeData
	// A shadow trial in front of the live handler judges the same pings:
	// sharing a tracker, each ping counted twice, and an asset was listed
	// stuck at half the pings it takes. Two sites on two stores with one
	// key_prefix share no key: sharing a tracker, one site's truck-1 under
	// way hid the other's, stuck.
	key := fmt.Sprintf("stuck store=%q prefix=%q mode=%s", store, s.keyer.Prefix, s.mode())
	v, _, _ := stuckTrackers.LoadOrNew(key, func() (caddy.Destructor, error) { // which never fails
		return stuckTrackerValue{dedup.NewStuckTracker(s.stuckRatio, s.stuckAfter, s.stuckTrack), store, s.keyer.Prefix, s.mode(),
			new(stuckHolders)}, nil
	})
	value := v.(stuckTrackerValue)
	value.holders.add(value.StuckTracker, h, s)
	h.stuck, h.stuckKey, h.stuckHolders = value.StuckTracker, key, value.holders
}

// releaseStuckTracker gives h's hold on its tracker back: the tracker runs
// on with the settings of the holders left, and goes with the last.
func (h *Handler) releaseStuckTracker() error {
	if h.stuckKey == "" {
		return nil // not provisioned that far
	}
	h.stuckHolders.remove(h.stuck, h)
	_, err := stuckTrackers.Delete(h.stuckKey)
	return err
}

// stuckAsset is one row of the admin endpoint.
type stuckAsset struct {
	// Store is the data of the handlers' store that saw the asset:
	// "memory", or "redis" and its servers, master and database.
	Store string `json:"store"`
	// KeyPrefix is the key_prefix of the handlers that saw the asset.
	KeyPrefix string `json:"key_prefix"`
	// Mode is theirs: enforce, or shadow for a trial's verdicts.
	Mode string `json:"mode"`
	// Scope is the asset's key scope (key_scope), if it has one.
	Scope string `json:"scope,omitempty"`
	dedup.StuckAsset
}

// allStuckAssets lists the stuck assets of every tracker in use.
func allStuckAssets(now time.Time) []stuckAsset {
	var out []stuckAsset
	stuckTrackers.Range(func(_, v any) bool {
		t := v.(stuckTrackerValue)
		for _, a := range t.Stuck(now) {
			row := stuckAsset{Store: t.store, KeyPrefix: t.keyPrefix, Mode: t.mode, StuckAsset: a}
			row.Scope, row.Asset = dedup.SplitScopedAsset(a.Asset)
			out = append(out, row)
		}
		return true
	})
	slices.SortStableFunc(out, func(a, b stuckAsset) int {
		return cmp.Or(strings.Compare(a.Store, b.Store), strings.Compare(a.KeyPrefix, b.KeyPrefix), strings.Compare(a.Mode, b.Mode))
	})
	return out
}

// watchForStuck feeds the stuck-asset tracker and warns, once per asset
// per hour, about an asset that looks stuck. now is when the verdict was
// made (the claim's time: one clock read fewer a ping).
func (h *Handler) watchForStuck(asset string, v dedup.Verdict, now time.Time) {
	if !h.stuck.Observe(asset, v, now) {
		return
	}
	a, _ := h.stuck.Lookup(asset, now)
	scope, id := dedup.SplitScopedAsset(asset)
	h.logger.Warn("asset looks stuck: nearly all its recent pings are suppressed and none was accepted for stuck_after; "+
		"is it repeating a cached fix or is its clock frozen?",
		zap.String("asset", id), zap.String("scope", scope), zap.Float64("ratio", a.Ratio), zap.Uint64("pings", a.Pings),
		zap.String("last_reason", string(a.LastReason)), zap.Time("since", a.Since),
		zap.String("store", h.storeData), zap.String("key_prefix", h.settings.keyer.Prefix), zap.String("mode", h.settings.mode()))
}
