package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

func TestAcceptedPingReachesUpstreamByteForByte(t *testing.T) {
	up := newUpstream(t)
	tester := startCaddy(t, up, "")
	body := ping("veh-88", base(), 52.5200087, 13.4049547)

	res := post(t, tester.Client, body)
	res.expect(t, http.StatusCreated, "accepted")
	if res.body != `{"stored":true}` {
		t.Fatalf("sender got %q, want the upstream's answer", res.body)
	}
	got := up.requests()
	if len(got) != 1 {
		t.Fatalf("upstream saw %d requests, want 1", len(got))
	}
	if !bytes.Equal(got[0].body, body) || got[0].contentLength != int64(len(body)) {
		t.Fatalf("upstream got %q (Content-Length %d), want %q (%d)", got[0].body, got[0].contentLength, body, len(body))
	}
}

// A chunked request has no Content-Length on arrival; the upstream must
// still get the whole body, with a length that matches it.
func TestChunkedPingReachesUpstreamWithALength(t *testing.T) {
	up := newUpstream(t)
	tester := startCaddy(t, up, "")
	body := ping("veh-chunked", base(), 52.5200087, 13.4049547)

	req, _ := http.NewRequest(http.MethodPost, siteURL, io.MultiReader(bytes.NewReader(body[:10]), bytes.NewReader(body[10:])))
	req.ContentLength = -1 // forces Transfer-Encoding: chunked
	res, err := tester.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("status %d", res.StatusCode)
	}
	got := up.requests()
	if len(got) != 1 || !bytes.Equal(got[0].body, body) || got[0].contentLength != int64(len(body)) {
		t.Fatalf("upstream got %+v, want %q with Content-Length %d", got, body, len(body))
	}
}

func TestDuplicatesAreAnsweredWithoutTheUpstream(t *testing.T) {
	up := newUpstream(t)
	tester := startCaddy(t, up, "")
	at := base()
	post(t, tester.Client, ping("veh-88", at, 52.5200087, 13.4049547)).expect(t, http.StatusCreated, "accepted")

	for _, tt := range []struct {
		name   string
		body   []byte
		reason string
	}{
		{"redelivery", ping("veh-88", at, 52.5200087, 13.4049547), "redelivery"},
		{"re-observation", ping("veh-88", at.Add(20*time.Second), 52.5200087, 13.4049547), "reobservation"},
		{"parked jitter", ping("veh-88", at.Add(40*time.Second), 52.5200410, 13.4049920), "jitter"},
	} {
		res := post(t, tester.Client, tt.body)
		res.expect(t, http.StatusOK, "suppressed")
		if res.header.Get("X-Dedup-Reason") != tt.reason || res.body != "" {
			t.Errorf("%s: reason %q body %q, want reason %q and no body", tt.name, res.header.Get("X-Dedup-Reason"), res.body, tt.reason)
		}
	}
	if n := up.count(); n != 1 {
		t.Fatalf("upstream saw %d requests, want only the first sighting", n)
	}

	post(t, tester.Client, ping("veh-88", at.Add(time.Minute), 52.5241000, 13.4102000)).expect(t, http.StatusCreated, "accepted")
	post(t, tester.Client, ping("veh-91", at, 52.5200087, 13.4049547)).expect(t, http.StatusCreated, "accepted")
	if n := up.count(); n != 3 {
		t.Fatalf("upstream saw %d requests, want 3 (first sighting, a real move, another asset)", n)
	}
}

