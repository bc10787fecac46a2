package dedup

import (
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/pipeline"
)

// DefaultRedisTimeout bounds each store operation when timeout is not set.
const DefaultRedisTimeout = 50 * time.Millisecond

// RedisStore keeps claims in Redis (7.0 or later, or a compatible server),
// shared by every Caddy instance that points at it. A tumbling claim is one
// SET key value NX PX ttl GET (atomic, with its expiry, returning the holder
// when it loses), settled with one SET key value XX KEEPTTL; the sliding
// and session shapes run one Lua script per claim, loaded once and called
// by SHA. The commands of a batch, and of concurrent requests, travel
// together through a Pipeline: one round trip.
type RedisStore struct {
	pipeline *pipeline.Pipeline
	timeout  time.Duration
}

// NewRedisStore returns a store sending its commands through pipe, whose
// operations each take at most timeout (DefaultRedisTimeout if timeout <=
// 0). The pipeline's client must have ContextTimeoutEnabled set for the
// timeout to bound network waits.
func NewRedisStore(pipe *pipeline.Pipeline, timeout time.Duration) *RedisStore {
	if timeout <= 0 {
		timeout = DefaultRedisTimeout
	}
	return &RedisStore{pipeline: pipe, timeout: timeout}
}

var (
	//go:embed lua/claim_release.lua
	claimReleaseLua string
	//go:embed lua/track_decide.lua
	trackDecideLua string
	//go:embed lua/track_settle.lua
	trackSettleLua string
	//go:embed lua/track_release.lua
	trackReleaseLua string

	claimReleaseScript = redis.NewScript(claimReleaseLua)
	trackDecideScript  = redis.NewScript(trackDecideLua)
	trackSettleScript  = redis.NewScript(trackSettleLua)
	trackReleaseScript = redis.NewScript(trackReleaseLua)

	// scripts are all the store's scripts, and sources their Lua, for
	// LoadScripts.
	scripts = []*redis.Script{claimReleaseScript, trackDecideScript, trackSettleScript, trackReleaseScript}
	sources = []string{claimReleaseLua, trackDecideLua, trackSettleLua, trackReleaseLua}
)

// LoadScripts loads the store's scripts on a new connection before it
// runs anything else: set it as the client's OnConnect. Redis forgets its
// scripts when it restarts or a replica takes over, and a script's call
// that fails NOSCRIPT is sent again after loading it, behind the commands
// queued after it, which then ran first (a redelivery's claim before the
// settlement that would have suppressed it). A connection made after the
// change loads them first. Redis refusing them does not fail the
// connection: one that cannot load them (a sentinel, a user without SCRIPT
// LOAD) still works, and the resend still covers a script flushed under a
// live connection. A timeout or a broken connection does, as go-redis's own
// handshake does: replies still on their way would answer the commands
// sent after them, each command told another's answer. It asks SCRIPT
// EXISTS first and loads only the scripts Redis lacks.
func LoadScripts(ctx context.Context, cn *redis.Conn) error {
	hashes := make([]string, len(scripts))
	for i, s := range scripts {
		hashes[i] = s.Hash()
	}
	// Only those Redis lacks: 17 KB on every new connection took longer
	// than the store's timeout on a slow link, and every connection was
	// dropped. A load that timed out still lands, so the next one finds it.
	known, err := cn.ScriptExists(ctx, hashes...).Result()
	if err != nil && !pipeline.IsReply(err) {
		return fmt.Errorf("loading the store's scripts on a new connection: %w", err)
	}
	if refusedAccess(err) {
		// Left to the store's own calls, which say what Redis refused
		// (and the startup warning its fix): loaded unauthenticated, the
		// decision script's 20 KB are more than Redis takes before AUTH,
		// and it closed the connection, which read as a Redis that did
		// not answer (EOF).
		return nil
	}
	if len(known) != len(scripts) { // SCRIPT EXISTS refused: load them all
		known = make([]bool, len(scripts))
	}
	cmds, _ := cn.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, src := range sources {
			if !known[i] {
				p.ScriptLoad(ctx, src) // not Script.Load: in a pipeline it would take the empty answer for the script's hash
			}
		}
		return nil
	})
	for _, cmd := range cmds {
		if err := cmd.Err(); err != nil && !pipeline.IsReply(err) {
			return fmt.Errorf("loading the store's scripts on a new connection: %w", err)
		}
	}
	return nil
}

