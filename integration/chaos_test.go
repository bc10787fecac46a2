package integration

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// The chaos test's knobs. The store times out after 100 ms and
// in_flight_timeout is 2 s, so the module cuts a claimed upstream request
// 1.8 s after its claim; a hung upstream request that nobody cuts fails
// after chaosHang, and the sender gives up waiting after chaosPatience, as
// the sender gave up on an upstream that hung for 40 s.
const (
	chaosStoreTimeout = 100 * time.Millisecond
	chaosInFlight     = 2 * time.Second
	chaosHang         = 4 * time.Second
	chaosPatience     = 3 * time.Second
	chaosSenders      = 8
	chaosTries        = 10
	// chaosPhase is how many observations are finished between faults.
	chaosPhase = 60
	// chaosMax caps the stream.
	chaosMax = 1000
)

// chaosUpstream is the backend of the chaos test. It fails every third
// request (500) and hangs every 23rd past the module's bound, until the
// proxy gives up on it or chaosHang passes (then 500). It never fails or
// hangs one observation twice in a row, so that ten tries always suffice:
// the test is about what the module does with failures, not about a
// sender's patience. It takes (commits) an observation only when it
// answers 201, and records with each the decision the module forwarded
// it as (header_up X-Dedup-Decision).
type chaosUpstream struct {
	*httptest.Server
	n             atomic.Int64
	failed, hangs atomic.Int64

	mu      sync.Mutex
	commits map[string][]commit
	unlucky map[string]bool // failed or hung last time
}

type commit struct {
	decision string
	at       time.Time
}

func newChaosUpstream(t *testing.T) *chaosUpstream {
	u := &chaosUpstream{commits: map[string][]commit{}, unlucky: map[string]bool{}}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.Close)
	return u
}

func (u *chaosUpstream) serve(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	body := string(b)
	n := u.n.Add(1)
	u.mu.Lock()
	spared := u.unlucky[body]
	fail, hang := !spared && n%3 == 0, !spared && n%23 == 7
	u.unlucky[body] = fail || hang
	u.mu.Unlock()
	switch {
	case hang:
		u.hangs.Add(1)
		select {
		case <-r.Context().Done(): // cut by the proxy: nothing taken
		case <-time.After(chaosHang):
			w.WriteHeader(http.StatusInternalServerError)
		}
	case fail:
		u.failed.Add(1)
		w.WriteHeader(http.StatusInternalServerError)
	default:
		u.mu.Lock()
		u.commits[body] = append(u.commits[body], commit{r.Header.Get("X-Dedup-Decision"), time.Now()})
		u.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}
}

// chaosSender delivers as a webhook sender with a retry ladder does: it
// retries on transport errors (its own timeout among them), 5xx and 409,
// ten tries, waiting 100 ms doubling to 1.6 s in between, and counts every
// answer it saw.
type chaosSender struct {
	client *http.Client
	url    string

	mu      sync.Mutex
	answers map[string]int // "status X-Dedup"
	// fiveXX counts the 5xx answers; handler5xx those that did not come
	// through a forward (X-Dedup neither accepted nor unchecked): the
	// handler's own.
	fiveXX, handler5xx int
	gaveUp             []string
	finished           atomic.Int64
}

// storeErrors counts the answers that said the store could not be asked:
// unavailable failing closed, unchecked failing open.
func (s *chaosSender) storeErrors(mode string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if mode == "open" {
		return s.answers["201 unchecked"] + s.answers["500 unchecked"] + s.answers["504 unchecked"]
	}
	return s.answers["503 unavailable"]
}

func (s *chaosSender) deliver(body string) bool {
	wait := 100 * time.Millisecond
	for range chaosTries {
		res, err := s.client.Post(s.url, "application/json", strings.NewReader(body))
		key := "transport error"
		retry := true
		if err == nil {
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			key = fmt.Sprintf("%d %s", res.StatusCode, res.Header.Get("X-Dedup"))
			retry = res.StatusCode == http.StatusConflict || res.StatusCode >= 500
		}
		s.mu.Lock()
		s.answers[key]++
		if err == nil && res.StatusCode >= 500 {
			s.fiveXX++
			if d := res.Header.Get("X-Dedup"); d != "accepted" && d != "unchecked" {
				s.handler5xx++
			}
		}
		s.mu.Unlock()
		if !retry {
			return true
		}
		time.Sleep(wait)
		wait = min(2*wait, 1600*time.Millisecond)
	}
	s.mu.Lock()
	s.gaveUp = append(s.gaveUp, body)
	s.mu.Unlock()
	return false
}

