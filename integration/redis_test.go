package integration

import (
	"bytes"
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

// connectionsReceived is how many connections a Redis has accepted since it
// started (INFO stats total_connections_received).
func connectionsReceived(t *testing.T, c *redis.Client) int {
	t.Helper()
	info, err := c.Info(context.Background(), "stats").Result()
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(info, "total_connections_received:")
	n, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(rest, "\n", 2)[0]))
	return n
}

// redisClientForDB returns a client on srv's database db.
func redisClientForDB(t *testing.T, srv *redistest.Server, db int) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(strings.Replace(srv.URL(), "/0", "/"+strconv.Itoa(db), 1))
	if err != nil {
		t.Fatal(err)
	}
	opts.TLSConfig = srv.Client().Options().TLSConfig
	opts.Username, opts.Password = srv.Client().Options().Username, srv.Client().Options().Password
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func redisOptions(srv *redistest.Server, extra string) string {
	return fmt.Sprintf("store redis %s {\n\t\t\ttimeout 200ms\n\t\t}\n\t\t%s", srv.URL(), extra)
}

func TestRedisStoreThroughCaddy(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	tester := startCaddy(t, up, redisOptions(srv, "retry_ladder 1m 1h\n\t\toutage_margin 30m"))
	body := ping("veh-redis", base(), 52.5200087, 13.4049547)

	post(t, tester.Client, body).expect(t, http.StatusCreated, "accepted")
	post(t, tester.Client, body).expect(t, http.StatusOK, "suppressed")

	key := up.requests()[0].header.Get("X-Dedup-Key")
	pttl, err := srv.Client().PTTL(context.Background(), key).Result()
	if err != nil {
		t.Fatalf("PTTL %s: %v", key, err)
	}
	if want := 90 * time.Minute; pttl <= want-time.Second || pttl > want {
		t.Fatalf("key %s has PTTL %v in Redis, want %v (last retry 1h + margin 30m)", key, pttl, want)
	}
	if n := up.count(); n != 1 {
		t.Fatalf("upstream saw %d requests, want 1", n)
	}
}

func TestRedisDownFailsOpen(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	tester := startCaddy(t, up, redisOptions(srv, "on_store_error open"))
	body := ping("veh-open", base(), 52.5200087, 13.4049547)

	srv.Kill()
	post(t, tester.Client, body).expect(t, http.StatusCreated, "unchecked")
	post(t, tester.Client, body).expect(t, http.StatusCreated, "unchecked")
	if n := up.count(); n != 2 {
		t.Fatalf("upstream saw %d requests; failing open must forward every ping", n)
	}

	srv.Restart()
	waitFor(t, func() bool { return post(t, tester.Client, body).header.Get("X-Dedup") == "accepted" })
	post(t, tester.Client, body).expect(t, http.StatusOK, "suppressed")
}

func TestRedisDownFailsClosed(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	tester := startCaddy(t, up, redisOptions(srv, "on_store_error closed"))
	srv.Kill()

	res := post(t, tester.Client, ping("veh-closed", base(), 52.5200087, 13.4049547))
	res.expect(t, http.StatusServiceUnavailable, "unavailable")
	if res.header.Get("Retry-After") == "" {
		t.Fatal("503 without Retry-After")
	}
	if n := up.count(); n != 0 {
		t.Fatalf("upstream saw %d requests; failing closed must forward nothing", n)
	}
}

// Provision does no network I/O: a config pointing at a Redis that is not
// there loads, and pings follow on_store_error until it comes up.
func TestConfigLoadsWhileRedisIsDown(t *testing.T) {
	srv := redistest.Start(t)
	srv.Kill()
	up := newUpstream(t)
	tester := startCaddy(t, up, redisOptions(srv, ""))
	body := ping("veh-late-redis", base(), 52.5200087, 13.4049547)
	post(t, tester.Client, body).expect(t, http.StatusCreated, "unchecked")

	srv.Restart()
	waitFor(t, func() bool { return post(t, tester.Client, body).header.Get("X-Dedup") == "accepted" })
}

// A config reload hands the new config the same Redis client: Redis accepts
// no new connections because of reloads.
func TestReloadsReuseRedisConnections(t *testing.T) {
	srv := redistest.Start(t)
	inspector := srv.Client()
	up := newUpstream(t)
	at := base()

	accepted := func() int { return connectionsReceived(t, inspector) }
	tester := startCaddy(t, up, redisOptions(srv, ""))
	post(t, tester.Client, ping("veh-reload-0", at, 52.5200087, 13.4049547)).expect(t, http.StatusCreated, "accepted")
	before := accepted()

	for i := 1; i <= 5; i++ {
		tester = startCaddy(t, up, redisOptions(srv, fmt.Sprintf("max_future %dm", 5+i)))
		post(t, tester.Client, ping(fmt.Sprintf("veh-reload-%d", i), at, 52.5200087, 13.4049547)).expect(t, http.StatusCreated, "accepted")
		post(t, tester.Client, ping("veh-reload-0", at, 52.5200087, 13.4049547)).expect(t, http.StatusOK, "suppressed")
	}
	if after := accepted(); after != before {
		t.Fatalf("Redis accepted %d new connections over 5 reloads; reloads must reuse the pooled client", after-before)
	}
}

