package fleetsim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeModule imitates telemetry_dedup keyed on content alone: the first
// sighting of a ping is accepted and proxied (in a batch, only the new
// elements), a repeat is answered 200 suppressed.
type fakeModule struct {
	// upstream is the backend's base URL; without one, accepted pings are
	// answered 201 here.
	upstream string
	// inFlightEvery answers every n-th request 409 in_flight, undecided.
	inFlightEvery int

	mu       sync.Mutex
	seen     map[string]bool
	requests int
}

func (m *fakeModule) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil || r.Header.Get("Content-Type") != "application/json" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	if m.busy() {
		w.Header().Set("X-Dedup", "in_flight")
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusConflict)
		return
	}
	elements := []json.RawMessage{body}
	if bytes.HasPrefix(body, []byte("[")) {
		elements = nil
		if err := json.Unmarshal(body, &elements); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
	}
	fresh := m.claim(elements)
	switch {
	case len(fresh) == 0:
		w.Header().Set("X-Dedup", "suppressed")
		w.WriteHeader(http.StatusOK)
	case len(fresh) < len(elements):
		w.Header().Set("X-Dedup", "partial")
		m.forward(w, append(append([]byte("["), bytes.Join(fresh, []byte(","))...), ']'))
	default:
		w.Header().Set("X-Dedup", "accepted")
		m.forward(w, body)
	}
}

// busy counts the request and says whether to send it back.
func (m *fakeModule) busy() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.requests++
	return m.inFlightEvery > 0 && m.requests%m.inFlightEvery == 0
}

func (m *fakeModule) requestCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.requests
}

// claim returns the elements not seen before, remembering them.
func (m *fakeModule) claim(elements []json.RawMessage) [][]byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	var fresh [][]byte
	for _, e := range elements {
		var p struct {
			Asset    string      `json:"asset_id"`
			Time     string      `json:"occurred_at"`
			Lat, Lon json.Number // the literal text
		}
		if err := json.Unmarshal(e, &p); err != nil {
			panic(err)
		}
		key := p.Asset + "|" + p.Time + "|" + p.Lat.String() + "|" + p.Lon.String()
		if !m.seen[key] {
			m.seen[key] = true
			fresh = append(fresh, e)
		}
	}
	return fresh
}

// forward proxies the body to the upstream and relays its status.
func (m *fakeModule) forward(w http.ResponseWriter, body []byte) {
	if m.upstream == "" {
		w.WriteHeader(http.StatusCreated)
		return
	}
	resp, err := http.Post(m.upstream, "application/json", bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	w.WriteHeader(resp.StatusCode)
	io.Copy(w, resp.Body)
}

// contentDecider is fakeModule's logic in process: what the HTTP runs must
// score.
type contentDecider map[string]bool

func (c contentDecider) Deliver(_ context.Context, d Delivery) ([]bool, error) {
	accepted := make([]bool, len(d.Pings))
	for i, p := range d.Pings {
		key := fmt.Sprint(p.Asset, p.Time.UnixMilli(), p.Lat, p.Lon)
		accepted[i] = !c[key]
		c[key] = true
	}
	return accepted, nil
}

// httpConfig is a small fleet with batches and redeliveries, quick to send.
func httpConfig(concurrency int) Config {
	return Config{
		Assets:          4,
		Duration:        15 * time.Minute,
		Start:           testStart,
		RedeliveryShare: 0.2,
		OfflineShare:    0.5,
		OfflineMin:      3 * time.Minute,
		OfflineMax:      6 * time.Minute,
		Concurrency:     concurrency,
	}
}

func TestHTTPDeciderScoresAsInProcess(t *testing.T) {
	for _, tc := range []struct {
		name          string
		upstream      bool
		concurrency   int
		inFlightEvery int
	}{
		{"upstream", true, 1, 0},
		{"upstream, concurrent, in flight", true, 3, 7},
		{"header", false, 1, 0},
		{"header, concurrent, in flight", false, 3, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			want, err := Run(context.Background(), httpConfig(1), contentDecider{})
			if err != nil {
				t.Fatal(err)
			}
			upstreamAddr := ""
			if tc.upstream {
				upstreamAddr = "127.0.0.1:0"
			}
			h, module := startDecider(t, upstreamAddr, tc.inFlightEvery)
			got, err := Run(context.Background(), httpConfig(tc.concurrency), h)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("over HTTP\n got %+v\nwant %+v", got, want)
			}
			if got.RedeliveriesAdmitted != 0 || got.Accepted != got.Pings-got.RedeliveriesSent || got.Batches == 0 {
				t.Errorf("accepted %d of %d pings with %d redeliveries (%d admitted), %d batches",
					got.Accepted, got.Pings, got.RedeliveriesSent, got.RedeliveriesAdmitted, got.Batches)
			}
			if n := module.requestCount(); tc.inFlightEvery > 0 && n <= got.Deliveries {
				t.Errorf("%d requests for %d deliveries: no 409 was retried", n, got.Deliveries)
			}
		})
	}
}