// A retrying sender sends a bounded stream through an xcaddy-built Caddy
// on a real Redis, each observation once and then once more (a redelivery,
// as after a timeout that came after the upstream had it), while the
// upstream fails every third request and hangs past the module's bound now
// and then; meanwhile Redis is killed and, a second after, restarted empty,
// and later hangs (paused) for 10 store timeouts. In both on_store_error
// modes:
//
//   - nothing is lost: every delivery and redelivery gets a final answer
//     within ten tries, and every observation reaches the upstream;
//   - the module adds no duplicate of its own: an observation reaches the
//     upstream as accepted at most once per Redis lifetime. A second
//     accepted copy is allowed only across the restart (the empty Redis
//     forgot the claim: no module can help that but a Redis that keeps its
//     data), and failing open, extra copies only as unchecked, forwarded
//     while the store could not be asked (the documented price of open);
//     failing closed, no copy is unchecked, so every observation arrives
//     exactly once in each Redis lifetime;
//   - failing open, the handler itself answers no 5xx: every 5xx a sender
//     saw is one of the upstream's failures or hangs, passed through.
//
// It checks that the faults happened (store errors answered in both
// faults, upstream failures and hangs, claims handed to the reconciler),
// and logs what the senders saw, for the README.
func TestChaos(t *testing.T) {
	caddy := buildCaddy(t)
	for _, mode := range []string{"closed", "open"} {
		t.Run(mode, func(t *testing.T) { runChaos(t, caddy, mode) })
	}
}