func TestPlaceholdersReachTheUpstream(t *testing.T) {
	up := newUpstream(t)
	tester := startCaddy(t, up, "")
	at := time.Date(2026, 8, 8, 12, 0, 0, 0, time.UTC)
	post(t, tester.Client, ping("veh-88", at, 52.5200087, 13.4049547)).expect(t, http.StatusCreated, "accepted")

	h := up.requests()[0].header
	want := map[string]string{
		"X-Dedup-Asset":  "veh-88",
		"X-Dedup-Bucket": "1786190400",
		"X-Dedup-Cell":   "8c1f1d48945d9ff",
	}
	for k, v := range want {
		if h.Get(k) != v {
			t.Errorf("%s = %q, want %q", k, h.Get(k), v)
		}
	}
	if key := h.Get("X-Dedup-Key"); !strings.HasPrefix(key, keyPrefix(t)) || len(key) != len(keyPrefix(t))+32 {
		t.Errorf("X-Dedup-Key = %q, want the prefix and 32 hex digits", key)
	}
}

func TestUpstreamFailureReleasesTheClaim(t *testing.T) {
	up := newUpstream(t)
	tester := startCaddy(t, up, "")
	body := ping("veh-500", base(), 52.5200087, 13.4049547)

	up.setResponse(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusInternalServerError) })
	post(t, tester.Client, body).expect(t, http.StatusInternalServerError, "accepted")

	up.setResponse(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	post(t, tester.Client, body).expect(t, http.StatusCreated, "accepted")
	post(t, tester.Client, body).expect(t, http.StatusOK, "suppressed")
	if n := up.count(); n != 2 {
		t.Fatalf("upstream saw %d requests, want the failed one and the retry", n)
	}
}

// A backend that refuses an observation with a 4xx (a rate limit, a wrong
// token, Traccar's 400 for a device it does not know yet) or answers a 3xx
// did not take it, and every real client resends it: the retry must reach
// the backend again, not be told "suppressed" for an observation the
// backend never stored.
func TestUpstreamRefusalReleasesTheClaim(t *testing.T) {
	up := newUpstream(t)
	tester := startCaddy(t, up, "")
	for i, refusal := range []int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusNotFound, http.StatusTooManyRequests, http.StatusFound} {
		body := ping(fmt.Sprintf("veh-refused-%d", refusal), base(), 52.5200087, 13.4049547)
		up.setResponse(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(refusal) })
		post(t, tester.Client, body).expect(t, refusal, "accepted")

		up.setResponse(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
		post(t, tester.Client, body).expect(t, http.StatusCreated, "accepted")
		post(t, tester.Client, body).expect(t, http.StatusOK, "suppressed")
		if n, want := up.count(), 2*(i+1); n != want {
			t.Fatalf("after a %d: upstream saw %d requests in all, want %d (the refused one and its retry each time)", refusal, n, want)
		}
	}
}

func TestUnreachableUpstreamReleasesTheClaim(t *testing.T) {
	up := newUpstream(t)
	tester := startCaddy(t, up, "")
	up.Close() // reverse_proxy now fails with 502 without an upstream answer
	body := ping("veh-502", base(), 52.5200087, 13.4049547)
	if res := post(t, tester.Client, body); res.status != http.StatusBadGateway {
		t.Fatalf("status %d, want 502", res.status)
	}
	if res := post(t, tester.Client, body); res.status != http.StatusBadGateway {
		t.Fatalf("retry: status %d X-Dedup %q; want 502 again, i.e. the claim was released and the retry forwarded",
			res.status, res.header.Get("X-Dedup"))
	}
}

