package dedup

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultReconcileQueue is how many claims a Reconciler holds at most.
const DefaultReconcileQueue = 10_000

// The Reconciler's timing. A failed store call is retried after
// reconcileFirstRetry, doubling up to reconcileMaxRetry. Once the store has
// answered, each claim is acted on again at every reconcileConfirmations
// offset: a command written before the fault may still be on its way when
// the store first answers, behind that answer in the server's socket buffer
// or, after a network cut, in TCP retransmission for up to about a minute.
// Acting by token again undoes what landed late and touches nothing else.
// A claim that lands late waits in_flight_timeout from its landing before
// it counts as settled (RedisStore dates it on Redis's clock), so a
// confirmation within in_flight_timeout of the landing releases it before
// any redelivery is told 200. The first comes soon: a server that hung
// runs what its sockets buffered the moment it resumes, possibly after the
// first answer came on another connection.
const (
	reconcileFirstRetry = 100 * time.Millisecond
	reconcileMaxRetry   = 2 * time.Second
)

// reconcileBatch is about how many claims one store call carries.
const reconcileBatch = 256

// reconcileLastPass bounds Close's last pass over the claims it holds: an
// exit or a reload must not wait long on a Redis that answers slowly. One
// that does not answer at all holds it two store timeouts (or this, if
// shorter): the pass sends a zone nothing more after three calls in a
// row failed whole (inZones).
const reconcileLastPass = 2 * time.Second

// The gaps between confirmations are no longer than DefaultInFlightTimeout,
// so that with it every claim landing in the first minute meets one before
// it could count as settled.
var reconcileConfirmations = []time.Duration{100 * time.Millisecond, time.Second, 10 * time.Second, 30 * time.Second, time.Minute}

// ReconcileOutcome is what became of a claim handed to a Reconciler.
type ReconcileOutcome string

// The outcomes, as counted.
const (
	// ReconcileReleased: the claim had landed, and was released.
	ReconcileReleased ReconcileOutcome = "released"
	// ReconcileReleasedLate: the claim landed after the store first
	// answered, or a failover brought it back after its release (Confirm),
	// and a confirmation released it.
	ReconcileReleasedLate ReconcileOutcome = "released_late"
	// ReconcileNotHeld: when the store answered, it held nothing of the
	// claim.
	ReconcileNotHeld ReconcileOutcome = "not_held"
	// ReconcileSettled: the claim was settled (if it had landed).
	ReconcileSettled ReconcileOutcome = "settled"
	// ReconcileDropped: the queue was full, the Reconciler closed first,
	// or Close gave up on it (which Close returns rather than reports).
	ReconcileDropped ReconcileOutcome = "dropped"
	// ReconcileExpired: the store did not answer before the claim's TTL
	// ran out, after which there is nothing left to act on.
	ReconcileExpired ReconcileOutcome = "expired"
	// ReconcileUnconfirmed: a release no replica acknowledged (Confirm),
	// which the queue had no room to confirm, or whose confirmations Close
	// abandoned.
	ReconcileUnconfirmed ReconcileOutcome = "unconfirmed"
)

// MayHaveWritten reports whether a failed store call may still have written
// its claims: anything but a call the breaker never let through, or did
// not make because the releases owed before it failed. A refused
// connection is no proof either: go-redis retries a command that failed on
// a broken connection, so the error that is left may be the last attempt's
// while an earlier one reached Redis; the breaker keeps such calls few.
func MayHaveWritten(err error) bool {
	return err != nil && !errors.Is(err, ErrBreakerOpen) && !errors.Is(err, ErrReleasesOwed)
}

// Reconciler settles or releases, by token, the claims whose store call
// failed without saying whether it wrote them (a timeout, a reset
// connection), and those whose settlement or release failed. Left alone,
// such a claim stands as pending for in_flight_timeout (its redeliveries
// told to come back, 409) and then as settled (suppressed): an observation
// whose request failed would be lost. The Reconciler retries each with a
// short, growing backoff until the store answers. Settle and release only
// touch what the claim's own token wrote, so acting on a claim that never
// landed, or on a key another request claimed since, changes nothing.
//
// It is bounded: a claim handed over when DefaultReconcileQueue (or the
// size given) are waiting is dropped and counted, and then stands until
// in_flight_timeout as before. One goroutine works the queue.
type Reconciler struct {
	store    Store
	capacity int
	report   func(ReconcileOutcome, int)
	confirm  []time.Duration

	// working is held shared by the passes over the queue (run's, a
	// batch at a time, and the calls' in ReleaseOwed), which go side by
	// side, and alone by
	// Close and takeFrom, which wait for the passes on their way and let
	// none begin meanwhile.
	working sync.RWMutex
	// flights are the passes on their way that hold releases owed: a call
	// on one of their keys waits for them (ReleaseOwed), since a release in
	// flight is no longer queued, and a pass of the call's own would find
	// nothing to make and let it overtake that release.
	flights []*flight // r.mu guards it
	seq     uint64    // flights begun so far; r.mu guards it
	passes  uint64    // passes over the queue begun so far; r.mu guards it
	// zone names the zone of a key (ZoneBy): a pass sends the batches of
	// each zone side by side with the others'.
	zone func(key string) string
	// confirmOwn keeps its own releases owed until confirmed (ConfirmOwn).
	confirmOwn bool
	mu         sync.Mutex
	owed       atomic.Int64 // release jobs the store has not yet answered
	// owedKeys counts, by Claim.Key, the claims of those jobs: a call on
	// one of these keys may be the retry of their observation (OwesFor).
	owedKeys map[string]int
	// unanswered counts the claims of the jobs the store has not yet
	// answered: what waits for Redis, where claims counts those kept for
	// their confirmations too.
	unanswered atomic.Int64
	added      atomic.Uint64 // the jobs ever queued (Added)
	jobs       []*reconcileJob
	claims     int // in jobs
	// confirming counts the claims of Confirm's jobs, which have a budget
	// of their own: a flood of them must not take the room of the claims
	// whose fate the store has not told.
	confirming int
	closed     bool
	wake       chan struct{}
	// running is run's, and stop cancels it: run begins no store call
	// after, the one on its way has its answer within the store's timeout
	// (workOn), and Close's last pass, bounded, makes the rest.
	running context.Context
	stop    context.CancelFunc
	stopped chan struct{}
}

