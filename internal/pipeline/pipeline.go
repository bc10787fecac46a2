// Package pipeline sends the Redis commands of concurrent requests together,
// one round trip for whatever is waiting, so that a busy handler pays for
// far fewer round trips than it has pings.
package pipeline

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Pipeline sends the Redis commands of concurrent requests together. A
// request queues its commands; if no batch is on its way, it sends the queue
// itself as one pipeline (one round trip), after letting the goroutines that
// are ready to run go first (see sendQueued), so a request that comes alone
// waits for nothing and nobody. While a batch is on its way, requests queue
// up, and whoever sends next takes them all.
//
// Commands that need no answer before their caller goes on (Go) queue the
// same way and are sent by the pipeline's own goroutine. Batches go one
// after the other, in the order their commands queued: a command queued
// before another on the same key (on a Cluster, the same slot) reaches
// Redis before it, which is the order callers rely on (a settlement before
// the next claim of its observation, a release before its retry).
//
// On a Cluster, each master's commands have a queue of their own (a shard,
// see route), so that a master that is down, hung or migrating a slot holds
// up only the commands for its slots: go-redis splits a pipeline per node
// but waits for every node, so with one queue for all, every request waited
// out the store timeout behind a batch that held a command for the hung
// master. A shard still sends through the Cluster client, which follows
// MOVED and ASK and reloads the slot map. The order of a key's commands
// holds while its master stays the same: across a failover or a migration,
// a command queued on the old master's shard may reach the key's new master
// after one queued later on the new master's shard.
//
// One Pipeline serves every store on one Redis connection; Close flushes and
// stops it.
type Pipeline struct {
	one     *shard               // every command's, unless on a Cluster
	cluster *redis.ClusterClient // else this, a shard per master

	mu     sync.Mutex
	shards map[string]*shard // by master address; only grows
	closed bool
}

// shard is one queue of commands and its batches, one on its way at a time.
type shard struct {
	// client sends the batches and loads the scripts Redis lacks: on a
	// Cluster, the Cluster client, which loads them on every master. A
	// script may be missing on a master other than the shard's (ASK sends
	// a command to the master a slot is moving to), and a master's own
	// client goes stale (go-redis closes it a minute after the node left
	// the slot map, and makes a new one if it comes back).
	client redis.UniversalClient

	mu    sync.Mutex
	queue []*pipelineJob
	// sending reports a batch on its way. One at a time keeps batches
	// large: a round trip costs both sides system calls however little it
	// carries, and on a busy server that cost, not the wait, is what limits
	// throughput (measured: two batches at a time carried 3.4 commands a
	// round trip under load, one with the yield of sendQueued 8.6, for 6%
	// more new pings per second and a third less Redis CPU). Whoever set it
	// sends until the queue is empty, or hands that on to drain.
	sending bool
	closed  bool

	// wake hands the sending of what is queued to drain, which then sends
	// until the queue is empty. Only the sender hands it on, so at most one
	// hand-over is ever waiting.
	wake chan struct{}
	stop chan struct{}
	done chan struct{}

	roundTrips, commands atomic.Uint64
}

// maxPipeline caps the commands of one round trip.
const maxPipeline = 512

// ErrClosed answers commands queued after Close.
var ErrClosed = errors.New("redis pipeline closed")

// pipelineJob is one request's commands, answered on answered (Do) or by
// calling then (Go).
type pipelineJob struct {
	cmds     []Cmd
	deadline time.Time
	answered chan error
	then     func(error)
	// split, when the commands live on several masters, holds the answers
	// of the parts sent to each.
	split *splitJob
}

// splitJob is a job whose commands went to several masters' shards, a part
// to each, answered once every part is, or given up by its caller before:
// a part a hung master holds up does not cost the others their answers.
type splitJob struct {
	job  *pipelineJob
	cmds [][]int // by part, the job's commands in it

	mu       sync.Mutex
	errs     []error // by part
	answered []bool  // by part
	left     int
	gaveUp   bool
}

// answerPart records part k's outcome, its commands' results in cmds, and
// answers the job when it was the last part.
func (s *splitJob) answerPart(k int, cmds []Cmd, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.left--
	if s.gaveUp {
		return // its caller has gone with what it had
	}
	for j, i := range s.cmds[k] {
		s.job.cmds[i].Result = cmds[j].Result
	}
	s.errs[k], s.answered[k] = err, true
	if s.left == 0 {
		s.job.answer(s.outcome(nil))
	}
}

