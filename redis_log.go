package telemetrydedup

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// goRedisLog takes the lines go-redis writes itself into Caddy's log: a
// pool's failed dials, a Sentinel's master found or failed over, a
// connection dropped. go-redis writes them as plain text to stderr, past
// Caddy's log outputs and levels, and during an outage its pool wrote
// about 13 lines a second there. They carry no level: most are notes
// (the master a Sentinel named), and the failures among them are the
// module's own store errors too, which it warns of. So they are info
// lines, each kind (its format) at most once per every, with a count of
// those held back; the last one held back is written once its period is
// over, as a kind may not come again (a failover's new master). go-redis
// has one logger a process, so this takes the lines of every go-redis
// client in Caddy.
type goRedisLog struct {
	logger func() *zap.Logger
	every  time.Duration

	mu    sync.Mutex
	kinds map[string]*goRedisKind // by format
}

// goRedisKind is one kind of go-redis line: when one was last written,
// and the latest held back since, with how many were.
type goRedisKind struct {
	last     time.Time
	held     string
	heldBack int
	flushing bool
}

func newGoRedisLog(logger func() *zap.Logger, every time.Duration) *goRedisLog {
	return &goRedisLog{logger: logger, every: every, kinds: map[string]*goRedisKind{}}
}

// Printf implements go-redis' internal.Logging.
func (g *goRedisLog) Printf(_ context.Context, format string, v ...any) {
	line := fmt.Sprintf(format, v...)
	g.mu.Lock()
	now := time.Now() // after the lock: a slow write before it does not shorten the period
	k := g.kinds[format]
	if k == nil {
		k = &goRedisKind{}
		g.kinds[format] = k
	}
	if now.Sub(k.last) >= g.every {
		// A line held back and not yet written (its timer is late) is
		// counted in this one, newer, rather than written after it.
		similar := k.heldBack
		k.last, k.held, k.heldBack = now, "", 0
		g.write(line, similar) // under g.mu: a kind's lines are written in their order
		g.mu.Unlock()
		return
	}
	k.held = line
	k.heldBack++
	if !k.flushing {
		k.flushing = true
		time.AfterFunc(k.last.Add(g.every).Sub(now), func() { g.flush(k) })
	}
	g.mu.Unlock()
}

// flush writes the latest line of k held back, with how many others were,
// once k's period is over.
func (g *goRedisLog) flush(k *goRedisKind) {
	g.mu.Lock()
	if k.heldBack == 0 { // counted in a newer line already
		k.flushing = false
		g.mu.Unlock()
		return
	}
	if wait := g.every - time.Since(k.last); wait > 0 { // a line was written since the timer was set
		time.AfterFunc(wait, func() { g.flush(k) })
		g.mu.Unlock()
		return
	}
	g.write(k.held, k.heldBack-1)
	k.held, k.heldBack, k.flushing, k.last = "", 0, false, time.Now()
	g.mu.Unlock()
}

func (g *goRedisLog) write(line string, similar int) {
	g.logger().Info(line, zap.Int("similar_since_last_line", similar))
}

func init() {
	redis.SetLogger(newGoRedisLog(func() *zap.Logger { return caddy.Log().Named("go-redis") }, storeErrorLogEvery))
}
