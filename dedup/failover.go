package dedup

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/pipeline"
)

// FailoverStore is a RedisStore on masters whose replicas take over when
// they fail: Sentinel, or a Cluster. A master answers a write before its
// replicas have it, and a failover in between promotes a replica without
// it. A claim or a settlement lost that way costs a copy more at worst. A
// release lost that way costs the observation: the promoted replica holds
// the claim again, and the retries of the observation whose request failed
// are told to come back (409) and then, once the claim is older than
// in_flight_timeout, that it was delivered.
//
// So FailoverStore sends a release on a connection of its own to its
// master, followed there, if the master has replicas online, by a WAIT
// for one of them, and hands the releases no replica acknowledged in time
// (or that had none online) to unconfirmed (Reconciler.Confirm), which
// releases them again at its confirmation offsets, on whichever master
// holds their keys by then, and first for any call on their keys.
// Releases are rare (an upstream failure), so each has round trips of its
// own rather than holding up the shared pipeline while a replica answers;
// decisions and settlements go as the RedisStore sends them.
type FailoverStore struct {
	*RedisStore
	client      redis.UniversalClient
	unconfirmed func([]*Claim) bool
}

// NewFailoverStore returns s, releasing through client (the Sentinel or
// Cluster client s's pipeline sends on) and handing the releases no replica
// acknowledged to unconfirmed.
func NewFailoverStore(s *RedisStore, client redis.UniversalClient, unconfirmed func([]*Claim) bool) *FailoverStore {
	return &FailoverStore{RedisStore: s, client: client, unconfirmed: unconfirmed}
}

// Release implements Store. Each master's claims are released side by
// side, within the store's timeout each: a hung master holds up no other's
// releases. Each claim has its own answer: one that failed (its master
// hung, its slot migrating) fails alone (a ReleaseError), so that its
// timeouts count toward its own breaker zone, and the handler hands only
// it to the reconciler. The releases no replica acknowledged go to be
// confirmed a master at a time: one job for a batch's claims on two
// masters failed every call on the healthy one's keys, by making the hung
// one's releases first, until the last confirmation.
func (s *FailoverStore) Release(ctx context.Context, claims []*Claim) ([]bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	groups, err := s.byMaster(ctx, claims)
	if err != nil {
		return nil, err
	}
	released, errs := make([]bool, len(claims)), make([]error, len(claims))
	acked := make([]bool, len(groups))
	var wg sync.WaitGroup
	for k, g := range groups {
		wg.Go(func() { acked[k] = s.releaseOn(ctx, g, claims, released, errs) })
	}
	wg.Wait()
	for k, g := range groups {
		if acked[k] {
			continue
		}
		// Not those a master failed to answer: the handler hands them to
		// the reconciler, whose own releases stay owed until confirmed
		// (Reconciler.ConfirmOwn). Both, and one claim was counted
		// twice.
		var group []*Claim
		for _, i := range g.order {
			if errs[i] == nil {
				group = append(group, claims[i])
			}
		}
		if len(group) > 0 {
			s.unconfirmed(group) // the Reconciler counts what it has no room for
		}
	}
	failed := make([]bool, len(claims))
	var first error
	for i, err := range errs {
		failed[i] = err != nil
		first = cmp.Or(first, err)
	}
	switch {
	case first == nil:
		return released, nil
	case !slices.Contains(failed, false):
		return nil, first
	}
	return nil, &ReleaseError{Err: first, Released: released, Failed: failed}
}

// masterReleases are the claims, by index in releaseOrder, whose keys one
// master holds.
type masterReleases struct {
	master *redis.Client
	order  []int
}

// byMaster groups claims by the master of their keys: one for Sentinel,
// each claim's slot's on a Cluster (a claim's keys share a slot).
func (s *FailoverStore) byMaster(ctx context.Context, claims []*Claim) ([]masterReleases, error) {
	order := releaseOrder(claims)
	cluster, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return []masterReleases{{master: s.client.(*redis.Client), order: order}}, nil
	}
	var groups []masterReleases
	for _, i := range order {
		_, keys, _ := releaseCall(claims[i])
		master, err := cluster.MasterForKey(ctx, keys[0])
		if err != nil {
			return nil, err
		}
		g := slices.IndexFunc(groups, func(g masterReleases) bool { return g.master == master })
		if g < 0 {
			g, groups = len(groups), append(groups, masterReleases{master: master})
		}
		groups[g].order = append(groups[g].order, i)
	}
	return groups, nil
}