// giveUp ends its caller's wait, with cause for the parts not answered yet:
// the outcome of those that were. Nothing is written into the job after it.
func (s *splitJob) giveUp(cause error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gaveUp = true
	return s.outcome(cause)
}

// outcome is nil when every part succeeded; the first failure when no
// command has a result; else a *PartialError naming the commands without
// one: those of the parts that failed or were not answered (failed with
// pending), and those a part's answer refused (an error reply, such as a
// migrating slot's TRYAGAIN, fails its own command, and the part's other
// commands hold their results). Counting a part refused in one command as
// failed whole, when the other master's part hung, made the whole call a
// plain timeout, and the releases that master made were counted failed.
// s.mu must be held.
func (s *splitJob) outcome(pending error) error {
	var first error
	failed := make([]bool, len(s.job.cmds))
	some := false // command with a result
	for k, cmds := range s.cmds {
		err := s.errs[k]
		if !s.answered[k] {
			err = pending
		}
		first = cmp.Or(first, err)
		for _, i := range cmds {
			failed[i] = err != nil && (!IsReply(err) || refused(s.job.cmds[i]))
			some = some || !failed[i]
		}
	}
	if first == nil || !some {
		return first
	}
	return &PartialError{Err: first, Failed: failed}
}

// refused reports a command of a part Redis answered with an error reply
// that holds no result of its own: its own error (a nil reply, such as a
// SET NX's that won, is a result), or none at all.
func refused(c Cmd) bool {
	if c.Result == nil {
		return true
	}
	err := c.Result.Err()
	return err != nil && !errors.Is(err, redis.Nil)
}

// PartialError answers a Do on a Cluster whose commands went to several
// masters when some answered and some did not (down, hung, or their part
// refused): the commands of those that answered hold their results.
type PartialError struct {
	// Err is the first failed part's error.
	Err error
	// Failed is, per command, whether it has no result.
	Failed []bool
}

// Error is the first failed part's.
func (e *PartialError) Error() string { return e.Err.Error() }

// Unwrap returns the first failed part's error.
func (e *PartialError) Unwrap() error { return e.Err }

// answer gives the job its outcome: nil or the first command error.
func (job *pipelineJob) answer(err error) {
	if job.then != nil {
		job.then(err)
		return
	}
	job.answered <- err
}

// Cmd is one command: a plain one (Queue only), or a script, which is sent
// as EVALSHA and loaded once if Redis does not know it yet (see EvalSha).
type Cmd struct {
	// Key is the (first) key the command acts on: on a Cluster, the command
	// goes to the shard of the key's master.
	Key string
	// Queue adds the command to a pipeline and returns it.
	Queue func(ctx context.Context, p redis.Pipeliner) redis.Cmder
	// Script is the script Queue runs by SHA, if it is one.
	Script *redis.Script
	// Result is the command, with its answer, after the round trip.
	Result redis.Cmder
}

// New returns a pipeline on client. Its shards' goroutines, which send the
// batches nobody waiting is sending, run until Close.
func New(client redis.UniversalClient) *Pipeline {
	p := &Pipeline{shards: map[string]*shard{}}
	if c, ok := client.(*redis.ClusterClient); ok {
		p.cluster = c
	} else {
		p.one = newShard(client)
		p.shards[""] = p.one
	}
	return p
}

