package telemetrydedup

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/pipeline"
)

// redisReplyFixes say what to do about the error replies a Redis that
// answers refuses commands with, by the reply's first word.
var redisReplyFixes = map[string]string{
	"OOM": "Redis is at maxmemory and refuses writes: raise maxmemory (the README's Sizing), or lower ttl, which is how long each key lives; " +
		"keep maxmemory-policy noeviction: any other policy evicts claims whose requests still wait for the upstream",
	"NOSCRIPT": "Redis lacks the store's scripts and did not take them when the store loaded them (SCRIPT LOAD): the Redis user may not run it " +
		"(ACL LOG says): give it the README's ACL rule (Stores), SCRIPT|LOAD included",
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
		return "Redis did not answer within the store's timeout: is it reachable, paused, overloaded, or at maxclients " +
			"(it then refuses new connections; " + maxclientsCheck + ")? " +
			"(With Sentinel, sentinels that require a password need sentinel_password; the startup warning says why they did not answer.)"
	}
	if errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) {
		return "Redis closed the connection: it restarted, refused a new connection at maxclients (" + maxclientsCheck +
			"), or a proxy or firewall between cut it"
	}
	return ""
}

// maxclientsCheck says how to tell a Redis at maxclients: its refusal
// ("max number of clients reached") answers the connection's handshake,
// which go-redis does not report, and the connection is closed.
const maxclientsCheck = "INFO clients' connected_clients against CONFIG GET maxclients; " +
	"every Caddy instance's pool_size adds up, with the other services' connections"

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
		eachServer(check, client, where, func(ctx context.Context, node redis.Cmdable, where string) {
			warnIfEvicting(ctx, node, where, logger)
			warnIfSnapshotting(ctx, node, where, logger)
		})
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

// eachServer runs judge on each server whose config the store's keys
// depend on: every master of a Cluster (each has a config of its own),
// else the one the client talks to.
func eachServer(ctx context.Context, client redis.UniversalClient, where string, judge func(context.Context, redis.Cmdable, string)) {
	if cluster, ok := client.(*redis.ClusterClient); ok {
		_ = cluster.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			judge(ctx, node, node.Options().Addr)
			return nil
		})
		return
	}
	judge(ctx, client, where)
}

// warnIfEvicting tells the operator at start that Redis may evict the
// store's keys: every key it writes has a TTL, so with maxmemory and any
// policy but noeviction (managed Redis often runs volatile-lru) a claim
// can go while its request still waits for the upstream. Its redelivery
// is then forwarded beside it instead of told to come back, and in
// sliding and session the release of a state change finds nothing to
// undo, and the retry can be suppressed: the backend never gets it. It
// reads INFO memory, which managed services allow where they deny CONFIG
// (and which shows no password). A Redis that does not answer it is not
// judged.
func warnIfEvicting(ctx context.Context, node redis.Cmdable, where string, logger *zap.Logger) {
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

// warnIfSnapshotting tells the operator at start that Redis keeps its data
// across a restart by snapshots (RDB) alone: a restart loads the last one
// (dump.rdb, whoever wrote it: the save schedule, or a backup job's SAVE
// or BGSAVE under save ""), and a claim it holds in flight that was
// released since (its upstream failed) is back. Its ping's retries are
// then told 409, and once the claim is older than in_flight_timeout, that
// it was delivered: the backend never gets it. An append-only file holds
// every release, and Redis loads it instead. INFO persistence tells the
// file, and the snapshots taken or loaded since Redis started; a schedule
// that has not run yet only CONFIG GET save would tell, which the README's
// ACL rule does not grant (it shows the config's secrets too), and whose
// refusal fills the ACL log. A Redis that does not answer is not judged.
func warnIfSnapshotting(ctx context.Context, node redis.Cmdable, where string, logger *zap.Logger) {
	info := node.InfoMap(ctx, "persistence")
	if info.Err() != nil || info.Item("Persistence", "aof_enabled") != "0" {
		return
	}
	var evidence []string
	for _, field := range []string{"rdb_saves", "rdb_last_load_keys_loaded"} {
		if n := info.Item("Persistence", field); n != "" && n != "0" {
			evidence = append(evidence, field+" "+n)
		}
	}
	if len(evidence) == 0 {
		return
	}
	logger.Warn("redis store keeps its data across restarts by snapshots alone: a restart loads the last one, "+
		"and a claim released since (its upstream failed) is back in flight: its ping's retries are told 409, then that it was delivered, "+
		"and the backend never gets it",
		zap.String("redis", where), zap.String("snapshots", strings.Join(evidence, ", ")),
		zap.String("fix", "set appendonly yes, which keeps every release (a restart loads it instead of the snapshot); "+
			"or keep nothing: save \"\", no SAVE or BGSAVE by a backup job, and no dump.rdb where Redis starts"))
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