func runChaos(t *testing.T, caddy, mode string) {
	srv := redistest.Start(t)
	up := newChaosUpstream(t)
	port := freePort(t)
	p := runCaddy(t, caddy, fmt.Sprintf(`{
	auto_https off
}
:%d {
	telemetry_dedup /telemetry {
		store redis %s {
			timeout %s
		}
		on_store_error %s
		in_flight_timeout %s
	}
	reverse_proxy %s {
		header_up X-Dedup-Decision {http.telemetry_dedup.decision}
	}
}`, port, srv.URL(), chaosStoreTimeout, mode, chaosInFlight, strings.TrimPrefix(up.URL, "http://")), port)
	s := &chaosSender{
		client:  &http.Client{Timeout: chaosPatience, Transport: &http.Transport{MaxIdleConnsPerHost: chaosSenders}},
		url:     "http://" + p.listen + "/telemetry",
		answers: map[string]int{},
	}

	// The stream: observations in distinct keys, each delivered, then
	// redelivered, by one of the senders, until stop.
	stop := make(chan struct{})
	var sent []string
	var sentMu sync.Mutex
	var wg sync.WaitGroup
	for w := range chaosSenders {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				body := string(ping(fmt.Sprintf("chaos-%d-%d", w, i), base(), 52.5200087, 13.4049547))
				sentMu.Lock()
				full := len(sent) >= chaosMax
				if !full {
					sent = append(sent, body)
				}
				sentMu.Unlock()
				if full {
					return
				}
				if s.deliver(body) {
					s.deliver(body)
				}
				s.finished.Add(1)
			}
		})
	}
	waitFinished := func(n int64) {
		t.Helper()
		for deadline := time.Now().Add(2 * time.Minute); s.finished.Load() < n; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("only %d observations finished, waiting for %d", s.finished.Load(), n)
			}
		}
	}

	// The kill comes first: an empty restart after the hang would erase
	// the claims the hang left behind, and with them what this test is
	// about.
	waitFinished(chaosPhase)
	beforeKill := s.storeErrors(mode)
	srv.Kill()
	killedAt := time.Now()
	time.Sleep(time.Second)
	srv.Restart()
	restartedAt := time.Now()
	waitFinished(s.finished.Load() + chaosPhase)
	beforeHang := s.storeErrors(mode)
	srv.Pause()
	time.Sleep(10 * chaosStoreTimeout)
	srv.Resume()
	waitFinished(s.finished.Load() + 2*chaosPhase)
	close(stop)
	wg.Wait()
	duringKill, duringHang := beforeHang-beforeKill, s.storeErrors(mode)-beforeHang

	metrics := scrapeAt(t, "http://"+p.admin)
	reconciled := map[string]float64{}
	for _, outcome := range []string{"released", "released_late", "not_held", "settled", "dropped", "expired"} {
		reconciled[outcome] = counterIn(metrics, "caddy_telemetry_dedup_reconciled_total", map[string]string{"outcome": outcome})
	}
	t.Logf("%s: %d observations, each delivered and redelivered; Redis paused for %s, killed for %s",
		mode, len(sent), 10*chaosStoreTimeout, restartedAt.Sub(killedAt).Round(100*time.Millisecond))
	t.Logf("the upstream failed %d requests and hung on %d; the senders saw %v", up.failed.Load(), up.hangs.Load(), sortedCounts(s.answers))
	t.Logf("reconciled by token: %v", reconciled)

	// Nothing is lost.
	if len(s.gaveUp) > 0 {
		t.Errorf("%d deliveries got no final answer in %d tries, e.g. %s", len(s.gaveUp), chaosTries, s.gaveUp[0])
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	forgotten, twice := 0, 0
	for _, body := range sent {
		commits := up.commits[body]
		if len(commits) > 1 {
			twice++
		}
		if len(commits) == 0 {
			t.Errorf("lost: %s never reached the upstream", body)
			continue
		}
		var before, after int // accepted copies on either side of the restart
		for _, c := range commits {
			switch {
			case c.decision == "unchecked" && mode == "open": // the price of failing open
			case c.decision != "accepted":
				t.Errorf("%s reached the upstream as %q failing %s", body, c.decision, mode)
			case c.at.Before(restartedAt):
				before++
			default:
				after++
			}
		}
		if before > 1 || after > 1 {
			t.Errorf("duplicated by the module: %s reached the upstream as accepted %d times before the restart and %d after", body, before, after)
		}
		if before == 1 && after == 1 {
			forgotten++
		}
	}
	t.Logf("%d observations reached the upstream more than once: %d because the restarted Redis had forgotten them; %d copies went up unchecked",
		twice, forgotten, countUnchecked(up.commits, sent))

	// Failing open, every 5xx is the upstream's own, passed through: each
	// of its failures and hangs makes at most one (a hang nobody cuts ends
	// in the sender's own timeout instead).
	if upstream5xx := int(up.failed.Load() + up.hangs.Load()); mode == "open" && (s.handler5xx > 0 || s.fiveXX > upstream5xx) {
		t.Errorf("failing open, the handler answered 5xx itself: %d of the %d 5xx did not come through a forward, "+
			"and the upstream failed or hung %d times", s.handler5xx, s.fiveXX, upstream5xx)
	}

	// The faults happened. (Whether a SET NX the hang held back landed
	// later depends on which connections the hang caught; the reconciler
	// tests in faults_test.go make sure one does.)
	if duringKill == 0 || duringHang == 0 || up.failed.Load() == 0 || up.hangs.Load() == 0 {
		t.Errorf("the faults did not all happen: %d and %d store errors answered while Redis was away and hung, %d upstream failures, %d hangs",
			duringKill, duringHang, up.failed.Load(), up.hangs.Load())
	}
	handed := 0.0
	for _, n := range reconciled {
		handed += n
	}
	if handed == 0 {
		t.Error("no claim was handed to the reconciler")
	}
	if reconciled["dropped"] > 0 || reconciled["expired"] > 0 {
		t.Errorf("the reconciler dropped %v and gave up on %v claims", reconciled["dropped"], reconciled["expired"])
	}
}

// countUnchecked counts the copies of sent that went upstream unchecked.
func countUnchecked(commits map[string][]commit, sent []string) int {
	n := 0
	for _, body := range sent {
		for _, c := range commits[body] {
			if c.decision == "unchecked" {
				n++
			}
		}
	}
	return n
}

func sortedCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "[%s]×%d ", k, m[k])
	}
	return strings.TrimSpace(b.String())
}
