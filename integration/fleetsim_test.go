package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/fleetsim"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// The fleet simulator against a real Caddy and a real Redis, the way an
// operator runs tools/fleetsim: its backend behind reverse_proxy scores
// what reached it. A short fleet, in each track shape: parked assets cost
// about one admission per window, and nothing is lost or let through twice.
func TestFleetSimulatorThroughCaddyAndRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates a fleet through Caddy; skipped with -short")
	}
	srv := redistest.Start(t)
	for _, shape := range []string{"sliding", "session"} {
		t.Run(shape, func(t *testing.T) {
			sim, err := fleetsim.NewHTTPDecider(siteURL, "127.0.0.1:0", fleetsim.Fields{})
			if err != nil {
				t.Fatal(err)
			}
			defer sim.Close()
			// A second, not the default 50ms: on a machine loaded by the
			// other packages' tests, a call past 50ms is unchecked and its
			// redelivery admitted, as on_store_error open says.
			caddyTester(t, fmt.Sprintf(caddytestGlobals+`
http://localhost:{$TD_TEST_HTTP_PORT} {
	telemetry_dedup /telemetry {
		key_prefix %q
		shape %s
		store redis %s {
			timeout 1s
		}
	}
	reverse_proxy %s
}`, "fleetsim:"+t.Name()+":", shape, srv.URL(), sim.UpstreamAddr()))
			cfg := fleetsim.Config{Assets: 6, Duration: 2 * time.Hour, AssetPrefix: shape + "-", Concurrency: 3}
			sc, err := fleetsim.Run(context.Background(), cfg, sim)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d pings: %.2f parked admissions per window, %d lost moves, %d of %d redeliveries admitted",
				sc.Pings, sc.ParkedAdmissionsPerWindow, sc.LostMoves, sc.RedeliveriesAdmitted, sc.RedeliveriesSent)
			if sc.ParkedAdmissionsPerWindow > 1.3 || sc.LostMoves != 0 || sc.RedeliveriesAdmitted != 0 {
				t.Errorf("%.2f parked admissions per window (want at most 1.3), %d lost moves, %d redeliveries admitted (want none)",
					sc.ParkedAdmissionsPerWindow, sc.LostMoves, sc.RedeliveriesAdmitted)
			}
		})
	}
}