// reconcileJob is one request's claims and what to do with them.
type reconcileJob struct {
	claims   []*Claim
	release  bool
	due      time.Time
	failures int // store calls that failed in a row
	// postponed: it waits out the backoff of a batch before it that
	// failed, as if it had failed itself.
	postponed bool
	answers   int    // store calls answered so far
	released  []bool // per claim, whether a pass released it
	// confirming: a Confirm job, whose release the store answered but no
	// replica acknowledged. scheduled is its next confirmation's time,
	// which an early pass (ReleaseOwed) or a failed one's backoff leaves
	// as it is.
	confirming bool
	scheduled  time.Time
	// own: a release of the Reconciler's own that the store answered,
	// kept owed until its confirmations are done (ConfirmOwn). It takes
	// no room in Confirm's budget, and its outcome was counted at that
	// first answer.
	own bool
	// flight is the flight that carries it (its seq), and releasedBy the
	// last whose release of it the store answered: a call that came
	// before that one began owes it nothing more (ReleaseOwed).
	flight, releasedBy uint64
	zone               string // of its first claim's key
	pass               uint64 // the last pass over the queue that took it
	passTries          int    // how many times that pass took it
}

// owed reports a release a call on its keys must wait for (what Owes
// counts): one the store has not yet answered, or one no replica
// acknowledged, until its confirmations are done, since a failover may
// bring its claim back before the next confirmation is due.
func (j *reconcileJob) owed() bool { return j.release && (j.answers == 0 || j.confirming || j.own) }

// NewReconciler starts a Reconciler on store, holding at most capacity
// claims (DefaultReconcileQueue if capacity <= 0). report, if not nil, is
// told how many claims met each outcome, for metrics and logs. Close stops
// it.
func NewReconciler(store Store, capacity int, report func(ReconcileOutcome, int)) *Reconciler {
	return newReconciler(store, capacity, report, reconcileConfirmations)
}

func newReconciler(store Store, capacity int, report func(ReconcileOutcome, int), confirm []time.Duration) *Reconciler {
	if capacity <= 0 {
		capacity = DefaultReconcileQueue
	}
	r := &Reconciler{
		store: store, capacity: capacity, report: report, confirm: confirm,
		wake: make(chan struct{}, 1), stopped: make(chan struct{}),
	}
	r.running, r.stop = context.WithCancel(context.Background())
	go r.run()
	return r
}

// ZoneBy has r's passes send each zone's store calls side by side with
// the other zones', zone naming the zone of a key: on a Redis Cluster, its
// master, so that a master that hangs holds up only the releases of its
// own slots (the pipeline has a queue per master). A job's zone is its
// first claim's. zone must not wait: it is asked as claims are handed
// over. Set it before any claim is.
func (r *Reconciler) ZoneBy(zone func(key string) string) { r.zone = zone }

// ConfirmOwn keeps the keys of r's own releases owed, once the store has
// answered them, until their confirmations are done, as Confirm's are: on
// a Redis whose masters fail over (Sentinel, a Cluster with replicas), its
// release goes without a WAIT, and a failover before a replica has it
// promotes one that still holds the claim; the retry of its observation,
// coming through first, would be told to come back, then that it was
// delivered (helper 2, stop 60). Set it before any claim is handed over.
func (r *Reconciler) ConfirmOwn() { r.confirmOwn = true }

// Hand gives the Reconciler claims to release (release) or to settle. It
// reports false, and counts them dropped, when the queue has no room.
func (r *Reconciler) Hand(claims []*Claim, release bool) bool {
	return r.enqueue(newReconcileJob(claims, release, time.Now()))
}

// Confirm gives the Reconciler claims the store released that no replica
// had acknowledged when it answered (FailoverStore): a failover before one
// does promotes a replica that still holds them, and the retries of their
// observations are told to come back, then that they were delivered. It
// releases them again at its confirmation offsets, as it does the claims
// it released itself, and counts what such a pass finds as released_late.
// Until then they are owed (OwesFor): a call on their keys, which may be
// the first to reach the promoted replica, releases them again first. It
// reports false, and counts them unconfirmed, when its budget (as large as
// the queue's) has no room.
func (r *Reconciler) Confirm(claims []*Claim) bool {
	if len(r.confirm) == 0 {
		return true // a Reconciler that confirms nothing
	}
	job := newReconcileJob(claims, true, time.Now().Add(r.confirm[0]))
	job.answers = 1 // the store's own answer, which the handler counted
	job.confirming, job.scheduled = true, job.due
	return r.enqueue(job)
}

func newReconcileJob(claims []*Claim, release bool, due time.Time) *reconcileJob {
	job := &reconcileJob{claims: make([]*Claim, len(claims)), release: release, due: due, released: make([]bool, len(claims))}
	for i, c := range claims {
		job.claims[i] = ownCopy(c)
	}
	return job
}

// enqueue queues job if there is room, counting its claims as waiting for
// the store's answer and its release as owed if the store has not yet
// answered them, and makes run look at it: run waits for its time, not the
// hour it waits when idle.
func (r *Reconciler) enqueue(job *reconcileJob) bool {
	n := len(job.claims)
	if n == 0 {
		return true
	}
	if r.zone != nil {
		job.zone = r.zone(job.claims[0].Key())
	}
	r.mu.Lock()
	dropped := ReconcileDropped
	if job.confirming {
		dropped = ReconcileUnconfirmed
	}
	if !r.roomLocked([]*reconcileJob{job}) {
		r.mu.Unlock()
		r.count(dropped, n)
		return false
	}
	r.addLocked(job)
	r.mu.Unlock()
	r.nudge()
	return true
}

