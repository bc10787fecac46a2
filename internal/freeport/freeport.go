// Package freeport picks loopback ports for the servers that tests and the
// benchmark start as processes of their own.
package freeport

import (
	"net"
	"sync"
)

// handedOut holds the ports Pick has returned. The kernel may offer a port
// again as soon as the listener that found it closes, before the process it
// was picked for binds it: two servers, or two sites of one Caddyfile, were
// then given the same port (Caddy refuses such a config as ambiguous).
var handedOut sync.Map

// Pick returns a free loopback port that it has not returned before in this
// process, nor has any other live process that picks through this package
// (see claim). Another process may still take it before it is bound: a
// caller that can, retries with another.
func Pick() (int, error) {
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if _, taken := handedOut.LoadOrStore(port, true); !taken && claim(port) {
			return port, nil
		}
	}
}
