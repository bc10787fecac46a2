package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// retryUntilFinal sends body until the answer is neither a 409 nor a 5xx,
// as a sender does, waiting between tries, and returns the final answer and
// the statuses before it.
func retryUntilFinal(t *testing.T, client *http.Client, body []byte, tries int, wait time.Duration) (response, []int) {
	t.Helper()
	var seen []int
	for range tries {
		res := post(t, client, body)
		if res.status != http.StatusConflict && res.status < 500 {
			return res, seen
		}
		seen = append(seen, res.status)
		time.Sleep(wait)
	}
	t.Fatalf("no final answer in %d tries: %v", tries, seen)
	return response{}, nil
}

// committed counts the pings an upstream took: answered 201 to the proxy.
type committed struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *committed) add(body []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[string(body)]++
}

func (c *committed) of(body []byte) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[string(body)]
}

// duringHang runs send while srv hangs (paused until a second after send
// returns), then lets srv answer what it was sent.
func duringHang(srv *redistest.Server, send func()) {
	srv.Pause()
	send()
	time.Sleep(time.Second)
	srv.Resume()
}

// acceptedOnRetry requires a sender retrying body to have it accepted.
func acceptedOnRetry(t *testing.T, client *http.Client, body []byte) {
	t.Helper()
	res, seen := retryUntilFinal(t, client, body, 25, 200*time.Millisecond)
	res.expect(t, http.StatusCreated, "accepted")
	t.Logf("after the hang: %v, then accepted", seen)
}

// warmRedisConnections sends a few pings at once, so that the store has
// connections ready before a fault: a connection opened to a hung Redis
// waits in its handshake and never writes the claim, which would leave
// these tests nothing to reconcile. It then waits until nothing of the
// warm-up is on its way: the settlements, which go after the answers (a
// batch of them still on its way when Redis hangs holds up the pipeline,
// the claim made during the hang waits past its timeout behind it and is
// never written, and again there would be nothing to reconcile), and the
// reconciler's calls for the pings whose own claim call timed out on a
// loaded machine (answered as on_store_error says, their claims perhaps
// never written, by design).
func warmRedisConnections(t *testing.T, client *http.Client, srv *redistest.Server) {
	t.Helper()
	const n = 4
	reconciledBefore := reconcilerAnswers(t)
	var accepted atomic.Int32
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			res := post(t, client, ping(fmt.Sprintf("veh-warm-up-%d", i), base(), 52.5200087, 13.4049547))
			if res.header.Get("X-Dedup") == "accepted" {
				accepted.Add(1)
			}
		})
	}
	wg.Wait()
	unsure := n - int(accepted.Load()) // each handed to the reconciler
	rdb := srv.Client()
	waitFor(t, func() bool {
		ctx := context.Background()
		keys := rdb.Keys(ctx, "*").Val()
		for _, k := range keys {
			if v := rdb.Get(ctx, k).Val(); !strings.HasPrefix(v, "a") { // a settled claim's record
				return false
			}
		}
		return len(keys) >= n-unsure && reconcilerAnswers(t) >= reconciledBefore+float64(unsure)
	})
}

// reconcilerAnswers is how many claims the reconciler has had the store's
// first answer for so far.
func reconcilerAnswers(t *testing.T) float64 {
	n := 0.0
	for _, outcome := range []string{"settled", "released", "not_held"} {
		n += counterValue(t, "caddy_telemetry_dedup_reconciled_total", map[string]string{"outcome": outcome})
	}
	return n
}

// hungRedisStore is the store option of the tests in which srv hangs past
// the store's timeout. The timeout is 500 ms, not 100: on a loaded machine
// under -race, calls took over 100 ms that Redis was not keeping waiting.
// The claim made as it began to hang was then never sent, leaving nothing
// to reconcile (failing closed: "the reconciler released nothing"), or a
// retry's call after the hang timed out too and was answered as
// on_store_error says (failing open: 201 unchecked, where the test wants
// the retry accepted or the redelivery suppressed). The hang still
// outlasts the timeout by a second (duringHang).
func hungRedisStore(srv *redistest.Server) string {
	return "store redis " + srv.URL() + " {\n\t\t\ttimeout 500ms\n\t\t}"
}

// The first fault, failing closed: Redis hangs past the timeout, so
// the sender gets 503 while the SET NX lands later. The reconciler releases
// that claim by token once Redis answers, and the sender's retry is
// accepted, instead of 409 for in_flight_timeout and then "suppressed" for
// an observation the upstream never got.
func TestTimedOutClaimIsReleasedFailingClosed(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	tester := startCaddy(t, up, hungRedisStore(srv)+"\n\t\ton_store_error closed")
	warmRedisConnections(t, tester.Client, srv)
	before := reconcilerReleases(t)
	body := ping("veh-hung-closed", base(), 52.5200087, 13.4049547)

	duringHang(srv, func() { post(t, tester.Client, body).expect(t, http.StatusServiceUnavailable, "unavailable") })
	acceptedOnRetry(t, tester.Client, body)
	if n := up.received(body); n != 1 {
		t.Errorf("the upstream got the ping %d times, want once", n)
	}
	if reconcilerReleases(t) <= before {
		t.Error("the reconciler released nothing: did the SET NX land at all?")
	}
}

// reconcilerReleases is how many claims the reconciler has released so far.
func reconcilerReleases(t *testing.T) float64 {
	return counterValue(t, "caddy_telemetry_dedup_reconciled_total", map[string]string{"outcome": "released"}) +
		counterValue(t, "caddy_telemetry_dedup_reconciled_total", map[string]string{"outcome": "released_late"})
}