// roomLocked reports whether the queue is open and has room for jobs: the
// claims of Confirm's jobs in their budget, the others in the queue's.
// r.mu must be held.
func (r *Reconciler) roomLocked(jobs []*reconcileJob) bool {
	plain, confirming := 0, 0
	for _, j := range jobs {
		if j.confirming {
			confirming += len(j.claims)
		} else {
			plain += len(j.claims)
		}
	}
	return !r.closed && plain <= r.capacity-(r.claims-r.confirming) && confirming <= r.capacity-r.confirming
}

// addLocked queues job, counting its claims as waiting for the store's
// answer and its release as owed if the store has not yet answered them.
// r.mu must be held.
func (r *Reconciler) addLocked(job *reconcileJob) {
	n := len(job.claims)
	r.jobs = append(r.jobs, job)
	r.added.Add(1)
	r.claims += n
	if job.confirming {
		r.confirming += n
	}
	if job.answers == 0 {
		r.unanswered.Add(int64(n))
	}
	if job.owed() {
		r.owed.Add(1)
		r.oweKeysLocked(job, 1)
	}
}

// jobCount is what addLocked counted of a job.
type jobCount struct {
	claims     []*Claim
	confirming bool
	unanswered bool
	owed       bool
}

// countOf is what addLocked counted of j, while it is r's to read.
func countOf(j *reconcileJob) jobCount {
	return jobCount{claims: j.claims, confirming: j.confirming, unanswered: j.answers == 0, owed: j.owed()}
}

// uncountLocked stops counting a job taken off the queue and handed to
// another Reconciler, as addLocked counted it (c: the job itself may be
// the other's already, and answered). r.mu must be held.
func (r *Reconciler) uncountLocked(c jobCount) {
	n := len(c.claims)
	r.claims -= n
	if c.confirming {
		r.confirming -= n
	}
	if c.unanswered {
		r.unanswered.Add(-int64(n))
	}
	if c.owed {
		r.owed.Add(-1)
		r.owedKeys = countKeys(r.owedKeys, c.claims, -1)
	}
}

// TakeOver moves to r the releases from owes on the keys of claims
// (OwesFor), which r then makes as its own, by token: a reload that
// replaced from's connection on the same Redis data (a new timeout, a
// rotated password) left them to from, which no request uses any more,
// which may be backing off for seconds when Redis answers again, and
// whose connection may no longer be let in (the old password refused),
// while the retries of their observations come through r's. It waits for
// a pass of from on its way (within from's store timeout), which gives its
// jobs back or answers them. It reports false if r is closed or has no
// room for them: from keeps them. A closing from keeps them too: its last
// pass makes them.
func (r *Reconciler) TakeOver(from *Reconciler, claims []*Claim) bool {
	if from == r || !from.OwesFor(claims) || from.closingErr() != nil {
		return true
	}
	keys := countKeys(nil, claims, 1)
	_, all := r.takeFrom(from, func(j *reconcileJob) bool { return j.owed() && anyKeyIn(keys, j.claims) }, true)
	return all
}

// TakeOverJobs moves to r the jobs from holds whose claims' keys all
// satisfy keys (every job, if keys is nil): the settlements, the releases
// and the confirmations, each with its claims, its tokens and its due
// time, which r then makes as its own. A connection that a reload retired
// on the same Redis data hands them over as it drains and as it closes,
// each to a connection that may touch its keys: its own may no longer be
// let in (the old password refused once Redis cut its pool), and its
// confirmations would then fail until the claims' TTL, while a claim that
// landed late stood, its sender's retry told to come back and then that
// it was delivered. It waits for a pass of from on its way, as TakeOver
// does. It takes each job r has room for (Confirm's in their budget, the
// others in the queue's), and returns how many claims it took: from keeps
// the rest, all of them if r is closed. A closing from keeps them too: its
// last pass makes them.
func (r *Reconciler) TakeOverJobs(from *Reconciler, keys func(key string) bool) int {
	if from == r {
		return 0
	}
	took, _ := r.takeFrom(from, func(j *reconcileJob) bool {
		return keys == nil || !slices.ContainsFunc(j.claims, func(c *Claim) bool { return !keys(c.Key()) })
	}, false)
	return took
}

// takeFrom moves to r the jobs of from that match: all or none of them
// (whole), else each that r has room for. It returns how many claims it
// moved, and whether it moved every job that matched (or none matched):
// from keeps the others, all of them if r is closed.
func (r *Reconciler) takeFrom(from *Reconciler, match func(*reconcileJob) bool, whole bool) (moved int, all bool) {
	from.working.Lock() // no pass of from takes them meanwhile
	defer from.working.Unlock()
	from.mu.Lock()
	if from.closed {
		from.mu.Unlock()
		return 0, true
	}
	jobs := from.takeLocked(match)
	counted := make([]jobCount, len(jobs))
	for i, j := range jobs {
		counted[i] = countOf(j)
	}
	from.mu.Unlock()
	if len(jobs) == 0 {
		return 0, true
	}
	// The two locks one after the other, never one inside the other: two
	// connections may take over from each other at once. Meanwhile both
	// count the jobs as owed, so that a call on their keys waits for them.
	took := make([]bool, len(jobs))
	r.mu.Lock()
	roomForAll := whole && r.roomLocked(jobs)
	for i, j := range jobs {
		if whole {
			took[i] = roomForAll
		} else {
			took[i] = r.roomLocked(jobs[i : i+1])
		}
		if took[i] {
			j.flight, j.releasedBy, j.pass = 0, 0, 0 // from's flights and passes, not r's: r owes them from now
			r.addLocked(j)
			moved += len(j.claims)
		}
	}
	r.mu.Unlock()
	from.mu.Lock()
	for i, j := range jobs {
		if took[i] {
			from.uncountLocked(counted[i])
		} else {
			from.jobs = append(from.jobs, j)
		}
	}
	from.mu.Unlock()
	if moved > 0 {
		r.nudge()
	}
	return moved, !slices.Contains(took, false)
}

// nudge makes run look at the queue again.
func (r *Reconciler) nudge() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Wake makes the claims waiting out a backoff due now: the store answers
// again (its breaker closed), and each moment a released claim waits is a
// moment in which a retry of its observation may find it older than
// in_flight_timeout and be told it was delivered.
func (r *Reconciler) Wake() {
	now := time.Now()
	r.mu.Lock()
	for _, j := range r.jobs {
		if j.failures > 0 || j.postponed {
			j.due = now
		}
	}
	r.mu.Unlock()
	r.nudge()
}