func newShard(client redis.UniversalClient) *shard {
	s := &shard{client: client, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go s.drain()
	return s
}

// RoundTrips returns how many pipelines Redis answered, and how many commands
// they carried, since the Pipeline was made.
func (p *Pipeline) RoundTrips() (roundTrips, commands uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.shards {
		roundTrips += s.roundTrips.Load()
		commands += s.commands.Load()
	}
	return roundTrips, commands
}

// Do runs cmds in one round trip (shared with other requests; on a
// Cluster, one a master) and returns the first command error; redis.Nil,
// an absent key, is not one. On a Cluster, when some masters answered and
// others did not, it is a *PartialError naming the commands without a
// result. It gives up with context.DeadlineExceeded once
// timeout has passed, or when ctx ends, whichever comes first.
//
// The timeout is a parameter rather than a context.WithTimeout of the
// caller's: a pooled timer costs a quarter of what a context with its own
// timer does (measured: 0.2 µs and 2 allocations against 0.86 µs and 7), and
// every ping pays it once or twice.
func (p *Pipeline) Do(ctx context.Context, timeout time.Duration, cmds []Cmd) error {
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	job := &pipelineJob{cmds: cmds, deadline: deadline, answered: make(chan error, 1)}
	if lead := p.enqueue(ctx, job); lead != nil && lead.sendQueued() {
		lead.wake <- struct{}{}
	}
	select { // a lead's own job is usually answered by now: no timer for it
	case err := <-job.answered:
		return err
	default:
	}
	timer := startTimer(time.Until(deadline))
	defer stopTimer(timer)
	select {
	case err := <-job.answered:
		return err
	case <-ctx.Done():
		return job.giveUp(ctx.Err())
	case <-timer.C:
		return job.giveUp(context.DeadlineExceeded)
	}
}

// giveUp ends a caller's wait for job with cause: for a job split over
// masters, what the parts that answered said.
func (job *pipelineJob) giveUp(cause error) error {
	if job.split == nil {
		return cause
	}
	select {
	case err := <-job.answered: // answered whole meanwhile
		return err
	default:
	}
	return job.split.giveUp(cause)
}

// Go queues cmds to run as Do's would, within timeout, and returns at once:
// the pipeline's goroutines send them, and then calls then with the first
// command error or nil (or with context.DeadlineExceeded if the timeout
// passed before they could go, or ErrClosed after Close). then runs on the
// goroutine that sent the batch, the pipeline's own or a Do caller's: it
// must not block. Commands queued by Go reach Redis before any queued on
// the same keys after Go returns.
func (p *Pipeline) Go(timeout time.Duration, cmds []Cmd, then func(error)) {
	job := &pipelineJob{cmds: cmds, deadline: time.Now().Add(timeout), then: then}
	if lead := p.enqueue(context.Background(), job); lead != nil {
		lead.wake <- struct{}{}
	}
}

// enqueue queues job and returns the shard whose sender the caller now is,
// if any: the caller must send its batch or hand it to drain.
func (p *Pipeline) enqueue(ctx context.Context, job *pipelineJob) (lead *shard) {
	if p.cluster == nil {
		if p.one.enqueue(job, false) {
			return p.one
		}
		return nil
	}
	return p.route(ctx, job)
}

// route queues job on the shard of its commands' master or, if they live on
// several, a part of it on each, answering job once every part has been
// answered: with the first error of the parts (in the order of their first
// commands) when all failed, else with a PartialError (see splitJob). It hands the sending of
// every shard the caller leads but one to that shard's drain: a caller that
// sent one batch after the other would hold up a healthy master's queue
// behind a hung one's.
//
// A job whose master cannot be found is answered with the error: the slot
// map is loaded on first use, and if it cannot be, a pipeline through the
// Cluster client would fail to load it too. The load waits no longer than
// the job's deadline.
func (p *Pipeline) route(ctx context.Context, job *pipelineJob) (lead *shard) {
	ctx, cancel := context.WithDeadline(ctx, job.deadline)
	defer cancel()
	var parts []part
	for i, c := range job.cmds {
		s, err := p.shardFor(ctx, c.Key)
		if err != nil {
			job.answer(err)
			return nil
		}
		k := slices.IndexFunc(parts, func(pt part) bool { return pt.shard == s })
		if k < 0 {
			k = len(parts)
			parts = append(parts, part{shard: s})
		}
		parts[k].cmds = append(parts[k].cmds, i)
	}
	switch len(parts) {
	case 0:
		job.answer(nil)
		return nil
	case 1:
		if parts[0].shard.enqueue(job, false) {
			return parts[0].shard
		}
		return nil
	}
	split := &splitJob{job: job, errs: make([]error, len(parts)), answered: make([]bool, len(parts)), left: len(parts)}
	for _, pt := range parts {
		split.cmds = append(split.cmds, pt.cmds)
	}
	job.split = split
	for k, pt := range parts {
		cmds := make([]Cmd, len(pt.cmds))
		for j, i := range pt.cmds {
			cmds[j] = job.cmds[i]
		}
		answered := func(err error) { split.answerPart(k, cmds, err) }
		if pt.shard.enqueue(&pipelineJob{cmds: cmds, deadline: job.deadline, then: answered}, false) {
			if lead != nil {
				lead.wake <- struct{}{}
			}
			lead = pt.shard
		}
	}
	return lead
}

// part is the commands of a job, by index, that go to one shard.
type part struct {
	shard *shard
	cmds  []int
}

// shardFor returns the shard of key's master, made on its first command.
func (p *Pipeline) shardFor(ctx context.Context, key string) (*shard, error) {
	master, err := p.cluster.MasterForKey(ctx, key)
	if err != nil {
		return nil, err
	}
	addr := master.Options().Addr
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	s := p.shards[addr]
	if s == nil {
		s = newShard(p.cluster)
		p.shards[addr] = s
	}
	return s, nil
}

// enqueue queues job, answering it ErrClosed after Close, and reports
// whether the caller is now the sender. closing makes job the last one the
// shard takes.
func (s *shard) enqueue(job *pipelineJob, closing bool) (lead bool) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		job.answer(ErrClosed)
		return false
	}
	s.queue = append(s.queue, job)
	s.closed = closing
	lead = !s.sending
	s.sending = true
	s.mu.Unlock()
	return lead
}

