package dedup

import (
	"context"
	"testing"
	"time"
)

// The design article's troubleshooting table, row by row. Rows covered by
// tests elsewhere say where:
//
//   - "A moving vehicle is reported as stationary": TestCoarseResolutionSwallowsRealMovement.
//   - "Two pings seconds apart both admitted": TestBucketBoundaryAdmitsBothSides, TestFigure2.
//   - "A delayed ping suppresses a newer one": TestOutOfOrderArrivalIsKeyedOnDeviceTime.
//   - "Suppression rate jumps to 100% for one asset" (a null-island reading):
//     TestParseRejectsInvalidPings/null_island.
//   - "Redis memory grows without bound": TestRedisKeysAlwaysCarryTheTTL.

// "Duplicates appear hours after deploy, never in testing": a TTL derived
// from the window expires before the provider's later retries, and each of
// them is admitted as new. The TTL from the retry ladder catches them all.
func TestTroubleshootingTTLFromTheWindowAdmitsLateRetries(t *testing.T) {
	ladderTTL, _, err := TTLPolicy{Window: DefaultWindow}.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name     string
		ttl      time.Duration
		admitted int // of the 5 retries of the ladder
	}{
		// The retry at exactly 5m finds the key just expired, as do the rest.
		{"ttl = window", DefaultWindow, 4},
		{"ttl = last retry + margin", ladderTTL, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := NewMemoryStore(0)
			clock := articleBase
			m.elapsed = func() time.Duration { return clock.Sub(articleBase) }
			d := newTestDeduper(m, Tumbling)
			d.Policy.TTL = tt.ttl
			d.settled(t, parked)
			admitted := 0
			for _, attempt := range DefaultRetryLadder {
				clock, d.clock = articleBase.Add(attempt), articleBase.Add(attempt)
				c, v := d.claim(t, parked)
				if v.Decision == Accepted {
					admitted++
					d.Settle(context.Background(), c)
				}
			}
			if admitted != tt.admitted {
				t.Fatalf("%d of the ladder's 5 retries admitted as new, want %d", admitted, tt.admitted)
			}
		})
	}
}

// "A parked vehicle produces thousands of events a day": position not
// quantised coarsely enough, so GPS jitter reads as movement. On a consumer
// receiver that stood still for 20 minutes (p95 jitter 20 m), sub-metre
// cells admit a fix every few seconds; resolution 12 collapses them.
func TestTroubleshootingJitterReadsAsMovementWithoutQuantisation(t *testing.T) {
	fixes := readRMC(t, parkedTrace)
	admitted := func(resolution int) int {
		d := newTestDeduper(NewMemoryStore(0), Tumbling)
		d.Keyer.Resolution = resolution
		n := 0
		for _, f := range fixes {
			if d.settled(t, f.Ping).Decision == Accepted {
				n++
			}
		}
		return n
	}
	fine, quantised := admitted(15), admitted(DefaultResolution)
	t.Logf("%d fixes: %d admitted at resolution 15, %d at 12", len(fixes), fine, quantised)
	if fine < 10*quantised || quantised > 20 {
		t.Fatalf("resolution 15 admitted %d and 12 admitted %d of %d fixes", fine, quantised, len(fixes))
	}
}
