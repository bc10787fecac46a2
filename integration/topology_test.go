package integration

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// counterValue reads one series of a counter from Caddy's metrics endpoint.
func counterValue(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	return counterIn(scrape(t), name, labels)
}

// counterIn sums the counters of one family in scraped metrics whose labels
// match labels.
func counterIn(families map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	total := 0.0
	for _, m := range families[name].GetMetric() {
		match := true
		for _, l := range m.GetLabel() {
			if want, ok := labels[l.GetName()]; ok && want != l.GetValue() {
				match = false
			}
		}
		if match {
			total += m.GetCounter().GetValue()
		}
	}
	return total
}

// The sliding shape's script touches two keys per asset; through a real
// Cluster they share a hash slot and the article's Figure 2 still holds.
func TestClusterThroughCaddy(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	up := newUpstream(t)
	tester := startCaddy(t, up, fmt.Sprintf("store redis {\n\t\t\taddresses %s\n\t\t}\n\t\tshape sliding", strings.Join(cluster.Addrs(), " ")))
	at := base().Add(5 * time.Minute)
	want := []string{"accepted", "suppressed", "suppressed", "accepted"}
	for i, p := range [][]byte{
		ping("veh-cluster", at.Add(-4*time.Second), 52.5200087, 13.4049547),
		ping("veh-cluster", at, 52.5200087, 13.4049547),                     // across the boundary: sliding
		ping("veh-cluster", at.Add(-4*time.Second), 52.5200087, 13.4049547), // redelivery
		ping("veh-cluster", at.Add(10*time.Second), 52.5241000, 13.4102000), // moved
	} {
		if got := post(t, tester.Client, p).header.Get("X-Dedup"); got != want[i] {
			t.Errorf("ping %d: %s, want %s", i+1, got, want[i])
		}
	}
}

// TLS with a client certificate, an ACL user and a database number, all
// from the Caddyfile.
func TestRedisOverTLSWithACLAndDatabase(t *testing.T) {
	srv, files := redistest.StartTLS(t)
	srv.AddUser(t, "dedup", "s3cret")
	// caddytest rewrites any "/<name>.crt" or "/<name>.key" in a config to its
	// own directory, so hand Caddy the same PEM files under other names.
	ca, cert, key := pemCopy(t, files.CA), pemCopy(t, files.ClientCert), pemCopy(t, files.ClientKey)
	up := newUpstream(t)
	// A generous timeout: the first TLS handshake with a client certificate,
	// under the race detector, can take longer than the default 50ms.
	tester := startCaddy(t, up, fmt.Sprintf(`store redis %s {
			timeout 2s
			username dedup
			password s3cret
			db 3
			tls {
				ca %s
				cert %s
				key %s
				server_name %s
			}
		}`, srv.URL(), ca, cert, key, files.ServerName))
	body := ping("veh-tls", base(), 52.5200087, 13.4049547)
	post(t, tester.Client, body).expect(t, http.StatusCreated, "accepted")
	post(t, tester.Client, body).expect(t, http.StatusOK, "suppressed")

	dedupKey := up.requests()[0].header.Get("X-Dedup-Key")
	if exists, err := srv.Client().Exists(context.Background(), dedupKey).Result(); err != nil || exists != 0 {
		t.Fatalf("key in database 0: %d %v; it belongs in database 3", exists, err)
	}
	db3 := redisClientForDB(t, srv, 3)
	if exists, err := db3.Exists(context.Background(), dedupKey).Result(); err != nil || exists != 1 {
		t.Fatalf("key %s in database 3: %d %v", dedupKey, exists, err)
	}
}

func pemCopy(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), strings.NewReplacer(".crt", "-crt", ".key", "-key").Replace(filepath.Base(path))+".pem")
	if err := os.WriteFile(out, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return out
}