// Decide implements Store.
func (s *RedisStore) Decide(ctx context.Context, claims []*Claim) ([]Verdict, error) {
	cmds := make([]pipeline.Cmd, len(claims))
	for i, c := range claims {
		if c.Policy.Shape == Tumbling {
			cmds[i] = claimCmd(c)
		} else {
			cmds[i] = trackDecideCmd(c)
		}
	}
	err := s.do(ctx, cmds)
	partial, _ := errors.AsType[*pipeline.PartialError](err)
	if err != nil && partial == nil {
		return nil, err
	}
	verdicts := make([]Verdict, len(claims))
	for i, c := range claims {
		if partial != nil && partial.Failed[i] {
			continue
		}
		var err error
		if c.Policy.Shape == Tumbling {
			verdicts[i], err = claimVerdict(c, cmds[i].Result.(*redis.StatusCmd))
		} else {
			verdicts[i], err = trackVerdict(c, cmds[i].Result.(*redis.Cmd))
		}
		if err != nil {
			return nil, err
		}
	}
	s.holdLateClaims(ctx, claims, verdicts)
	if partial != nil {
		// A Cluster master that did not answer costs only its own claims
		// their verdicts (see DecideError).
		return verdicts, &DecideError{Err: partial.Err, Failed: partial.Failed}
	}
	return verdicts, nil
}

// holdLateClaims applies waitFromLanding to the tumbling redeliveries that
// found a pending claim older than in_flight_timeout, dating each claim by
// its key's remaining TTL: one more round trip, only for those, which
// arise only after a hang or a vanished process. If Redis cannot say, the
// redelivery is told to come back, the safe answer while a claim is
// pending.
func (s *RedisStore) holdLateClaims(ctx context.Context, claims []*Claim, verdicts []Verdict) {
	var old []int
	for i, c := range claims {
		if c.Policy.Shape == Tumbling && c.held && settledByClaimTime(verdicts[i], !c.holder.settled) {
			old = append(old, i)
		}
	}
	if len(old) == 0 {
		return
	}
	cmds := make([]pipeline.Cmd, len(old))
	for j, i := range old {
		key := claims[i].Observation.Key
		cmds[j] = pipeline.Cmd{Key: key, Queue: func(ctx context.Context, p redis.Pipeliner) redis.Cmder { return p.PTTL(ctx, key) }}
	}
	err := s.do(ctx, cmds)
	for j, i := range old {
		left := time.Duration(-1) // undated: counts as just landed
		if err == nil {
			if ttl, err := cmds[j].Result.(*redis.DurationCmd).Result(); err == nil {
				left = ttl
			}
		}
		held, pol := claims[i].holder, claims[i].Policy
		verdicts[i] = waitFromLanding(verdicts[i], true, left, held.wait(pol), held.claimTTL(pol))
	}
}

func claimCmd(c *Claim) pipeline.Cmd {
	key, value, ttl := c.Observation.Key, newRecord(c).encode(), c.Policy.TTL
	return pipeline.Cmd{Key: key, Queue: func(ctx context.Context, p redis.Pipeliner) redis.Cmder {
		return p.SetArgs(ctx, key, value, redis.SetArgs{Mode: "NX", TTL: ttl, Get: true})
	}}
}

func claimVerdict(c *Claim, cmd *redis.StatusCmd) (Verdict, error) {
	old, err := cmd.Result()
	if errors.Is(err, redis.Nil) {
		return accepted, nil
	}
	if err != nil {
		return Verdict{}, err
	}
	held, err := decodeRecord(old)
	if err != nil {
		return Verdict{}, err
	}
	// A retried SET whose first attempt landed finds this request's own value.
	if held.token == recordToken(c.Token) {
		return accepted, nil
	}
	return judgeHeld(held, c), nil
}

func trackDecideCmd(c *Claim) pipeline.Cmd {
	pol := c.Policy
	return pipeline.EvalSha(trackDecideScript, []string{c.StateKey, c.SeenKey},
		encodeFix(fixOf(c), pol.Radius), seenField(c), c.At.UnixMilli(), pol.TTL.Milliseconds(), string(pol.Shape),
		pol.Window.Microseconds(), pol.SessionIdle.Microseconds(), waitMsOf(pol))
}

// trackVerdict reads the decision script's answer: the verdict and, for a
// redelivery of a settled ping, that ping's claim time (8 bytes), which
// makes the seen entry c's holder, or for a suppression flagged
// flagUndoable that flag.
func trackVerdict(c *Claim, cmd *redis.Cmd) (Verdict, error) {
	res, err := cmd.StringSlice()
	if err != nil {
		return Verdict{}, err
	}
	if len(res) < 2 || len(res) > 3 || (len(res) == 3 && len(res[2]) != 8 && res[2] != string(flagUndoable)) {
		return Verdict{}, fmt.Errorf("track script answered %q", res)
	}
	switch {
	case len(res) < 3:
	case res[2] == string(flagUndoable):
		c.undoable = true
	default:
		c.held, c.holder = true, record{claimedMs: int64(binary.BigEndian.Uint64([]byte(res[2]))), settled: true}
	}
	return Verdict{Decision: Decision(res[0]), Reason: Reason(res[1])}, nil
}

// Settle implements Store without waiting: the settlements join the
// pipeline's queue, ahead of every claim decided later, and go with the
// next batch. Nothing a sender is told depends on them (a settlement only
// turns a redelivery's "come back" into "delivered"), so the answer need
// not wait a round trip for them; and settlements that wait for no one
// ride along with the claims of other requests instead of making round
// trips of their own.
func (s *RedisStore) Settle(claims []*Claim, done func(error)) {
	cmds := make([]pipeline.Cmd, len(claims))
	for i, c := range claims {
		if c.Policy.Shape == Tumbling {
			cmds[i] = settleCmd(c)
		} else {
			cmds[i] = pipeline.EvalSha(trackSettleScript, []string{c.SeenKey}, seenField(c), uint64Bytes(c.Token))
		}
	}
	s.pipeline.Go(s.timeout, cmds, done)
}

