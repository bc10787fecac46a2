package telemetrydedup

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// go-redis's own lines go to the log at warn, each kind (its format) at
// most once per storeErrorLogEvery, the next one counting those held back.
func TestGoRedisLinesAreLoggedAKindAtATime(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	g := &goRedisLog{logger: func() *zap.Logger { return zap.New(core) }, kinds: map[string]*throttledLog{}}
	for i := range 50 {
		g.Printf(context.Background(), "redis: connection pool: failed to dial after %d attempts: %v", 5, fmt.Errorf("dial %d: connection refused", i))
		g.Printf(context.Background(), "redis: discarding bad PubSub connection: %v", "EOF")
	}
	lines := logs.All()
	if len(lines) != 2 {
		t.Fatalf("100 lines of two kinds logged %d lines; want one of each kind", len(lines))
	}
	for _, l := range lines {
		if l.Level != zapcore.WarnLevel || !strings.Contains(fmt.Sprint(l.ContextMap()["error"]), "redis: ") {
			t.Errorf("a go-redis line logged as %s %q %v; want a warning with go-redis's text", l.Level, l.Message, l.ContextMap())
		}
	}
}

// A Redis outage writes none of go-redis's plain-text lines to standard
// error (its pool's failed dials, about 13 a second), which bypassed
// Caddy's log outputs, levels and format. (Helper 6's review, stop 62.)
//
// Setup: a redis store, a ping accepted, Redis killed, then 60 pings over
// 3 s.
func TestARedisOutageWritesNoLinesOutsideCaddysLog(t *testing.T) {
	srv := redistest.Start(t)
	tt := tableHandler(t, fmt.Sprintf(`{"key_prefix":"raw-lines:","store":{"type":"redis","url":%q,"timeout":50000000}}`, srv.URL()))
	at := time.Now().UTC().Add(-time.Minute).Truncate(time.Second)
	if res := tt.post(fmt.Sprintf(`{"asset_id":"veh-raw-0","occurred_at":%q,"lat":52.52,"lon":13.40}`, at.Format(time.RFC3339)), "application/json", nil); res.header.Get("X-Dedup") != "accepted" {
		t.Fatalf("setup: %d %v", res.status, res.header)
	}
	srv.Kill()
	stderr := captureFD2(t, func() {
		for i := range 60 {
			tt.post(fmt.Sprintf(`{"asset_id":"veh-raw-%d","occurred_at":%q,"lat":52.52,"lon":13.40}`, i%7, at.Add(time.Duration(i)*time.Second).Format(time.RFC3339)), "application/json", nil)
			time.Sleep(50 * time.Millisecond)
		}
	})
	var raw []string
	for _, line := range strings.Split(stderr, "\n") {
		if strings.HasPrefix(line, "redis: ") {
			raw = append(raw, line)
		}
	}
	if len(raw) > 0 {
		t.Errorf("a 3 s Redis outage wrote %d plain-text lines to stderr outside Caddy's logger (go-redis's own logger), e.g.\n%s",
			len(raw), raw[0])
	}
}

// captureFD2 runs f with the process's standard error (file descriptor 2)
// going to a file, and returns what was written there: what a Caddy run
// under systemd or Docker puts in its log stream besides Caddy's own
// logger's lines.
func captureFD2(t *testing.T, f func()) string {
	t.Helper()
	out, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	saved, err := syscall.Dup(2)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Dup3(int(out.Fd()), 2, 0); err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() { _ = syscall.Dup3(saved, 2, 0); _ = syscall.Close(saved) }()
		f()
	}()
	b, err := os.ReadFile(out.Name())
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
