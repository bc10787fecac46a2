// Package redistest starts throwaway redis-server processes on free loopback
// ports for tests, so that tests can kill, pause, restart and inspect them and
// never touch a Redis someone else is using.
//
// Besides a plain server (Start, StartWith) it can start a TLS server with
// certificates made at test time (StartTLS), a Redis Cluster (StartCluster)
// and a master, replica and three sentinels (StartSentinel). Every process is
// killed when the test ends and keeps its files under t.TempDir(); a process's
// own output goes to a log file whose tail is printed if the test fails.
package redistest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/freeport"
)

// startAttempts bounds the retries when a port picked by freePort is taken
// by someone else before redis-server binds it.
const startAttempts = 5

// Server is one redis-server process owned by a test.
type Server struct {
	t        testing.TB
	port     int
	dir      string
	args     []string    // redis-server's arguments, reused as is by Restart
	tls      *tls.Config // client config for a TLS-only server, else nil
	password string      // the default user's password (--requirepass), if any

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan error // receives the process's exit
	paused bool
}

// Start runs a redis-server without persistence on a free loopback port and
// stops it when the test ends. It fails the test if redis-server is not
// installed: store tests are meant to talk to a real Redis.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartWith(t)
}

// StartWith is Start for tests that need a server configured differently,
// such as one with a password ("--requirepass", "secret") or a small memory
// limit. args are appended to Start's own arguments as redis-server command
// line options, so they override them. Restart reuses them.
//
// If args set --requirepass, Client, AddUser and the readiness check log in
// with that password, so that the helper keeps working on a locked server.
func StartWith(t testing.TB, args ...string) *Server {
	t.Helper()
	return launch(t, nil, func(s *Server) ([]string, error) {
		return append(baseArgs(s), args...), nil
	})
}

// baseArgs are the options every data server gets: loopback only, nothing
// written to disk, and its files in its own directory.
func baseArgs(s *Server) []string {
	return []string{
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
	}
}

// launch starts a server whose arguments argv builds for the port picked in
// s.port, picking another port when the process cannot come up (most often
// because the port was taken in the meantime).
func launch(t testing.TB, tlsConf *tls.Config, argv func(s *Server) ([]string, error)) *Server {
	t.Helper()
	requireBinary(t, "redis-server")
	s := &Server{t: t, dir: t.TempDir(), tls: tlsConf}
	var err error
	for range startAttempts {
		s.port = freePort(t)
		if s.args, err = argv(s); err != nil {
			t.Fatalf("preparing redis-server: %v", err)
		}
		s.password = lastValue(s.args, "--requirepass")
		if err = s.start(); err == nil {
			t.Cleanup(s.cleanup)
			return s
		}
	}
	t.Fatalf("starting redis-server: %v", err)
	return nil
}

// Addr is the server's host:port (the TLS port for a server from StartTLS).
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// URL is a redis:// URL for the server's database 0, or a rediss:// one for a
// server from StartTLS. A rediss URL alone does not carry the test CA or
// client certificate: set TLSConfig from TLSFiles.Config after redis.ParseURL.
func (s *Server) URL() string {
	if s.tls != nil {
		return "rediss://" + s.Addr() + "/0"
	}
	return "redis://" + s.Addr() + "/0"
}

// Client returns a new client on the server, closed when the test ends. It
// speaks TLS to a server from StartTLS and logs in as the default user on a
// server started with --requirepass. Like the project's stores it sets
// ContextTimeoutEnabled, so that a context deadline bounds each call (without
// it go-redis waits out its own read timeout on a paused server).
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(s.options())
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

func (s *Server) options() *redis.Options {
	o := &redis.Options{Addr: s.Addr(), Password: s.password, ContextTimeoutEnabled: true}
	if s.tls != nil {
		o.TLSConfig = s.tls.Clone()
	}
	return o
}

// AddUser creates an ACL user that may run every command on every key and
// channel, so that tests of username/password configuration have a real
// account to log in with besides the default user.
func (s *Server) AddUser(t testing.TB, name, password string) {
	t.Helper()
	s.AddUserOn(t, name, password, "~*")
}

// AddUserOn creates an ACL user that may run every command on every
// channel but only on the keys its patterns match ("~s1:*"), as the
// README's ACL advice confines each site's user to its key_prefix.
func (s *Server) AddUserOn(t testing.TB, name, password string, keys ...string) {
	t.Helper()
	c := redis.NewClient(s.options())
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	args := []any{"ACL", "SETUSER", name, "on", ">" + password, "resetkeys"}
	for _, k := range keys {
		args = append(args, k)
	}
	if err := c.Do(ctx, append(args, "&*", "+@all")...).Err(); err != nil {
		t.Fatalf("adding ACL user %q on %s: %v", name, s.Addr(), err)
	}
}

// RotatePassword gives user name the password alone and cuts its
// connections, as a rotation followed by Redis dropping its clients (a
// restart, a network blip) does: the old password no longer logs in.
func (s *Server) RotatePassword(t testing.TB, name, password string) {
	t.Helper()
	c := redis.NewClient(s.options())
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Do(ctx, "ACL", "SETUSER", name, "resetpass", ">"+password).Err(); err != nil {
		t.Fatalf("rotating the password of ACL user %q on %s: %v", name, s.Addr(), err)
	}
	if err := c.Do(ctx, "CLIENT", "KILL", "USER", name).Err(); err != nil {
		t.Fatalf("cutting the connections of ACL user %q on %s: %v", name, s.Addr(), err)
	}
}

