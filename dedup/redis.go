package dedup

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultRedisTimeout bounds each store operation when timeout is not set.
const DefaultRedisTimeout = 50 * time.Millisecond

// RedisStore keeps claims in Redis (7.0 or later, or a compatible server),
// shared by every Caddy instance that points at it. Every decision is one
// round trip: a tumbling claim is one SET key value NX PX ttl GET (atomic,
// with its expiry, returning the holder when it loses); the sliding and
// session shapes run one Lua script, loaded once and called by SHA.
type RedisStore struct {
	client  redis.UniversalClient
	timeout time.Duration
}

// NewRedisStore returns a store on client whose operations each take at
// most timeout (DefaultRedisTimeout if timeout <= 0). The client must have
// ContextTimeoutEnabled set for the timeout to bound network waits.
func NewRedisStore(client redis.UniversalClient, timeout time.Duration) *RedisStore {
	if timeout <= 0 {
		timeout = DefaultRedisTimeout
	}
	return &RedisStore{client: client, timeout: timeout}
}

var (
	//go:embed lua/claim_settle.lua
	claimSettleLua string
	//go:embed lua/claim_release.lua
	claimReleaseLua string
	//go:embed lua/track_decide.lua
	trackDecideLua string
	//go:embed lua/track_settle.lua
	trackSettleLua string
	//go:embed lua/track_release.lua
	trackReleaseLua string

	claimSettleScript  = redis.NewScript(claimSettleLua)
	claimReleaseScript = redis.NewScript(claimReleaseLua)
	trackDecideScript  = redis.NewScript(trackDecideLua)
	trackSettleScript  = redis.NewScript(trackSettleLua)
	trackReleaseScript = redis.NewScript(trackReleaseLua)
)

// Decide implements Store.
func (s *RedisStore) Decide(ctx context.Context, c *Claim) (Verdict, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if c.Policy.Shape == Tumbling {
		return s.decideTumbling(ctx, c)
	}
	return s.decideTrack(ctx, c)
}

func (s *RedisStore) decideTumbling(ctx context.Context, c *Claim) (Verdict, error) {
	old, err := s.client.SetArgs(ctx, c.Observation.Key, newRecord(c).encode(),
		redis.SetArgs{Mode: "NX", TTL: c.Policy.TTL, Get: true}).Result()
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
	if held.token == c.Token {
		return accepted, nil
	}
	return judgeHeld(held, c), nil
}

func (s *RedisStore) decideTrack(ctx context.Context, c *Claim) (Verdict, error) {
	pol := c.Policy
	res, err := trackDecideScript.Run(ctx, s.client, []string{c.StateKey, c.SeenKey},
		encodePoint(pointOf(c)), seenField(c), c.At.UnixMilli(), pol.TTL.Milliseconds(), string(pol.Shape),
		pol.Window.Microseconds(), pol.SessionIdle.Microseconds(),
		strconv.FormatFloat(pol.Hysteresis, 'g', -1, 64), pol.InFlightTimeout.Milliseconds()).StringSlice()
	if err != nil {
		return Verdict{}, err
	}
	if len(res) != 2 {
		return Verdict{}, fmt.Errorf("track script answered %q", res)
	}
	return Verdict{Decision: Decision(res[0]), Reason: Reason(res[1])}, nil
}

// Settle implements Store.
func (s *RedisStore) Settle(ctx context.Context, c *Claim) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if c.Policy.Shape == Tumbling {
		r := newRecord(c)
		r.settled = true
		return claimSettleScript.Run(ctx, s.client, []string{c.Observation.Key}, r.encode()).Err()
	}
	return trackSettleScript.Run(ctx, s.client, []string{c.SeenKey}, seenField(c), tokenBytes(c.Token)).Err()
}

// Release implements Store.
func (s *RedisStore) Release(ctx context.Context, c *Claim) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var n int
	var err error
	if c.Policy.Shape == Tumbling {
		n, err = claimReleaseScript.Run(ctx, s.client, []string{c.Observation.Key}, tokenBytes(c.Token)).Int()
	} else {
		n, err = trackReleaseScript.Run(ctx, s.client, []string{c.StateKey, c.SeenKey}, seenField(c), tokenBytes(c.Token)).Int()
	}
	return n == 1, err
}
