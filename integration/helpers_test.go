// Package integration drives a real Caddy (in process, through caddytest,
// and as an xcaddy-built binary) with the telemetry_dedup module in front of
// a real upstream server, against a real redis-server started per test.
package integration

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	_ "github.com/telemetry-dedup/caddy-telemetry-dedup"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/freeport"
)

func TestMain(m *testing.M) {
	if err := pickCaddytestPorts(); err != nil {
		fmt.Fprintln(os.Stderr, "integration: no free port for caddytest's Caddy:", err)
		os.Exit(1)
	}
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// caddytestGlobals are the global options caddytest's in-process Caddy
// needs: its admin API and the test sites' ports, which the Caddyfile reads
// from the environment pickCaddytestPorts sets.
const caddytestGlobals = `{
	admin localhost:{$TD_TEST_ADMIN_PORT}
	http_port {$TD_TEST_HTTP_PORT}
	https_port {$TD_TEST_HTTPS_PORT}
	grace_period 1ns
	skip_install_trust
}
`

// Where caddytest's Caddy serves the test sites and its admin API, set by
// pickCaddytestPorts.
var (
	httpPort string // the sites' port
	siteAddr string // localhost:httpPort
	siteURL  string // the test site's /telemetry
	adminURL string // the admin API, which serves the metrics
)

// pickCaddytestPorts gives caddytest's Caddy free ports rather than fixed
// ones: two runs of this suite on one machine, or anything else listening
// on a fixed port, would otherwise answer each other's requests.
// caddytest.Default is what every Tester starts from.
func pickCaddytestPorts() error {
	var ports [3]int
	for i := range ports {
		port, err := freeport.Pick()
		if err != nil {
			return err
		}
		ports[i] = port
	}
	caddytest.Default.AdminPort = ports[0]
	httpPort = strconv.Itoa(ports[1])
	siteAddr = "localhost:" + httpPort
	siteURL = "http://" + siteAddr + "/telemetry"
	adminURL = "http://localhost:" + strconv.Itoa(ports[0])
	for name, port := range map[string]int{"TD_TEST_ADMIN_PORT": ports[0], "TD_TEST_HTTP_PORT": ports[1], "TD_TEST_HTTPS_PORT": ports[2]} {
		if err := os.Setenv(name, strconv.Itoa(port)); err != nil {
			return err
		}
	}
	return nil
}

// received is one request as the upstream saw it.
type received struct {
	method, query string
	body          []byte
	contentLength int64
	header        http.Header
}

// upstream is the backend behind reverse_proxy. It records what reaches it
// and answers with respond (201 by default), which can read the body again.
type upstream struct {
	*httptest.Server
	mu      sync.Mutex
	got     []received
	respond func(w http.ResponseWriter, r *http.Request)
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{respond: func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"stored":true}`)
	}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.got = append(u.got, received{method: r.Method, query: r.URL.RawQuery, body: body, contentLength: r.ContentLength, header: r.Header.Clone()})
		respond := u.respond
		u.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		respond(w, r)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) setResponse(f func(w http.ResponseWriter, r *http.Request)) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.respond = f
}

func (u *upstream) requests() []received {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]received(nil), u.got...)
}

func (u *upstream) count() int { return len(u.requests()) }

// received counts the requests whose body was body.
func (u *upstream) received(body []byte) int {
	n := 0
	for _, r := range u.requests() {
		if bytes.Equal(r.body, body) {
			n++
		}
	}
	return n
}

// startCaddy loads a Caddyfile whose site serves /telemetry through
// telemetry_dedup (with the given options) in front of up. Each test gets
// its own key_prefix (keyPrefix): the memory store outlives a config load.
func startCaddy(t *testing.T, up *upstream, options string) *caddytest.Tester {
	t.Helper()
	return caddyTester(t, fmt.Sprintf(caddytestGlobals+`
http://localhost:{$TD_TEST_HTTP_PORT} {
	telemetry_dedup /telemetry {
		key_prefix %q
		%s
	}
	reverse_proxy %s {
		header_up X-Dedup-Key {http.telemetry_dedup.key}
		header_up X-Dedup-Cell {http.telemetry_dedup.cell}
		header_up X-Dedup-Bucket {http.telemetry_dedup.bucket}
		header_up X-Dedup-Asset {http.telemetry_dedup.asset}
		header_up X-Dedup-Decision {http.telemetry_dedup.decision}
		header_up X-Dedup-Why {http.telemetry_dedup.reason}
	}
}`, keyPrefix(t), options, strings.TrimPrefix(up.URL, "http://")))
}

// keyPrefixes remembers the key_prefix of each running test, and how many
// runs of each test name there have been.
var keyPrefixes struct {
	sync.Mutex
	of   map[*testing.T]string
	runs map[string]int
}

// keyPrefix is the key_prefix of this run of the test, the same however
// often the test loads a config: "test:<name>:", or "test:<name>#<run>:"
// from a test's second run in the process on. Caddy's memory store
// outlives every config load, and a test's name alone was not its own
// across runs: under -count=2 the second run found the first run's keys,
// and its first pings were answered suppressed instead of accepted.
func keyPrefix(t *testing.T) string {
	keyPrefixes.Lock()
	defer keyPrefixes.Unlock()
	if p, ok := keyPrefixes.of[t]; ok {
		return p
	}
	if keyPrefixes.of == nil {
		keyPrefixes.of, keyPrefixes.runs = map[*testing.T]string{}, map[string]int{}
	}
	keyPrefixes.runs[t.Name()]++
	p := "test:" + t.Name() + ":"
	if n := keyPrefixes.runs[t.Name()]; n > 1 {
		p = fmt.Sprintf("test:%s#%d:", t.Name(), n)
	}
	keyPrefixes.of[t] = p
	t.Cleanup(func() {
		keyPrefixes.Lock()
		defer keyPrefixes.Unlock()
		delete(keyPrefixes.of, t)
	})
	return p
}

// caddytestClient is an HTTP client for caddytest's Caddy, which dials
// 127.0.0.1 whatever the host.
func caddytestClient() *http.Client {
	return &http.Client{Transport: caddytest.CreateTestingTransport(), Timeout: 10 * time.Second}
}

// caddyTester loads a Caddyfile into caddytest's in-process Caddy.
func caddyTester(t *testing.T, caddyfile string) *caddytest.Tester {
	t.Helper()
	tester := caddytest.NewTester(t)
	tester.InitServer(caddyfile, "caddyfile")
	return tester
}

// ping builds a body in the default field layout, minutes before now so
// max_future never interferes.
func ping(asset string, at time.Time, lat, lon float64) []byte {
	return fmt.Appendf(nil, `{"asset_id":%q,"occurred_at":%q,"lat":%v,"lon":%v,"speed_kmh":0}`,
		asset, at.UTC().Format(time.RFC3339Nano), lat, lon)
}

// base is a device time safely in the past, at the start of a 5m bucket.
func base() time.Time {
	return time.Now().UTC().Truncate(5 * time.Minute).Add(-time.Hour)
}

// response is what the sender saw.
type response struct {
	status int
	header http.Header
	body   string
}

func post(t *testing.T, client *http.Client, body []byte, header ...string) response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, siteURL, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", body, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return response{res.StatusCode, res.Header, string(b)}
}

func (r response) expect(t *testing.T, status int, decision string) {
	t.Helper()
	if r.status != status || r.header.Get("X-Dedup") != decision {
		t.Fatalf("got %d X-Dedup=%q (reason %q) body %q; want %d X-Dedup=%q",
			r.status, r.header.Get("X-Dedup"), r.header.Get("X-Dedup-Reason"), r.body, status, decision)
	}
}
