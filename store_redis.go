package telemetrydedup

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	neturl "net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/pipeline"
)

func init() {
	caddy.RegisterModule(RedisStore{})
	caddy.OnExit(finishRedisAtExit)
}

// RedisStore keeps claims in Redis 7 or later: one server, a Sentinel-managed
// master, or a Cluster. Every Caddy instance pointed at the same Redis shares
// the same decisions. Clients are shared across config reloads: a reload with
// the same connection settings keeps its connections. A circuit breaker
// stops calling a Redis that keeps failing, so on_store_error applies at once
// instead of after a timeout per request.
type RedisStore struct {
	// One server, as a URL: redis://[user:password@]host:port/db, or
	// rediss:// for TLS. With cluster, the URL's host is a seed node.
	URL string `json:"url,omitempty"`

	// Cluster seed nodes (host:port), or with master the Sentinel
	// addresses. Two or more addresses without master mean a Cluster.
	Addresses []string `json:"addresses,omitempty"`

	// Treat a single address (or the URL) as a Cluster seed.
	Cluster bool `json:"cluster,omitempty"`

	// The Sentinel master name; Addresses are then the sentinels.
	Master string `json:"master,omitempty"`

	// ACL user for the data nodes. Overrides the URL's.
	Username string `json:"username,omitempty"`
	// Password for the data nodes (of Username, or the default user).
	// Overrides the URL's.
	Password string `json:"password,omitempty"`

	// ACL user for the sentinels. Default: none.
	SentinelUsername string `json:"sentinel_username,omitempty"`
	// Password for the sentinels. The sentinels get no AUTH without it,
	// whatever Password says: sentinels that require one (requirepass in
	// sentinel.conf) need it here, often the same as Password. Default:
	// none.
	SentinelPassword string `json:"sentinel_password,omitempty"`

	// The database number (not with Cluster). Overrides the URL's.
	DB *int `json:"db,omitempty"`

	// TLS settings; a rediss:// URL turns TLS on with the system roots.
	TLS *RedisTLS `json:"tls,omitempty"`

	// The longest any one store operation may take before it counts as a
	// store error (and on_store_error decides). Default: 50ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// How long opening a connection may take. Default: go-redis's, 5s.
	DialTimeout caddy.Duration `json:"dial_timeout,omitempty"`
	// How long reading a reply may take on a connection. Default:
	// go-redis's, 5s; Timeout bounds each operation's wait anyway. Below
	// Timeout, a reply later than this has go-redis send the call again
	// on a new connection, after it ran (README, Stores).
	ReadTimeout caddy.Duration `json:"read_timeout,omitempty"`
	// How long writing a command may take on a connection. Default:
	// ReadTimeout, as go-redis does; Timeout bounds each operation's wait anyway.
	WriteTimeout caddy.Duration `json:"write_timeout,omitempty"`

	// Connections per node. Default: 10 per CPU.
	PoolSize int `json:"pool_size,omitempty"`

	// Consecutive store failures that open the circuit breaker. Default: 5.
	BreakerFailures int `json:"breaker_failures,omitempty"`

	// The longest an open breaker skips the store before one probe request
	// tries it again: the first probe goes 100ms after the breaker opens,
	// and each failed probe doubles the wait, up to this. Default: 1s.
	BreakerCooldown caddy.Duration `json:"breaker_cooldown,omitempty"`

	poolKey    string
	drainMax   time.Duration
	users      *atomic.Int64
	holders    *atomic.Int64
	drainUntil *atomic.Int64
	logger     *zap.Logger
	loggers    *connectionLoggers
	client     redis.UniversalClient
	store      dedup.Store
	breaker    *dedup.Breaker
	reconciler *dedup.Reconciler
	handOver   func() bool // the connection's (redisConnection.handOver)
	timeout    time.Duration
	username   string // the data nodes' ACL user, the URL's or Username; "" for the default user
}

