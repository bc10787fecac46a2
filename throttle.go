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
	// held is the latest occurrence held back, which flush writes.
	held heldLine
}

// heldLine is an occurrence a throttledLog held back.
type heldLine struct {
	logger *zap.Logger
	msg    string
	err    error
}

// newThrottledLog writes to logger at most once per storeErrorLogEvery.
func newThrottledLog(logger *zap.Logger) *throttledLog {
	return &throttledLog{logger: logger, every: storeErrorLogEvery}
}

func (t *throttledLog) log(msg string, err error) { t.logTo(t.logger, msg, err) }

// logTo is log to a logger the caller picks at the time: a connection's
// lines go to the latest config's.
func (t *throttledLog) logTo(logger *zap.Logger, msg string, err error) {
	t.mu.Lock()
	now := time.Now()
	if now.Sub(t.last) < t.every {
		t.dropped++
		t.held = heldLine{logger, msg, err}
		t.mu.Unlock()
		return
	}
	dropped := t.dropped
	t.last, t.dropped, t.held = now, 0, heldLine{}
	t.mu.Unlock()
	writeStoreError(logger, msg, err, dropped)
}

// flush writes the latest occurrence held back, if any, counting the
// others: a config unloaded or a connection closed in an outage logs no
// more, and the failures of its last seconds would be told by no line.
func (t *throttledLog) flush() {
	t.mu.Lock()
	dropped, held := t.dropped, t.held
	t.dropped, t.held = 0, heldLine{}
	t.mu.Unlock()
	if dropped > 0 {
		writeStoreError(held.logger, held.msg, held.err, dropped-1)
	}
}

// writeStoreError writes one store error line, with the fix for its error
// if there is one.
func writeStoreError(logger *zap.Logger, msg string, err error, similar int) {
	fields := []zap.Field{zap.Error(err), zap.Int("similar_since_last_line", similar)}
	if fix := storeErrorFix(err); fix != "" {
		fields = append(fields, zap.String("fix", fix))
	}
	logger.Warn(msg, fields...)
}