// Owes reports whether releases wait that the store has not yet answered:
// ReleaseOwed has work to do.
func (r *Reconciler) Owes() bool { return r.owed.Load() > 0 }

// OwesFor reports whether releases the store has not yet answered hold the
// key of any of claims (the same observation in tumbling, the same asset
// in sliding and session): a call on them may be the retry of one of
// their observations, and must wait for them (Breaker.ReleaseFirst). A
// call on other keys need not: on a Cluster, a release owed on a slot that
// cannot be reached (its master down, the slot migrating) would otherwise
// fail every call.
func (r *Reconciler) OwesFor(claims []*Claim) bool {
	if !r.Owes() {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return anyKeyIn(r.owedKeys, claims)
}

// oweKeysLocked counts delta for the key of each claim of j in owedKeys.
// r.mu must be held.
func (r *Reconciler) oweKeysLocked(j *reconcileJob, delta int) {
	r.owedKeys = countKeys(r.owedKeys, j.claims, delta)
}

// countKeys adds delta to the count of the key of each of claims in
// counts, made if nil, dropping the keys that reach 0, and returns it.
func countKeys(counts map[string]int, claims []*Claim, delta int) map[string]int {
	if counts == nil {
		counts = map[string]int{}
	}
	for _, c := range claims {
		k := c.Key()
		if counts[k] += delta; counts[k] <= 0 {
			delete(counts, k)
		}
	}
	return counts
}

// anyKeyIn reports whether counts holds the key of any of claims.
func anyKeyIn(counts map[string]int, claims []*Claim) bool {
	for _, c := range claims {
		if counts[c.Key()] > 0 {
			return true
		}
	}
	return false
}

// flight is a pass on its way over releases owed: run's, or a call's in
// ReleaseOwed. Once done is closed, err and failed say what it came to;
// r.mu guards the rest.
type flight struct {
	seq uint64 // when it began: r.seq's value then
	// keys holds the key of each claim of the owed releases it took, with
	// the oldest releasedBy among them: a call that came after that
	// release began needs nothing of it (ReleaseOwed). A job holds the
	// claims of one request, a gateway's batch of several assets: a call
	// on any of them waits for it.
	keys map[string]uint64
	jobs []*reconcileJob
	done chan struct{}
	err  error
	// failed holds the keys of the releases it did not make, if err.
	failed map[string]bool
	// call: a call's pass, whose failure the calls that wait for it
	// share (each would otherwise wait out a hung store's timeout behind
	// the one before it). After run's, they make their own pass, as they
	// did when run's held them behind one lock: the store may answer now.
	call bool
}

// beginLocked registers a flight of jobs, taken off the queue, and returns
// it: nil when they hold no release owed (run's pass, on settlements and
// confirmations of late landings alone). r.mu must be held.
func (r *Reconciler) beginLocked(jobs []*reconcileJob, call bool) *flight {
	var keys map[string]uint64
	for _, j := range jobs {
		if !j.owed() {
			continue
		}
		if keys == nil {
			keys = map[string]uint64{}
		}
		for _, c := range j.claims {
			if by, ok := keys[c.Key()]; !ok || j.releasedBy < by {
				keys[c.Key()] = j.releasedBy
			}
		}
	}
	if keys == nil {
		return nil
	}
	r.seq++
	f := &flight{seq: r.seq, keys: keys, jobs: jobs, call: call, done: make(chan struct{})}
	for _, j := range jobs {
		j.flight = f.seq
	}
	r.flights = append(r.flights, f)
	return f
}

// land ends f with what its store calls came to: the calls waiting for
// it go on.
func (r *Reconciler) land(f *flight, out passOutcome) {
	if f == nil {
		return
	}
	r.mu.Lock()
	r.flights = slices.DeleteFunc(r.flights, func(g *flight) bool { return g == f })
	f.err, f.failed = out.err, out.failed
	r.mu.Unlock()
	close(f.done)
}

// flightsOnLocked returns the flights that hold a release owed on a key
// of claims that a call that came when r.seq was came still needs: one
// not made since by a pass begun after it came. r.mu must be held.
func (r *Reconciler) flightsOnLocked(claims []*Claim, came uint64) []*flight {
	var on []*flight
	for _, f := range r.flights {
		if slices.ContainsFunc(claims, func(c *Claim) bool {
			by, ok := f.keys[c.Key()]
			return ok && by <= came
		}) {
			on = append(on, f)
		}
	}
	return on
}

// paid counts the owed release j as answered (or given up on).
func (r *Reconciler) paid(j *reconcileJob) {
	r.owed.Add(-1)
	r.mu.Lock()
	r.oweKeysLocked(j, -1)
	r.mu.Unlock()
}

// Len returns how many claims are waiting.
func (r *Reconciler) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.claims
}

// Added counts the jobs ever queued: handed, confirmed or taken over from
// another Reconciler. A caller that finds it unchanged knows no job came
// since it looked, whatever finished meanwhile (Len would not say).
func (r *Reconciler) Added() uint64 { return r.added.Load() }

// Unanswered returns how many claims wait for the store's first answer:
// of the claims waiting, those the store has not yet settled or released
// (Len also counts those kept a while to catch a late landing).
func (r *Reconciler) Unanswered() int { return int(r.unanswered.Load()) }

// Unreconciled counts the claims Close gave up on because the store never
// answered them (ReconcileDropped). Each, if it landed, stands as pending
// until in_flight_timeout, and then as settled until its TTL ends.
type Unreconciled struct {
	// Releases: claims of requests that failed, whose senders' retries
	// are told to come back and then that they were delivered, though the
	// upstream never took them.
	Releases int
	// Settlements: claims of requests that went through, whose
	// redeliveries are told to come back until in_flight_timeout.
	Settlements int
}

