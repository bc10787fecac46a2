package dedup

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// Concurrent requests share round trips, and decide exactly as the same
// claims do one after the other: one accepted claim per observation, the
// others asked to come back while it is in flight.
func TestPipelineGivesConcurrentClaimsTheSequentialDecisions(t *testing.T) {
	const observations, copies = 200, 4
	var claims []*Claim
	pol := testPolicy(Tumbling)
	for i := range observations {
		p := parked
		p.Asset = fmt.Sprintf("veh-%d", i)
		for c := range copies {
			claims = append(claims, claimOf(pol, p, uint64(i*copies+c+1), articleBase))
		}
	}
	tally := func(verdicts []Verdict) map[Verdict]int {
		n := map[Verdict]int{}
		for _, v := range verdicts {
			n[v]++
		}
		return n
	}

	sequential := newRedisStore(t, redistest.Start(t))
	var want []Verdict
	for _, c := range claims {
		want = append(want, decide(t, sequential, c))
	}

	concurrent := newRedisStore(t, redistest.Start(t))
	got := make([]Verdict, len(claims))
	var wg sync.WaitGroup
	for i, c := range claims {
		wg.Go(func() { got[i] = decide(t, concurrent, c) })
	}
	wg.Wait()

	if fmt.Sprint(tally(got)) != fmt.Sprint(tally(want)) {
		t.Fatalf("concurrent verdicts %v, sequential %v", tally(got), tally(want))
	}
	if n := tally(got)[accepted]; n != observations {
		t.Fatalf("%d accepted, want one per observation (%d)", n, observations)
	}
	roundTrips, commands := concurrent.pipeline.RoundTrips()
	t.Logf("%d concurrent claims took %d round trips", commands, roundTrips)
	if commands != uint64(len(claims)) || roundTrips >= commands {
		t.Fatalf("%d round trips for %d commands: concurrent claims should share them", roundTrips, commands)
	}
}

// A request alone goes at once: the writer does not wait for company.
func TestPipelineSendsALoneRequestAtOnce(t *testing.T) {
	s := newRedisStore(t, redistest.Start(t))
	s.timeout = 10 * time.Second // generous: a wait for a batch to fill would show as a hang, not as a slow test
	for i := range 5 {
		p := parked
		p.Asset = fmt.Sprintf("alone-%d", i)
		if _, err := decideOne(context.Background(), s, claimOf(testPolicy(Tumbling), p, uint64(i+1), articleBase)); err != nil {
			t.Fatal(err)
		}
		if rt, n := s.pipeline.RoundTrips(); rt != uint64(i+1) || n != uint64(i+1) {
			t.Fatalf("after %d lone claims: %d round trips, %d commands", i+1, rt, n)
		}
	}
}
