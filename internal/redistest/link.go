package redistest

import (
	"net"
	"sync"
	"testing"
)

// Link is a TCP relay on a replica's link to its master. A test can hold
// what the master sends, so that the replica lacks the master's latest
// writes (and does not acknowledge them), and then cut the link, dropping
// what it held: a master that dies before its replica has its last writes.
type Link struct {
	listener net.Listener
	to       string

	mu    sync.Mutex
	moved *sync.Cond // broadcast when held or cut changes
	held  bool
	cut   int // how many times Cut was called; a relay started before a cut stops
	conns []net.Conn
	// holding counts the bytes from the master held now, dropped those a
	// cut dropped.
	holding, dropped int
}

// StartLink relays to addr until the test ends.
func StartLink(t testing.TB, addr string) *Link {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	link := &Link{listener: l, to: addr}
	link.moved = sync.NewCond(&link.mu)
	go link.serve()
	t.Cleanup(link.close)
	return link
}

// Addr is where the replica connects.
func (l *Link) Addr() string { return l.listener.Addr().String() }

// Hold stops relaying what the master sends until Cut.
func (l *Link) Hold() {
	l.mu.Lock()
	l.held = true
	l.mu.Unlock()
}

// Cut closes the link's connections, dropping what Hold held, and relays
// the connections made afterwards as before Hold.
func (l *Link) Cut() {
	l.mu.Lock()
	l.cut++
	l.held = false
	l.dropped += l.holding
	l.holding = 0
	for _, c := range l.conns {
		c.Close()
	}
	l.conns = nil
	l.moved.Broadcast()
	l.mu.Unlock()
}

// Dropped returns how many bytes from the master Cut dropped.
func (l *Link) Dropped() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dropped
}

func (l *Link) serve() {
	serveRelay(l.listener, l.to, func(replica, master net.Conn) (up, down func()) {
		l.mu.Lock()
		l.conns = append(l.conns, replica, master)
		epoch := l.cut
		l.mu.Unlock()
		return nil, func() { l.relayFromMaster(master, replica, epoch) }
	})
}

// relayFromMaster copies what master sends to replica, but for what it
// reads while the link is held: that waits, and a cut drops it.
func (l *Link) relayFromMaster(master, replica net.Conn, epoch int) {
	defer replica.Close()
	defer master.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := master.Read(buf)
		l.mu.Lock()
		if l.held && l.cut == epoch {
			l.holding += n
			for l.held && l.cut == epoch {
				l.moved.Wait()
			}
		}
		if l.cut != epoch { // counted by Cut
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
		if n > 0 {
			if _, werr := replica.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (l *Link) close() {
	l.listener.Close()
	l.Cut()
}
