package telemetrydedup

import (
	"sync"
	"time"

	"go.uber.org/zap"
)

// storeErrorLogEvery spaces out store error lines: during an outage every
// request fails the same way, and one line per request would bury the log.
const storeErrorLogEvery = 10 * time.Second

// throttledLog writes a warning at most once per period, with the number of
// occurrences it held back since the last line.
type throttledLog struct {
	logger *zap.Logger
	every  time.Duration

	mu      sync.Mutex
	last    time.Time
	dropped int
}

func newThrottledLog(logger *zap.Logger, every time.Duration) *throttledLog {
	return &throttledLog{logger: logger, every: every}
}

func (t *throttledLog) log(msg string, err error) { t.logTo(t.logger, msg, err) }

// logTo is log to a logger the caller picks at the time: a connection's
// lines go to the latest config's.
func (t *throttledLog) logTo(logger *zap.Logger, msg string, err error) {
	t.mu.Lock()
	now := time.Now()
	if now.Sub(t.last) < t.every {
		t.dropped++
		t.mu.Unlock()
		return
	}
	dropped := t.dropped
	t.last, t.dropped = now, 0
	t.mu.Unlock()
	fields := []zap.Field{zap.Error(err), zap.Int("similar_since_last_line", dropped)}
	if fix := storeErrorFix(err); fix != "" {
		fields = append(fields, zap.String("fix", fix))
	}
	logger.Warn(msg, fields...)
}
