package telemetrydedup

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// While Redis hangs (past timeout, the breaker open), the near cache still
// answers the redeliveries of settled pings: sent alone, such a redelivery
// is suppressed, and the upstream does not get it again. Inside a batch it
// must get exactly the decision it would get alone (README, Batches: "every
// element ... gets exactly the decision ... it would get alone"): the
// batch's new ping goes upstream unchecked, the known duplicate does not.
// The near cache's answers were thrown away with the store error of the
// batch's misses, and the duplicate went upstream a second time,
// "unchecked" (on_store_error open, the default).
func TestANearCachedDuplicateInABatchIsSuppressedWhileRedisHangs(t *testing.T) {
	for _, shape := range []string{"tumbling", "sliding", "session"} {
		t.Run(shape, func(t *testing.T) {
			rdb := redistest.Start(t) // a connection, and a breaker, of its own
			tt := tableHandler(t, fmt.Sprintf(`{"key_prefix":"nearout:","shape":%q,"store":{"type":"redis","url":%q,"timeout":%d,"breaker_failures":1}}`,
				shape, rdb.URL(), (50*time.Millisecond).Nanoseconds()))
			at := time.Now().UTC().Add(-time.Hour)
			delivered := fmt.Sprintf(`{"asset_id":"veh-near","occurred_at":%q,"lat":52.52,"lon":13.40}`, at.Format(time.RFC3339))
			// later than the delivered ping, and first in the batch: the
			// batch is decided in device-time order, and its answers
			// must find their elements again
			fresh := fmt.Sprintf(`{"asset_id":"veh-new","occurred_at":%q,"lat":48.85,"lon":2.35}`, at.Add(time.Second).Format(time.RFC3339))
			if res := tt.post(delivered, "application/json", nil); res.status != http.StatusCreated {
				t.Fatalf("first delivery: %d %s", res.status, res.body)
			}
			// its redelivery, Redis up: the near cache learns the settled ping
			for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				res := tt.post(delivered, "application/json", nil)
				if res.header.Get("X-Dedup") == "suppressed" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("redelivery with Redis up: %d %s", res.status, res.header.Get("X-Dedup"))
				}
			}

			rdb.Pause()
			defer rdb.Resume()
			tt.upstream = nil
			// alone, Redis hung: the near cache answers it
			if res := tt.post(delivered, "application/json", nil); res.status != http.StatusOK || res.header.Get("X-Dedup") != "suppressed" {
				t.Fatalf("setup: the redelivery alone while Redis hangs: %d %s, want 200 suppressed from the near cache", res.status, res.header.Get("X-Dedup"))
			}
			// beside a new ping in a batch
			res := tt.post("["+fresh+","+delivered+"]", "application/json", nil)
			if len(tt.upstream) != 1 || !strings.Contains(string(tt.upstream[0]), "veh-new") {
				t.Errorf("the new ping the store could not judge must go upstream unchecked; the upstream got %q", tt.upstream)
			}
			for _, body := range tt.upstream {
				if strings.Contains(string(body), "veh-near") {
					t.Errorf("the upstream got the delivered ping again, in the batch's forward (X-Dedup %q, suppressed %q): %s",
						res.header.Get("X-Dedup"), res.header.Get("X-Dedup-Suppressed"), body)
				}
			}
			if got := res.header.Get("X-Dedup-Suppressed"); got != "1" {
				t.Errorf("batch [new ping, redelivery the near cache holds] while Redis hangs: %d X-Dedup %q, X-Dedup-Suppressed %q, want the redelivery suppressed as alone (1)",
					res.status, res.header.Get("X-Dedup"), got)
			}
		})
	}
}
