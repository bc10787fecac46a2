package telemetrydedup

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	neturl "net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
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

	// How long opening a connection may take, at least 1ms. Default:
	// go-redis's, 5s.
	DialTimeout caddy.Duration `json:"dial_timeout,omitempty"`
	// How long reading a reply may take on a connection, at least 1ms. Default:
	// go-redis's, 5s; Timeout bounds each operation's wait anyway. Below
	// Timeout, a reply later than this has go-redis send the call again
	// on a new connection, after it ran (README, Stores).
	ReadTimeout caddy.Duration `json:"read_timeout,omitempty"`
	// How long writing a command may take on a connection, at least 1ms. Default:
	// ReadTimeout, as go-redis does; Timeout bounds each operation's wait anyway.
	WriteTimeout caddy.Duration `json:"write_timeout,omitempty"`

	// Connections per node, at most 10000 (a Redis server's default
	// maxclients). Default: 10 per CPU.
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
	prefixes   *keyPrefixes
	prefix     *string // the handler's key_prefix, once it said (servesPrefix)
	timeout    time.Duration
	username   string // the data nodes' ACL user, the URL's or Username; "" for the default user
	dataID     string // the connection's keyspaceOf
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
	r.reconciler, r.handOver, r.prefixes = conn.reconciler, conn.handOver, &conn.prefixes
	r.username = opts.Username
	r.dataID = conn.keyspaceID

	go warnIfUnreachable(ctx, conn.client, describeTopology(resolved), logger)
	return nil
}

// minRedisTimeout is the shortest store timeout: a loopback round trip
// takes about 0.1 ms idle, and a busy server's several times that.
const minRedisTimeout = time.Millisecond

// checkTimeoutFloor refuses one of the store's timeouts (0 is the
// default) no Redis round trip fits in, for the Caddyfile and JSON alike.
func checkTimeoutFloor(option string, timeout time.Duration) error {
	if timeout > 0 && timeout < minRedisTimeout {
		return fmt.Errorf("is shorter than %s, less than a Redis round trip takes under load: "+
			"every store call would time out, and every ping be handled %s; %s", minRedisTimeout, whileRedisFails, timeoutUse(option))
	}
	return nil
}

// checkCooldownFloor refuses a breaker_cooldown (0: the default) shorter
// than the breaker's first wait: in JSON a bare number is nanoseconds, and
// "breaker_cooldown": 30 had an open breaker let nearly every request try
// a Redis that is down, each waiting the store's timeout and logging two
// breaker lines.
func checkCooldownFloor(cooldown time.Duration) error {
	if cooldown > 0 && cooldown < dedup.MinBreakerCooldown {
		return fmt.Errorf("is shorter than %s, the open breaker's first wait: nearly every request would try a Redis that is down, "+
			"wait out the store's timeout and log the breaker opening again; use one such as 1s "+
			"(in JSON, a bare number is nanoseconds: 1000000000), or leave it out for its default", dedup.MinBreakerCooldown)
	}
	return nil
}

// timeoutUse says what value to give one of the store's timeouts: a
// connection's read or write timeout stays at or above timeout (below it,
// go-redis sends a call Redis was merely slow to answer again: README,
// Stores).
func timeoutUse(option string) string {
	if option == "timeout" {
		return "use one such as 50ms"
	}
	return "leave it out for go-redis's 5s, or keep it at or above timeout"
}