// Caddy cleans a config up as soon as a reload has replaced it, while the
// requests it started still run. A reload that changes the Redis settings
// (a new client) must leave the old client open for them: a request whose
// upstream fails after the reload still releases its claim, and the
// sender's retry is accepted, not suppressed as a redelivery of a ping the
// backend never stored.
func TestAReloadKeepsTheClientOfTheRequestsStillRunning(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	store := func(timeout string) string {
		return fmt.Sprintf("store redis %s {\n\t\t\ttimeout %s\n\t\t}\n\t\tin_flight_timeout 5s", srv.URL(), timeout)
	}
	tester := startCaddy(t, up, store("200ms"))
	body := ping("veh-reload-in-flight", base(), 52.5200087, 13.4049547)
	arrived, release := holdUpstream(up, http.StatusInternalServerError, "")
	first := make(chan response, 1)
	go func() { first <- post(t, tester.Client, body) }()
	<-arrived
	tester = startCaddy(t, up, store("250ms"))
	answering(up, http.StatusCreated, "", "")
	release()
	(<-first).expect(t, http.StatusInternalServerError, "accepted")
	post(t, tester.Client, body).expect(t, http.StatusCreated, "accepted")
}

// A reload that replaces the Redis connection while Redis hangs (an
// operator raising timeout because Redis is slow) must not abandon what the
// old connection's reconciler still owes: the claim written during the hang
// lands once Redis answers, and only that reconciler knows to release it.
// Abandoned, the sender's retry is told to come back until in_flight_timeout
// and then that the ping was delivered, which the upstream never saw.
func TestAReloadKeepsTheReconcilerOfTheReplacedConnection(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	store := func(timeout string) string {
		return fmt.Sprintf("store redis %s {\n\t\t\ttimeout %s\n\t\t}\n\t\ton_store_error closed\n\t\tin_flight_timeout 2s", srv.URL(), timeout)
	}
	tester := startCaddy(t, up, store("100ms"))
	warmRedisConnections(t, tester.Client, srv)
	body := ping("veh-reload-owed", base(), 52.5200087, 13.4049547)

	duringHang(srv, func() {
		post(t, tester.Client, body).expect(t, http.StatusServiceUnavailable, "unavailable")
		tester = startCaddy(t, up, store("150ms"))
	})
	acceptedOnRetry(t, tester.Client, body)
	if n := up.received(body); n != 1 {
		t.Errorf("the upstream got the ping %d times, want once", n)
	}
}

