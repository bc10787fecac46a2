package dedup

import (
	"math/bits"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// Defaults of stuck-asset detection.
const (
	DefaultStuckRatio = 0.95
	DefaultStuckTrack = 10_000
)

// stuckWarnEvery spaces out the warnings about one asset.
const stuckWarnEvery = time.Hour

// StuckSilence is how long a stuck asset stays listed after its latest
// ping, unless stuck_after or three of its own intervals between pings are
// longer: one that went silent (its battery died, it was taken out of
// service) is no longer repeating a fix, and an alert on the stuck gauge
// must clear; one that reports every two hours must not be listed and
// unlisted between its pings.
const StuckSilence = time.Hour

// stuckWindow is how many recent pings of an asset are remembered: one bit
// each, in a uint64.
const stuckWindow = 64

// StuckTracker spots assets whose pings are nearly all suppressed and none
// accepted for a while: a device stuck on a cached fix, or with a frozen
// clock, whose every report deduplicates against the last. A parked asset
// is not stuck: it is admitted again every window.
//
// It remembers the last 64 decisions of at most Track assets, least recently
// seen dropped first, so its memory is bounded whatever the fleet size. An
// asset enters at its first suppressed ping: one whose every ping is
// accepted cannot be stuck, so a fleet of moving assets takes no room from
// the assets that can.
type StuckTracker struct {
	ratio float64
	after time.Duration

	mu     sync.Mutex
	assets *simplelru.LRU[string, *assetHistory]
}

// assetHistory is what the tracker knows of one asset.
type assetHistory struct {
	recent       uint64 // one bit per recent ping, 1 = suppressed, newest lowest
	n            int    // how many bits of recent are filled, up to stuckWindow
	pings        uint64
	lastAccepted time.Time // or the first suppression, if none was accepted since
	// lastSeen is its latest ping: stuck_after is measured up to it, not
	// to the clock, so that a parked asset that stops reporting (its
	// ignition off) is not taken for one repeating a cached fix.
	lastSeen time.Time
	// gaps are the times between its latest three requests, the latest
	// first: the shorter is how often it reports, for how long its
	// silence says nothing yet (one long gap, a week parked, is no
	// schedule).
	gaps       [2]time.Duration
	lastReason Reason
	warned     time.Time
}

// StuckAsset is one asset the tracker considers stuck.
type StuckAsset struct {
	// Asset is the asset id.
	Asset string `json:"asset"`
	// Ratio is the suppressed share of its last 64 pings.
	Ratio float64 `json:"ratio"`
	// Pings counts its pings since its first suppressed one.
	Pings uint64 `json:"pings"`
	// LastReason is the reason of its last suppression.
	LastReason Reason `json:"last_reason"`
	// Since is when it last had a ping accepted (or its first suppressed
	// ping, if none was accepted since).
	Since time.Time `json:"since"`
}

// NewStuckTracker returns a tracker that calls an asset stuck when at least
// ratio of its last 64 pings were suppressed and none was accepted for
// after, remembering at most track assets.
func NewStuckTracker(ratio float64, after time.Duration, track int) *StuckTracker {
	lru, _ := simplelru.NewLRU[string, *assetHistory](max(track, 1), nil) // only fails for a size below 1
	return &StuckTracker{ratio: ratio, after: after, assets: lru}
}

// Configure sets the tracker's detection settings, as NewStuckTracker's,
// keeping the assets it remembers (the least recently seen dropped if
// track is smaller): a reload that raises stuck_after, as the README
// advises for noise, must not empty the list of assets still stuck.
func (t *StuckTracker) Configure(ratio float64, after time.Duration, track int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ratio, t.after = ratio, after
	t.assets.Resize(max(track, 1))
}

// Observe records one decision about asset. It reports true when the asset
// is stuck and has not been warned about within the warning period: the
// caller should say so, once.
func (t *StuckTracker) Observe(asset string, v Verdict, now time.Time) (warn bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	h, ok := t.assets.Get(asset)
	if !ok {
		if v.Decision == Accepted {
			return false // not stuck, and nothing to remember until it is suppressed
		}
		h = &assetHistory{lastAccepted: now}
		t.assets.Add(strings.Clone(asset), h) // the id may share memory with a whole request body
	}
	h.pings++
	if h.pings > 1 && now.After(h.lastSeen) { // a batch's pings share one time
		h.gaps = [2]time.Duration{now.Sub(h.lastSeen), h.gaps[0]}
	}
	h.lastSeen = now
	h.recent <<= 1
	h.n = min(h.n+1, stuckWindow)
	if v.Decision == Accepted {
		h.lastAccepted = now
	} else {
		h.recent |= 1
		h.lastReason = v.Reason
	}
	if !t.stuck(h, now) || now.Sub(h.warned) < stuckWarnEvery {
		return false
	}
	h.warned = now
	return true
}

// Lookup returns what the tracker knows of asset, and whether it is stuck.
func (t *StuckTracker) Lookup(asset string, now time.Time) (StuckAsset, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	h, ok := t.assets.Peek(asset)
	if !ok {
		return StuckAsset{}, false
	}
	return h.report(asset), t.stuck(h, now)
}

// Stuck lists the stuck assets, most suppressed first.
func (t *StuckTracker) Stuck(now time.Time) []StuckAsset {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []StuckAsset
	for _, asset := range t.assets.Keys() {
		if h, _ := t.assets.Peek(asset); t.stuck(h, now) {
			out = append(out, h.report(asset))
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Ratio != out[j].Ratio {
			return out[i].Ratio > out[j].Ratio
		}
		return out[i].Asset < out[j].Asset
	})
	return out
}

// Len returns how many assets the tracker remembers.
func (t *StuckTracker) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.assets.Len()
}

// stuck reports an asset whose last 64 pings were nearly all suppressed,
// none accepted for after up to its latest ping: still reporting (heard
// from within StuckSilence, after, or three of its intervals, whichever is
// longest), and still not admitted.
// now only bounds that latest ping (a clock set back does not make an
// asset stuck early).
func (t *StuckTracker) stuck(h *assetHistory, now time.Time) bool {
	last := h.lastSeen
	if now.Before(last) {
		last = now
	}
	return h.n == stuckWindow && h.ratio() >= t.ratio && last.Sub(h.lastAccepted) >= t.after &&
		now.Sub(h.lastSeen) <= max(t.after, StuckSilence, 3*h.interval())
}

// interval is how often the asset reports: the shorter of its latest two
// gaps, or its one gap.
func (h *assetHistory) interval() time.Duration {
	if h.gaps[1] == 0 {
		return h.gaps[0]
	}
	return min(h.gaps[0], h.gaps[1])
}

func (h *assetHistory) ratio() float64 {
	return float64(bits.OnesCount64(h.recent)) / float64(max(h.n, 1))
}

func (h *assetHistory) report(asset string) StuckAsset {
	return StuckAsset{Asset: asset, Ratio: h.ratio(), Pings: h.pings, LastReason: h.lastReason, Since: h.lastAccepted}
}