func TestReleaseOnFailureOff(t *testing.T) {
	up := newUpstream(t)
	tester := startCaddy(t, up, "release_on_failure off")
	body := ping("veh-off", base(), 52.5200087, 13.4049547)
	up.setResponse(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
	post(t, tester.Client, body).expect(t, http.StatusServiceUnavailable, "accepted")
	post(t, tester.Client, body).expect(t, http.StatusOK, "suppressed")
}

// While the first delivery waits for its upstream, an exact redelivery is
// asked to come back (the first may still fail); a different observation in
// the same key is a plain duplicate.
func TestRedeliveryOfAnInFlightClaimIsAskedToComeBack(t *testing.T) {
	up := newUpstream(t)
	tester := startCaddy(t, up, "")
	at := base()
	body := ping("veh-slow", at, 52.5200087, 13.4049547)

	arrived, proceed := make(chan struct{}), make(chan struct{})
	up.setResponse(func(w http.ResponseWriter, _ *http.Request) {
		close(arrived)
		<-proceed
		w.WriteHeader(http.StatusCreated)
	})
	first := make(chan response)
	go func() { first <- post(t, tester.Client, body) }()
	<-arrived

	res := post(t, tester.Client, body)
	res.expect(t, http.StatusConflict, "in_flight")
	if res.header.Get("Retry-After") != "1" {
		t.Fatalf("Retry-After %q, want 1", res.header.Get("Retry-After"))
	}
	post(t, tester.Client, ping("veh-slow", at.Add(time.Second), 52.5200410, 13.4049920)).expect(t, http.StatusOK, "suppressed")

	close(proceed)
	(<-first).expect(t, http.StatusCreated, "accepted")
	post(t, tester.Client, body).expect(t, http.StatusOK, "suppressed")
	if n := up.count(); n != 1 {
		t.Fatalf("upstream saw %d requests, want 1", n)
	}
}

// A sender that times out and hangs up does not cancel the upstream request:
// what the upstream then answers decides the claim.
func TestSenderHangUpDoesNotDecideTheClaim(t *testing.T) {
	for _, tt := range []struct {
		name     string
		status   int
		decision string // what the sender's retry then gets
	}{
		{"upstream fails after the hang-up: the retry is accepted", http.StatusInternalServerError, "accepted"},
		{"upstream stores it after the hang-up: the retry is a duplicate", http.StatusCreated, "suppressed"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			up := newUpstream(t)
			tester := startCaddy(t, up, "")
			body := ping("veh-hangup", base(), 52.5200087, 13.4049547)

			finished := make(chan error, 1)
			up.setResponse(func(w http.ResponseWriter, r *http.Request) {
				select {
				case <-time.After(500 * time.Millisecond):
					w.WriteHeader(tt.status)
					finished <- nil
				case <-r.Context().Done():
					finished <- r.Context().Err()
				}
			})
			impatient := &http.Client{Timeout: 100 * time.Millisecond}
			req, _ := http.NewRequest(http.MethodPost, siteURL, bytes.NewReader(body))
			if res, err := impatient.Do(req); err == nil {
				res.Body.Close()
				t.Fatalf("sender did not time out: %d", res.StatusCode)
			}
			if err := <-finished; err != nil {
				t.Fatalf("the upstream request was cancelled with the sender: %v", err)
			}
			up.setResponse(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
			waitFor(t, func() bool {
				return post(t, tester.Client, body).header.Get("X-Dedup") == tt.decision
			})
		})
	}
}

// waitFor retries cond for a while: the first request finishes its claim
// just after its upstream answers.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met within 5s")
}

