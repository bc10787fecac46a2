package dedup

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultRedisTimeout bounds each store operation when timeout is not set.
const DefaultRedisTimeout = 50 * time.Millisecond

// RedisStore keeps claims in Redis (7.0 or later, or a compatible server),
// shared by every Caddy instance that points at it. A claim is one
// SET key value NX PX ttl GET: atomic, with its expiry, and returning the
// current holder when it loses, all in one round trip.
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

// The token sits at bytes 2..9 of an encoded Record (Lua strings count from
// 1), so both scripts compare the holder by token, as MemoryStore does.
var (
	settleScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 2, 9) == string.sub(ARGV[1], 2, 9) then
	redis.call('SET', KEYS[1], ARGV[1], 'KEEPTTL')
	return 1
end
return 0`)

	releaseScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 2, 9) == string.sub(ARGV[1], 2, 9) then
	return redis.call('DEL', KEYS[1])
end
return 0`)
)

// Claim implements Store.
func (s *RedisStore) Claim(ctx context.Context, key string, rec Record, ttl time.Duration) (Record, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	old, err := s.client.SetArgs(ctx, key, rec.encode(), redis.SetArgs{Mode: "NX", TTL: ttl, Get: true}).Result()
	if errors.Is(err, redis.Nil) {
		return Record{}, true, nil
	}
	if err != nil {
		return Record{}, false, err
	}
	held, err := decodeRecord(old)
	if err != nil {
		return Record{}, false, err
	}
	// A retried SET whose first attempt landed finds this request's own value.
	if held.Token == rec.Token {
		return Record{}, true, nil
	}
	return held, false, nil
}

// Settle implements Store.
func (s *RedisStore) Settle(ctx context.Context, key string, rec Record) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	rec.Settled = true
	return settleScript.Run(ctx, s.client, []string{key}, rec.encode()).Err()
}

// Release implements Store.
func (s *RedisStore) Release(ctx context.Context, key string, rec Record) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	n, err := releaseScript.Run(ctx, s.client, []string{key}, rec.encode()).Int()
	return n == 1, err
}
