package dedup

import (
	"testing"
	"time"
)

// A parked asset that reports every 10 s in tumbling (5 m window) is
// admitted once a window, 1 ping in 30: its last 64 decisions are ≥ 95%
// suppressed, by design. When it then stops reporting (ignition off, the
// end of a shift), it has not had a ping accepted for stuck_after, but it
// has had no ping at all: it is not repeating a cached fix. It must not be
// listed (and counted in caddy_telemetry_dedup_stuck_assets) as stuck for
// as long as the tracker remembers it.
func TestStuckTrackerDoesNotListAParkedAssetThatWentSilent(t *testing.T) {
	window := 5 * time.Minute
	tr := NewStuckTracker(DefaultStuckRatio, 3*window, DefaultStuckTrack)
	now := articleBase
	for i := range 360 { // one hour parked at 10 s
		now = articleBase.Add(time.Duration(i) * 10 * time.Second)
		v := suppressed(Jitter)
		if i%30 == 0 {
			v = accepted
		}
		if tr.Observe("parked", v, now) {
			t.Fatalf("warned about a parked asset while it reported, at +%s", now.Sub(articleBase))
		}
	}
	if stuck := tr.Stuck(now); len(stuck) != 0 {
		t.Fatalf("a parked asset reporting every window is listed as stuck: %+v", stuck)
	}
	// It goes silent. An hour later, it is still just parked and off.
	if stuck := tr.Stuck(now.Add(time.Hour)); len(stuck) != 0 {
		t.Fatalf("a parked asset that stopped reporting is listed as stuck an hour later: %+v", stuck)
	}
	if _, stuck := tr.Lookup("parked", now.Add(time.Hour)); stuck {
		t.Fatal("Lookup calls a parked asset that stopped reporting stuck")
	}
}
