package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The third fault: 300 connections each declare a 1 MiB body and
// send one byte, about 100 KB of traffic in all. Against an xcaddy-built
// Caddy, its heap (live objects, after a forced GC) grows by less than
// 50 MB while they hang, and other senders are still served. It was 324 MB
// when the declared length was allocated up front.
func TestSlowBodiesDoNotGrowTheHeap(t *testing.T) {
	const conns = 300
	caddy := buildCaddy(t)
	up := newUpstream(t)
	port := freePort(t)
	p := runCaddy(t, caddy, fmt.Sprintf(`{
	auto_https off
}
:%d {
	telemetry_dedup /telemetry
	reverse_proxy %s
}`, port, strings.TrimPrefix(up.URL, "http://")), port)
	admin := "http://" + p.admin
	site := "http://" + p.listen + "/telemetry"
	if res, err := http.Post(site, "application/json", strings.NewReader(string(ping("veh-before", base(), 52.52, 13.40)))); err != nil || res.StatusCode != http.StatusCreated {
		t.Fatalf("warm-up ping: %v %v", res, err)
	}
	before := liveHeap(t, admin)

	for i := range conns {
		c, err := net.Dial("tcp", p.listen)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
		fmt.Fprintf(c, "POST /telemetry HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", p.listen, 1<<20)
	}
	// Every one of them is in the handler, waiting for the rest of its body.
	for deadline := time.Now().Add(30 * time.Second); readingBodies(t, admin) < conns; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d requests reached the body read", readingBodies(t, admin), conns)
		}
	}

	res, err := http.Post(site, "application/json", strings.NewReader(string(ping("veh-during", base(), 52.52, 13.40))))
	if err != nil {
		t.Fatalf("a ping while %d bodies hang: %v", conns, err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusCreated || res.Header.Get("X-Dedup") != "accepted" {
		t.Fatalf("a ping while %d bodies hang: %d %s", conns, res.StatusCode, res.Header.Get("X-Dedup"))
	}
	during := liveHeap(t, admin)
	growth := int64(during) - int64(before)
	t.Logf("%d connections declaring 1 MiB and sending 1 byte: Caddy's live heap %.1f MB -> %.1f MB (%+.1f MB); other pings still served",
		conns, float64(before)/1e6, float64(during)/1e6, float64(growth)/1e6)
	if growth > 50e6 {
		t.Fatalf("the heap grew by %.1f MB, want < 50 MB", float64(growth)/1e6)
	}
}

// liveHeap is Caddy's heap in use after a garbage collection: the pprof
// heap endpoint with gc=1 collects first, then expvar's memstats reports.
func liveHeap(t *testing.T, admin string) uint64 {
	t.Helper()
	res, err := http.Get(admin + "/debug/pprof/heap?gc=1")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	res, err = http.Get(admin + "/debug/vars")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var vars struct{ Memstats struct{ HeapAlloc uint64 } }
	if err := json.NewDecoder(res.Body).Decode(&vars); err != nil {
		t.Fatalf("decoding /debug/vars: %v", err)
	}
	return vars.Memstats.HeapAlloc
}

// readingBodies counts Caddy's goroutines inside the module's body read,
// from the goroutine profile.
func readingBodies(t *testing.T, admin string) int {
	t.Helper()
	res, err := http.Get(admin + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	n, count := 0, 0
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if head, _, ok := strings.Cut(line, " @ "); ok { // "300 @ 0x4a... 0x4b...": a stack and how many share it
			count, _ = strconv.Atoi(head)
		}
		if strings.Contains(line, "caddy-telemetry-dedup.readBody+") {
			n += count
			count = 0 // once per stack
		}
	}
	return n
}
