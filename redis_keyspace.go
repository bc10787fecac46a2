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

// keyspace holds the reconcilers of the Redis connections open on the same
// data. A reload that replaces a connection (a new timeout, a rotated
// password) while Redis hangs leaves the releases the old one owes to its
// reconciler, and the senders' retries come through the new connection: its
// calls must make those releases first, as they make their own connection's
// (Breaker.ReleaseFirst), or a retry coming after in_flight_timeout is told
// its ping was delivered when the upstream never took it: the old
// connection, which no request uses any more, has no breaker to tell it
// that Redis answers again, and may be backing off for seconds. They make
// them through their own connection (releaseOwed): the old one's may no
// longer be let in.
type keyspace struct {
	// reconcilers is read on every store call, so it is swapped whole.
	reconcilers atomic.Pointer[[]*dedup.Reconciler]
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

// joinKeyspace adds r to the keyspace id, and returns it.
func joinKeyspace(id string, r *dedup.Reconciler) *keyspace {
	keyspaces.Lock()
	defer keyspaces.Unlock()
	ks := keyspaces.byID[id]
	if ks == nil {
		ks = &keyspace{}
		ks.reconcilers.Store(&[]*dedup.Reconciler{})
		keyspaces.byID[id] = ks
	}
	joined := append(slices.Clone(*ks.reconcilers.Load()), r)
	ks.reconcilers.Store(&joined)
	return ks
}

// leave takes r out of the keyspace id, which is forgotten once empty.
func (ks *keyspace) leave(id string, r *dedup.Reconciler) {
	keyspaces.Lock()
	defer keyspaces.Unlock()
	left := slices.DeleteFunc(slices.Clone(*ks.reconcilers.Load()), func(o *dedup.Reconciler) bool { return o == r })
	ks.reconcilers.Store(&left)
	if len(left) == 0 && keyspaces.byID[id] == ks {
		delete(keyspaces.byID, id)
	}
}

// successor is the reconciler of the connection that joined the keyspace
// last, if it joined after r's: the one a reload replaced r's connection
// with, to which r's hands its jobs as it closes (redisConnection.handOver).
// Never one that joined before: two connections a reload left would hand
// them back and forth.
func (ks *keyspace) successor(r *dedup.Reconciler) *dedup.Reconciler {
	members := *ks.reconcilers.Load()
	if i := slices.Index(members, r); i >= 0 && i < len(members)-1 {
		return members[len(members)-1]
	}
	return nil
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
// could not take them) is followed by another, a few at most.
func (ks *keyspace) releaseOwed(ctx context.Context, own *dedup.Reconciler, claims []*dedup.Claim) error {
	for range keyspaceRounds {
		for _, r := range *ks.reconcilers.Load() {
			if r != own && r.OwesFor(claims) && !own.TakeOver(r, claims) {
				// own is closing, or full: r makes them, as before.
				if err := r.ReleaseOwed(ctx, claims); err != nil {
					return err
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
	return nil
}

// othersOweFor reports whether a reconciler on the keyspace other than own
// (nil: any) owes a release on the key of any of claims.
func (ks *keyspace) othersOweFor(own *dedup.Reconciler, claims []*dedup.Claim) bool {
	for _, r := range *ks.reconcilers.Load() {
		if r != own && r.OwesFor(claims) {
			return true
		}
	}
	return false
}

// keyspaceRounds bounds the rounds of one keyspace.releaseOwed.
const keyspaceRounds = 3