// connectionTimeoutArg reads one of the store's timeouts, which no Redis
// round trip must fit in (checkTimeoutFloor).
func connectionTimeoutArg(d *caddyfile.Dispenser, dst *caddy.Duration) error {
	option := d.Val()
	if err := positiveDurationArg(d, dst); err != nil {
		return err
	}
	if err := checkTimeoutFloor(option, time.Duration(*dst)); err != nil {
		return d.Errf("%s %s %v", option, time.Duration(*dst), err)
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
	if err := checkTimeoutFloor("timeout", time.Duration(r.Timeout)); err != nil {
		return fmt.Errorf("store redis: timeout %s %w", time.Duration(r.Timeout), err)
	}
	if err := checkCooldownFloor(time.Duration(r.BreakerCooldown)); err != nil {
		return fmt.Errorf("store redis: breaker_cooldown %s %w", time.Duration(r.BreakerCooldown), err)
	}
	for name, value := range map[string]caddy.Duration{"dial_timeout": r.DialTimeout, "read_timeout": r.ReadTimeout, "write_timeout": r.WriteTimeout} {
		if value < 0 {
			return fmt.Errorf("store redis: %s %s is negative, which turns go-redis's timeout off; "+
				"use one such as 3s, or leave it out for its default", name, time.Duration(value))
		}
		if err := checkTimeoutFloor(name, time.Duration(value)); err != nil {
			return fmt.Errorf("store redis: %s %s %w", name, time.Duration(value), err)
		}
	}
	for name, value := range map[string]int{"pool_size": r.PoolSize, "db": r.db(), "breaker_failures": r.BreakerFailures} {
		if value < 0 {
			return fmt.Errorf("store redis: %s %d is negative; use %s, or leave it out for its default", name, value, redisCountUse[name])
		}
	}
	return checkPoolSize(r.PoolSize)
}

// maxPoolSize is the largest pool_size: a Redis server takes 10000
// clients by default (maxclients), and go-redis reserves room for every
// connection of the pool when the client is made, on each node.
const maxPoolSize = 10000

// checkPoolSize refuses a pool no server takes, for the Caddyfile and JSON
// alike: pool_size 100000000 was a fatal out-of-memory error at load, every
// site of the process down with it, not a configuration error.
func checkPoolSize(n int) error {
	if n > maxPoolSize {
		return fmt.Errorf("store redis: pool_size %d is more connections than a Redis server takes by default (maxclients %d), "+
			"and go-redis reserves room for each when the config loads; use %s, at most %d", n, maxPoolSize, redisCountUse["pool_size"], maxPoolSize)
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
		if err := checkAddress(addr); err != nil {
			return nil, err
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
	if r.Cluster || (len(opts.Addrs) > 1 && r.Master == "") {
		switch {
		case r.db() != 0:
			return nil, errors.New("store redis: a Cluster has only database 0; drop db")
		case r.DB == nil && opts.DB != 0:
			// go-redis drops it for a Cluster without a word: two
			// deployments told apart by it would share one key space.
			return nil, fmt.Errorf("store redis: a Cluster has only database 0; drop the URL's /%d", opts.DB)
		}
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
	// The URL's ?skip_verify=true stands beside a tls block that leaves
	// insecure_skip_verify out: a flag cannot be written false.
	c.InsecureSkipVerify = c.InsecureSkipVerify || t.InsecureSkipVerify //nolint:gosec // an explicit, documented opt-in for tests
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

// Store returns the claim store.
func (r *RedisStore) Store() dedup.Store { return r.store }

// keySpace is the Redis data the store's connection reaches.
func (r *RedisStore) keySpace() string { return "redis " + r.dataID }

// Reconciler returns the connection's reconciler: the claims of calls that
// timed out are released or settled by token through it.
func (r *RedisStore) Reconciler() *dedup.Reconciler { return r.reconciler }

func (r *RedisStore) operationTimeout() time.Duration {
	return cmp.Or(time.Duration(r.Timeout), dedup.DefaultRedisTimeout)
}

// DefaultNearCache is the near cache a Redis store gets unless near_cache
// says otherwise: its round trips are what the cache saves.
func (r *RedisStore) DefaultNearCache() int { return dedup.DefaultNearCache }

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
		return connectionTimeoutArg(d, &r.Timeout)
	case "dial_timeout":
		return connectionTimeoutArg(d, &r.DialTimeout)
	case "read_timeout":
		return connectionTimeoutArg(d, &r.ReadTimeout)
	case "write_timeout":
		return connectionTimeoutArg(d, &r.WriteTimeout)
	case "pool_size":
		if err := intArg(d, &r.PoolSize, 1, redisCountUse[option]); err != nil {
			return err
		}
		if err := checkPoolSize(r.PoolSize); err != nil {
			return d.Err(err.Error())
		}
		return nil
	case "breaker_failures":
		return intArg(d, &r.BreakerFailures, 1, redisCountUse[option])
	case "breaker_cooldown":
		if err := positiveDurationArg(d, &r.BreakerCooldown); err != nil {
			return err
		}
		if err := checkCooldownFloor(time.Duration(r.BreakerCooldown)); err != nil {
			return d.Errf("breaker_cooldown %s %v", time.Duration(r.BreakerCooldown), err)
		}
		return nil
	default:
		if err := optionOfHandler(d, "redis", option); err != nil {
			return err
		}
		if slices.Contains(redisTLSOptionNames, option) {
			return d.Errf("%s is a TLS option: %s", option, tlsOptionPlace(option))
		}
		return d.Errf("unrecognized store redis option %q; the options are %s", option, strings.Join(redisOptionNames, ", "))
	}
	return nil
}

// redisOptionNames are the options of the store redis block.
var redisOptionNames = []string{"addresses", "cluster", "master", "username", "password", "sentinel_username", "sentinel_password",
	"db", "tls", "timeout", "dial_timeout", "read_timeout", "write_timeout", "pool_size", "breaker_failures", "breaker_cooldown"}

// redisTLSOptionNames are the options of the redis store's tls block.
var redisTLSOptionNames = []string{"ca", "cert", "key", "server_name", "insecure_skip_verify"}

// tlsOptionPlace says where an option of the tls block goes.
func tlsOptionPlace(name string) string {
	return fmt.Sprintf("it goes in the redis store's tls block, store redis [<url>] { tls { %s ... } }", name)
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
	// No error below quotes the URL or a piece of it: a password whose /,
	// # or % breaks the URL would go, whole or in part, into the log and
	// the admin API's answer.
	if !strings.Contains(url, "://") {
		return nil, errors.New("store redis: the URL has no scheme; write it redis://host:port/db (rediss:// for TLS), " +
			"or give host:port in addresses")
	}
	u, err := neturl.Parse(url)
	if err != nil {
		return nil, errors.New("store redis: the URL does not parse; " + urlAdvice)
	}
	if (u.Scheme == "redis" || u.Scheme == "rediss") && u.Hostname() == "" {
		// go-redis takes localhost for a URL without a host: whatever Redis
		// runs there, not the one the configuration names.
		return nil, errors.New("store redis: the URL has no host; is the environment variable set? " +
			"Use one such as redis://127.0.0.1:6379/0")
	}
	for option := range u.Query() {
		// The store takes the address, the credentials, the database and
		// the TLS settings from go-redis's reading of the URL; the rest it
		// sets from the block, and an option here would be dropped.
		if option != "db" && option != "skip_verify" {
			return nil, errors.New("store redis: the URL's query holds options the store does not read (only db and skip_verify); " +
				"give them in the store's block (dial_timeout, read_timeout, write_timeout, pool_size, timeout) and drop them from the URL")
		}
	}
	opts, err := redis.ParseURL(url)
	switch {
	case err != nil && strings.HasPrefix(err.Error(), "redis: invalid URL scheme"):
		return nil, fmt.Errorf("store redis: %v; use redis://, rediss:// for TLS, or unix:// for a socket", err)
	case err != nil:
		return nil, errors.New("store redis: go-redis cannot read the URL's path or options (it takes /<db> and ?db= and ?skip_verify=); " + urlAdvice)
	case opts.DB < 0:
		return nil, fmt.Errorf("store redis: the URL's database /%d is negative; use one such as /0", opts.DB)
	}
	return opts, nil
}

// urlAdvice is how a Redis URL is written.
const urlAdvice = "use redis://[user:password@]host:port/db or rediss:// for TLS, " +
	"with a password's /, #, ? and % percent-encoded, or give the password in the block's password option"

// checkAddress refuses an address go-redis cannot dial as the one meant:
// empty, or without a host ({env.REDIS_HOST}:6379 unset), which it dials
// on this machine, whatever Redis runs here; or neither host:port nor a
// socket's absolute path (a URL, a name without its port), which fails
// every call, every ping then unchecked.
func checkAddress(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	_, portErr := strconv.Atoi(port)
	hostPort := err == nil && portErr == nil && !strings.Contains(addr, "://") // redis://host splits at its scheme's colon
	switch {
	case strings.HasPrefix(addr, "/"):
		return nil // a unix socket, which go-redis dials as one
	case addr == "" || hostPort && host == "":
		return fmt.Errorf("store redis: addresses: %q has no host; is the environment variable set? Use host:port such as 127.0.0.1:6379", addr)
	case !hostPort:
		return fmt.Errorf("store redis: addresses: %q is not host:port; write each as host:port, such as 10.0.0.1:26379 "+
			"(a URL goes alone after store redis)", addr)
	}
	return nil
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
	_ keyPrefixed           = (*RedisStore)(nil)
	_ deadLetterChecker     = (*RedisStore)(nil)
)
