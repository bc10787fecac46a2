package integration

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// commandCalls is INFO commandstats: calls per command, as Redis counted
// them, including the commands a Lua script runs (a settlement's script does
// one GET and one SET).
func commandCalls(t *testing.T, c *redis.Client) map[string]int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]int{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		v, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		calls[strings.TrimPrefix(name, "cmdstat_")], _ = strconv.Atoi(v)
	}
	return calls
}

// storeTraffic counts what the module sent Redis during f, whose requests
// make settlements store calls to settle what they forwarded: round trips by
// its own count, commands by Redis's. A request's answer does not wait for
// its settlement, so it first waits for the settlements to be answered.
func storeTraffic(t *testing.T, c *redis.Client, settlements uint64, f func()) (roundTrips float64, calls map[string]int) {
	t.Helper()
	rt := counterValue(t, "caddy_telemetry_dedup_redis_round_trips_total", nil)
	settled := storeCalls(scrape(t), "settle")
	before := commandCalls(t, c)
	f()
	for deadline := time.Now().Add(5 * time.Second); storeCalls(scrape(t), "settle") < settled+settlements; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d settlements never answered", settlements)
		}
	}
	after := commandCalls(t, c)
	calls = map[string]int{}
	for k, v := range after {
		if d := v - before[k]; d != 0 && k != "info" {
			calls[k] = d
		}
	}
	return counterValue(t, "caddy_telemetry_dedup_redis_round_trips_total", nil) - rt, calls
}

func TestStoreRoundTrips(t *testing.T) {
	srv := redistest.Start(t)
	inspector := srv.Client()
	up := newUpstream(t)
	tester := startCaddy(t, up, redisOptions(srv, ""))
	at := base()
	// Warm up: the connection.
	storeTraffic(t, inspector, 1, func() {
		post(t, tester.Client, ping("veh-rt-warm-up", at, 52.5200087, 13.4049547)).expect(t, http.StatusCreated, "accepted")
	})

	first := ping("veh-rt", at, 52.5200087, 13.4049547)
	rt, calls := storeTraffic(t, inspector, 1, func() { post(t, tester.Client, first).expect(t, http.StatusCreated, "accepted") })
	if rt != 2 || calls["set"] != 2 || len(calls) != 1 {
		t.Errorf("a new ping: %v round trips, commands %v; want the claim (SET NX) and its settlement (SET XX), no script", rt, calls)
	}
	rt, calls = storeTraffic(t, inspector, 0, func() {
		post(t, tester.Client, ping("veh-rt", at.Add(10*time.Second), 52.5200410, 13.4049920)).expect(t, http.StatusOK, "suppressed")
	})
	if rt != 0 || len(calls) != 0 {
		t.Errorf("a duplicate of a settled key: %v round trips, commands %v; want none (near cache)", rt, calls)
	}

	var elements []string
	for i := range 100 {
		elements = append(elements, string(ping(fmt.Sprintf("veh-rt-%d", i), at, 52.5200087, 13.4049547)))
	}
	batch := []byte("[" + strings.Join(elements, ",") + "]")
	rt, calls = storeTraffic(t, inspector, 1, func() {
		postBatch(t, tester.Client, "application/json", batch).expect(t, http.StatusCreated, "accepted")
	})
	if rt != 2 || calls["set"] != 200 || len(calls) != 1 {
		t.Errorf("a batch of 100 new pings: %v round trips, commands %v; want 2 round trips: 100 claims, then 100 settlements", rt, calls)
	}
	rt, calls = storeTraffic(t, inspector, 0, func() { postBatch(t, tester.Client, "application/json", batch).expect(t, http.StatusOK, "suppressed") })
	if rt != 0 {
		t.Errorf("the same batch again: %v round trips, commands %v; want none (near cache)", rt, calls)
	}
}

func TestRoundTripsWithoutTheNearCache(t *testing.T) {
	srv := redistest.Start(t)
	inspector := srv.Client()
	up := newUpstream(t)
	tester := startCaddy(t, up, redisOptions(srv, "near_cache off"))
	body := ping("veh-no-cache", base(), 52.5200087, 13.4049547)
	storeTraffic(t, inspector, 1, func() { post(t, tester.Client, body).expect(t, http.StatusCreated, "accepted") })
	rt, calls := storeTraffic(t, inspector, 0, func() { post(t, tester.Client, body).expect(t, http.StatusOK, "suppressed") })
	if rt != 1 || calls["set"] != 1 || len(calls) != 1 {
		t.Errorf("a duplicate without near cache: %v round trips, commands %v; want one SET", rt, calls)
	}
}

// A request's answer does not wait for its settlement, yet the redelivery
// a sender makes as soon as it has the answer finds the claim settled: the
// settlement goes to Redis ahead of every later claim. Without the near
// cache every redelivery is judged by Redis.
func TestRedeliveryRightAfterTheAnswerIsSuppressed(t *testing.T) {
	for _, shape := range []string{"tumbling", "sliding"} {
		t.Run(shape, func(t *testing.T) {
			srv := redistest.Start(t)
			up := newUpstream(t)
			tester := startCaddy(t, up, redisOptions(srv, "near_cache off\n\t\tshape "+shape))
			at := base()
			for i := range 200 {
				body := ping(fmt.Sprintf("veh-redeliver-%s-%d", shape, i), at, 52.5200087, 13.4049547)
				post(t, tester.Client, body).expect(t, http.StatusCreated, "accepted")
				post(t, tester.Client, body).expect(t, http.StatusOK, "suppressed")
			}
		})
	}
}

// With the near cache on, a first request whose upstream fails is released
// and its retry accepted: nothing the upstream did not take is cached.
func TestNearCacheAfterAnUpstreamFailure(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	tester := startCaddy(t, up, redisOptions(srv, ""))
	body := ping("veh-nc-fail", base(), 52.5200087, 13.4049547)
	up.setResponse(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusInternalServerError) })
	post(t, tester.Client, body).expect(t, http.StatusInternalServerError, "accepted")
	up.setResponse(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	post(t, tester.Client, body).expect(t, http.StatusCreated, "accepted")
	post(t, tester.Client, body).expect(t, http.StatusOK, "suppressed")
}