// releaseOn releases g's claims on its master, writes what each undid
// into released and what failed into errs (by claim), and reports whether
// a replica acknowledged them. A claim whose slot has moved or is moving
// (MOVED, ASK) is released through the Cluster client instead
// (releaseRedirected), and counts as unacknowledged. A master with
// replicas online gets a WAIT for one of them on the same connection, a
// second round trip, which waits half the store's timeout at most so that
// both fit within it. A master with none online (ROLE) gets none, and the
// releases count as unacknowledged: a replica whose link dropped a moment
// ago may still be promoted. A user that may not run ROLE (an @admin
// command) still gets the WAIT. The scripts go as EVAL, whole: a master
// that does not know them yet (a replica just promoted) runs them all the
// same.
func (s *FailoverStore) releaseOn(ctx context.Context, g masterReleases, claims []*Claim, released []bool, errs []error) (acked bool) {
	conn := g.master.Conn()
	defer conn.Close()
	p := conn.Pipeline()
	cmds := queueReleases(ctx, p, g.order, claims)
	role := p.Do(ctx, "role")
	_ = pipeline.Exec(ctx, p) // errors are per command
	var moved []int
	failed := false
	for j, i := range g.order {
		undid, err := releasedBy(cmds[j])
		switch {
		case isRedirect(err):
			moved = append(moved, i)
		case err != nil:
			errs[i], failed = err, true
		default:
			released[i] = undid
		}
	}
	if len(moved) > 0 {
		s.releaseRedirected(ctx, moved, claims, released, errs)
		return false
	}
	if failed {
		return false
	}
	if replicas, err := connectedReplicas(role); err == nil && replicas == 0 {
		return false
	}
	n, err := conn.Wait(ctx, 1, max(s.timeout/2, time.Millisecond)).Result()
	return err == nil && n >= 1
}

// queueReleases queues on p the releases of the claims at the indices
// order, their scripts as EVAL, whole: a master that does not know them
// yet (a replica just promoted, the new master of a moved slot) runs them
// all the same.
func queueReleases(ctx context.Context, p redis.Pipeliner, order []int, claims []*Claim) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(order))
	for j, i := range order {
		script, keys, args := releaseCall(claims[i])
		cmds[j] = script.Eval(ctx, p, keys, args...)
	}
	return cmds
}

// connectedReplicas reads a master's answer to ROLE: how many replicas
// are connected to it.
func connectedReplicas(role *redis.Cmd) (int, error) {
	reply, err := role.Slice()
	if err != nil {
		return 0, err
	}
	if len(reply) < 3 || reply[0] != "master" {
		return 0, fmt.Errorf("ROLE answered %v, not a master's role", reply)
	}
	replicas, ok := reply[2].([]any)
	if !ok {
		return 0, fmt.Errorf("ROLE answered %v, without a list of replicas", reply)
	}
	return len(replicas), nil
}

// isRedirect reports a Cluster's answer that a key's slot is elsewhere or
// moving (MOVED, ASK, TRYAGAIN), which a master's own client does not
// follow.
func isRedirect(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.HasPrefix(msg, "MOVED ") || strings.HasPrefix(msg, "ASK ") || strings.HasPrefix(msg, "TRYAGAIN")
}

// releaseRedirected releases the claims at the indices moved through the
// Cluster client, which follows a slot that moved or is moving (MOVED,
// ASK; not TRYAGAIN, which it returns, and which fails that claim alone),
// without a WAIT. Only these: a hung master's claims beside them would
// hold the call for its timeout. The scripts go as EVAL, whole, as
// releaseOn's: loading one the slot's new master lacks would load it on
// every master, the hung one's included.
func (s *FailoverStore) releaseRedirected(ctx context.Context, moved []int, claims []*Claim, released []bool, errs []error) {
	p := s.client.Pipeline()
	cmds := queueReleases(ctx, p, moved, claims)
	_ = pipeline.Exec(ctx, p) // errors are per command
	for j, i := range moved {
		undid, err := releasedBy(cmds[j])
		if err != nil {
			errs[i] = err
			continue
		}
		released[i] = undid
	}
}
