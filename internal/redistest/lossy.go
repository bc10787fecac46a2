package redistest

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// ReplyLoser is a TCP relay in front of a server that can lose one reply:
// the command it answers has run, and the client sees its connection
// reset, as after a failover or a proxy's reset. go-redis then sends the
// command again on a new connection.
type ReplyLoser struct {
	listener net.Listener
	to       string
	armed    atomic.Bool
	lost     atomic.Int32
	mu       sync.Mutex
	conns    []net.Conn
}

// StartReplyLoser relays to addr until the test ends.
func StartReplyLoser(t testing.TB, addr string) *ReplyLoser {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &ReplyLoser{listener: l, to: addr}
	go p.serve()
	t.Cleanup(p.close)
	return p
}

// Addr is where clients connect.
func (p *ReplyLoser) Addr() string { return p.listener.Addr().String() }

// LoseNextReply makes the relay cut the connection that next carries a
// reply, instead of relaying it.
func (p *ReplyLoser) LoseNextReply() { p.armed.Store(true) }

// Lost counts the replies lost so far.
func (p *ReplyLoser) Lost() int { return int(p.lost.Load()) }

func (p *ReplyLoser) serve() {
	serveRelay(p.listener, p.to, func(client, server net.Conn) (up, down func()) {
		p.mu.Lock()
		p.conns = append(p.conns, client, server)
		p.mu.Unlock()
		return nil, func() { p.relayReplies(server, client) }
	})
}

// serveRelay accepts clients on l until it closes, and dials to for each.
// pair, given the two, returns what carries the client's bytes up to the
// server and the server's down to the client, each run on a goroutine of
// its own; a nil up copies them as they come, then closes the server.
func serveRelay(l net.Listener, to string, pair func(client, server net.Conn) (up, down func())) {
	for {
		client, err := l.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", to)
		if err != nil {
			client.Close()
			continue
		}
		up, down := pair(client, server)
		if up == nil {
			up = func() { _, _ = io.Copy(server, client); server.Close() }
		}
		go up()
		go down()
	}
}

func (p *ReplyLoser) relayReplies(server, client net.Conn) {
	defer client.Close()
	defer server.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := server.Read(buf)
		if n > 0 && p.armed.CompareAndSwap(true, false) {
			p.lost.Add(1)
			return
		}
		if n > 0 {
			if _, werr := client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *ReplyLoser) close() {
	p.listener.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}