// Pause freezes the server (SIGSTOP) without closing anything: connections
// stay open and new ones are still accepted by the kernel, but nothing is
// ever answered. This is how a hung Redis looks, which only client timeouts
// can detect, unlike Kill, whose refused or reset connections fail at once.
func (s *Server) Pause() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.t.Fatalf("pausing redis-server on port %d: it is not running", s.port)
	}
	if err := s.signal(syscall.SIGSTOP); err != nil {
		s.t.Fatalf("pausing redis-server on port %d: %v", s.port, err)
	}
	s.paused = true
}

// Resume lets a paused server go on (SIGCONT); it then answers what it was
// sent while paused, as a Redis recovering from a stall would.
func (s *Server) Resume() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.t.Fatalf("resuming redis-server on port %d: it is not running", s.port)
	}
	if err := s.signal(syscall.SIGCONT); err != nil {
		s.t.Fatalf("resuming redis-server on port %d: %v", s.port, err)
	}
	s.paused = false
}

// Kill stops the server at once (SIGKILL), as a crash or a network cut
// would. The port stays reserved for Restart. It works on a paused server
// too, so a test that pauses a server never has to resume it.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kill()
}

func (s *Server) kill() {
	if s.cmd == nil {
		return
	}
	// SIGKILL ends a stopped process too, so a paused server needs no
	// Resume first and the wait below cannot hang on it.
	_ = s.signal(syscall.SIGKILL)
	<-s.done
	s.cmd, s.paused = nil, false
}

// signal sends sig to the server's whole process group, so that a child it
// forked (an RDB for a replica) stops, goes on or dies with it.
func (s *Server) signal(sig syscall.Signal) error {
	err := syscall.Kill(-s.cmd.Process.Pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		err = nil // already gone: Kill's wait reports it
	}
	return err
}

// Restart starts an empty server on the same port, with the same arguments,
// after Kill (it kills the server first if it is still running).
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	if err := s.start(); err != nil {
		s.t.Fatalf("restarting redis-server on port %d: %v", s.port, err)
	}
}

func (s *Server) cleanup() {
	s.Kill()
	if s.t.Failed() {
		if tail := s.logTail(30); tail != "" {
			s.t.Logf("last lines of redis-server on port %d (%s):\n%s", s.port, s.logPath(), tail)
		}
	}
}

func (s *Server) logPath() string { return filepath.Join(s.dir, "redis-server.log") }

// logTail returns the last n lines the process wrote, for failure messages.
func (s *Server) logTail(n int) string {
	b, err := os.ReadFile(s.logPath())
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (s *Server) start() error {
	log, err := os.OpenFile(s.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close() // the child has its own copy
	cmd := exec.Command("redis-server", s.args...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid: true,
		// If the test binary dies without running cleanups (a -timeout
		// panic, a crash), the server must not outlive it.
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	s.mu.Lock()
	s.cmd, s.done, s.paused = cmd, make(chan error, 1), false
	s.mu.Unlock()
	go func() { s.done <- cmd.Wait() }()
	if err := s.waitReady(cmd.Process.Pid); err != nil {
		s.Kill()
		return fmt.Errorf("%w\n%s", err, s.logTail(10))
	}
	return nil
}

// waitReady waits until the process answers on its port. It checks the pid
// the answer names, since a port lost to a race may be answered by somebody
// else's server while ours has already exited.
func (s *Server) waitReady(pid int) error {
	o := s.options()
	o.MaxRetries = -1
	c := redis.NewClient(o)
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		info, err := c.Info(ctx, "server").Result()
		cancel()
		if err == nil {
			if got := infoField(info, "process_id"); got != strconv.Itoa(pid) {
				err = fmt.Errorf("port %d is answered by process %s, not by ours (%d)", s.port, got, pid)
			}
		} else if authRequired(err) {
			// A server locked by ACL options we do not know answered: it is
			// up, and it can only be ours if our process is still alive.
			err = nil
		}
		select {
		case exit := <-s.done:
			s.done <- exit // for Kill
			return fmt.Errorf("redis-server on port %d exited: %v", s.port, exit)
		default:
		}
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on port %d did not answer: %w", s.port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func authRequired(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := rerr.Error()
	return strings.HasPrefix(msg, "NOAUTH") || strings.HasPrefix(msg, "WRONGPASS") ||
		strings.HasPrefix(msg, "NOPERM")
}

// infoField returns one "name:value" field of an INFO reply.
func infoField(info, name string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), name+":"); ok {
			return v
		}
	}
	return ""
}

// lastValue returns the value after the last occurrence of option in args,
// the one redis-server applies.
func lastValue(args []string, option string) string {
	v := ""
	for i := 0; i+1 < len(args); i++ {
		if args[i] == option {
			v = args[i+1]
		}
	}
	return v
}

func requireBinary(t testing.TB, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Fatalf("%s is not on PATH (install it, e.g. apt-get install redis-server): %v", name, err)
	}
}

func freePort(t testing.TB) int {
	port, err := freeport.Pick()
	if err != nil {
		t.Fatalf("finding a free port: %v", err)
	}
	return port
}
