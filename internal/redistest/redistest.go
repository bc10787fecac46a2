// Package redistest starts throwaway redis-server processes on free loopback
// ports for tests, so that tests can kill, restart and inspect them and never
// touch a Redis someone else is using.
package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is one redis-server process owned by a test.
type Server struct {
	t    testing.TB
	port int
	dir  string
	cmd  *exec.Cmd
	done chan error // receives the process's exit
}

// Start runs a redis-server without persistence on a free loopback port and
// stops it when the test ends. It fails the test if redis-server is not
// installed: store tests are meant to talk to a real Redis.
func Start(t testing.TB) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server is not on PATH (install it, e.g. apt-get install redis-server): %v", err)
	}
	s := &Server{t: t, dir: t.TempDir()}
	var err error
	for range 5 { // a freed port can be taken by someone else before we bind it
		s.port = freePort(t)
		if err = s.start(); err == nil {
			t.Cleanup(s.Kill)
			return s
		}
	}
	t.Fatalf("starting redis-server: %v", err)
	return nil
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// URL is a redis:// URL for the server's database 0.
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

// Client returns a new client on the server, closed when the test ends.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

// Kill stops the server at once (SIGKILL), as a crash or a network cut
// would. The port stays reserved for Restart.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// Restart starts an empty server on the same port after Kill.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	if err := s.start(); err != nil {
		s.t.Fatalf("restarting redis-server on port %d: %v", s.port, err)
	}
}

func (s *Server) start() error {
	cmd := exec.Command("redis-server",
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir)
	if testing.Verbose() {
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	s.cmd, s.done = cmd, make(chan error, 1)
	go func() { s.done <- cmd.Wait() }()
	if err := s.waitReady(); err != nil {
		s.Kill()
		return err
	}
	return nil
}

func (s *Server) waitReady() error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		select {
		case exit := <-s.done:
			s.done <- exit // for Kill
			return fmt.Errorf("redis-server on port %d exited: %v", s.port, exit)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on port %d did not answer PING: %w", s.port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("finding a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