// Failing open, the same fault and an unchecked forward that fails: the
// late claim is released, and the retry is accepted and reaches the
// upstream, rather than being suppressed as a redelivery of a ping the
// upstream refused.
func TestTimedOutClaimIsReleasedWhenTheUncheckedForwardFails(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	tester := startCaddy(t, up, hungRedisStore(srv))
	warmRedisConnections(t, tester.Client, srv)
	body := ping("veh-hung-open-failed", base(), 52.5200087, 13.4049547)
	var took committed
	var once sync.Once
	up.setResponse(func(w http.ResponseWriter, r *http.Request) {
		got, _ := io.ReadAll(r.Body)
		failed := false
		if bytes.Equal(got, body) {
			once.Do(func() { failed = true })
		}
		if failed {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		took.add(got)
		w.WriteHeader(http.StatusCreated)
	})

	before := reconcilerReleases(t)
	duringHang(srv, func() { post(t, tester.Client, body).expect(t, http.StatusInternalServerError, "unchecked") })
	acceptedOnRetry(t, tester.Client, body)
	if n := took.of(body); n != 1 {
		t.Errorf("the upstream took the ping %d times, want once", n)
	}
	waitFor(t, func() bool { return reconcilerReleases(t) > before }) // the late claim landed, and was released
}

// Failing open, the same fault and an unchecked forward that succeeds: the
// late claim is settled, so the redelivery is suppressed and the upstream
// gets the observation once.
func TestTimedOutClaimIsSettledWhenTheUncheckedForwardSucceeds(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	tester := startCaddy(t, up, hungRedisStore(srv))
	warmRedisConnections(t, tester.Client, srv)
	settled := func() float64 {
		return counterValue(t, "caddy_telemetry_dedup_reconciled_total", map[string]string{"outcome": "settled"})
	}
	before := settled()
	body := ping("veh-hung-open-ok", base(), 52.5200087, 13.4049547)

	duringHang(srv, func() { post(t, tester.Client, body).expect(t, http.StatusCreated, "unchecked") })
	waitFor(t, func() bool { return settled() > before })

	res, seen := retryUntilFinal(t, tester.Client, body, 25, 200*time.Millisecond)
	res.expect(t, http.StatusOK, "suppressed")
	if len(seen) > 0 {
		t.Errorf("the redelivery was answered %v before it was suppressed", seen)
	}
	if n := up.received(body); n != 1 {
		t.Errorf("the upstream got the ping %d times, want once", n)
	}
}

// The second fault: an upstream that hangs past in_flight_timeout
// and then fails. The module cuts the upstream request at the bound and
// releases the claim before in_flight_timeout, so redeliveries are asked to
// come back while it hangs and accepted after, never suppressed.
func TestHungUpstreamIsCutBeforeInFlightTimeout(t *testing.T) {
	up := newUpstream(t)
	tester := startCaddy(t, up, "in_flight_timeout 2s")
	body := ping("veh-hung-upstream", base(), 52.5200087, 13.4049547)
	var took committed
	var once sync.Once
	up.setResponse(func(w http.ResponseWriter, r *http.Request) {
		hang := false
		once.Do(func() { hang = true })
		if hang {
			select {
			case <-r.Context().Done(): // the proxy gave up on it: nothing taken
			case <-time.After(20 * time.Second):
				w.WriteHeader(http.StatusInternalServerError)
			}
			return
		}
		got, _ := io.ReadAll(r.Body)
		took.add(got)
		w.WriteHeader(http.StatusCreated)
	})

	first := make(chan response, 1)
	start := time.Now()
	go func() { first <- post(t, caddytestClient(), body) }()
	waitFor(t, func() bool { return up.count() == 1 })
	res, seen := retryUntilFinal(t, tester.Client, body, 40, 250*time.Millisecond)
	res.expect(t, http.StatusCreated, "accepted")
	cut := <-first
	t.Logf("the hung request was answered %d after %s; its redelivery %v, then accepted", cut.status, time.Since(start).Round(100*time.Millisecond), seen)
	if cut.status != http.StatusGatewayTimeout {
		t.Errorf("the hung request was answered %d, want 504 from the cut", cut.status)
	}
	if len(seen) == 0 || seen[0] != http.StatusConflict {
		t.Errorf("the redelivery during the hang was answered %v, want 409 first", seen)
	}
	if n := took.of(body); n != 1 {
		t.Errorf("the upstream took the ping %d times, want once", n)
	}
}

// The cut is logged where an operator looks: a warning naming
// in_flight_timeout in Caddy's log, through a real reverse_proxy, whose
// error for the cut is the deadline's. (Helper 4's review, stop 63.)
func TestACutUpstreamIsLoggedNamingInFlightTimeout(t *testing.T) {
	up := newUpstream(t)
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	globals := strings.Replace(caddytestGlobals, "skip_install_trust", "skip_install_trust\n\tlog {\n\t\toutput file "+logFile+"\n\t\tlevel WARN\n\t}", 1)
	tester := caddyTester(t, fmt.Sprintf(globals+`
http://localhost:{$TD_TEST_HTTP_PORT} {
	telemetry_dedup /telemetry {
		key_prefix %q
		in_flight_timeout 2s
	}
	reverse_proxy %s
}`, keyPrefix(t), strings.TrimPrefix(up.URL, "http://")))
	up.setResponse(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done(): // the proxy gave up on it
		case <-time.After(20 * time.Second):
			w.WriteHeader(http.StatusCreated)
		}
	})
	if res := post(t, tester.Client, ping("veh-cut-logged", base(), 52.5200087, 13.4049547)); res.status != http.StatusGatewayTimeout {
		t.Fatalf("the hung request was answered %d, want 504 from the cut", res.status)
	}
	waitFor(t, func() bool {
		logged, _ := os.ReadFile(logFile)
		return strings.Contains(string(logged), "telemetry_dedup cut an upstream request")
	})
}