func TestBadPingsAreRejectedAndNeverForwarded(t *testing.T) {
	up := newUpstream(t)
	tester := startCaddy(t, up, "max_body 512B")
	at := base().Format(time.RFC3339)

	for _, tt := range []struct {
		name   string
		body   string
		status int
		field  string
		rule   string
	}{
		{"malformed JSON", `{"asset_id":"veh-88",`, http.StatusBadRequest, "", "malformed"},
		{"empty body", ``, http.StatusBadRequest, "", "malformed"},
		{"oversize", `{"asset_id":"` + strings.Repeat("x", 600) + `"}`, http.StatusRequestEntityTooLarge, "", "too_large"},
		{"latitude 91", `{"asset_id":"a","occurred_at":"` + at + `","lat":91,"lon":13.4}`, http.StatusUnprocessableEntity, "lat", "range"},
		{"naive time", `{"asset_id":"a","occurred_at":"2026-08-08T12:00:00","lat":52.5,"lon":13.4}`, http.StatusUnprocessableEntity, "occurred_at", "timezone"},
		{"null island", `{"asset_id":"a","occurred_at":"` + at + `","lat":0,"lon":0}`, http.StatusUnprocessableEntity, "lat", "null_island"},
		{"future", `{"asset_id":"a","occurred_at":"` + time.Now().Add(time.Hour).UTC().Format(time.RFC3339) + `","lat":52.5,"lon":13.4}`, http.StatusUnprocessableEntity, "occurred_at", "max_future"},
		{"missing asset", `{"occurred_at":"` + at + `","lat":52.5,"lon":13.4}`, http.StatusUnprocessableEntity, "asset_id", "required"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res := post(t, tester.Client, []byte(tt.body))
			res.expect(t, tt.status, "rejected")
			var e struct{ Decision, Error, Field, Rule string }
			if err := json.Unmarshal([]byte(res.body), &e); err != nil || res.header.Get("Content-Type") != "application/json" {
				t.Fatalf("error body %q is not JSON: %v", res.body, err)
			}
			if e.Error == "" || e.Decision != "rejected" || e.Field != tt.field || e.Rule != tt.rule {
				t.Fatalf("error body %+v, want field %q rule %q and a message", e, tt.field, tt.rule)
			}
		})
	}
	if n := up.count(); n != 0 {
		t.Fatalf("upstream saw %d rejected pings", n)
	}
}

func TestClaimsSurviveAConfigReload(t *testing.T) {
	up := newUpstream(t)
	body := ping("veh-reload", base(), 52.5200087, 13.4049547)
	tester := startCaddy(t, up, "")
	post(t, tester.Client, body).expect(t, http.StatusCreated, "accepted")

	tester = startCaddy(t, up, "max_future 10m") // a different config, the same memory store
	post(t, tester.Client, body).expect(t, http.StatusOK, "suppressed")
}

// A reload through a config that uses the memory store nowhere (a trial of
// the redis store, or the directive taken out for a while) and back is no
// restart: the claims are still there (helper 3's finding; the store was
// dropped with the last config that held it).
func TestClaimsSurviveAReloadThroughAConfigWithoutTheMemoryStore(t *testing.T) {
	for _, between := range []string{"the redis store", "no telemetry_dedup"} {
		t.Run(between, func(t *testing.T) {
			up := newUpstream(t)
			body := ping("veh-memory-kept", base(), 52.5200087, 13.4049547)
			tester := startCaddy(t, up, "")
			post(t, tester.Client, body).expect(t, http.StatusCreated, "accepted")

			if between == "the redis store" {
				startCaddy(t, up, redisOptions(redistest.Start(t), ""))
			} else {
				caddyTester(t, fmt.Sprintf(caddytestGlobals+`
http://localhost:{$TD_TEST_HTTP_PORT} {
	reverse_proxy %s
}`, strings.TrimPrefix(up.URL, "http://")))
			}
			tester = startCaddy(t, up, "")
			post(t, tester.Client, body).expect(t, http.StatusOK, "suppressed")
			if n := up.received(body); n != 1 {
				t.Fatalf("the upstream has the ping %d times, want once", n)
			}
		})
	}
}

func TestConcurrentRedeliveriesReachTheUpstreamOnce(t *testing.T) {
	up := newUpstream(t)
	tester := startCaddy(t, up, "")
	body := ping("veh-storm", base(), 52.5200087, 13.4049547)

	var wg sync.WaitGroup
	statuses := make(chan int, 20)
	for range 20 {
		wg.Go(func() {
			res := post(t, tester.Client, body)
			statuses <- res.status
		})
	}
	wg.Wait()
	close(statuses)
	accepted := 0
	for s := range statuses {
		switch s {
		case http.StatusCreated:
			accepted++
		case http.StatusOK, http.StatusConflict:
		default:
			t.Errorf("unexpected status %d", s)
		}
	}
	if accepted != 1 || up.count() != 1 {
		t.Fatalf("%d accepted, upstream saw %d; want exactly one of each", accepted, up.count())
	}
}
