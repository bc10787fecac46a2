package integration

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Hostile or broken bodies get a clear 4xx, never reach the upstream, never
// crash the proxy and leave no goroutine behind.
func TestHostileBodiesAreRejectedCleanly(t *testing.T) {
	up := newUpstream(t)
	tester := startCaddy(t, up, "")
	at := base().Format(time.RFC3339)
	// Warm up keep-alive connections on both sides, then count.
	post(t, tester.Client, ping("veh-warm-up", base(), 52.5200087, 13.4049547))
	tester.Client.CloseIdleConnections()
	time.Sleep(100 * time.Millisecond)
	baseline := runtime.NumGoroutine()

	for _, tt := range []struct {
		name   string
		body   string
		status int
	}{
		{"deeply nested", strings.Repeat("[", 1<<20-1), http.StatusBadRequest},
		{"deeply nested object", strings.Repeat(`{"a":`, 100_000), http.StatusBadRequest},
		{"invalid UTF-8", `{"asset_id":"veh-` + "\xff\xfe" + `","occurred_at":"` + at + `","lat":52.5,"lon":13.4}`, http.StatusBadRequest},
		{"duplicate key", `{"asset_id":"veh-dup","occurred_at":"` + at + `","lat":52.5,"lat":91,"lon":13.4}`, http.StatusBadRequest},
		{"huge latitude", `{"asset_id":"veh-huge","occurred_at":"` + at + `","lat":1e400,"lon":13.4}`, http.StatusUnprocessableEntity},
		{"huge epoch", `{"asset_id":"veh-huge","occurred_at":1e30,"lat":52.5,"lon":13.4}`, http.StatusUnprocessableEntity},
		{"empty", ``, http.StatusBadRequest},
		{"just whitespace", "  \n ", http.StatusBadRequest},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res := post(t, tester.Client, []byte(tt.body))
			res.expect(t, tt.status, "rejected")
			if !strings.Contains(res.body, `"error":`) {
				t.Errorf("no error message: %s", res.body)
			}
		})
	}

	// A body that stops half-way and a sender that hangs up.
	conn, err := net.Dial("tcp", siteAddr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST /telemetry HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"asset_id\":", siteAddr)
	time.Sleep(200 * time.Millisecond)
	conn.Close()

	// A body trickled in chunks, slowly, is read whole and accepted.
	conn, err = net.Dial("tcp", siteAddr)
	if err != nil {
		t.Fatal(err)
	}
	body := string(ping("veh-trickle", base(), 52.5200087, 13.4049547))
	fmt.Fprintf(conn, "POST /telemetry HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n", siteAddr)
	for len(body) > 0 {
		n := min(16, len(body))
		fmt.Fprintf(conn, "%x\r\n%s\r\n", n, body[:n])
		body = body[n:]
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Fprintf(conn, "0\r\n\r\n")
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusCreated || res.Header.Get("X-Dedup") != "accepted" {
		t.Fatalf("trickled ping: %d %s", res.StatusCode, res.Header.Get("X-Dedup"))
	}
	if n := up.count(); n != 2 {
		t.Fatalf("upstream saw %d requests; only the warm-up and the trickled ping belong there", n)
	}

	conn.Close()
	tester.Client.CloseIdleConnections()
	for deadline := time.Now().Add(5 * time.Second); runtime.NumGoroutine() > baseline+2; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, %d before the hostile requests:\n%s", runtime.NumGoroutine(), baseline, buf[:runtime.Stack(buf, true)])
		}
	}
}