// RedisTLS configures TLS to Redis. Placeholders are expanded in every field.
type RedisTLS struct {
	// PEM file of the CA that signed the server's certificate. Default: the
	// system roots.
	CA string `json:"ca,omitempty"`
	// PEM file of a client certificate, for servers that require one
	// (tls-auth-clients).
	Cert string `json:"cert,omitempty"`
	// PEM file of the client certificate's private key.
	Key string `json:"key,omitempty"`
	// The name to verify the server's certificate against. Default: the
	// address's host.
	ServerName string `json:"server_name,omitempty"`
	// Skip certificate verification. Only for tests.
	InsecureSkipVerify bool `json:"insecure_skip_verify,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (RedisStore) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.telemetry_dedup.stores.redis",
		New: func() caddy.Module { return new(RedisStore) },
	}
}

// Provision takes the shared client for these connection settings, creating
// it if no config holds one yet. It does no network I/O: an unreachable
// Redis at start is a runtime condition for on_store_error, not a reason to
// refuse the config. (With on_invalid dead_letter the handler then checks
// the stream beside the load, and logs a config Redis says can never work:
// checkDeadLetterStream.)
func (r *RedisStore) Provision(ctx caddy.Context) error {
	if err := r.checkNumbers(); err != nil {
		return err
	}
	resolved := r.expanded()
	if r.URL != "" && resolved.URL == "" {
		return fmt.Errorf("store redis: the URL %s is empty once its placeholders are filled; is the environment variable set? "+
			"It should hold one such as redis://127.0.0.1:6379/0", r.URL)
	}
	if r.Master != "" && resolved.Master == "" {
		return fmt.Errorf("store redis: master is empty once its placeholders are filled (%s); is the environment variable set? "+
			"Without it the sentinels would be taken for a Cluster", r.Master)
	}
	if err := r.checkCredentialsFilled(resolved); err != nil {
		return err
	}
	opts, err := resolved.options()
	if err != nil {
		return err
	}
	identity, _ := json.Marshal(resolved) // the resolved settings are the connection's identity
	poolKey := "redis " + string(identity)
	logger := ctx.Logger()
	r.logger = logger
	v, loaded, err := stores.LoadOrNew(poolKey, func() (caddy.Destructor, error) {
		return newRedisConnection(opts, resolved, logger), nil
	})
	if err != nil {
		return err
	}
	r.poolKey = poolKey // Cleanup lets go of the connection only once it holds one
	conn := v.(*redisConnection)
	conn.holders.Add(1)
	r.holders, r.drainUntil = &conn.holders, &conn.drainUntil
	if loaded {
		conn.loggers.add(logger)
	}
	r.loggers = &conn.loggers
	r.users = &conn.users
	r.client = conn.client
	r.timeout = r.operationTimeout()
	r.store, r.breaker = conn.store, conn.breaker
	r.reconciler, r.handOver = conn.reconciler, conn.handOver
	r.username = opts.Username

	go warnIfUnreachable(ctx, conn.client, describeTopology(resolved), logger)
	return nil
}

// minRedisTimeout is the shortest store timeout: a loopback round trip
// takes about 0.1 ms idle, and a busy server's several times that.
const minRedisTimeout = time.Millisecond

// checkTimeoutFloor refuses a store timeout (0 is the default) no Redis
// round trip fits in, for the Caddyfile and JSON alike.
func checkTimeoutFloor(timeout time.Duration) error {
	if timeout > 0 && timeout < minRedisTimeout {
		return fmt.Errorf("is shorter than %s, less than a Redis round trip takes under load: "+
			"every store call would time out, and every ping be handled %s; use one such as 50ms", minRedisTimeout, whileRedisFails)
	}
	return nil
}

// checkNumbers refuses numbers no connection can have, which go-redis
// would not: a negative pool size panics it, and a negative database or
// failure count would silently mean the default.
func (r *RedisStore) checkNumbers() error {
	if r.Timeout < 0 || r.BreakerCooldown < 0 {
		return fmt.Errorf("store redis: timeout %s, breaker_cooldown %s: a negative duration bounds nothing; "+
			"use one such as 50ms and 1s, or leave it out for its default", time.Duration(r.Timeout), time.Duration(r.BreakerCooldown))
	}
	if err := checkTimeoutFloor(time.Duration(r.Timeout)); err != nil {
		return fmt.Errorf("store redis: timeout %s %w", time.Duration(r.Timeout), err)
	}
	for name, value := range map[string]caddy.Duration{"dial_timeout": r.DialTimeout, "read_timeout": r.ReadTimeout, "write_timeout": r.WriteTimeout} {
		if value < 0 {
			return fmt.Errorf("store redis: %s %s is negative, which turns go-redis's timeout off; "+
				"use one such as 3s, or leave it out for its default", name, time.Duration(value))
		}
	}
	for name, value := range map[string]int{"pool_size": r.PoolSize, "db": r.db(), "breaker_failures": r.BreakerFailures} {
		if value < 0 {
			return fmt.Errorf("store redis: %s %d is negative; use %s, or leave it out for its default", name, value, redisCountUse[name])
		}
	}
	return nil
}

// db is the database number given, 0 if none.
func (r *RedisStore) db() int {
	if r.DB == nil {
		return 0
	}
	return *r.DB
}

// redisCountUse is what each count of the store's settings is, for the
// errors of the Caddyfile and of JSON alike.
var redisCountUse = map[string]string{
	"pool_size":        "a number of connections such as 20",
	"db":               "a database number such as 0",
	"breaker_failures": "a number of consecutive failures such as 5",
}

// checkCredentialsFilled refuses a credential written with placeholders
// that are all empty: an unset {env.REDIS_PASSWORD} connected without AUTH,
// every ping then went unchecked, and the warning that the server wants a
// password sent its operator to set one they had set.
func (r *RedisStore) checkCredentialsFilled(resolved RedisStore) error {
	for _, c := range []struct{ option, written, filled string }{
		{"username", r.Username, resolved.Username},
		{"password", r.Password, resolved.Password},
		{"sentinel_username", r.SentinelUsername, resolved.SentinelUsername},
		{"sentinel_password", r.SentinelPassword, resolved.SentinelPassword},
	} {
		if c.written != "" && c.filled == "" {
			return fmt.Errorf("store redis: %s is empty once its placeholders are filled (%s); is the environment variable set? "+
				"Set it, or leave %s out to connect without one", c.option, c.written, c.option)
		}
	}
	return nil
}

// placeholderFields are the settings that may hold placeholders such as
// {env.REDIS_PASSWORD}: the one list both expanding them and checking for
// them go by.
func (r *RedisStore) placeholderFields() []*string {
	fields := []*string{&r.URL, &r.Master, &r.Username, &r.Password, &r.SentinelUsername, &r.SentinelPassword}
	for i := range r.Addresses {
		fields = append(fields, &r.Addresses[i])
	}
	if r.TLS != nil {
		fields = append(fields, &r.TLS.CA, &r.TLS.Cert, &r.TLS.Key, &r.TLS.ServerName)
	}
	return fields
}

// expanded returns a copy with placeholders expanded, so that secrets stay
// out of the config.
func (r *RedisStore) expanded() RedisStore {
	x := *r
	x.Addresses = slices.Clone(r.Addresses)
	if r.TLS != nil {
		t := *r.TLS
		x.TLS = &t
	}
	repl := caddy.NewReplacer()
	for _, f := range x.placeholderFields() {
		*f = repl.ReplaceKnown(*f, "")
	}
	return x
}

// options builds the go-redis options: URL first, explicit fields over it.
func (r RedisStore) options() (*redis.UniversalOptions, error) {
	opts := &redis.UniversalOptions{
		Addrs:                 r.Addresses,
		MasterName:            r.Master,
		IsClusterMode:         r.Cluster,
		SentinelUsername:      r.SentinelUsername,
		SentinelPassword:      r.SentinelPassword,
		DialTimeout:           time.Duration(r.DialTimeout),
		ReadTimeout:           time.Duration(r.ReadTimeout),
		WriteTimeout:          time.Duration(r.WriteTimeout),
		PoolSize:              r.PoolSize,
		ContextTimeoutEnabled: true, // the per-operation timeout must bound network waits
		OnConnect:             dedup.LoadScripts,
	}
	switch {
	case r.URL != "" && len(r.Addresses) > 0:
		return nil, errors.New("store redis: give either a URL or addresses, not both")
	case r.URL != "":
		u, err := parseRedisURL(r.URL)
		if err != nil {
			return nil, err
		}
		opts.Addrs, opts.Username, opts.Password, opts.DB, opts.TLSConfig = []string{u.Addr}, u.Username, u.Password, u.DB, u.TLSConfig
	case len(r.Addresses) == 0:
		return nil, errors.New("store redis: needs a URL, or addresses (with master for Sentinel, two or more or cluster for Cluster)")
	}
	for _, addr := range r.Addresses {
		// go-redis dials this machine for an empty address, or one without
		// a host ({env.REDIS_HOST}:6379 unset): whatever Redis runs here,
		// not the one the configuration names.
		if host, _, err := net.SplitHostPort(addr); addr == "" || err == nil && host == "" {
			return nil, fmt.Errorf("store redis: addresses: %q has no host; is the environment variable set? Use host:port such as 127.0.0.1:6379", addr)
		}
	}
	if r.Master != "" && r.Cluster {
		return nil, errors.New("store redis: master (Sentinel) and cluster exclude each other")
	}
	if r.Master == "" && (r.SentinelUsername != "" || r.SentinelPassword != "") {
		// go-redis would send them to no sentinel, and the operator would
		// take the sentinels for guarded.
		return nil, errors.New("store redis: sentinel_username and sentinel_password are for Sentinel, and do nothing without master; add master <name>, or remove them")
	}
	if r.db() != 0 && (r.Cluster || (len(opts.Addrs) > 1 && r.Master == "")) {
		return nil, errors.New("store redis: a Cluster has only database 0; drop db")
	}
	opts.Username = cmp.Or(r.Username, opts.Username)
	opts.Password = cmp.Or(r.Password, opts.Password)
	if r.DB != nil { // db 0 too: it overrides the URL's
		opts.DB = *r.DB
	}
	if r.TLS != nil {
		tlsConfig, err := r.TLS.config(opts.TLSConfig)
		if err != nil {
			return nil, err
		}
		opts.TLSConfig = tlsConfig
	}
	return opts, nil
}

func (t RedisTLS) config(fromURL *tls.Config) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if fromURL != nil {
		c = fromURL.Clone()
	}
	c.ServerName = cmp.Or(t.ServerName, c.ServerName)
	c.InsecureSkipVerify = t.InsecureSkipVerify //nolint:gosec // an explicit, documented opt-in for tests
	if t.CA != "" {
		pem, err := os.ReadFile(t.CA)
		if err != nil {
			return nil, fmt.Errorf("store redis: tls ca: %v", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("store redis: tls ca %s holds no PEM certificate", t.CA)
		}
	}
	if (t.Cert == "") != (t.Key == "") {
		return nil, errors.New("store redis: tls cert and key go together; give both or neither")
	}
	if t.Cert != "" {
		pair, err := tls.LoadX509KeyPair(t.Cert, t.Key)
		if err != nil {
			return nil, fmt.Errorf("store redis: tls client certificate: %v", err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	return c, nil
}

// redisReplyFixes say what to do about the error replies a Redis that
// answers refuses commands with, by the reply's first word.
var redisReplyFixes = map[string]string{
	"OOM":         "Redis is at maxmemory and refuses writes: raise maxmemory, or let it evict keys with a TTL (maxmemory-policy volatile-ttl)",
	"NOAUTH":      "Redis requires a password: set password (and username) in the store's block, or in the URL",
	"WRONGPASS":   "Redis refused the username or password: check password and username in the store's block or URL",
	"NOPERM":      "the Redis user may not run a command or key the store needs: give it the README's ACL rule (Stores): the key_prefix's keys (and dead_letter_stream's) and PING SET GET DEL PTTL PEXPIRE HGET HSET HDEL TIME EVALSHA SCRIPT|LOAD SCRIPT|EXISTS XADD TYPE; with Sentinel or Cluster also EVAL WAIT ROLE; with Cluster also CLUSTER|SLOTS COMMAND",
	"READONLY":    "the store is connected to a replica: point it at the master, or give master and the sentinels' addresses",
	"LOADING":     "Redis is loading its data set after a restart; it answers once loaded",
	"MASTERDOWN":  "the replica lost its master: see the sentinels or the master",
	"CLUSTERDOWN": "the Redis Cluster is down or not all its slots are served",
}

// scriptACLRefusals start the replies of a Redis that refuses a script a
// command or key its user may not use: it says ERR there, not NOPERM
// (7.0, then 7.2 and later).
var scriptACLRefusals = []string{
	"ERR The user executing the script can't",
	"ERR ACL failure in script",
}

// storeErrorFix says what to do about a store error, if the error says
// enough: Redis's own error replies, and a wait that timed out.
func storeErrorFix(err error) string {
	if refusal := (*deadLetterRefusal)(nil); errors.As(err, &refusal) {
		return refusal.fix()
	}
	var reply redis.Error
	if errors.As(err, &reply) && !errors.Is(err, redis.Nil) {
		msg := reply.Error()
		if slices.ContainsFunc(scriptACLRefusals, func(prefix string) bool { return strings.HasPrefix(msg, prefix) }) {
			return redisReplyFixes["NOPERM"]
		}
		word, _, _ := strings.Cut(msg, " ")
		return redisReplyFixes[word]
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "Redis did not answer within the store's timeout: is it reachable, paused or overloaded? " +
			"(With Sentinel, sentinels that require a password need sentinel_password; the startup warning says why they did not answer.)"
	}
	return ""
}

// whileRedisFails says what becomes of the pings while Redis fails, in the
// lines of a store or connection: the handlers that share it may differ in
// mode and options, so it says what each kind of them does.
const whileRedisFails = "in enforce mode as on_store_error says (and invalid ones 503 with on_invalid dead_letter), " +
	"while shadow mode forwards them all and only records what enforce would do"

// startupCheckTimeout bounds the startup check of a Redis store.
const startupCheckTimeout = 2 * time.Second

// warnIfUnreachable tells the operator at start that Redis does not answer,
// or refuses to (a password or ACL rule missing, with the fix), instead of
// letting the first store error in traffic be the news.
func warnIfUnreachable(ctx context.Context, client redis.UniversalClient, where string, logger *zap.Logger) {
	check, cancel := context.WithTimeout(ctx, startupCheckTimeout)
	defer cancel()
	err := client.Ping(check).Err()
	if err == nil {
		warnIfEvicting(check, client, where, logger)
		return
	}
	if ctx.Err() != nil { // the config was unloaded meanwhile
		return
	}
	msg := "redis store does not answer; until it does, pings are handled " + whileRedisFails
	fields := []zap.Field{zap.String("redis", where), zap.Error(err)}
	switch {
	case pipeline.IsReply(err):
		msg = "redis store refuses the startup check (PING); until it accepts it, pings are handled " + whileRedisFails
		if fix := storeErrorFix(err); fix != "" {
			fields = append(fields, zap.String("fix", fix))
		}
	case check.Err() != nil: // the PING ran out of the check's time, whatever error the wait ended in
		fields = append(fields, zap.String("fix", "no answer within "+startupCheckTimeout.String()+
			": is Redis reachable from here, paused or overloaded? With Sentinel, sentinels that require a password need sentinel_password"))
	}
	logger.Warn(msg, fields...)
}

// warnIfEvicting tells the operator at start that Redis may evict the
// store's keys: every key it writes has a TTL, so with maxmemory and any
// policy but noeviction (managed Redis often runs volatile-lru) a claim
// can go while its request still waits for the upstream. Its redelivery
// is then forwarded beside it instead of told to come back, and in
// sliding and session the release of a state change finds nothing to
// undo, and the retry can be suppressed: the backend never gets it. It
// reads INFO memory, which managed services allow where they deny CONFIG
// (and which shows no password), on every master of a Cluster: each has a
// config of its own. A Redis that does not answer it is not judged.
func warnIfEvicting(ctx context.Context, client redis.UniversalClient, where string, logger *zap.Logger) {
	judge := func(ctx context.Context, node redis.Cmdable, where string) {
		info := node.InfoMap(ctx, "memory")
		if info.Err() != nil {
			return
		}
		maxmemory, policy := info.Item("Memory", "maxmemory"), info.Item("Memory", "maxmemory_policy")
		if maxmemory == "" || maxmemory == "0" || policy == "" || policy == "noeviction" {
			return
		}
		logger.Warn("redis store may evict claims: a claim evicted while its request waits for the upstream lets its redelivery through a second time, "+
			"and in sliding and session can lose a state change's retry",
			zap.String("redis", where), zap.String("maxmemory", maxmemory), zap.String("maxmemory_policy", policy),
			zap.String("fix", "set maxmemory-policy noeviction (a full Redis then refuses new claims, which on_store_error answers), "+
				"or maxmemory 0, and size Redis for the keys of a TTL (the README's Sizing)"))
	}
	if cluster, ok := client.(*redis.ClusterClient); ok {
		_ = cluster.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			judge(ctx, node, node.Options().Addr)
			return nil
		})
		return
	}
	judge(ctx, client, where)
}

// describeTopology names a connection for logs, without secrets.
func describeTopology(r RedisStore) string {
	addrs := r.Addresses
	if r.URL != "" {
		if u, err := redis.ParseURL(r.URL); err == nil {
			addrs = []string{u.Addr}
		}
	}
	switch {
	case r.Master != "":
		return "sentinel master " + r.Master + " via " + strings.Join(addrs, ",")
	case r.Cluster || len(addrs) > 1:
		return "cluster via " + strings.Join(addrs, ",")
	default:
		return strings.Join(addrs, ",")
	}
}

// drainWithin returns the counter of the requests using the connection,
// and bounds how long Cleanup waits for them: a request holds a claim for
// at most inFlight, then releases it within the store's timeout.
func (r *RedisStore) drainWithin(inFlight time.Duration) *atomic.Int64 {
	r.drainMax = inFlight + r.operationTimeout() + time.Second
	return r.users
}

// Cleanup lets go of the shared client; the last config to do so closes it.
// Caddy cleans a config up as soon as a reload has replaced it, while the
// requests it started may still run: their settlements and releases need
// the connection, and without them a failed request's retry would be
// suppressed. So the last store to hold the connection lets go of it only
// once no request uses it (or drainMax has passed), and while its
// reconciler holds claims, only once it has settled or released them, or
// handed them to the connection that replaced it: a reload that replaces
// the connection while Redis hangs would otherwise drop the releases of
// the claims that land once Redis answers. A store
// that another still holds the connection with (the new config's, on a
// reload that keeps it) lets go at once: that one waits when it goes.
func (r *RedisStore) Cleanup() error {
	if r.poolKey == "" {
		return nil
	}
	if r.loggers != nil {
		r.loggers.remove(r.logger)
	}
	if r.holders.Add(-1) > 0 {
		r.leaveDrain(time.Now().Add(r.drainMax))
		_, err := stores.Delete(r.poolKey)
		return err
	}
	if caddy.Exiting() {
		// The handlers cut the requests still running as Caddy exits: wait
		// for them to release their claims, which takes one store call.
		// Those of a config a reload replaced count too: the connection
		// they release on may be no current config's, and nothing else
		// keeps the process from ending first.
		waitForUsers(redisUsers, time.Now().Add(r.operationTimeout()+time.Second))
	}
	if caddy.Exiting() || r.users.Load() == 0 && r.reconciler.Len() == 0 {
		_, err := stores.Delete(r.poolKey)
		return err
	}
	deadline := time.Now().Add(r.drainMax)
	if left := time.Unix(0, r.drainUntil.Load()); left.After(deadline) {
		deadline = left
	}
	draining.Add(1)
	go r.deleteWhenDrained(deadline)
	return nil
}

// leaveDrain leaves the wait for this store's requests, until deadline at
// the latest, to the last store to let go of the connection.
func (r *RedisStore) leaveDrain(deadline time.Time) {
	for {
		was := r.drainUntil.Load()
		if was >= deadline.UnixNano() || r.drainUntil.CompareAndSwap(was, deadline.UnixNano()) {
			return
		}
	}
}

// drainPoll is how often a cleaned-up config looks whether the requests
// using its connection are done; reconcilePoll, whether its reconciler
// is, which may take as long as an outage lasts.
const (
	drainPoll     = 50 * time.Millisecond
	reconcilePoll = time.Second
)

// deleteWhenDrained lets go of the connection once its requests are done
// (or deadline has passed) and its reconciler holds no claim, or has
// handed them to the connection a reload replaced it with, or Caddy
// exits. The reconciler bounds its own wait: it gives up on a claim at its
// TTL, and its last look for a late landing comes 101.1 s after the store
// first answered it.
func (r *RedisStore) deleteWhenDrained(deadline time.Time) {
	defer draining.Done()
	waitForUsers(r.users.Load, deadline)
	r.waitForReconciler()
	if _, err := stores.Delete(r.poolKey); err != nil {
		r.logger.Error("closing a Redis connection no config uses any more", zap.Error(err))
	}
}

// waitForReconciler waits until the reconciler holds no claim, or has
// handed them over (redisConnection.handOver: it tries again at each look,
// the other connection may have had no room), or Caddy exits. The exit
// hook (finishRedisAtExit) waits for the connection's close within a cap,
// and ends the wait at once: a look a second later could leave the close
// too little of the cap to end in, and the process would end before the
// reconciler's last pass, and before the line of what it gave up on.
func (r *RedisStore) waitForReconciler() {
	for r.reconciler.Len() > 0 && !caddy.Exiting() && !r.handOver() {
		select {
		case <-atExit.Done():
			return
		case <-time.After(reconcilePoll):
		}
	}
}

// waitForUsers waits until users counts no request, or deadline.
func waitForUsers(users func() int64, deadline time.Time) {
	for users() > 0 && time.Now().Before(deadline) {
		time.Sleep(drainPoll)
	}
}

// draining counts the Redis connections no config holds any more that
// wait for their requests and their reconciler (deleteWhenDrained).
var draining sync.WaitGroup

// finishRedisAtExit holds Caddy's exit for what the cleanups of the
// configs loaded do not wait for: the requests of a config a reload
// replaced, on a Redis connection no config loaded uses (the new one has
// the memory store, or not the module), and that connection's closing,
// the reconciler's last pass. Without it the process ended with their
// claims pending. A config without the module cuts nothing as Caddy
// exits: this cuts them too, and tells such a connection to close now
// (waitForReconciler). It waits a few store timeouts at most.
func finishRedisAtExit(context.Context) {
	cutAtExit(context.DeadlineExceeded)
	timeout := longestRedisTimeout()
	waitForUsers(redisUsers, time.Now().Add(timeout+time.Second))
	closed := make(chan struct{})
	go func() {
		draining.Wait()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(4*timeout + 2*time.Second): // a flush, the reconciler's last pass (two calls, 2 s at most), the pipeline's close
	}
}

// longestRedisTimeout is the longest store timeout of the Redis
// connections open.
func longestRedisTimeout() (longest time.Duration) {
	stores.Range(func(_, v any) bool {
		if c, ok := v.(*redisConnection); ok {
			longest = max(longest, c.timeout)
		}
		return true
	})
	return longest
}

// redisUsers counts the requests using any Redis connection.
func redisUsers() (n int64) {
	stores.Range(func(_, v any) bool {
		if c, ok := v.(*redisConnection); ok {
			n += c.users.Load()
		}
		return true
	})
	return n
}

// Store returns the claim store.
func (r *RedisStore) Store() dedup.Store { return r.store }

// Reconciler returns the connection's reconciler: the claims of calls that
// timed out are released or settled by token through it.
func (r *RedisStore) Reconciler() *dedup.Reconciler { return r.reconciler }

func (r *RedisStore) operationTimeout() time.Duration {
	return cmp.Or(time.Duration(r.Timeout), dedup.DefaultRedisTimeout)
}

// DefaultNearCache is the near cache a Redis store gets unless near_cache
// says otherwise: its round trips are what the cache saves.
func (r *RedisStore) DefaultNearCache() int { return dedup.DefaultNearCache }

// DeadLetters returns a sink that appends to a Redis stream on the store's
// server (XADD MAXLEN ~), with the store's operation timeout, through the
// store's circuit breaker (on a Cluster, the zone of the stream's master):
// skipped while it is open, and its probe once its wait is over.
func (r *RedisStore) DeadLetters(stream string, maxLen int64) deadLetterSink {
	return redisDeadLetters{client: r.client, breaker: r.breaker, stream: stream, user: r.username, maxLen: maxLen, timeout: r.timeout}
}

// checkDeadLetterStream tells, at load, a dead-letter stream Redis says
// no letter can ever be written to: its key holds another type (XADD would
// answer WRONGTYPE), or the store's user may not XADD to it (NOPERM). In
// enforce mode every invalid ping would be answered 503 forever, and a
// sender that keeps its queue in order (Overland) stall behind it; what
// the senders get is for the handler to say, which knows its mode. The
// user's right is tried with an XADD that writes nothing, whoever the user
// is: Redis checks the ACL before it refuses the ID 0-0, which it does
// before it looks at the key, and NOMKSTREAM creates none. ACL DRYRUN
// would need a right the README's rule does not give, and a refusal of it
// in ACL LOG at every load. A user without TYPE (an older README rule) has
// its type check skipped. A Redis that does not answer within the startup
// check's time is warned about and the config loads, as the store's own
// startup check does: an outage at start is on_store_error's.
func (r *RedisStore) checkDeadLetterStream(ctx context.Context, stream string) error {
	check, cancel := context.WithTimeout(ctx, startupCheckTimeout)
	defer cancel()
	kind, err := r.client.Type(check, stream).Result()
	if err == nil && kind != "none" && kind != "stream" {
		return &dedup.ConfigError{Option: "dead_letter_stream", Problem: fmt.Sprintf(
			"the key %q holds a %s, not a stream, so no dead letter can be written to it (XADD answers WRONGTYPE): "+
				"name another key with dead_letter_stream, "+
				"or delete this one (redis-cli DEL %s) if nothing needs what it holds", stream, kind, stream)}
	}
	if err == nil || pipeline.IsReply(err) { // a TYPE refused leaves the type unchecked, not the right to write
		err = r.client.Do(check, "XADD", stream, "NOMKSTREAM", "0-0", "reason", "check").Err()
		if refusesXADD(err, "NOPERM") {
			user := cmp.Or(r.username, "default")
			return &dedup.ConfigError{Option: "dead_letter_stream", Problem: fmt.Sprintf(
				"the Redis user %s may not XADD to the key %q (%v), so no dead letter can be written: %s",
				user, stream, err, grantXADD(user, stream))}
		}
	}
	if err != nil && !pipeline.IsReply(err) && ctx.Err() == nil {
		r.logger.Warn("dead_letter_stream not checked: the redis store does not answer within "+startupCheckTimeout.String()+
			"; if its key holds another type or the user may not XADD to it, no dead letter is written: in enforce mode "+
			"invalid pings are answered 503, while shadow mode forwards them all the same, and the store-error log says why",
			zap.String("dead_letter_stream", stream), zap.Error(err))
	}
	return nil
}

// grantXADD says how to let user write dead letters to stream.
func grantXADD(user, stream string) string {
	return fmt.Sprintf("grant it (ACL SETUSER %s +xadd ~%s, on every data server; README, Stores), "+
		"or name a key under its key patterns with dead_letter_stream", user, stream)
}

// redisDeadLetters appends dead letters to a Redis stream.
type redisDeadLetters struct {
	client  redis.UniversalClient
	breaker *dedup.Breaker
	stream  string
	user    string // the ACL user, for the fix of a refusal; "" for the default user
	maxLen  int64
	timeout time.Duration
}

// deadLetterRefusal is a letter Redis refused because of the config: the
// stream's key holds another type (WRONGTYPE) or the user may not write it
// (NOPERM). Retries will not write it, unlike an outage's: its fix says
// what to change.
type deadLetterRefusal struct {
	err          error
	stream, user string
}

func (e *deadLetterRefusal) Error() string { return e.err.Error() }
func (e *deadLetterRefusal) Unwrap() error { return e.err }

// fix says what to change: the store-error log line's fix.
func (e *deadLetterRefusal) fix() string {
	// The line it goes with says what the pings' senders got, which the
	// handler's mode decides.
	const problem = "a configuration problem that retries will not fix: no dead letter is written until it is changed; "
	if strings.HasPrefix(e.err.Error(), "WRONGTYPE") {
		return problem + fmt.Sprintf("the key %q holds another type than a stream: name another key with dead_letter_stream, "+
			"or delete this one (redis-cli DEL %s) if nothing needs what it holds", e.stream, e.stream)
	}
	user := cmp.Or(e.user, "default")
	return problem + fmt.Sprintf("the Redis user %s may not XADD to the key %q: ", user, e.stream) + grantXADD(user, e.stream)
}

// refusal wraps err as a deadLetterRefusal if Redis refused the letter
// because of the config.
func (d redisDeadLetters) refusal(err error) error {
	if err == nil { // before anything escapes: no allocation for a letter written
		return nil
	}
	if refusesXADD(err, "WRONGTYPE") || refusesXADD(err, "NOPERM") {
		return &deadLetterRefusal{err: err, stream: d.stream, user: d.user}
	}
	return err
}

// refusesXADD reports Redis's reply refusing an XADD, starting with word:
// WRONGTYPE, or NOPERM for XADD or its key ("... to run the 'xadd'
// command", "... to access one of the keys" in 7.0, "... a key" later).
// A NOPERM for another command is the connection's handshake (SELECT
// without +select), which pipeline.Exec sets on every command: granting
// XADD would not fix it.
func refusesXADD(err error, word string) bool {
	var reply redis.Error
	if !errors.As(err, &reply) || !strings.HasPrefix(reply.Error(), word+" ") {
		return false
	}
	msg := reply.Error()
	return word != "NOPERM" || !strings.Contains(msg, "run the '") || strings.Contains(msg, "run the 'xadd'")
}

// add appends a request's letters in one pipeline, within one timeout: a
// batch of invalid pings used to wait a timeout per ping on a hung Redis.
// It is detached from the sender's cancellation, like a claim's
// settlement: a sender that hangs up does not undo the record.
func (d redisDeadLetters) add(ctx context.Context, letters []deadLetter) []error {
	errs := make([]error, len(letters))
	err := d.breaker.Call(d.stream, func() error {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.timeout)
		defer cancel()
		pipe := d.client.Pipeline()
		cmds := make([]*redis.StringCmd, len(letters))
		for i, l := range letters {
			cmds[i] = pipe.XAdd(ctx, &redis.XAddArgs{
				Stream: d.stream,
				MaxLen: d.maxLen,
				Approx: true,
				Values: []any{
					"reason", l.reason,
					"field", l.field,
					"error", l.error,
					"body", l.body,
					"received_at", l.receivedAt.Format(time.RFC3339Nano),
					"remote_addr", l.remoteAddr,
				},
			})
		}
		err := pipeline.Exec(ctx, pipe) // the first command's error; each holds its own
		for i, cmd := range cmds {
			errs[i] = d.refusal(cmd.Err())
		}
		if pipeline.IsReply(err) {
			return nil // Redis answered, refusing the letter (a key of another type, an ACL): no outage for the breaker
		}
		return err
	})
	if errors.Is(err, dedup.ErrBreakerOpen) {
		for i := range errs {
			errs[i] = err
		}
	}
	return errs
}

// UnmarshalCaddyfile sets up the store from Caddyfile tokens:
//
//	store redis [<url>] {
//		addresses <host:port>...
//		cluster
//		master <name>
//		username <user>
//		password <password>
//		sentinel_username <user>
//		sentinel_password <password>
//		db <n>
//		tls {
//			ca <file>
//			cert <file>
//			key <file>
//			server_name <name>
//			insecure_skip_verify
//		}
//		timeout <duration>
//		dial_timeout <duration>
//		read_timeout <duration>
//		write_timeout <duration>
//		pool_size <n>
//		breaker_failures <n>
//		breaker_cooldown <duration>
//	}
func (r *RedisStore) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume store name
	// The settings' conflicts are reported at the store's line: after the
	// block the dispenser is at the brace that closes it.
	at := optionAt{d.File(), d.Line()}
	if d.NextArg() {
		r.URL = d.Val()
		if !strings.Contains(r.URL, "{") { // placeholders are checked when they are expanded, at load
			if _, err := parseRedisURL(r.URL); err != nil {
				return d.Err(err.Error())
			}
		}
		if d.NextArg() {
			return d.Errf("store redis takes one URL, got %q after it; for Sentinel or Cluster list the nodes in its block: addresses <host:port>...", d.Val())
		}
	}
	lines := map[string]int{} // option -> the line it was first given on
	var previous string
	for d.NextBlock(0) {
		option := d.Val()
		if option == "{" && previous != "" {
			return noBlockError(d, previous, redisOptionSyntax[previous])
		}
		previous = option
		if line, seen := lines[option]; seen {
			return d.Errf("%s already specified on line %d; give each option once", option, line)
		}
		lines[option] = d.Line()
		if err := r.unmarshalOption(d, option); err != nil {
			return withSyntax(d, err, option, redisOptionSyntax[option])
		}
	}
	if r.URL == "" && len(r.Addresses) == 0 {
		return at.errorf("store redis needs a URL, e.g. store redis redis://127.0.0.1:6379/0 or store redis {env.REDIS_URL}, " +
			"or addresses in its block (with master for Sentinel, cluster for Cluster)")
	}
	// Check now, so the error points at the store, unless the settings wait
	// for placeholders or TLS files, which are only read at load.
	if !r.waitsForLoad() {
		if _, err := r.options(); err != nil {
			return at.errorf("%w", err)
		}
	}
	return nil
}

// waitsForLoad reports settings that can only be checked at load: they
// hold placeholders, or name TLS files.
func (r *RedisStore) waitsForLoad() bool {
	return r.TLS != nil || slices.ContainsFunc(r.placeholderFields(), func(f *string) bool { return strings.Contains(*f, "{") })
}

// redisOptionSyntax is how each one-value option of the block is written.
var redisOptionSyntax = map[string]string{
	"master": "<name>", "username": "<user>", "password": "<password>",
	"sentinel_username": "<user>", "sentinel_password": "<password>", "db": "<n>",
	"timeout": "<duration>", "dial_timeout": "<duration>", "read_timeout": "<duration>", "write_timeout": "<duration>",
	"pool_size": "<n>", "breaker_failures": "<n>", "breaker_cooldown": "<duration>",
}

func (r *RedisStore) unmarshalOption(d *caddyfile.Dispenser, option string) error {
	switch option {
	case "addresses":
		r.Addresses = d.RemainingArgs()
		if len(r.Addresses) == 0 {
			return d.Err("addresses needs at least one host:port")
		}
	case "cluster":
		if d.NextArg() {
			return d.Errf("cluster takes no value, got %q: it is a flag, on when written; remove %q, or the line for one server", d.Val(), d.Val())
		}
		r.Cluster = true
	case "master":
		return oneArg(d, &r.Master)
	case "username":
		return oneArg(d, &r.Username)
	case "password":
		return oneArg(d, &r.Password)
	case "sentinel_username":
		return oneArg(d, &r.SentinelUsername)
	case "sentinel_password":
		return oneArg(d, &r.SentinelPassword)
	case "db":
		r.DB = new(int)
		return intArg(d, r.DB, 0, redisCountUse[option])
	case "tls":
		return r.unmarshalTLS(d)
	case "timeout":
		if err := positiveDurationArg(d, &r.Timeout); err != nil {
			return err
		}
		if err := checkTimeoutFloor(time.Duration(r.Timeout)); err != nil {
			return d.Errf("timeout %s: %v", d.Val(), err)
		}
		return nil
	case "dial_timeout":
		return positiveDurationArg(d, &r.DialTimeout)
	case "read_timeout":
		return positiveDurationArg(d, &r.ReadTimeout)
	case "write_timeout":
		return positiveDurationArg(d, &r.WriteTimeout)
	case "pool_size":
		return intArg(d, &r.PoolSize, 1, redisCountUse[option])
	case "breaker_failures":
		return intArg(d, &r.BreakerFailures, 1, redisCountUse[option])
	case "breaker_cooldown":
		return positiveDurationArg(d, &r.BreakerCooldown)
	default:
		return d.Errf("unrecognized store redis option %q; the options are addresses, cluster, master, username, password, "+
			"sentinel_username, sentinel_password, db, tls, timeout, dial_timeout, read_timeout, write_timeout, pool_size, "+
			"breaker_failures and breaker_cooldown", option)
	}
	return nil
}

// tlsOptionSyntax is how each one-value option of the tls block is written.
var tlsOptionSyntax = map[string]string{"ca": "<pem file>", "cert": "<pem file>", "key": "<pem file>", "server_name": "<name>"}

func (r *RedisStore) unmarshalTLS(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.Errf("tls takes no value, got %q: write tls { ... } with ca, cert, key, server_name or insecure_skip_verify in its block, "+
			"or tls { } for the system roots", d.Val())
	}
	r.TLS = new(RedisTLS)
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if seen[d.Val()] {
			return d.Errf("tls %s already specified; give each option once", d.Val())
		}
		seen[d.Val()] = true
		switch option := d.Val(); option {
		case "ca", "cert", "key", "server_name":
			dst := map[string]*string{"ca": &r.TLS.CA, "cert": &r.TLS.Cert, "key": &r.TLS.Key, "server_name": &r.TLS.ServerName}[option]
			if err := oneArg(d, dst); err != nil {
				return withSyntax(d, err, option, tlsOptionSyntax[option])
			}
		case "insecure_skip_verify":
			if d.NextArg() {
				return d.Errf("insecure_skip_verify takes no value, got %q: it is a flag, on when written; "+
					"remove %q, or the line to verify the server's certificate", d.Val(), d.Val())
			}
			r.TLS.InsecureSkipVerify = true
		default:
			return d.Errf("unrecognized tls option %q; use ca, cert, key, server_name or insecure_skip_verify", d.Val())
		}
	}
	if (r.TLS.Cert == "") != (r.TLS.Key == "") {
		// Said here with its line; loading the files waits for the config
		// to run, where the line is gone.
		return d.Errf("tls cert and key go together (a client certificate and its private key); give both or neither")
	}
	return nil
}

func parseRedisURL(url string) (*redis.Options, error) {
	if url == "" {
		return nil, fmt.Errorf("store redis: the URL is empty; set one such as redis://127.0.0.1:6379/0 (is the environment variable set?)")
	}
	if u, err := neturl.Parse(url); err == nil && (u.Scheme == "redis" || u.Scheme == "rediss") && u.Hostname() == "" {
		// go-redis takes localhost for a URL without a host: whatever Redis
		// runs there, not the one the configuration names.
		return nil, errors.New("store redis: the URL has no host; is the environment variable set? " +
			"Use one such as redis://127.0.0.1:6379/0")
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("store redis: %v; use redis://[user:password@]host:port/db or rediss:// for TLS", err)
	}
	return opts, nil
}

// Interface guards
var (
	_ caddy.Provisioner     = (*RedisStore)(nil)
	_ caddy.CleanerUpper    = (*RedisStore)(nil)
	_ caddyfile.Unmarshaler = (*RedisStore)(nil)
	_ storeModule           = (*RedisStore)(nil)
	_ deadLetterer          = (*RedisStore)(nil)
	_ nearCacher            = (*RedisStore)(nil)
	_ reconciling           = (*RedisStore)(nil)
	_ drainer               = (*RedisStore)(nil)
	_ timeoutStore          = (*RedisStore)(nil)
)