// startDecider starts a fakeModule in front of a new HTTPDecider and
// returns both.
func startDecider(t *testing.T, upstreamAddr string, inFlightEvery int) (*HTTPDecider, *fakeModule) {
	t.Helper()
	module := &fakeModule{inFlightEvery: inFlightEvery, seen: map[string]bool{}}
	srv := httptest.NewServer(module)
	t.Cleanup(srv.Close)
	h, err := NewHTTPDecider(srv.URL, upstreamAddr, Fields{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	if upstreamAddr != "" {
		module.upstream = "http://" + h.UpstreamAddr()
	}
	return h, module
}

func TestHTTPDeciderTellsWhichBatchElementsWentUpstream(t *testing.T) {
	h, _ := startDecider(t, "127.0.0.1:0", 0)
	pings := make([]Ping, 3)
	for i := range pings {
		pings[i] = Ping{Asset: "veh-1", Time: testStart.Add(time.Duration(i) * time.Second), Lat: 52.52, Lon: 13.4 + float64(i)/1e4}
	}
	ctx := context.Background()
	if _, err := h.Deliver(ctx, Delivery{Pings: pings[1:2]}); err != nil {
		t.Fatal(err)
	}
	got, err := h.Deliver(ctx, Delivery{Pings: pings, Batch: true})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[true false true]" {
		t.Errorf("batch decisions %v, want [true false true]", got)
	}
}

func TestHTTPDeciderReadsTheAnswer(t *testing.T) {
	for _, tc := range []struct {
		name     string
		upstream bool
		status   int
		dedup    string
		want     bool
		wantErr  string
		tries    int32
	}{
		{"accepted", false, 201, "accepted", true, "", 1},
		{"unchecked", false, 200, "unchecked", true, "", 1},
		{"suppressed", false, 200, "suppressed", false, "", 1},
		{"rejected", false, 422, "rejected", false, "422", 1},
		{"no header", false, 200, "", false, "200", 1},
		{"shadow", false, 200, "would_suppress", false, "would_suppress", 1},
		{"backend failed", false, 502, "accepted", false, "502", 1},
		{"in flight for ever", false, 409, "in_flight", false, "409", maxTries},
		{"rejected, upstream mode", true, 422, "rejected", false, "422", 1},
		{"proxied elsewhere, upstream mode", true, 201, "accepted", false, "reverse_proxy", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tries atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				tries.Add(1)
				if tc.dedup != "" {
					w.Header().Set("X-Dedup", tc.dedup)
				}
				w.Header().Set("Retry-After", "0")
				w.WriteHeader(tc.status)
				io.WriteString(w, `{"decision":"test"}`)
			}))
			defer srv.Close()
			upstreamAddr := ""
			if tc.upstream {
				upstreamAddr = "127.0.0.1:0"
			}
			h, err := NewHTTPDecider(srv.URL, upstreamAddr, Fields{})
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			got, err := h.Deliver(context.Background(), Delivery{Pings: []Ping{{Asset: "veh-1", Time: testStart, Lat: 52.52, Lon: 13.4}}})
			switch {
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), `{\"decision\":\"test\"}`) {
					t.Errorf("error %v, want one naming %s and the body", err, tc.wantErr)
				}
			case err != nil:
				t.Errorf("error %v", err)
			case got[0] != tc.want:
				t.Errorf("accepted %v, want %v", got[0], tc.want)
			}
			if tries.Load() != tc.tries {
				t.Errorf("%d tries, want %d", tries.Load(), tc.tries)
			}
		})
	}
}

func TestFieldsBody(t *testing.T) {
	p := Ping{Asset: "veh-0001", Time: testStart.Add(1234 * time.Millisecond), Lat: 52.5200087, Lon: 13.4}
	withExtras := p
	withExtras.Accuracy, withExtras.Speed, withExtras.HasSpeed = 4.53, 0, true
	for _, tc := range []struct {
		name   string
		fields Fields
		pings  []Ping
		batch  bool
		want   string
	}{
		{"single", Fields{}, []Ping{p}, false,
			`{"asset_id":"veh-0001","occurred_at":"2026-03-01T08:00:01.234Z","lat":52.5200087,"lon":13.4000000}`},
		{"accuracy and speed", Fields{}, []Ping{withExtras}, false,
			`{"asset_id":"veh-0001","occurred_at":"2026-03-01T08:00:01.234Z","lat":52.5200087,"lon":13.4000000,"accuracy":4.53,"speed":0}`},
		{"batch of one", Fields{}, []Ping{p}, true,
			`[{"asset_id":"veh-0001","occurred_at":"2026-03-01T08:00:01.234Z","lat":52.5200087,"lon":13.4000000}]`},
		{"renamed", Fields{Asset: "id", Time: "ts", Lat: "y", Lon: "x", Accuracy: "acc", Speed: "v"}, []Ping{withExtras, p}, true,
			`[{"id":"veh-0001","ts":"2026-03-01T08:00:01.234Z","y":52.5200087,"x":13.4000000,"acc":4.53,"v":0},` +
				`{"id":"veh-0001","ts":"2026-03-01T08:00:01.234Z","y":52.5200087,"x":13.4000000}]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(tc.fields.withDefaults().body(tc.pings, tc.batch)); got != tc.want {
				t.Errorf("body\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}
