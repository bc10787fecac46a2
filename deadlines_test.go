package telemetrydedup

import (
	"context"
	"testing"
	"time"
)

// An upstream request is cut no later than its bound and at most a width
// sooner; requests whose deadlines fall in one width share a timer, and a
// context of another exit shares none.
func TestSharedDeadlinesEndByTheDeadlineAskedFor(t *testing.T) {
	var d sharedDeadlines
	exit, stop := context.WithCancel(context.Background())
	defer stop()
	base := time.Now().Add(time.Hour)
	for _, ask := range []time.Time{base, base.Add(time.Millisecond), base.Add(3 * time.Second), base.Add(deadlineWidth - 1)} {
		got, ok := d.at(exit, ask).Deadline()
		if !ok || got.After(ask) || ask.Sub(got) >= deadlineWidth {
			t.Errorf("asked for %v, the context ends at %v (set %v): want at most %v sooner and never later", ask, got, ok, time.Duration(deadlineWidth))
		}
	}
	start := time.Unix(0, base.UnixNano()&^(deadlineWidth-1))
	if a, b := d.at(exit, start), d.at(exit, start.Add(deadlineWidth-1)); a != b {
		t.Error("two deadlines in one width got contexts of their own")
	}
	if a, b := d.at(exit, start), d.at(exit, start.Add(deadlineWidth)); a == b {
		t.Error("deadlines a width apart share a context")
	}
	other, stopOther := context.WithCancel(context.Background())
	defer stopOther()
	ours := d.at(exit, start)
	if d.at(other, start) == ours {
		t.Error("a context of another exit shares this one's deadline")
	}
	stop()
	if ctx := d.at(exit, start); ctx.Err() == nil {
		t.Error("the exit did not cut a request's deadline context")
	}
	if d.at(other, start).Err() != nil {
		t.Error("one exit cut the requests of another")
	}
}

// A deadline that has passed gives a context that has ended, as
// context.WithDeadline's would.
func TestASharedDeadlineInThePastHasEnded(t *testing.T) {
	var d sharedDeadlines
	ctx := d.at(context.Background(), time.Now().Add(-time.Second))
	select {
	case <-ctx.Done():
	case <-time.After(time.Second):
		t.Fatal("a context whose deadline had passed did not end")
	}
	if ctx.Err() != context.DeadlineExceeded {
		t.Errorf("err %v, want context.DeadlineExceeded", ctx.Err())
	}
}
