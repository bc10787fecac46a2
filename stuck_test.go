package telemetrydedup

import (
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
)

// With key_scope, the admin endpoint lists a stuck asset as its id and its
// scope, not as the scoped identity its keys are made of.
func TestStuckAssetsShowTheirScopeApart(t *testing.T) {
	var s settings
	s.keyer.Prefix = "test:" + t.Name() + ":"
	s.stuckRatio, s.stuckAfter, s.stuckTrack = 0.9, time.Minute, 10
	tracker, key, err := loadStuckTracker(s)
	if err != nil {
		t.Fatal(err)
	}
	defer stuckTrackers.Delete(key)
	start := time.Now()
	for i := range 70 {
		tracker.Observe(dedup.ScopedAsset("acme.example", "truck-1"), dedup.Verdict{Decision: dedup.Suppressed, Reason: dedup.Redelivery},
			start.Add(time.Duration(i)*2*time.Second))
	}
	var mine []stuckAsset
	for _, a := range allStuckAssets(start.Add(3 * time.Minute)) {
		if a.KeyPrefix == s.keyer.Prefix {
			mine = append(mine, a)
		}
	}
	if len(mine) != 1 || mine[0].Asset != "truck-1" || mine[0].Scope != "acme.example" {
		t.Fatalf("stuck assets %+v, want truck-1 in scope acme.example", mine)
	}
}
