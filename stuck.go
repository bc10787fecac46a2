package telemetrydedup

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

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
}

func (stuckTrackerValue) Destruct() error { return nil }

// loadStuckTracker returns the shared tracker of the key space on the
// store's data (storeModule.keySpace), set to these settings, and the key
// to give back to the pool on cleanup. Handlers of one key space share its
// stuck settings: the last loaded one's. Keyed by the settings too, a
// reload that raised stuck_after (or window, whose 3× is its default)
// started an empty tracker, and an asset still stuck was unlisted until
// 64 more pings.
func loadStuckTracker(s settings, store string) (*dedup.StuckTracker, string) {
	// A shadow trial in front of the live handler judges the same pings:
	// sharing a tracker, each ping counted twice, and an asset was listed
	// stuck at half the pings it takes. Two sites on two stores with one
	// key_prefix share no key: sharing a tracker, one site's truck-1 under
	// way hid the other's, stuck.
	key := fmt.Sprintf("stuck store=%q prefix=%q mode=%s", store, s.keyer.Prefix, s.mode())
	v, loaded, _ := stuckTrackers.LoadOrNew(key, func() (caddy.Destructor, error) { // which never fails
		return stuckTrackerValue{dedup.NewStuckTracker(s.stuckRatio, s.stuckAfter, s.stuckTrack), store, s.keyer.Prefix, s.mode()}, nil
	})
	tracker := v.(stuckTrackerValue).StuckTracker
	if loaded {
		tracker.Configure(s.stuckRatio, s.stuckAfter, s.stuckTrack)
	}
	return tracker, key
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
