package telemetrydedup

import (
	"context"
	"fmt"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// goRedisLog takes the lines go-redis writes itself (a pool's failed
// dials, a connection it dropped) into Caddy's log, as warnings, each kind
// at most once per storeErrorLogEvery with a count of those held back.
// go-redis writes them as plain text to stderr, past Caddy's log outputs
// and levels: during an outage its pool wrote about 13 lines a second
// there. go-redis has one logger for the process, so this takes the lines
// of every go-redis client in Caddy.
type goRedisLog struct {
	logger func() *zap.Logger

	mu    sync.Mutex
	kinds map[string]*throttledLog // by format
}

// Printf implements go-redis' internal.Logging.
func (g *goRedisLog) Printf(_ context.Context, format string, v ...any) {
	g.mu.Lock()
	kind := g.kinds[format]
	if kind == nil {
		kind = newThrottledLog(nil, storeErrorLogEvery)
		g.kinds[format] = kind
	}
	g.mu.Unlock()
	kind.logTo(g.logger(), "the Redis client reports", fmt.Errorf(format, v...))
}

func init() {
	redis.SetLogger(&goRedisLog{
		logger: func() *zap.Logger { return caddy.Log().Named("go-redis") },
		kinds:  map[string]*throttledLog{},
	})
}
