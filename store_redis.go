package telemetrydedup

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
)

func init() {
	caddy.RegisterModule(RedisStore{})
}

// RedisStore keeps claims in Redis 7 or later, shared by every Caddy instance
// pointed at the same server. Clients are shared across config reloads:
// a reload with the same URL keeps its connections.
type RedisStore struct {
	// The server, as a URL: redis://[user:password@]host:port/db, or
	// rediss:// for TLS. Placeholders such as {env.REDIS_URL} are expanded
	// when the config loads. Required.
	URL string `json:"url,omitempty"`

	// The longest any one store operation may take before it counts as a
	// store error (and on_store_error decides). Default: 50ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	poolKey string
	client  *redis.Client
	store   *dedup.RedisStore
}

// CaddyModule returns the Caddy module information.
func (RedisStore) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.telemetry_dedup.stores.redis",
		New: func() caddy.Module { return new(RedisStore) },
	}
}

// Provision takes the shared client for this URL, creating it if no config
// holds one yet. It does no network I/O: an unreachable Redis at start is a
// runtime condition for on_store_error, not a reason to refuse the config.
func (r *RedisStore) Provision(ctx caddy.Context) error {
	url := caddy.NewReplacer().ReplaceKnown(r.URL, "")
	opts, err := parseRedisURL(url)
	if err != nil {
		return err
	}
	opts.ContextTimeoutEnabled = true // the per-operation timeout must bound network waits

	r.poolKey = "redis " + url
	v, _, err := stores.LoadOrNew(r.poolKey, func() (caddy.Destructor, error) {
		return redisClient{redis.NewClient(opts)}, nil
	})
	if err != nil {
		return err
	}
	r.client = v.(redisClient).Client
	r.store = dedup.NewRedisStore(r.client, time.Duration(r.Timeout))

	go warnIfUnreachable(ctx, r.client, opts.Addr, ctx.Logger())
	return nil
}

// warnIfUnreachable tells the operator at start that Redis does not answer,
// instead of letting the first store error in traffic be the news.
func warnIfUnreachable(ctx context.Context, client *redis.Client, addr string, logger *zap.Logger) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil && ctx.Err() == nil {
		logger.Warn("redis store does not answer; until it does, on_store_error decides what happens to pings",
			zap.String("addr", addr), zap.Error(err))
	}
}

// Cleanup lets go of the shared client; the last config to do so closes it.
func (r *RedisStore) Cleanup() error {
	if r.poolKey == "" {
		return nil
	}
	_, err := stores.Delete(r.poolKey)
	return err
}

// Store returns the claim store.
func (r *RedisStore) Store() dedup.Store { return r.store }

// redisClient lends the store's client, with its operation timeout, to the
// dead-letter stream.
func (r *RedisStore) redisClient() (redis.UniversalClient, time.Duration) {
	return r.client, cmp.Or(time.Duration(r.Timeout), dedup.DefaultRedisTimeout)
}

// UnmarshalCaddyfile sets up the store from Caddyfile tokens:
//
//	store redis <url> {
//		timeout <duration>
//	}
func (r *RedisStore) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume store name
	if !d.NextArg() {
		return d.Err("store redis needs a URL, e.g. store redis redis://127.0.0.1:6379/0 or store redis {env.REDIS_URL}")
	}
	r.URL = d.Val()
	if !strings.Contains(r.URL, "{") { // placeholders are checked when they are expanded, at load
		if _, err := parseRedisURL(r.URL); err != nil {
			return d.Err(err.Error())
		}
	}
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "timeout":
			if r.Timeout != 0 {
				return d.Err("timeout already specified")
			}
			dur, err := parseDurationArg(d)
			if err != nil {
				return err
			}
			r.Timeout = caddy.Duration(dur)
		default:
			return d.Errf("unrecognized store redis option %q; the redis store takes timeout", d.Val())
		}
	}
	return nil
}

func parseRedisURL(url string) (*redis.Options, error) {
	if url == "" {
		return nil, fmt.Errorf("store redis: the URL is empty; set one such as redis://127.0.0.1:6379/0 (is the environment variable set?)")
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("store redis: %v; use redis://[user:password@]host:port/db or rediss:// for TLS", err)
	}
	return opts, nil
}

// redisClient lets a client live in the usage pool, closed with the last
// config that used it.
type redisClient struct{ *redis.Client }

func (c redisClient) Destruct() error { return c.Close() }

// Interface guards
var (
	_ caddy.Provisioner     = (*RedisStore)(nil)
	_ caddy.CleanerUpper    = (*RedisStore)(nil)
	_ caddyfile.Unmarshaler = (*RedisStore)(nil)
	_ storeProvider         = (*RedisStore)(nil)
	_ redisClienter         = (*RedisStore)(nil)
)