// Close stops the Reconciler. Once a store call on its way (run's, or a
// ReleaseOwed pass's) has its answer (or the store's timeout has passed),
// it makes one last pass over every claim it holds, their backoff ignored
// (a Redis that came back just before an exit or a reload answers it),
// releases first, within reconcileLastPass: a Redis that does not answer
// holds it two store timeouts at most. It returns the claims the store
// still never answered, uncounted: the caller counts them as dropped with
// the line that says what they are, while the claims handed over
// meanwhile or later are dropped and reported as any others, each on its
// own. The confirmations not yet done it counts as unconfirmed.
func (r *Reconciler) Close() Unreconciled {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return Unreconciled{}
	}
	r.closed = true
	r.mu.Unlock()
	r.stop()
	<-r.stopped
	r.working.Lock() // a pass on its way answers its jobs first
	defer r.working.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), reconcileLastPass)
	r.workOn(ctx, func(*reconcileJob) bool { return true }, true)
	cancel()
	r.mu.Lock()
	var left Unreconciled
	madeAnyway := 0
	for _, j := range r.jobs {
		switch {
		case j.answers > 0:
		case j.release:
			// Those a pass released beside others it could not are made.
			n := countTrue(j.released)
			madeAnyway += n
			left.Releases += len(j.claims) - n
		default:
			left.Settlements += len(j.claims)
		}
	}
	unconfirmed := r.confirming
	r.jobs, r.claims, r.confirming = nil, 0, 0
	r.unanswered.Store(0)
	r.owed.Store(0)
	clear(r.owedKeys)
	r.mu.Unlock()
	r.count(ReconcileReleased, madeAnyway)
	r.count(ReconcileUnconfirmed, unconfirmed)
	return left
}

func (r *Reconciler) run() {
	defer close(r.stopped)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		timer.Reset(r.untilNext())
		select {
		case <-r.running.Done():
			return
		case <-r.wake:
		case <-timer.C:
		}
		r.work(r.running)
	}
}

// untilNext is the time to the earliest job, or an hour when there is none.
func (r *Reconciler) untilNext() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	next := time.Hour
	now := time.Now()
	for _, j := range r.jobs {
		next = min(next, max(0, j.due.Sub(now)))
	}
	return next
}

// work does every job that is due.
func (r *Reconciler) work(ctx context.Context) {
	now := time.Now()
	r.workOn(ctx, func(j *reconcileJob) bool { return !j.due.After(now) }, false)
}

// workOn does the jobs that match, the releases and then the
// settlements, a batch at a time taken off the queue (fromTheQueue,
// inZones), until ctx ends: no store call begins after, and those on
// their way have their answers (within ctx's deadline, if any, and the
// store's timeout). last: Close's last pass, which goes on past a zone's
// failed call, and holds r.working already; run's holds it shared for
// each batch (fromTheQueue). Cancelling it would not stop its command, which
// the pipeline sends all the same, only lose its answer: Close's last
// pass would then find the claims it released gone, and count them
// not_held. Its owed releases are a flight: a call on their keys waits
// for them. r.working must be held.
func (r *Reconciler) workOn(ctx context.Context, match func(*reconcileJob) bool, last bool) {
	calls, cancel := withoutCancel(ctx)
	defer cancel()
	r.mu.Lock()
	r.passes++
	pass := r.passes
	zones := zonesOf(r.jobs, match)
	r.mu.Unlock()
	// Each job once a pass: a failed one is back on the queue, and a
	// pass that matches every job (Close's) would take it again. The
	// releases the store never answered first, then the confirmations of
	// those it did, then the settlements: an exit on a slow Redis spent
	// its time on confirmations and gave up the releases never made.
	phases := []func(*reconcileJob) bool{
		func(j *reconcileJob) bool { return j.release && j.answers == 0 },
		func(j *reconcileJob) bool { return j.release && j.answers > 0 },
		func(j *reconcileJob) bool { return !j.release },
	}
	// The last pass tries a job that failed once more, within its bound:
	// one call that timed out on a busy Redis gave its jobs up at exit.
	fresh := func(j *reconcileJob) bool { return j.pass != pass || last && j.failures > 0 && j.passTries < 2 }
	for _, phase := range phases {
		out := r.inZones(calls, zones, r.fromTheQueue(ctx, pass, func(j *reconcileJob) bool { return fresh(j) && phase(j) && match(j) }, !last), last)
		r.postponeFailing(pass, match, out)
		zones = slices.DeleteFunc(zones, func(zone string) bool { return out.gaveUp[zone] })
	}
}

// postponeFailing has the jobs pass left in the zones where out failed
// whole (the store, or a master, failing), settlements included, wait out
// the failed calls' backoff, rather than their timeout now and again.
func (r *Reconciler) postponeFailing(pass uint64, match func(*reconcileJob) bool, out passOutcome) {
	if len(out.failing) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, j := range r.jobs {
		if j.pass != pass && match(j) && out.failing[j.zone] && j.due.Before(out.retry) {
			j.due, j.postponed = out.retry, true
		}
	}
}

// fromTheQueue hands out the batches of pass, a zone's at a time, taking
// them off the queue as they go: the jobs that match, in queue order. A
// call on the keys of a job still queued makes its release itself, at
// once, rather than wait for the batches of a pass ahead of it. Each batch
// that holds releases owed is a flight of its own, landed by inZones. With
// lock, r.working is held shared for each batch, until its done is
// called: a takeover (takeFrom) waits for the batches on their way, not
// for the whole pass.
func (r *Reconciler) fromTheQueue(ctx context.Context, pass uint64, match func(*reconcileJob) bool, lock bool) func(zone string) ([]*reconcileJob, *flight, func()) {
	done := func() {}
	if lock {
		done = r.working.RUnlock
	}
	return func(zone string) ([]*reconcileJob, *flight, func()) {
		for ctx.Err() == nil {
			now := time.Now()
			if lock {
				r.working.RLock()
			}
			r.mu.Lock()
			batch := r.takeBatchLocked(func(j *reconcileJob) bool { return j.zone == zone && match(j) })
			for _, j := range batch {
				if j.pass != pass {
					j.pass, j.passTries = pass, 0
				}
				j.passTries++
			}
			f := r.beginLocked(batch, false)
			r.mu.Unlock()
			if len(batch) == 0 {
				done()
				return nil, nil, nil
			}
			// An expired one has nothing left to act on.
			if batch = slices.DeleteFunc(batch, func(j *reconcileJob) bool { return r.finishIfExpired(j, now) }); len(batch) > 0 {
				return batch, f, done
			}
			r.land(f, passOutcome{})
			done()
		}
		return nil, nil, nil
	}
}