// Stopping Caddy (SIGINT or SIGTERM, caddy stop) with a grace_period shorter
// than a request still waiting for its upstream ends that request with the
// process, before its upstream answered. Its claim must not outlive it as
// pending in Redis: the sender's retry after the restart would be told to
// come back until in_flight_timeout, and then that the ping was delivered,
// which the upstream never took. A reload made while the request waits
// (caddy reload, then a restart) changes nothing: the request belongs to
// the replaced config, whose connection may be the new config's or its own,
// also when the new config uses Redis nowhere, or not the module at all.
func TestAStopMidRequestLeavesNoClaimBehind(t *testing.T) {
	caddy := buildCaddy(t)
	for _, tc := range []struct {
		name   string
		reload string // the store after a reload made mid-request: "" for no reload, "-" for a config without the module
	}{
		{name: "no reload"},
		{name: "after a reload that keeps the connection", reload: "redis 100ms"},
		{name: "after a reload that replaces the connection", reload: "redis 150ms"},
		{name: "after a reload to the memory store", reload: "memory"},
		{name: "after a reload without the module", reload: "-"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			up := newUpstream(t)
			port := freePort(t)
			config := func(store string, maxFuture int) string {
				if timeout, ok := strings.CutPrefix(store, "redis "); ok {
					store = fmt.Sprintf("redis %s {\n\t\t\ttimeout %s\n\t\t}", srv.URL(), timeout)
				}
				module := fmt.Sprintf(`telemetry_dedup /telemetry {
		store %s
		in_flight_timeout 3s
		max_future %dm
	}`, store, maxFuture)
				if store == "-" {
					module = ""
				}
				return fmt.Sprintf(`{
	auto_https off
	grace_period 200ms
}
:%d {
	%s
	reverse_proxy %s
}`, port, module, strings.TrimPrefix(up.URL, "http://"))
			}
			p := runCaddy(t, caddy, config("redis 100ms", 5), port)
			url := "http://" + p.listen + "/telemetry"
			body := ping("veh-stopped-mid-request", base(), 52.5200087, 13.4049547)
			arrived, release := holdUpstream(up, http.StatusInternalServerError, "")
			first := make(chan string, 1)
			go func() {
				res, err := http.Post(url, "application/json", bytes.NewReader(body))
				if err != nil {
					first <- err.Error()
					return
				}
				res.Body.Close()
				first <- fmt.Sprintf("%d %s", res.StatusCode, res.Header.Get("X-Dedup"))
			}()
			<-arrived
			if tc.reload != "" {
				reload(t, p.admin, config(tc.reload, 6))
			}
			p.stop()
			release()
			// The cut request's 504 is written by Caddy's server after the
			// handler returns, and the process may end first: then the
			// sender sees the connection close, which every client retries
			// as it retries a 504. Never a 499, which some clients drop.
			if got := <-first; got != "504 accepted" && !strings.HasSuffix(got, ": EOF") {
				t.Errorf("the request cut by the stop was answered %q; want 504 accepted, as an upstream cut for hanging (or the connection closed by the exit)", got)
			}
			answering(up, http.StatusCreated, "", "")

			runCaddy(t, caddy, config("redis 100ms", 5), port)
			client := &http.Client{Timeout: 5 * time.Second}
			var seen []int
			for range 25 {
				res, err := client.Post(url, "application/json", bytes.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				res.Body.Close()
				if res.StatusCode != http.StatusConflict && res.StatusCode < 500 {
					if res.StatusCode != http.StatusCreated || res.Header.Get("X-Dedup") != "accepted" {
						t.Fatalf("the retry after the restart got %d X-Dedup=%q after %v; want 201 accepted: the upstream never took the ping",
							res.StatusCode, res.Header.Get("X-Dedup"), seen)
					}
					t.Logf("the retry after the restart: %v, then accepted", seen)
					return
				}
				seen = append(seen, res.StatusCode)
				time.Sleep(200 * time.Millisecond)
			}
			t.Fatalf("no final answer in 25 tries: %v", seen)
		})
	}
}

// A reload that leaves a Redis connection to no config (the new one has
// the memory store) keeps it open while its reconciler owes releases. When
// Caddy then exits, the reconciler's last pass must be made before the
// process ends: a Redis back (restarted with its data) just before the
// exit gets the release of the claim of a request whose upstream failed
// while Redis was down, and the sender's retry after the restart is
// accepted, not told to come back and then that its ping was delivered.
func TestAnExitWaitsForAConnectionNoConfigUses(t *testing.T) {
	caddy := buildCaddy(t)
	srv := redistest.StartWith(t, "--appendonly", "yes", "--appendfsync", "always")
	up := newUpstream(t)
	port := freePort(t)
	config := func(store string) string {
		return fmt.Sprintf(`{
	auto_https off
}
:%d {
	telemetry_dedup /telemetry {
		store %s
	}
	reverse_proxy %s
}`, port, store, strings.TrimPrefix(up.URL, "http://"))
	}
	onRedis := fmt.Sprintf("redis %s {\n\t\t\ttimeout 100ms\n\t\t}", srv.URL())
	send := func(body []byte) string {
		res, err := http.Post("http://127.0.0.1:"+strconv.Itoa(port)+"/telemetry", "application/json", bytes.NewReader(body))
		if err != nil {
			return err.Error()
		}
		res.Body.Close()
		return fmt.Sprintf("%d %s", res.StatusCode, res.Header.Get("X-Dedup"))
	}
	p := runCaddy(t, caddy, config(onRedis), port)
	body := ping("veh-owed-at-exit", base(), 52.5200087, 13.4049547)
	arrived, release := holdUpstream(up, http.StatusInternalServerError, "")
	first := make(chan string, 1)
	go func() { first <- send(body) }()
	<-arrived
	srv.Kill() // the claim is on disk; its release is refused
	release()
	if got := <-first; got != "500 accepted" {
		t.Fatalf("the request whose upstream failed: %q, want 500 accepted", got)
	}
	reload(t, p.admin, config("memory"))
	time.Sleep(1600 * time.Millisecond) // the reconciler's tries, refused, back off to 1.6 s apart
	srv.Restart()
	began := time.Now()
	p.stop()
	t.Logf("the exit took %v", time.Since(began)) // up to a second more while the connection looked for it once a second

	answering(up, http.StatusCreated, "", "")
	runCaddy(t, caddy, config(onRedis), port)
	if got := send(body); got != "201 accepted" {
		t.Errorf("the retry after the restart: %q, want 201 accepted: the upstream never took the ping", got)
	}
}
