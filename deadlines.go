package telemetrydedup

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// deadlineWidth is how finely the deadlines of upstream requests are told
// apart: 2^23 ns, about 8 ms, a few hundredths of the shortest upstream
// bound (minUpstreamTime).
const deadlineWidth = 1 << 23

// sharedDeadlines hands out contexts that end at a deadline, one for all
// the upstream requests whose deadlines fall in the same deadlineWidth,
// each ending at that slot's start: never later than asked. A context with
// a timer of its own for each request cost a new ping 7 allocations and
// a registration with the exit context's children, taken under its lock,
// for a deadline nobody needs to the nanosecond; requests claimed within a
// few milliseconds of each other now share one timer.
//
// It holds the slots of the last deadlineSlots widths, so that requests
// whose claims were made a little apart (a batch's store call outlasting
// a single ping's) do not take turns replacing each other's slot.
type sharedDeadlines struct {
	slots [deadlineSlots]atomic.Pointer[deadlineSlot]
	mu    sync.Mutex // makes a missing slot once
}

// upstreamDeadlines are the deadlines of every handler's upstream requests.
var upstreamDeadlines sharedDeadlines

// deadlineSlots is how many widths sharedDeadlines remembers: half a second.
const deadlineSlots = 64

// deadlineSlot is the context of one width's requests.
type deadlineSlot struct {
	parent context.Context
	end    int64 // UnixNano, a multiple of deadlineWidth
	ctx    context.Context
	// cancel is never called: the timer WithDeadline starts cancels ctx
	// at end, and no request may cut its neighbours' short before then.
	// It is kept so that go vet's lostcancel check sees it is not lost.
	cancel context.CancelFunc
}

// at returns a context derived from parent that ends by deadline: at the
// start of deadline's width.
func (d *sharedDeadlines) at(parent context.Context, deadline time.Time) context.Context {
	end := deadline.UnixNano() &^ (deadlineWidth - 1)
	slot := &d.slots[(end/deadlineWidth)%deadlineSlots]
	if s := slot.Load(); s != nil && s.end == end && s.parent == parent {
		return s.ctx
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if s := slot.Load(); s != nil && s.end == end && s.parent == parent {
		return s.ctx
	}
	ctx, cancel := context.WithDeadline(parent, time.Unix(0, end))
	slot.Store(&deadlineSlot{parent: parent, end: end, ctx: ctx, cancel: cancel})
	return ctx
}