// Flush sends what is queued and waits until it has been answered: the
// callbacks of the commands queued by Go before it have run.
func (p *Pipeline) Flush() { p.eachShard(func(s *shard) { s.flush(false) }) }

// Close sends what is queued, waits until it has been answered, and stops
// the pipeline's goroutines; commands queued later are answered ErrClosed.
// It does not close the client.
func (p *Pipeline) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.eachShard((*shard).close)
}

// eachShard runs f on every shard, side by side: a hung master's flush
// holds up no other.
func (p *Pipeline) eachShard(f func(*shard)) {
	p.mu.Lock()
	shards := slices.Collect(maps.Values(p.shards))
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range shards {
		wg.Go(func() { f(s) })
	}
	wg.Wait()
}

// flush queues a job with no commands, the shard's last if closing, and
// waits for its answer: once it is answered, so is everything queued
// before it. It reports whether the shard was still open.
func (s *shard) flush(closing bool) bool {
	last := &pipelineJob{deadline: time.Now().Add(time.Hour), answered: make(chan error, 1)}
	if s.enqueue(last, closing) {
		s.wake <- struct{}{}
	}
	return !errors.Is(<-last.answered, ErrClosed)
}

func (s *shard) close() {
	if s.flush(true) {
		close(s.stop)
		<-s.done
	}
}

// timers are stopped timers, for Do to wait with.
var timers sync.Pool

func startTimer(d time.Duration) *time.Timer {
	t, ok := timers.Get().(*time.Timer)
	if !ok {
		return time.NewTimer(d)
	}
	t.Reset(d)
	return t
}

// stopTimer stops t and keeps it for another Do if it had not fired: then
// its channel holds no tick, under either timer-channel semantics a build's
// GODEBUG may choose, and a reused timer never fires early.
func stopTimer(t *time.Timer) {
	if t.Stop() {
		timers.Put(t)
	}
}

// sendQueued sends what is queued as one batch. It first yields to the
// goroutines that are ready to run: on a busy server those are requests about
// to queue their commands, which then travel in this round trip instead of
// the next; on an idle one nothing else is ready and the yield returns at
// once. Unlike waiting on a timer, it costs no system call and never waits
// for nothing. It reports whether more has queued up meanwhile: the caller
// must then send that too, or hand it to drain, as the shard still counts a
// batch as on its way.
func (s *shard) sendQueued() (more bool) {
	runtime.Gosched()
	s.mu.Lock()
	batch := s.take()
	if len(batch) == 0 { // every job in it had expired
		s.sending = false
		s.mu.Unlock()
		return false
	}
	s.mu.Unlock()
	s.send(batch)

	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queue) > 0 {
		return true
	}
	s.sending = false
	return false
}

// drain sends, on each hand-over, batches until nothing is queued. A
// request that sent a batch hands what queued behind it to drain, so that
// its caller gets its answer now rather than after serving everyone else;
// commands queued by Go are handed to it at once. One long-lived goroutine
// serves every busy stretch: a goroutine a batch grew a new stack each time,
// go-redis's call path being deep (stack growth took 5.3 µs a new ping in a
// CPU profile of Caddy under all-new load, 2.0 with one drainer a stretch).
func (s *shard) drain() {
	defer close(s.done)
	for {
		select {
		case <-s.wake:
			for s.sendQueued() {
			}
		case <-s.stop:
			return
		}
	}
}