// A hung Redis (paused: connections open, nothing answered) is skipped
// after breaker_failures timeouts: the requests after that are answered
// unchecked at once instead of each waiting for the store timeout. When
// Redis answers again, a probe closes the breaker and decisions resume.
func TestBreakerSkipsAHungRedis(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	tester := startCaddy(t, up, `store redis `+srv.URL()+` {
			timeout 500ms
			breaker_failures 3
			breaker_cooldown 1s
		}`)
	at := base()
	post(t, tester.Client, ping("veh-breaker", at, 52.5200087, 13.4049547)).expect(t, http.StatusCreated, "accepted")

	errorsBefore := counterValue(t, "caddy_telemetry_dedup_store_errors_total", map[string]string{"op": "decide"})
	opensBefore := counterValue(t, "caddy_telemetry_dedup_breaker_transitions_total", map[string]string{"to": "open"})
	srv.Pause()
	const outage = 40
	for i := range outage {
		post(t, tester.Client, ping("veh-breaker", at.Add(time.Duration(i+1)*time.Second), 52.53+float64(i)*0.001, 13.40)).
			expect(t, http.StatusCreated, "unchecked")
	}
	timedOut := counterValue(t, "caddy_telemetry_dedup_store_errors_total", map[string]string{"op": "decide"}) - errorsBefore
	t.Logf("%d of %d requests during the hang reached the store and waited for its timeout", int(timedOut), outage)
	// The 3 that opened the breaker, and at most one probe per cool-down.
	if timedOut < 3 || timedOut > 6 {
		t.Errorf("%v store timeouts during the hang; want the 3 that open the breaker and a probe or two, not one per request", timedOut)
	}
	if opened := counterValue(t, "caddy_telemetry_dedup_breaker_transitions_total", map[string]string{"to": "open"}) - opensBefore; opened < 1 {
		t.Error("the breaker never opened")
	}

	srv.Resume()
	fresh := ping("veh-breaker-after", at, 52.5200087, 13.4049547)
	waitFor(t, func() bool { return post(t, tester.Client, fresh).header.Get("X-Dedup") == "accepted" })
	post(t, tester.Client, fresh).expect(t, http.StatusOK, "suppressed")
}

// The breaker probes with a growing backoff capped at breaker_cooldown (1s
// by default), so Redis is used again within about a second of coming back
// however long it was away. Killed for 5.5 s, a fixed 5 s cool-down would
// have probed just before the restart and then waited 5 s more.
func TestBreakerUsesARecoveredRedisWithinASecond(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	tester := startCaddy(t, up, "store redis "+srv.URL()+" {\n\t\t\ttimeout 100ms\n\t\t}")
	at := base()
	i := 0
	send := func() string {
		i++
		return post(t, tester.Client, ping(fmt.Sprintf("veh-recovery-%d", i), at, 52.5200087, 13.4049547)).header.Get("X-Dedup")
	}
	send()
	srv.Kill()
	for down := time.Now(); time.Since(down) < 5500*time.Millisecond; {
		if d := send(); d != "unchecked" {
			t.Fatalf("a ping while Redis was down: %s", d)
		}
	}
	srv.Restart()
	back := time.Now()
	unchecked := 0
	for send() == "unchecked" {
		unchecked++
		if time.Since(back) > 10*time.Second {
			t.Fatal("Redis was not used again within 10s of coming back")
		}
	}
	lag := time.Since(back)
	t.Logf("Redis was used again %s after it came back; %d pings went unchecked meanwhile", lag.Round(10*time.Millisecond), unchecked)
	if lag > 2500*time.Millisecond {
		t.Errorf("Redis was used again only %s after it came back; the breaker must probe at least once a second", lag)
	}
}

// Redis is killed in the middle of a load and restarted: failing open,
// no request gets a 5xx and nothing is lost; decisions resume after the
// restart.
func TestRedisKilledMidLoad(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	startCaddy(t, up, redisOptions(srv, ""))
	l := startLoad(t, siteURL, 8)
	time.Sleep(500 * time.Millisecond)
	srv.Kill()
	time.Sleep(time.Second)
	srv.Restart()
	time.Sleep(time.Second)
	l.finish()

	duplicated := l.upstreamCounts(t, up)
	t.Logf("%d deliveries: %v; %d observations went upstream twice while Redis was down (fail open)",
		l.delivered.Load(), l.decisions, duplicated)
	if l.serverErrors.Load() != 0 {
		t.Errorf("%d 5xx answers while Redis was down", l.serverErrors.Load())
	}
	if l.decisions["unchecked"] == 0 {
		t.Error("no delivery was answered unchecked: did Redis go down at all?")
	}

	tester := caddytestClient()
	fresh := ping("veh-after-restart", base(), 52.5200087, 13.4049547)
	waitFor(t, func() bool { return post(t, tester, fresh).header.Get("X-Dedup") == "accepted" })
	post(t, tester, fresh).expect(t, http.StatusOK, "suppressed")
}

