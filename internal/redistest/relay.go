package redistest

import (
	"net"
	"sync"
	"testing"
)

// StartRelay relays to addr until the test ends, for a test that shapes
// what passes (a slow link, a held reply), and returns where clients
// connect. For each client it dials addr, and pair returns what carries
// the client's bytes up to the server and the server's down to the client
// (a nil up copies them as they come), each run on a goroutine of its own.
func StartRelay(t testing.TB, addr string, pair func(client, server net.Conn) (up, down func())) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go serveRelay(l, addr, func(client, server net.Conn) (up, down func()) {
		mu.Lock()
		conns = append(conns, client, server)
		mu.Unlock()
		return pair(client, server)
	})
	return l.Addr().String()
}
