package telemetrydedup

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
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

// On a Cluster a hung master holds up only the commands for its slots
// (README, Pipelining; its breaker zone opens alone): a ping of an asset on
// a healthy master is judged as usual. A batch holding a ping of an asset
// on each (a gateway forwarding its fleet's positions together) must
// give each the decision it would get alone: the healthy master's jitter
// fix of a parked asset is suppressed, as it is alone at the same moment.
// The whole batch was answered by the hung master's failure: the jitter fix
// went upstream "unchecked" beside the new ping.
func TestABatchSpanningAHungClusterMasterSuppressesTheHealthyOnesJitter(t *testing.T) {
	tt, nodeOf, parked, other, pingAt := gatewayOnACluster(t, "clus:", `,"breaker_failures":1`)
	if res := tt.post(pingAt(other, 0, 48.85, 2.35), "application/json", nil); res.status != http.StatusCreated {
		t.Fatalf("the other asset's first fix: %d %s", res.status, res.body)
	}

	hung := nodeOf(other)
	hung.Pause()
	defer hung.Resume()
	tt.upstream = nil
	// alone: the healthy master judges it
	if res := tt.post(pingAt(parked, 20, 52.52001, 13.40001), "application/json", nil); res.header.Get("X-Dedup") != "suppressed" {
		t.Fatalf("setup: jitter of the parked asset alone while the other master hangs: %d %s, want suppressed", res.status, res.header.Get("X-Dedup"))
	}
	// in a batch beside the hung master's asset: first while the hung
	// master's breaker zone is closed (the call waits for it), then open
	// (its claims fail at once, the others go to their master)
	for _, sec := range []int{25, 30} {
		tt.upstream = nil
		res := tt.post("["+pingAt(parked, sec, 52.51999, 13.39999)+","+pingAt(other, sec, 48.86, 2.36)+"]", "application/json", nil)
		for _, body := range tt.upstream {
			if strings.Contains(string(body), parked) || !strings.Contains(string(body), other) {
				t.Errorf("at %ds: the upstream got %s (X-Dedup %q, suppressed %q); want only the other asset's fix, unchecked",
					sec, body, res.header.Get("X-Dedup"), res.header.Get("X-Dedup-Suppressed"))
			}
		}
		if got := res.header.Get("X-Dedup-Suppressed"); got != "1" {
			t.Errorf("at %ds, batch [parked asset's jitter (healthy master), other asset's fix (hung master)]: %d X-Dedup %q, X-Dedup-Suppressed %q; want the jitter suppressed as alone (1)",
				sec, res.status, res.header.Get("X-Dedup"), got)
		}
	}
}

// The same gateway batch, the hung master's asset owing a release (its
// last request's upstream failed while the master hung, and the release
// could not reach it): the healthy master's jitter fix of a parked asset
// is suppressed alone, and must be in the batch too (README, Redis
// Cluster: "only its pings there go to on_store_error: those on the
// masters that answered keep their decisions, as alone"). The breaker
// makes the releases owed first, and their failure (ErrReleasesOwed)
// failed the whole call: the jitter went upstream unchecked in every such
// batch for as long as the release stayed owed. That failure counts in no
// zone, so the hung master's zone never opened to split the call either.
func TestABatchWithAHungMastersOwedReleaseSuppressesTheHealthyOnesJitter(t *testing.T) {
	tt, nodeOf, parked, other, pingAt := gatewayOnACluster(t, "owed:", "")

	// the other asset's fix is accepted, and its upstream fails while its
	// master hangs: the release cannot reach the master and is owed
	hung := nodeOf(other)
	defer hung.Resume()
	tt.upstreamStatus = func(body []byte) int {
		if strings.Contains(string(body), other) {
			hung.Pause()
			return http.StatusServiceUnavailable
		}
		return http.StatusCreated
	}
	if res := tt.post(pingAt(other, 0, 48.85, 2.35), "application/json", nil); res.status != http.StatusServiceUnavailable {
		t.Fatalf("setup: the other asset's fix, its upstream failing: %d %s", res.status, res.header.Get("X-Dedup"))
	}
	tt.upstreamStatus = nil

	tt.upstream = nil
	if res := tt.post(pingAt(parked, 20, 52.52001, 13.40001), "application/json", nil); res.header.Get("X-Dedup") != "suppressed" {
		t.Fatalf("setup: jitter of the parked asset alone while the other master hangs: %d %s, want suppressed", res.status, res.header.Get("X-Dedup"))
	}
	for _, sec := range []int{25, 30, 35} {
		tt.upstream = nil
		res := tt.post("["+pingAt(parked, sec, 52.51999, 13.39999)+","+pingAt(other, sec, 48.86, 2.36)+"]", "application/json", nil)
		for _, body := range tt.upstream {
			if strings.Contains(string(body), parked) {
				t.Errorf("at %ds: the upstream got the parked asset's jitter: %s (X-Dedup %q, suppressed %q)",
					sec, body, res.header.Get("X-Dedup"), res.header.Get("X-Dedup-Suppressed"))
			}
		}
		if got := res.header.Get("X-Dedup-Suppressed"); got != "1" {
			t.Errorf("at %ds, batch [parked asset's jitter (healthy master), fix of the asset owing a release (hung master)]: %d X-Dedup %q, X-Dedup-Suppressed %q; want the jitter suppressed as alone (1)",
				sec, res.status, res.header.Get("X-Dedup"), got)
		}
	}
}

