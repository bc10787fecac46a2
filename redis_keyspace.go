package telemetrydedup

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
)

// keyspace holds the Redis connections open on the same data. A reload
// that replaces a connection (a new timeout, a rotated password) while
// Redis hangs leaves the releases the old one owes to its
// reconciler, and the senders' retries come through the new connection: its
// calls must make those releases first, as they make their own connection's
// (Breaker.ReleaseFirst), or a retry coming after in_flight_timeout is told
// its ping was delivered when the upstream never took it: the old
// connection, which no request uses any more, has no breaker to tell it
// that Redis answers again, and may be backing off for seconds. They make
// them through their own connection (releaseOwed): the old one's may no
// longer be let in.
type keyspace struct {
	// connections, oldest first, is read on every store call, so it is
	// swapped whole.
	connections atomic.Pointer[[]*redisConnection]
}

// keyspaces are the keyspaces of the Redis connections open, by keyspaceOf.
var keyspaces = struct {
	sync.Mutex
	byID map[string]*keyspace
}{byID: map[string]*keyspace{}}

// keyspaceOf names the data opts reach: the same servers (or Sentinel
// master, or Cluster) and database, whatever the credentials or timeouts.
func keyspaceOf(opts *redis.UniversalOptions) string {
	addrs := slices.Sorted(slices.Values(opts.Addrs))
	return fmt.Sprintf("%s|%s|%d", strings.Join(addrs, ","), opts.MasterName, opts.DB)
}

// joinKeyspace adds c to the keyspace id, and returns it.
func joinKeyspace(id string, c *redisConnection) *keyspace {
	keyspaces.Lock()
	defer keyspaces.Unlock()
	ks := keyspaces.byID[id]
	if ks == nil {
		ks = &keyspace{}
		ks.connections.Store(&[]*redisConnection{})
		keyspaces.byID[id] = ks
	}
	joined := append(slices.Clone(*ks.connections.Load()), c)
	ks.connections.Store(&joined)
	return ks
}

// leave takes c out of the keyspace id, which is forgotten once empty.
func (ks *keyspace) leave(id string, c *redisConnection) {
	keyspaces.Lock()
	defer keyspaces.Unlock()
	left := slices.DeleteFunc(slices.Clone(*ks.connections.Load()), func(o *redisConnection) bool { return o == c })
	ks.connections.Store(&left)
	if len(left) == 0 && keyspaces.byID[id] == ks {
		delete(keyspaces.byID, id)
	}
}

// heirs are the connections to which c, which no config holds any more,
// hands its reconciler's jobs as it drains and as it closes
// (redisConnection.handOver), in the order it offers them: every other
// connection on the keyspace that a config holds, those logging in as c's
// user first, the newest first. Each takes the jobs on the key prefixes it
// serves (keyPrefixes): the connection a site's new config holds, whatever
// its age or user (a rotated one; an older connection the config
// adopted), may touch that site's keys, and another site's, whose user may
// be limited to its own key_prefix as the README's ACL advice has it, would
// be refused them at every try until the claims' TTL, where c could make
// them itself. Never one no config holds any more, which a later reload
// retired too, and whose reconciler may be about to make its last pass and
// drop them; so jobs never go back and forth between retired connections.
func (ks *keyspace) heirs(c *redisConnection) []*redisConnection {
	var sameUser, others []*redisConnection
	members := *ks.connections.Load()
	for i := len(members) - 1; i >= 0; i-- {
		switch o := members[i]; {
		case o == c || o.holders.Load() == 0:
		case o.user == c.user:
			sameUser = append(sameUser, o)
		default:
			others = append(others, o)
		}
	}
	return append(sameUser, others...)
}

// servesPrefix counts the handler's key_prefix among those of the stores
// holding the connection (keyPrefixed), until Cleanup.
func (r *RedisStore) servesPrefix(prefix string) {
	r.prefix = &prefix
	r.prefixes.hold(prefix)
}

// keyPrefixes counts the stores holding a connection by the key_prefix of
// their handler: the keys the connection may be handed jobs on
// (keyspace.heirs).
type keyPrefixes struct {
	mu   sync.Mutex
	held map[string]int
}

// hold counts a store of a handler whose keys are under prefix.
func (k *keyPrefixes) hold(prefix string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.held == nil {
		k.held = map[string]int{}
	}
	k.held[prefix]++
}

// release uncounts it.
func (k *keyPrefixes) release(prefix string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.held[prefix]--; k.held[prefix] <= 0 {
		delete(k.held, prefix)
	}
}

// servesKey reports whether a store holding the connection serves a
// key_prefix key is under.
func (k *keyPrefixes) servesKey(key string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	for prefix := range k.held {
		if strings.HasPrefix(key, prefix) {
			return true
		}
	}
	return false
}

// owesFor reports whether a reconciler on the keyspace owes a release on
// the key of any of claims (Reconciler.OwesFor).
func (ks *keyspace) owesFor(claims []*dedup.Claim) bool { return ks.othersOweFor(nil, claims) }

// releaseOwed makes, through own (the reconciler of the connection whose
// call it is), the releases every reconciler on the keyspace owes on the
// keys of claims, and returns its failure: own takes over those of the
// others (Reconciler.TakeOver) and makes them with its own. Asking the
// others to make them would fail the call with them whenever their
// connection can no longer reach Redis while own's can: a reload that
// rotated the password replaced the connection, and once Redis cut the old
// one's pool (a restart, a blip) the old password is refused, call after
// call, until the claims' TTL ends. Releases are by token: any connection
// on the same data makes them alike. A round that leaves another owing
// some (two connections took them over from each other at once, or own
// could not take them) is followed by another, a few at most; after those
// the call fails. So does a call whose keys a closing connection owes
// releases on (TakeOver leaves them to its last pass), as a call through
// that connection does: made now, it could reach Redis before them. Either
// failure is ErrOwedElsewhere, which the calling connection's breaker does
// not count.
func (ks *keyspace) releaseOwed(ctx context.Context, own *dedup.Reconciler, claims []*dedup.Claim) error {
	for range keyspaceRounds {
		for _, c := range *ks.connections.Load() {
			if r := c.reconciler; r != own && r.OwesFor(claims) && (!own.TakeOver(r, claims) || r.OwesFor(claims)) {
				// own is closing or full: r makes them, as before; or r
				// is closing, its last pass making them: the call fails.
				if err := r.ReleaseOwed(ctx, claims); err != nil {
					return fmt.Errorf("%w: %w", dedup.ErrOwedElsewhere, err)
				}
			}
		}
		if own.OwesFor(claims) {
			if err := own.ReleaseOwed(ctx, claims); err != nil {
				return err
			}
		}
		if !ks.othersOweFor(own, claims) {
			return nil
		}
	}
	// Two connections took them over from each other, round after round:
	// made now, the call could reach Redis before them.
	return dedup.ErrOwedElsewhere
}

// othersOweFor reports whether a reconciler on the keyspace other than own
// (nil: any) owes a release on the key of any of claims.
func (ks *keyspace) othersOweFor(own *dedup.Reconciler, claims []*dedup.Claim) bool {
	for _, c := range *ks.connections.Load() {
		if c.reconciler != own && c.reconciler.OwesFor(claims) {
			return true
		}
	}
	return false
}

// keyspaceRounds bounds the rounds of one keyspace.releaseOwed.
const keyspaceRounds = 3