// settleCmd settles a tumbling claim with a plain SET, a fraction of a
// script's cost to Redis: XX leaves a key that is gone (released, expired)
// gone, KEEPTTL keeps its expiry. It does not check whose claim the key
// holds, and need not: only a request whose upstream took the observation
// settles, and a settled key says no more than that its observation was
// delivered. The key can hold another request's claim only if it was gone
// in between (a settlement the reconciler makes late); that request's
// forward was a second delivery whatever this one does, and its release
// then finds this claim's token and leaves the key settled.
func settleCmd(c *Claim) pipeline.Cmd {
	key, value := c.Observation.Key, settledRecord(c).encode()
	return pipeline.Cmd{Key: key, Queue: func(ctx context.Context, p redis.Pipeliner) redis.Cmder {
		return p.SetArgs(ctx, key, value, redis.SetArgs{Mode: "XX", KeepTTL: true})
	}}
}

// Release implements Store.
func (s *RedisStore) Release(ctx context.Context, claims []*Claim) ([]bool, error) {
	order := releaseOrder(claims)
	cmds := make([]pipeline.Cmd, len(claims))
	for j, i := range order {
		script, keys, args := releaseCall(claims[i])
		cmds[j] = pipeline.EvalSha(script, keys, args...)
	}
	if err := s.do(ctx, cmds); err != nil {
		return nil, partialRelease(err, order, cmds)
	}
	released := make([]bool, len(claims))
	for j, i := range order {
		var err error
		if released[i], err = releasedBy(cmds[j].Result.(*redis.Cmd)); err != nil {
			return nil, err
		}
	}
	return released, nil
}

// ReleaseError is a Release that Redis refused for some of its claims and
// answered for the others: on a Cluster, the claims on a slot that is
// migrating (TRYAGAIN) fail while the other slots' releases are made. The
// Reconciler counts each claim by its own answer, so that a call on a
// key whose release went through is not failed for another's.
type ReleaseError struct {
	// Err is the first refusal.
	Err error
	// Released is, per claim, whether its release undid anything, and
	// Failed whether Redis refused it or did not answer it.
	Released, Failed []bool
}

// Error is the first refusal's.
func (e *ReleaseError) Error() string { return e.Err.Error() }

// Unwrap returns the first refusal.
func (e *ReleaseError) Unwrap() error { return e.Err }

// partialRelease is err, the failure of the release commands cmds (sent in
// order), as a ReleaseError telling which were made if Redis answered
// them: a reply means every command has its result; on a Cluster, a
// pipeline.PartialError says the commands of the masters that answered
// have theirs, and the others none. Each command's own answer decides:
// a master that answered one command TRYAGAIN (a migrating slot) made
// the releases of its other slots, and failing them too had the calls on
// their assets answered unchecked for the whole migration. After a
// timeout otherwise, the results may still be on their way.
func partialRelease(err error, order []int, cmds []pipeline.Cmd) error {
	if _, split := errors.AsType[*pipeline.PartialError](err); !split && !pipeline.IsReply(err) {
		return err
	}
	e := &ReleaseError{Err: err, Released: make([]bool, len(order)), Failed: make([]bool, len(order))}
	for j, i := range order {
		cmd, ok := cmds[j].Result.(*redis.Cmd)
		if !ok { // never sent (its caller's time was up), or its master did not answer
			e.Failed[i] = true
			continue
		}
		var cerr error
		if e.Released[i], cerr = releasedBy(cmd); cerr != nil {
			e.Failed[i] = true
		}
	}
	return e
}

// refusedAccess reports Redis refusing the connection's user a command: no
// password given, a wrong one, or an ACL that denies it.
func refusedAccess(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.HasPrefix(msg, "NOAUTH") || strings.HasPrefix(msg, "WRONGPASS") || strings.HasPrefix(msg, "NOPERM")
}

// releaseCall is the script that releases c, with its keys and arguments.
func releaseCall(c *Claim) (script *redis.Script, keys []string, args []any) {
	if c.Policy.Shape == Tumbling {
		return claimReleaseScript, []string{c.Observation.Key}, []any{newRecord(c).encode()[1:5]}
	}
	return trackReleaseScript, []string{c.StateKey, c.SeenKey}, []any{seenField(c), uint64Bytes(c.Token), uint64Bytes(statePrint(c.State, c.StateFields))}
}

// releasedBy reads a release script's answer: whether it undid anything.
func releasedBy(cmd *redis.Cmd) (bool, error) {
	n, err := cmd.Int()
	return n == 1, err
}

func (s *RedisStore) do(ctx context.Context, cmds []pipeline.Cmd) error {
	return s.pipeline.Do(ctx, s.timeout, cmds)
}