// passOutcome is what the store calls of a pass came to: the earliest
// retry of a failed batch, the keys of the claims that failed, the first
// error, the zones where a call failed whole (the store, or that master,
// failing: not a Cluster call that one master of several failed), and
// those the pass gave up on (inZones).
type passOutcome struct {
	retry           time.Time
	failed          map[string]bool
	err             error
	failing, gaveUp map[string]bool
}

// reconcileAtOnce is how many store calls of a pass are on their way at
// once to each zone (ZoneBy: a Cluster master; one zone on any other
// Redis): together about a round trip's worth (the pipeline's 512
// commands). All of a pass's batches at once joined the pipeline's queue
// at one instant with one deadline: on a healthy Redis the tail expired
// unsent, and thousands of releases failed (helper 2, stop 60). One at a
// time across masters, each batch on a hung master waited out its
// timeout while the others waited behind it.
const reconcileAtOnce = 2

// inZones makes the store calls of a pass, all releases or all
// settlements, whose batches next hands out by zone (nil when the zone
// has no more): reconcileAtOnce at a time to each zone, the zones side by
// side, so that a hung master holds up only its own. A zone whose call
// failed whole (the store, or that master, failing: not a Cluster call
// that one master of several failed) is sent no more this pass; in the
// last (Close's) only after one more failure in a row than it has calls
// at once: a call that timed out on a busy master must not cost an exit
// the rest of its releases, and a hung one holds it two timeouts. It lands
// the flight next gives with each batch, and fails only the keys whose
// calls failed, and calls the done it gives.
func (r *Reconciler) inZones(ctx context.Context, zones []string, next func(zone string) ([]*reconcileJob, *flight, func()), last bool) passOutcome {
	out := passOutcome{failed: map[string]bool{}, gaveUp: map[string]bool{}}
	giveUp := 1 // whole failures in a row that end a zone's part of the pass
	if last {
		giveUp = reconcileAtOnce + 1
	}
	inARow := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, zone := range zones {
		for range reconcileAtOnce {
			wg.Go(func() {
				for {
					mu.Lock()
					stop := out.gaveUp[zone]
					mu.Unlock()
					if stop {
						return
					}
					batch, f, done := next(zone)
					if len(batch) == 0 {
						return
					}
					retry, failed, err := r.attempt(ctx, batch)
					r.land(f, passOutcome{failed: failed, err: err})
					done()
					mu.Lock()
					if out.add(zone, retry, failed, err) {
						inARow[zone]++
					} else {
						inARow[zone] = 0
					}
					out.gaveUp[zone] = out.gaveUp[zone] || inARow[zone] >= giveUp
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	return out
}

// add counts the outcome of one store call of the pass, to zone, and
// reports whether it failed whole.
func (out *passOutcome) add(zone string, retry time.Time, failed map[string]bool, err error) (whole bool) {
	maps.Copy(out.failed, failed)
	if err == nil {
		return false
	}
	if out.retry.IsZero() || retry.Before(out.retry) {
		out.retry = retry
	}
	out.err = cmp.Or(out.err, err)
	if _, partial := errors.AsType[*ReleaseError](err); !partial {
		if out.failing == nil {
			out.failing = map[string]bool{}
		}
		out.failing[zone] = true
		return true
	}
	return false
}

// withoutCancel is ctx with its deadline but not its cancellation.
func withoutCancel(ctx context.Context) (context.Context, context.CancelFunc) {
	if deadline, ok := ctx.Deadline(); ok {
		return context.WithDeadline(context.WithoutCancel(ctx), deadline)
	}
	return context.WithoutCancel(ctx), func() {}
}

// ReleaseOwed makes now, and waits for, the releases the store has not yet
// answered (those still waiting out a backoff after failing, and those
// just handed over) and the confirmations on the keys of claims (Confirm).
// A store call on claims that OwesFor reports owed calls it first
// (Breaker.ReleaseFirst): a claim whose release waits here may by then be
// older than in_flight_timeout, and the retry of its observation, coming
// through first, would be told it was delivered. It returns the store's
// error if a release failed; what was not released is then retried with
// its backoff as before. Once Close has begun, a pass begins no more store
// calls, and the calls whose releases it left fail (errClosing).
//
// A call whose keys a pass on its way holds releases on (run's, or
// another call's; a release is a request's, and holds the keys of each
// of its pings) waits for that pass instead of making its own: in an
// outage each call of a burst on one asset would otherwise wait out the
// store's timeout behind the one before it. A call on other keys makes
// its own pass, side by side with the others: on a Cluster, a call on a
// healthy master's key does not wait for a hung master's releases. A
// release a pass begun after the call came has made is no longer the
// call's business: a confirmation stays owed once made, and a call that
// waited for the passes of the calls that came after it would wait, in
// a stream of them, for ever. A call that waited for a pass begun before
// it came makes one of its own after, unless one begun since made it: a
// burst on one key makes two passes. A pass is not
// cancelled with the caller that began it (a sender that hung up would
// fail every call waiting for it); the store's timeout bounds it.
func (r *Reconciler) ReleaseOwed(ctx context.Context, claims []*Claim) error {
	r.mu.Lock()
	came := r.seq
	r.mu.Unlock()
	for range maxOwedRounds {
		if !r.OwesFor(claims) {
			return nil
		}
		if err := r.closingErr(); err != nil {
			return err // at once: waited for, the last pass holds r.working to its end
		}
		mine, others, err := r.flightFor(claims, came)
		switch {
		case err != nil:
			return err
		case mine != nil:
			r.fly(context.WithoutCancel(ctx), mine)
			return mine.errFor(claims)
		case others == nil: // released by a pass begun since the call came
			return nil
		}
		for _, f := range others {
			select {
			case <-f.done:
			case <-ctx.Done():
				return ctx.Err()
			}
			if err := f.errFor(claims); err != nil && f.call {
				return err
			}
		}
	}
	return errStillOwed
}

// maxOwedRounds bounds the passes a call waits for: past the passes on
// its way when it came and one begun after, more means its keys' releases
// are handed over faster than the store makes them.
const maxOwedRounds = 8

// errStillOwed fails a call whose keys had releases owed after
// maxOwedRounds passes: made now, it could reach the store before them.
var errStillOwed = errors.New("releases owed on the same keys were still being made after several passes (a store answering slowly); the call was not made")

// errFor is the flight's error if it did not release a job on a key of
// claims: a call whose own keys' releases went through need not fail for
// another's. When it released those of some of the claims, it is a
// DecideError naming the others, which the call may be made without.
func (f *flight) errFor(claims []*Claim) error {
	if f.err == nil {
		return nil
	}
	failed := make([]bool, len(claims))
	some, all := false, true
	for i, c := range claims {
		failed[i] = f.failed[c.Key()]
		some, all = some || failed[i], all && failed[i]
	}
	switch {
	case !some:
		return nil
	case all:
		return f.err
	}
	return &DecideError{Err: f.err, Failed: failed}
}

// flightFor returns the flights on the keys of claims, for the call to
// wait for; or, when there are none and a release owed on them was not
// made by a pass begun since the call came (came: r.seq then), a flight of
// the call's own (mine) holding every release owed on them, with
// r.working held shared for it (fly lets go of it); or neither, when
// there is nothing left to wait for. Once Close has begun, a call whose
// keys are owed fails (errClosing): Close's last pass makes their
// releases, and made now, the call could reach Redis before them.
func (r *Reconciler) flightFor(claims []*Claim, came uint64) (mine *flight, others []*flight, err error) {
	r.working.RLock() // before the flight: Close's last pass must not miss its jobs
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := countKeys(nil, claims, 1)
	owed := func(j *reconcileJob) bool { return j.owed() && anyKeyIn(keys, j.claims) }
	others = r.flightsOnLocked(claims, came)
	switch {
	case others != nil:
	case r.closed: // before what is left owed: Close's last pass has emptied the queue, given up or not
		err = errClosing
	case !slices.ContainsFunc(r.jobs, func(j *reconcileJob) bool { return owed(j) && j.releasedBy <= came }):
	default:
		return r.beginLocked(r.takeLocked(owed), true), nil, nil
	}
	r.working.RUnlock()
	return nil, others, err
}

// fly makes the releases of the call's flight f, and lands it. r.working
// is held shared (flightFor), and let go of here.
func (r *Reconciler) fly(ctx context.Context, f *flight) {
	defer r.working.RUnlock()
	now := time.Now()
	// An expired one has nothing left to act on: its key owes nothing
	// any more.
	owed := slices.DeleteFunc(f.jobs, func(j *reconcileJob) bool { return r.finishIfExpired(j, now) })
	var out passOutcome
	defer func() { r.land(f, out) }() // a flight left on its way would hold every later call on its keys
	left := &jobList{jobs: owed}
	out = r.inZones(ctx, zonesOf(owed, func(*reconcileJob) bool { return true }), left.next, false)
	for _, j := range left.jobs { // a zone's, sent no more after a call of it failed whole
		r.requeue(j)
		for _, c := range j.claims {
			out.failed[c.Key()] = true
		}
	}
}

// errClosing fails the calls waiting for releases owed that a pass left to
// Close's last pass: made now, a call could reach Redis before them.
var errClosing = errors.New("the reconciler is closing (Caddy exits, or no config uses its Redis connection any more), and its last pass makes the releases owed")

// closingErr is errClosing once Close has begun.
func (r *Reconciler) closingErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errClosing
	}
	return nil
}

// takeLocked takes the jobs that match off the queue, in queue order.
func (r *Reconciler) takeLocked(match func(*reconcileJob) bool) []*reconcileJob {
	var taken []*reconcileJob
	r.jobs = slices.DeleteFunc(r.jobs, func(j *reconcileJob) bool {
		if match(j) {
			taken = append(taken, j)
			return true
		}
		return false
	})
	return taken
}

// takeBatchLocked takes the jobs of one store call off the queue
// (takeBatch). r.mu must be held.
func (r *Reconciler) takeBatchLocked(match func(*reconcileJob) bool) []*reconcileJob {
	var batch []*reconcileJob
	r.jobs, batch = takeBatch(r.jobs, match)
	return batch
}

// takeBatch takes the jobs of one store call out of jobs: those that
// match, in order, whole, up to about reconcileBatch claims, and at least
// one if any does. It returns the jobs left and the batch.
func takeBatch(jobs []*reconcileJob, match func(*reconcileJob) bool) (left, batch []*reconcileJob) {
	claims := 0
	left = slices.DeleteFunc(jobs, func(j *reconcileJob) bool {
		if !match(j) || claims > 0 && claims+len(j.claims) > reconcileBatch {
			return false
		}
		claims += len(j.claims)
		batch = append(batch, j)
		return true
	})
	return left, batch
}

// jobList hands out jobs, taken off the queue already, as inZones asks
// for them: whole jobs, up to about reconcileBatch claims a batch. What a
// failing zone left stays in it.
type jobList struct {
	mu   sync.Mutex
	jobs []*reconcileJob
}

func (l *jobList) next(zone string) ([]*reconcileJob, *flight, func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var batch []*reconcileJob
	l.jobs, batch = takeBatch(l.jobs, func(j *reconcileJob) bool { return j.zone == zone })
	return batch, nil, func() {}
}

// zonesOf lists the zones of the jobs that match.
func zonesOf(jobs []*reconcileJob, match func(*reconcileJob) bool) []string {
	var zones []string
	for _, j := range jobs {
		if match(j) && !slices.Contains(zones, j.zone) {
			zones = append(zones, j.zone)
		}
	}
	return zones
}

// attempt makes one store call for jobs, all releases or all settlements,
// and reschedules or finishes each by its answer. It returns the store's
// error, if the call failed, the keys of the claims it failed for (all of
// them, unless Redis answered some of the releases: ReleaseError; a job
// with any of them failed is tried again whole), and when the first
// failed job is tried again: once a job is back on the queue, only r.mu
// may read it.
func (r *Reconciler) attempt(ctx context.Context, jobs []*reconcileJob) (retry time.Time, failed map[string]bool, err error) {
	var claims []*Claim
	for _, j := range jobs {
		claims = append(claims, j.claims...)
	}
	var released, refused []bool
	if jobs[0].release {
		released, err = r.store.Release(ctx, claims)
		if partial, ok := errors.AsType[*ReleaseError](err); ok {
			released, refused = partial.Released, partial.Failed
		}
	} else {
		err = WaitSettled(ctx, r.store, claims)
	}
	now := time.Now()
	at := 0
	for _, j := range jobs {
		j.postponed = false
		from, to := at, at+len(j.claims)
		at = to
		if err != nil && (refused == nil || slices.Contains(refused[from:to], true)) {
			j.failures++
			j.due = now.Add(min(reconcileFirstRetry<<min(j.failures-1, 16), reconcileMaxRetry))
			if failed == nil {
				retry, failed = j.due, map[string]bool{}
			}
			late := 0
			for k, c := range j.claims {
				// A release Redis made (the claim's master answered) fails
				// no call on its key, beside one it did not make, and is
				// counted released when the job is answered: the next
				// pass finds its claim gone. A confirmation's counts as
				// late at once, as an answered pass's would.
				switch {
				case refused == nil || refused[from+k]:
					failed[c.Key()] = true
				case released[from+k] && !j.released[k]:
					j.released[k] = true
					if j.answers > 0 {
						late++
					}
				}
			}
			r.count(ReconcileReleasedLate, late)
			r.requeue(j)
			continue
		}
		var mine []bool
		if j.release {
			mine = released[from:to]
		}
		r.answered(j, mine, now)
	}
	return retry, failed, err
}

// answered records a store's answer to one pass over j: the first answer
// decides the outcome, the confirmations count what landed late.
func (r *Reconciler) answered(j *reconcileJob, released []bool, now time.Time) {
	j.releasedBy = j.flight
	switch {
	case j.answers > 0:
	case j.release && r.confirmOwn && len(r.confirm) > 0:
		j.own = true // owed still: paid when its confirmations end (finish)
	case j.owed():
		r.paid(j)
	}
	late := 0
	for i, ok := range released {
		if ok && !j.released[i] {
			j.released[i] = true
			if j.answers > 0 {
				late++
			}
		}
	}
	if j.answers == 0 {
		r.unanswered.Add(-int64(len(j.claims)))
		if j.release {
			n := countTrue(j.released)
			r.count(ReconcileReleased, n)
			r.count(ReconcileNotHeld, len(j.claims)-n)
		} else {
			r.count(ReconcileSettled, len(j.claims))
		}
	}
	r.count(ReconcileReleasedLate, late)
	j.failures = 0
	if (j.confirming || j.own) && now.Before(j.scheduled) {
		// A pass a call on its keys made (ReleaseOwed), or the retry of a
		// failed one, ahead of the schedule, which stands: the failover
		// may still be to come.
		j.due = j.scheduled
		r.requeue(j)
		return
	}
	if j.answers++; j.answers > len(r.confirm) {
		r.finish(j, "")
		return
	}
	j.due = now.Add(r.confirm[j.answers-1])
	j.scheduled = j.due
	r.requeue(j)
}

// ownCopy is a copy of c that holds on to nothing of its request: the
// strings a parser reads may point into the request's body, which a job
// kept for a minute would otherwise keep alive.
func ownCopy(c *Claim) *Claim {
	o := *c
	o.Asset, o.Event, o.State = strings.Clone(c.Asset), strings.Clone(c.Event), strings.Clone(c.State)
	return &o
}

func (j *reconcileJob) expired(now time.Time) bool {
	c := j.claims[0] // the claims of one request share their claim time and policy
	return !now.Before(c.At.Add(c.Policy.TTL))
}

// requeue puts j back on the queue, and makes run look at it: a pass of
// ReleaseOwed may have made it due sooner than run waits.
func (r *Reconciler) requeue(j *reconcileJob) {
	r.mu.Lock()
	r.jobs = append(r.jobs, j)
	r.mu.Unlock()
	r.nudge()
}

// finishIfExpired finishes j, taken off the queue, if its claims' TTL
// has run out, counting them expired if the store never answered (once
// it has, their outcome is counted and a confirmation is moot), and
// reports whether it did.
func (r *Reconciler) finishIfExpired(j *reconcileJob, now time.Time) bool {
	switch {
	case !j.expired(now):
		return false
	case j.answers == 0:
		r.finish(j, ReconcileExpired)
	default:
		r.finish(j, "")
	}
	return true
}

// finish ends j, taken off the queue, counting its claims as outcome if given.
// It counts them first: whoever sees the queue shorter (Len, the pending
// gauge) then also sees their outcome.
func (r *Reconciler) finish(j *reconcileJob, outcome ReconcileOutcome) {
	if j.owed() { // expired unanswered
		r.paid(j)
	}
	if j.answers == 0 {
		r.unanswered.Add(-int64(len(j.claims)))
	}
	if outcome != "" {
		// Those a pass released beside others it could not are made.
		n := 0
		if j.release && j.answers == 0 {
			n = countTrue(j.released)
		}
		r.count(ReconcileReleased, n)
		r.count(outcome, len(j.claims)-n)
	}
	r.mu.Lock()
	r.claims -= len(j.claims)
	if j.confirming {
		r.confirming -= len(j.claims)
	}
	r.mu.Unlock()
}

func (r *Reconciler) count(outcome ReconcileOutcome, n int) {
	if n > 0 && r.report != nil {
		r.report(outcome, n)
	}
}

func countTrue(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}