// take removes from the queue the jobs of one batch, up to maxPipeline
// commands. A job whose caller has given up is answered with
// context.DeadlineExceeded and never sent: a claim written after its
// request was told the store failed would stand as an orphan, and the
// caller's view (it may have been written, or not) stays true only if
// nothing is written later than the deadline. The caller holds s.mu.
func (s *shard) take() []*pipelineJob {
	now := time.Now()
	var batch []*pipelineJob
	n, i := 0, 0
	for ; i < len(s.queue); i++ {
		job := s.queue[i]
		if job.expired(now) {
			job.answer(context.DeadlineExceeded)
			continue
		}
		if len(batch) > 0 && n+len(job.cmds) > maxPipeline {
			break
		}
		batch = append(batch, job)
		n += len(job.cmds)
	}
	s.queue = slices.Delete(s.queue, 0, i)
	return batch
}

func (job *pipelineJob) expired(now time.Time) bool { return !now.Before(job.deadline) }

// send runs a batch as one pipeline, with the latest deadline among its
// jobs (each job's caller still gives up at its own), then once more for
// the scripts Redis did not know yet.
func (s *shard) send(batch []*pipelineJob) {
	var latest time.Time // Close's empty job, due in an hour, sends nothing
	for _, job := range batch {
		if len(job.cmds) > 0 && job.deadline.After(latest) {
			latest = job.deadline
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), latest)
	defer cancel()

	s.exec(ctx, batch, func(*Cmd) bool { return true })
	if scripts := unknownScripts(batch); len(scripts) > 0 {
		for _, script := range scripts {
			script.Load(ctx, s.client) // a Cluster client loads it on every master
		}
		// Again for the jobs whose callers still wait (see take).
		live := slices.DeleteFunc(slices.Clone(batch), func(job *pipelineJob) bool { return job.expired(time.Now()) })
		s.exec(ctx, live, func(c *Cmd) bool { return isNoScript(c.Result.Err()) })
	}
	for _, job := range batch {
		job.answer(job.err())
	}
}

// exec sends the commands that want says need sending, as one pipeline.
func (s *shard) exec(ctx context.Context, batch []*pipelineJob, want func(*Cmd) bool) {
	pipe := s.client.Pipeline()
	n := 0
	for _, job := range batch {
		for i := range job.cmds {
			if c := &job.cmds[i]; want(c) {
				c.Result = c.Queue(ctx, pipe)
				n++
			}
		}
	}
	if n == 0 {
		return
	}
	if err := Exec(ctx, pipe); err == nil || IsReply(err) { // a round trip Redis answered; errors are per command
		s.roundTrips.Add(1)
		s.commands.Add(uint64(n))
	}
}

// IsReply reports an error that is Redis's own reply (a refusal: NOPERM,
// WRONGPASS, LOADING, ...), not a failure to get one (a dial refused, a
// connection lost). Only a pipeline Redis answered counts as a round trip:
// the attempts of an outage, or of a replaced connection's reconciler on a
// Redis that is gone, are none.
func IsReply(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply)
}

// Exec runs pipe's commands in one round trip and returns the first
// failed command's error, as pipe.Exec does; each command holds its own.
// A Redis error reply to the connection's handshake (a wrong password, a
// user without SELECT), which go-redis leaves off the commands, is set on
// every command: none ran, and each would read as an empty answer.
func Exec(ctx context.Context, pipe redis.Pipeliner) error {
	sent, err := pipe.Exec(ctx)
	if err != nil && !slices.ContainsFunc(sent, func(c redis.Cmder) bool { return c.Err() != nil }) {
		for _, c := range sent {
			c.SetErr(err)
		}
	}
	return err
}

func unknownScripts(batch []*pipelineJob) []*redis.Script {
	var scripts []*redis.Script
	for _, job := range batch {
		for _, c := range job.cmds {
			if c.Script != nil && isNoScript(c.Result.Err()) && !slices.Contains(scripts, c.Script) {
				scripts = append(scripts, c.Script)
			}
		}
	}
	return scripts
}

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// err is the job's first command error; an absent key is an answer, not an
// error.
func (job *pipelineJob) err() error {
	for _, c := range job.cmds {
		if err := c.Result.Err(); err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
	}
	return nil
}

// EvalSha queues a script by SHA: the round trip carries the hash, not the
// script, and the script is loaded the first time Redis says it lacks it.
// Its keys must share a slot, as any script's on a Cluster.
func EvalSha(s *redis.Script, keys []string, args ...any) Cmd {
	var key string
	if len(keys) > 0 {
		key = keys[0]
	}
	return Cmd{
		Key:    key,
		Script: s,
		Queue: func(ctx context.Context, p redis.Pipeliner) redis.Cmder {
			return s.EvalSha(ctx, p, keys, args...)
		},
	}
}