// The master dies under load; the sentinels promote the replica and the
// module follows it. Failing open admits some duplicates while there is no
// master (and claims not yet replicated are lost with it): they are counted
// here, not hidden, and nothing is lost.
func TestSentinelFailoverUnderLoad(t *testing.T) {
	st := redistest.StartSentinel(t)
	up := newUpstream(t)
	startCaddy(t, up, fmt.Sprintf("store redis {\n\t\t\taddresses %s\n\t\t\tmaster %s\n\t\t\ttimeout 200ms\n\t\t\tbreaker_cooldown 500ms\n\t\t}",
		strings.Join(st.Addrs(), " "), st.MasterName))
	l := startLoad(t, siteURL, 8)
	time.Sleep(time.Second)
	killedAt := time.Now()
	st.Master().Kill()
	newMaster := st.WaitForFailover(t, 45*time.Second)
	failoverTook := time.Since(killedAt)
	time.Sleep(2 * time.Second)
	l.finish()

	duplicated := l.upstreamCounts(t, up)
	t.Logf("failover to %s took %s; %d deliveries: %v; %d observations reached the upstream twice (wrong decisions, fail open)",
		newMaster, failoverTook.Round(100*time.Millisecond), l.delivered.Load(), l.decisions, duplicated)
	if l.serverErrors.Load() != 0 {
		t.Errorf("%d 5xx answers during the failover", l.serverErrors.Load())
	}

	tester := caddytestClient()
	fresh := ping("veh-after-failover", base(), 52.5200087, 13.4049547)
	waitFor(t, func() bool { return post(t, tester, fresh).header.Get("X-Dedup") == "accepted" })
	post(t, tester, fresh).expect(t, http.StatusOK, "suppressed")
}

// The upstream fails a ping, Caddy releases its claim, and the Sentinel
// master dies before its replica has the release: the promoted replica
// holds the claim again. The sender's retries must be accepted once the
// new master answers, not told to come back until in_flight_timeout and
// then that the ping was delivered.
func TestReleaseLostInASentinelFailoverIsMadeAgain(t *testing.T) {
	st, link := redistest.StartSentinelLinked(t)
	replica := st.Replica().Client()
	up := newUpstream(t)
	var held sync.Once
	up.setResponse(func(w http.ResponseWriter, _ *http.Request) {
		// The claim is on the replica; what the master writes next is not.
		held.Do(func() {
			for deadline := time.Now().Add(5 * time.Second); replica.DBSize(context.Background()).Val() == 0 && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond)
			}
			link.Hold()
		})
		w.WriteHeader(http.StatusInternalServerError)
	})
	startCaddy(t, up, fmt.Sprintf("store redis {\n\t\t\taddresses %s\n\t\t\tmaster %s\n\t\t\ttimeout 500ms\n\t\t\tbreaker_cooldown 500ms\n\t\t}",
		strings.Join(st.Addrs(), " "), st.MasterName))
	tester := caddytestClient()
	releasedLate := func() float64 {
		return counterValue(t, "caddy_telemetry_dedup_reconciled_total", map[string]string{"outcome": "released_late"})
	}
	before := releasedLate()
	body := ping("veh-failover", base(), 52.5200087, 13.4049547)
	post(t, tester, body).expect(t, http.StatusInternalServerError, "accepted")

	st.Master().Kill()
	link.Cut()
	if link.Dropped() == 0 {
		t.Fatal("the cut dropped nothing: the replica may have had the release after all")
	}
	st.WaitForFailover(t, 45*time.Second)
	up.setResponse(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })

	var seen []string
	for deadline := time.Now().Add(40 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		res := post(t, tester, body)
		decision := res.header.Get("X-Dedup")
		if len(seen) == 0 || seen[len(seen)-1] != decision {
			seen = append(seen, decision)
		}
		if decision == "accepted" && res.status == http.StatusCreated {
			break
		}
		if decision == "suppressed" || time.Now().After(deadline) {
			t.Fatalf("the retries after the failover were answered %v: the ping whose request failed is lost", seen)
		}
	}
	t.Logf("the retries after the failover were answered %v", seen)
	if n := releasedLate() - before; n < 1 {
		t.Errorf("reconciled_total{outcome=released_late} grew by %v, want the release the failover undid", n)
	}
}
