package telemetrydedup

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// go-redis's own lines go to the log at info, each kind (its format) at
// most once per period; the last one held back is written when the period
// is over, with how many others were.
func TestGoRedisLinesAreLoggedAKindAtATime(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	g := newGoRedisLog(func() *zap.Logger { return zap.New(core) }, 300*time.Millisecond)
	for i := range 50 {
		g.Printf(context.Background(), "redis: connection pool: failed to dial after %d attempts: %v", 5, fmt.Errorf("dial %d: connection refused", i))
		g.Printf(context.Background(), "redis: discarding bad PubSub connection: %v", "EOF")
	}
	if n := logs.Len(); n != 2 {
		t.Fatalf("100 lines of two kinds logged %d lines at once; want the first of each kind", n)
	}
	time.Sleep(600 * time.Millisecond)
	lines := logs.All()
	if len(lines) != 4 {
		t.Fatalf("%d lines once the period was over; want each kind's last line held back too, 4 in all", len(lines))
	}
	dials := logs.FilterMessageSnippet("dial 49:").All()
	if len(dials) != 1 || dials[0].ContextMap()["similar_since_last_line"] != int64(48) {
		t.Errorf("the dials' line held back: %v; want the last dial's, once, with the 48 before it counted", dials)
	}
	for _, l := range lines {
		if l.Level != zapcore.InfoLevel || !strings.HasPrefix(l.Message, "redis: ") {
			t.Errorf("a go-redis line logged as %s %q; want go-redis's text at info", l.Level, l.Message)
		}
	}
}

// One kind of go-redis line written without pause (a pool's failed dials
// in an outage) comes to the log in order and at most once a period: a
// line held back was written by its late timer right after a newer one of
// its kind written at once, the log's last word on that kind stale (an old
// master after a second failover). (Helper 8's review, stop 62.)
func TestAHeldBackGoRedisLineIsNeverWrittenAfterANewerOne(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	g := newGoRedisLog(func() *zap.Logger { return zap.New(core) }, 20*time.Millisecond)
	end := time.Now().Add(600 * time.Millisecond)
	for i := 0; time.Now().Before(end); i++ {
		g.Printf(context.Background(), "sentinel: new master=%q addr=%q", "mymaster", "10.0.0."+strconv.Itoa(i)+":6379")
	}
	time.Sleep(100 * time.Millisecond) // the last held line's flush
	prev, prevAt := -1, time.Time{}
	outOfOrder, tooClose := 0, 0
	var example string
	for _, l := range logs.All() {
		s := l.Message[len(`sentinel: new master="mymaster" addr="10.0.0.`):]
		n, _ := strconv.Atoi(s[:len(s)-len(`:6379"`)])
		if n < prev {
			outOfOrder++
			if example == "" {
				example = "line " + strconv.Itoa(n) + " written after line " + strconv.Itoa(prev)
			}
		}
		if !prevAt.IsZero() && l.Time.Sub(prevAt) < 10*time.Millisecond {
			tooClose++
		}
		prev, prevAt = max(prev, n), l.Time
	}
	if outOfOrder > 0 || tooClose > 0 {
		t.Errorf("of go-redis's %d lines of one kind, %d came less than half a period after the one before, and %d were written "+
			"after a newer line of their kind (%s)", logs.Len(), tooClose, outOfOrder, example)
	}
}

// A healthy Sentinel start writes no warning of go-redis's: its lines
// that it found the master ("sentinel: new master", "sentinel: selected
// addr") are notes, and were warnings, paging an operator who alerts on
// warnings at every start. (Helper 7's review, stop 62.)
func TestAHealthySentinelStartWritesNoGoRedisWarnings(t *testing.T) {
	st := redistest.StartSentinel(t)
	logs, _ := observeGoRedis(t, time.Second)
	store := fmt.Sprintf(`{"type":"redis","addresses":[%q,%q,%q],"master":%q,"timeout":1000000000}`,
		st.Addrs()[0], st.Addrs()[1], st.Addrs()[2], st.MasterName)
	tt := tableHandler(t, `{"key_prefix":"sentinel-lines:","store":`+store+`}`)
	at := time.Now().UTC().Add(-time.Minute).Truncate(time.Second)
	if res := tt.post(fmt.Sprintf(`{"asset_id":"veh-s","occurred_at":%q,"lat":52.52,"lon":13.40}`, at.Format(time.RFC3339)), "application/json", nil); res.header.Get("X-Dedup") != "accepted" {
		t.Fatalf("setup: %d %v", res.status, res.header)
	}
	if logs.Len() == 0 {
		t.Fatal("go-redis wrote no line at a Sentinel start; the test needs its notes")
	}
	for _, l := range logs.All() {
		if l.Level >= zapcore.WarnLevel {
			t.Errorf("a healthy Sentinel start logged %s %q %v", l.Level, l.Message, l.ContextMap())
		}
	}
}

// A Sentinel failover soon after the start is named in the log: go-redis's
// line naming the new master is the second of its kind within the period,
// held back, and is written once the period (10 s here) is over. It was never
// written, and the log's only line on the master named the old, dead one.
// (Helper 7's review, stop 62.)
func TestAFailoverSoonAfterStartIsNamedInTheLog(t *testing.T) {
	st := redistest.StartSentinel(t)
	logs, _ := observeGoRedis(t, 10*time.Second) // longer than the failover takes
	store := fmt.Sprintf(`{"type":"redis","addresses":[%q,%q,%q],"master":%q,"timeout":200000000}`,
		st.Addrs()[0], st.Addrs()[1], st.Addrs()[2], st.MasterName)
	tt := tableHandler(t, `{"key_prefix":"failover-lines:","store":`+store+`}`)
	at := time.Now().UTC().Add(-time.Minute).Truncate(time.Second)
	ping := func(i int) string {
		return fmt.Sprintf(`{"asset_id":"veh-f%d","occurred_at":%q,"lat":52.52,"lon":13.40}`, i, at.Format(time.RFC3339))
	}
	if res := tt.post(ping(0), "application/json", nil); res.header.Get("X-Dedup") != "accepted" {
		t.Fatalf("setup: %d %v", res.status, res.header)
	}
	st.Master().Kill()
	newMaster := st.WaitForFailover(t, 30*time.Second)
	accepted := false
	for i := 1; i < 200 && !accepted; i++ {
		accepted = tt.post(ping(i), "application/json", nil).header.Get("X-Dedup") == "accepted"
		time.Sleep(50 * time.Millisecond)
	}
	if !accepted {
		t.Fatalf("setup: no ping accepted through the new master %s", newMaster)
	}
	var seen []string
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		seen = seen[:0]
		for _, l := range logs.All() {
			seen = append(seen, l.Message)
			if strings.Contains(l.Message, newMaster) {
				return
			}
		}
	}
	t.Errorf("the failover to %s is named by no line of the log; go-redis's lines:\n%s", newMaster, strings.Join(seen, "\n"))
}

// observeGoRedis has go-redis's lines logged to the observer it returns,
// a kind at most once per every, for the rest of the test.
func observeGoRedis(t *testing.T, every time.Duration) (*observer.ObservedLogs, *goRedisLog) {
	core, logs := observer.New(zapcore.DebugLevel)
	g := newGoRedisLog(func() *zap.Logger { return zap.New(core) }, every)
	redis.SetLogger(g)
	t.Cleanup(func() {
		redis.SetLogger(newGoRedisLog(func() *zap.Logger { return caddy.Log().Named("go-redis") }, storeErrorLogEvery))
	})
	return logs, g
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