// gatewayOnACluster is a sliding handler on a 3-master Cluster (its store
// block's extra JSON fields in storeExtra), two assets whose state lives on
// different masters, the first of them parked (its stay accepted, then its
// jitter suppressed), the master of an asset, and a ping of an asset sec
// seconds into the test's hour.
func gatewayOnACluster(t *testing.T, prefix, storeExtra string) (tt *tableTester, nodeOf func(asset string) *redistest.Server,
	parked, other string, pingAt func(asset string, sec int, lat, lon float64) string) {
	t.Helper()
	parked = "veh-parked"
	tt, nodeOf, other, pingAt = slidingOnACluster(t, prefix, "", storeExtra, parked)
	if res := tt.post(pingAt(parked, 0, 52.52, 13.40), "application/json", nil); res.status != http.StatusCreated {
		t.Fatalf("first fix: %d %s", res.status, res.body)
	}
	for sec := 5; sec <= 15; sec += 5 {
		if res := tt.post(pingAt(parked, sec, 52.52+float64(sec)*1e-6, 13.40), "application/json", nil); res.header.Get("X-Dedup") != "suppressed" {
			t.Fatalf("jitter at %ds: %d %s", sec, res.status, res.header.Get("X-Dedup"))
		}
	}
	return tt, nodeOf, parked, other, pingAt
}

// slidingOnACluster is a sliding handler on a 3-master Cluster, with the
// extra JSON fields of the handler and of its store block (each starting
// with a comma), the master of an asset, an asset on another master than
// first's, and a ping of an asset sec seconds into the test's hour.
func slidingOnACluster(t *testing.T, prefix, handlerExtra, storeExtra, first string) (tt *tableTester, nodeOf func(asset string) *redistest.Server,
	other string, pingAt func(asset string, sec int, lat, lon float64) string) {
	t.Helper()
	cluster := redistest.StartCluster(t, 3)
	a := cluster.Addrs()
	tt = tableHandler(t, fmt.Sprintf(`{"key_prefix":%q,"shape":"sliding"%s,"store":{"type":"redis","addresses":[%q,%q,%q],"timeout":%d%s}}`,
		prefix, handlerExtra, a[0], a[1], a[2], (200*time.Millisecond).Nanoseconds(), storeExtra))
	base := time.Now().UTC().Add(-time.Hour).Truncate(time.Minute)
	keyer := dedup.Keyer{Prefix: prefix}
	nodeOf = func(asset string) *redistest.Server {
		state, _ := keyer.TrackKeys(asset, base)
		return cluster.NodeFor(state)
	}
	for i := 0; other == ""; i++ {
		if id := fmt.Sprintf("veh-%d", i); nodeOf(id) != nodeOf(first) {
			other = id
		}
	}
	pingAt = func(asset string, sec int, lat, lon float64) string {
		return fmt.Sprintf(`{"asset_id":%q,"occurred_at":%q,"lat":%.7f,"lon":%.7f}`, asset, base.Add(time.Duration(sec)*time.Second).Format(time.RFC3339), lat, lon)
	}
	return tt, nodeOf, other, pingAt
}
