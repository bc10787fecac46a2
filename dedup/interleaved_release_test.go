package dedup

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// Two requests of one asset are both accepted and both fail: Traccar's
// position forwarder with forward.retry.enable sends each position as it
// comes, so two of one device are in flight at once, a backend blip fails
// both, and its retries (100 ms doubling) come back in any order; or two
// Caddy instances behind a load balancer share one Redis, where one
// instance's claims can land between another's claims of one batch. The
// track keeps one undo record, so the two releases cannot both put back
// the track from before their request. Whatever the order of the releases
// and of the retries (some of which fail again), the sender must see:
//
//	(a) no ping accepted the first time suppressed on its retry when it
//	    would be accepted sent alone after the other request was delivered
//	    (a ping its batch suppressed the first time is its redelivery on the
//	    retry, as when one request fails);
//	(b) no state change lost: a state value a failed ping carried that the
//	    backend never got is admitted with the next ping that carries it, a
//	    plain fix where the backend last heard of the asset;
//	(c) no redelivery of what the backend has (the retries, delivered)
//	    admitted again.
//
// Every ordered pair of requests from the pool below that the track
// accepts both of (A claimed first, B after it, or between A's claims) is
// run through every order, in both track shapes and both stores.
func TestInterleavedFailedRequestsOfOneAsset(t *testing.T) {
	pool := interleavingPool()
	names := slices.Sorted(maps.Keys(pool))
	eachInterleavingStore(t, func(r *interleaving) {
		for _, an := range names {
			for _, bn := range names {
				if an != bn {
					r.pair(an, pool[an], bn, pool[bn])
				}
			}
		}
		r.t.Logf("%d pairs both accepted, %d runs", r.pairs, r.runs)
	})
}

// eachInterleavingStore runs body in both track shapes and both stores,
// and requires the two stores to answer every call alike (Go and Lua).
func eachInterleavingStore(t *testing.T, body func(r *interleaving)) {
	for _, shape := range []Shape{Sliding, Session} {
		t.Run(string(shape), func(t *testing.T) {
			stores := map[string]Store{"memory": NewMemoryStore(0), "redis": newRedisStore(t, redistest.Start(t))}
			logs := map[string][]string{}
			for _, name := range []string{"memory", "redis"} {
				t.Run(name, func(t *testing.T) {
					r := &interleaving{t: t, d: newTestDeduper(stores[name], shape)}
					defer func() { logs[name] = r.log }()
					body(r)
				})
			}
			mem, red := logs["memory"], logs["redis"]
			for i := range min(len(mem), len(red)) {
				if mem[i] != red[i] {
					t.Fatalf("call %d: memory answered %s, redis %s", i, mem[i], red[i])
				}
			}
			if len(mem) != len(red) {
				t.Fatalf("memory answered %d calls, redis %d", len(mem), len(red))
			}
		})
	}
}

// interleavingPool is what the interleaving tests send, by name, to an
// asset parked at the origin with fixes from 0 to 40 s.
func interleavingPool() map[string][]ping.Ping {
	const (
		ignOn  = "position.attributes.ignition=true"
		ignOff = "position.attributes.ignition=false"
		driver = "position.attributes.driverUniqueId=D1"
	)
	return map[string][]ping.Ping{
		"jitter":          {offset(60, -2, 1)},                         // a parked jitter fix
		"jitter 6m":       {offset(6*60, 2, 1)},                        // a window on (sliding)
		"jitter 11m":      {offset(11*60, 2, -1)},                      // an idle gap on (session)
		"departure":       {withSpeed(offset(70, 40, 0), 5)},           // setting off
		"far":             {offset(75, 90, 0)},                         // 90 m off, no speed
		"ignition on":     {withState(offset(80, 1, 1), ignOn)},        // a state change
		"ignition off":    {withState(offset(85, -1, 1), ignOff)},      // another value of it
		"driver":          {withState(offset(90, 1, -1), driver)},      // another state field
		"alarm":           {withEvent(offset(100, 2, 0), "alarm=sos")}, // an event
		"late ignition":   {withState(offset(35, 0, 1), ignOn)},        // late: before the stay's last fix
		"late far":        {offset(25, 60, 0)},                         // late, away from the stay
		"ignition moving": {withState(withSpeed(offset(95, 45, 0), 5), ignOn)},
		"drive": {withSpeed(offset(70, 30, 0), 5), withSpeed(offset(75, 55, 0), 5),
			withSpeed(offset(80, 80, 0), 5)},
		"ignition, jitter":   {withState(offset(80, 1, 1), ignOn), offset(85, -1, 0)},
		"jitter, ignition":   {offset(65, 1, 0), withState(offset(82, 0, -1), ignOn)},
		"alarm, departure":   {withEvent(offset(100, 2, 0), "alarm=sos"), withSpeed(offset(105, 40, 0), 5)},
		"ignition, driver":   {withState(offset(80, 1, 1), ignOn), withState(offset(90, 1, -1), driver)},
		"late, ignition off": {offset(30, 60, 0), withState(offset(88, 0, 2), ignOff)},
		"late jitter":        {offset(38, 1, 2)},
		"late alarm":         {withEvent(offset(15, 1, 0), "alarm=sos")},
		"late driver":        {withState(offset(33, 0, -1), driver)},
		"departure 6m":       {withSpeed(offset(6*60, 40, 0), 5)},
		"departure fast":     {withSpeed(offset(72, 60, 10), 12)},
		"arrival":            {offset(200, 400, 0), offset(210, 402, 1), offset(220, 399, -1), offset(230, 401, 2)},
		"arrival ign off":    {offset(240, 400, 1), withState(offset(250, 402, 0), ignOff)},
		"driver moving":      {withState(withSpeed(offset(100, 120, 0), 9), driver)},
		"ignition far":       {withState(offset(110, 150, 0), ignOn)},
		"alarm far":          {withEvent(offset(115, 150, 3), "alarm=sos")},
		"jitter 11m ign":     {offset(11*60, 1, 1), withState(offset(11*60+5, 2, 1), ignOn)},
		"outlier":            {offset(62, 30, 0)},
		"outlier at rest":    {withSpeed(offset(64, 30, 0), 0)},
	}
}

// A two-ping batch of one asset (Traccar's forwarder with several
// positions in flight, an OwnTracks or Overland batch) whose claims two
// other requests' claims land between, from other instances on one
// Redis, and all three fail: whatever the order of the releases and
// retries, the sender sees what TestInterleavedFailedRequestsOfOneAsset
// requires of two. Every batch of two from the pool is run with every
// ordered pair of single pings that carry a state or an event, or none
// at the stay (a state change is what a lost acceptance loses; the fixes
// away from the stay add moves, which the pair test covers).
func TestThreeInterleavedFailedRequestsOfOneAsset(t *testing.T) {
	pool := interleavingPool()
	var batches, singles []string
	for _, name := range slices.Sorted(maps.Keys(pool)) {
		switch pings := pool[name]; {
		case len(pings) == 2:
			batches = append(batches, name)
		case len(pings) == 1 && pings[0].State+pings[0].Event != "" && !pings[0].HasSpeed:
			singles = append(singles, name)
		}
	}
	eachInterleavingStore(t, func(r *interleaving) {
		for _, qn := range batches {
			for _, bn := range singles {
				for _, cn := range singles {
					if bn == cn {
						continue
					}
					names := []string{qn, bn, cn}
					reqs := [][]ping.Ping{pool[qn], pool[bn], pool[cn]}
					after, ok := r.acceptable(reqs)
					if !ok {
						continue
					}
					r.pairs++
					for _, order := range interleavings3 {
						r.run(names, reqs, after, 1, order)
					}
				}
			}
		}
		r.t.Logf("%d triples all accepted, %d runs", r.pairs, r.runs)
	})
}

// interleavings3 are orders of the releases and retries of a batch (A)
// and two requests (B, C) whose claims landed between the batch's, as
// in interleavings.
var interleavings3 = []string{"rArBrCsAsBsC", "rCrBrAsCsBsA", "rBrArCsBsAsC", "rArBrCfAsCsBsA"}

// the orders of the releases and retries of requests 0 (A) and 1 (B),
// once both are accepted: r releases, s retries (and settles the retry)
// and f retries that fail again (released in turn)
var interleavings = []string{"rArBsAsB", "rArBsBsA", "rBrAsAsB", "rBrAsBsA", "rAsArBsB", "rBsBrAsA",
	"rArBfAfBsAsB", "rBrAfBfAsBsA", "rAfArBsBsA"}

type interleaving struct {
	t      *testing.T
	d      *testDeduper
	assets int
	pairs  int
	runs   int
	log    []string // every answer of the store, to compare the stores'
}

// asset returns pings as a fresh asset's, parked.
func (r *interleaving) fresh() string {
	r.assets++
	id := fmt.Sprintf("veh-i%d", r.assets)
	for i, p := range []ping.Ping{offset(0, 0, 0), offset(10, 2, -1), offset(20, -3, 2), offset(30, 1, 3), offset(40, -2, -2)} {
		p.Asset = id
		if v := r.d.settled(r.t, p); v.Decision != []Decision{Accepted, Suppressed}[min(i, 1)] {
			r.t.Fatalf("park: %+v", v)
		}
	}
	return id
}

func as(id string, pings []ping.Ping) []ping.Ping {
	out := make([]ping.Ping, len(pings))
	for i, p := range pings {
		p.Asset = id
		out[i] = p
	}
	return out
}

func (r *interleaving) claimAll(pings []ping.Ping) ([]*Claim, []Verdict) {
	r.t.Helper()
	claims, verdicts, err := r.d.ClaimAll(context.Background(), observeAll(r.d, pings))
	if err != nil {
		r.t.Fatal(err)
	}
	r.log = append(r.log, fmt.Sprint(verdicts))
	return claims, verdicts
}

func (r *interleaving) deliver(pings []ping.Ping) []Verdict {
	r.t.Helper()
	claims, verdicts := r.claimAll(pings)
	if err := r.d.Settle(context.Background(), acceptedOf(claims, verdicts)...); err != nil {
		r.t.Fatal(err)
	}
	return verdicts
}

func (r *interleaving) release(claims []*Claim) {
	r.t.Helper()
	n, err := r.d.Release(context.Background(), claims...)
	if err != nil {
		r.t.Fatal(err)
	}
	r.log = append(r.log, fmt.Sprint("released ", n))
}

func anyAccepted(vs []Verdict) bool {
	for _, v := range vs {
		if v.Decision == Accepted {
			return true
		}
	}
	return false
}

func (r *interleaving) pair(an string, a []ping.Ping, bn string, b []ping.Ping) {
	names, reqs := []string{an, bn}, [][]ping.Ping{a, b}
	after, ok := r.acceptable(reqs)
	if !ok {
		return
	}
	r.pairs++
	// split k > 0: B's call lands between A's k-th and next claim (two
	// instances on one Redis, each pipelining its request's claims)
	for split := range len(a) {
		for _, order := range interleavings {
			r.run(names, reqs, after, split, order)
		}
	}
}

// acceptable reports whether the track accepts something of each request,
// claimed one after another, sharing no ping (one ping in two requests:
// the second is the first's redelivery). If so it returns what each
// request gets sent alone after the others were delivered.
func (r *interleaving) acceptable(reqs [][]ping.Ping) (after [][]Verdict, ok bool) {
	r.t.Helper()
	var all []ping.Ping
	for _, req := range reqs {
		for _, p := range req {
			if slices.Contains(all, p) {
				return nil, false
			}
		}
		all = append(all, req...)
	}
	id := r.fresh()
	for _, req := range reqs {
		if _, v := r.claimAll(as(id, req)); !anyAccepted(v) {
			return nil, false
		}
	}
	for i := range reqs {
		id := r.fresh()
		for j := range reqs {
			if j != i {
				r.deliver(as(id, reqs[j]))
			}
		}
		after = append(after, r.deliver(as(id, reqs[i])))
	}
	return after, true
}

// run claims reqs on a fresh asset, the others' claims between the first
// request's split-th and next (split 0: one after another), and plays
// order: r releases a request, s retries it (and settles the retry), f
// retries it and fails again (released in turn); A is reqs[0], B reqs[1]
// and so on.
func (r *interleaving) run(names []string, reqs [][]ping.Ping, after [][]Verdict, split int, order string) {
	t := r.t
	t.Helper()
	id := r.fresh()
	asset := make([][]ping.Ping, len(reqs))
	for i, req := range reqs {
		asset[i] = as(id, req)
	}
	var claims [][]*Claim
	var first [][]Verdict
	if split == 0 {
		for _, req := range asset {
			c, v := r.claimAll(req)
			claims, first = append(claims, c), append(first, v)
		}
	} else {
		claims, first = r.interleavedClaims(asset, split)
	}
	if slices.ContainsFunc(first, func(v []Verdict) bool { return !anyAccepted(v) }) {
		return
	}
	r.runs++
	var trace []string
	fail := func(format string, args ...any) {
		t.Helper()
		var got []string
		for i, v := range first {
			got = append(got, fmt.Sprintf("%c=%q %s", 'A'+i, names[i], decisions(v)))
		}
		t.Errorf("%s, split %d, %s (%s): %s", strings.Join(got, ", "), split, order,
			strings.Join(trace, ", "), fmt.Sprintf(format, args...))
	}
	var delivered []ping.Ping // what the backend got, in the order it got it
	for k := 0; k < len(order); k += 2 {
		i := int(order[k+1] - 'A')
		switch order[k] {
		case 'r':
			r.release(acceptedOf(claims[i], first[i]))
		case 'f':
			retryClaims, retry := r.claimAll(asset[i])
			trace = append(trace, fmt.Sprintf("failed retry %c %v", 'A'+i, decisions(retry)))
			for j, v := range retry {
				if v.Decision != Accepted && first[i][j].Decision == Accepted && after[i][j].Decision == Accepted {
					fail("(a) failed retry of %c's ping %d (%s) %+v, but accepted alone after the others delivered", 'A'+i, j, names[i], v)
				}
			}
			r.release(acceptedOf(retryClaims, retry))
		case 's':
			retry := r.deliver(asset[i])
			trace = append(trace, fmt.Sprintf("retry %c %v", 'A'+i, decisions(retry)))
			for j, v := range retry {
				switch {
				case v.Decision == Accepted:
					delivered = append(delivered, asset[i][j])
				case v.Decision == InFlight:
					fail("retry of %c's ping %d: %+v", 'A'+i, j, v)
				case first[i][j].Decision == Accepted && after[i][j].Decision == Accepted:
					fail("(a) retry of %c's ping %d (%s) %+v, but accepted alone after the others delivered", 'A'+i, j, names[i], v)
				}
			}
		}
	}
	// (c) redeliveries of every request, now delivered
	for i := range asset {
		for j, v := range r.deliver(asset[i]) {
			if v.Decision != Suppressed {
				fail("(c) redelivery of %c's ping %d after its retry was delivered: %+v", 'A'+i, j, v)
			}
		}
	}
	// (b) each state value the requests carried: admitted with the next
	// ping that carries it, a plain fix where the backend last heard of
	// the asset, unless the backend got it
	last := as(id, []ping.Ping{offset(40, 0, 0)})[0]
	for _, p := range delivered {
		if p.Time.After(last.Time) {
			last = p
		}
	}
	probe := last
	for _, p := range slices.Concat(reqs...) {
		if p.Time.After(probe.Time) {
			probe.Time = p.Time
		}
	}
	for _, p := range slices.Concat(reqs...) {
		if p.State == "" || heard(delivered, p.State) {
			continue
		}
		probe.Time = probe.Time.Add(time.Second)
		probe.State, probe.Event, probe.HasSpeed = p.State, "", false
		if v := r.deliver([]ping.Ping{probe})[0]; v.Decision != Accepted {
			fail("(b) %q never delivered, the next ping carrying it %+v", p.State, v)
		}
	}
}

// interleavedClaims decides reqs as requests from several instances on
// one Redis would be: each request's claims in device-time order, as
// ClaimAll makes them, and the other requests' between the first's
// split-th and the next.
func (r *interleaving) interleavedClaims(reqs [][]ping.Ping, split int) (claims [][]*Claim, verdicts [][]Verdict) {
	claims = make([][]*Claim, len(reqs))
	sorted := make([][]*Claim, len(reqs))
	for i, pings := range reqs {
		request := rand.Uint64() &^ 0xffff
		for _, p := range pings {
			c := &Claim{Observation: r.d.Observe(p), Policy: &r.d.Policy, At: r.d.clock}
			c.StateKey, c.SeenKey = r.d.Keyer.TrackKeys(c.Asset, c.Time)
			claims[i] = append(claims[i], c)
		}
		sorted[i] = slices.Clone(claims[i])
		slices.SortStableFunc(sorted[i], func(x, y *Claim) int { return x.Time.Compare(y.Time) })
		for rank, c := range sorted[i] {
			c.Token = request + uint64(rank)
		}
		markCopies(sorted[i], nil)
	}
	decided := map[*Claim]Verdict{}
	parts := slices.Concat([][]*Claim{sorted[0][:split]}, sorted[1:], [][]*Claim{sorted[0][split:]})
	for _, part := range parts {
		vs, err := r.d.Store.Decide(context.Background(), part)
		if err != nil {
			r.t.Fatal(err)
		}
		for k, c := range part {
			decided[c] = vs[k]
		}
		r.log = append(r.log, fmt.Sprint(vs))
	}
	verdicts = make([][]Verdict, len(reqs))
	for i := range reqs {
		for _, c := range claims[i] {
			verdicts[i] = append(verdicts[i], decided[c])
		}
	}
	return claims, verdicts
}

// heard reports whether the backend got a ping carrying state.
func heard(delivered []ping.Ping, state string) bool {
	for _, p := range delivered {
		if p.State == state {
			return true
		}
	}
	return false
}

func decisions(vs []Verdict) string {
	var b strings.Builder
	for _, v := range vs {
		b.WriteByte(string(v.Decision)[0])
	}
	return b.String()
}

// Traccar's forwarder (forward.retry.enable) posts a parked car's position
// 30 m from its stay, with no speed (it could be a move: admitted), and 18 s
// later the ignition turning on back at the stay (admitted; the first is
// now an outlier the stay learnt, which widens it to hold one as far). The
// backend answers 503 to both, and the retries come back the second
// first. The first's release found the second accepted after it and could
// not undo it: its retry was judged against a stay its own first attempt
// had widened, and suppressed as jitter, although sent alone after the
// second it is admitted. The backend never heard of it.
func TestARetryReleasedBehindAnotherRequestIsAccepted(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		moved := releasedBehindAnother(t, d)
		if v := d.settled(t, moved); v.Decision != Accepted {
			t.Fatalf("the retry of the fix 30 m off: %+v, want accepted (as alone after the ignition)", v)
		}
		if v := d.settled(t, moved); v != suppressed(Redelivery) {
			t.Fatalf("its redelivery, delivered: %+v, want suppressed", v)
		}
	})
}

// releasedBehindAnother parks d's asset, has a fix 30 m off and then an
// ignition change accepted in two requests, releases both (the first
// behind the second), and has the ignition's retry accepted: it returns
// the fix, whose retry comes next.
func releasedBehindAnother(t *testing.T, d *testDeduper) ping.Ping {
	t.Helper()
	park(t, d)
	moved, ignition := offset(62, 30, 0), withState(offset(80, 1, 1), "position.attributes.ignition=true")
	cm, vm := d.claim(t, moved)
	ci, vi := d.claim(t, ignition)
	if vm.Decision != Accepted || vi.Decision != Accepted {
		t.Fatalf("the fix 30 m off: %+v, the ignition: %+v, want both accepted", vm, vi)
	}
	for _, c := range []*Claim{cm, ci} {
		if n, err := d.Release(t.Context(), c); err != nil || n != 1 {
			t.Fatalf("release: %d %v", n, err)
		}
	}
	if v := d.settled(t, ignition); v.Decision != Accepted {
		t.Fatalf("the ignition's retry: %+v, want accepted", v)
	}
	return moved
}

// Two Caddy instances on one Redis each pipeline a batch of one asset: the
// first the ignition turning on at the stay and, 10 s later, the car
// setting off 40 m on; the second the driver's card read between the two,
// which lands in Redis between the first batch's claims. All are
// admitted, and both upstream calls fail. The departure took the undo
// record back from the driver's request, holding the ignition already: its
// release put the ignition back with the track, the ignition's own
// release found its request's record spent and forgot nothing, and the
// retry took the ignition for no change and suppressed it as jitter. The
// backend never heard the ignition turned on.
func TestABatchAnotherInstancesClaimLandedInKeepsItsStateChange(t *testing.T) {
	const ignition = "position.attributes.ignition=true"
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d)
		r := &interleaving{t: t, d: d}
		a := []ping.Ping{withState(offset(80, 1, 1), ignition), withSpeed(offset(90, 40, 0), 5)}
		b := []ping.Ping{withState(offset(85, -1, 1), "position.attributes.driverUniqueId=D1")}
		claims, first := r.interleavedClaims([][]ping.Ping{a, b}, 1)
		for i := range 2 {
			for j, v := range first[i] {
				if v.Decision != Accepted {
					t.Fatalf("request %d, claim %d: %+v, want accepted", i, j, v)
				}
			}
			if _, err := d.Release(t.Context(), claims[i]...); err != nil {
				t.Fatal(err)
			}
		}
		if v := r.deliver(a); v[0].Decision != Accepted || v[1].Decision != Accepted {
			t.Fatalf("the first batch's retry: %+v, want the ignition and the departure accepted", v)
		}
		if v := r.deliver(b); v[0].Decision != Accepted {
			t.Fatalf("the driver's retry: %+v, want accepted", v)
		}
		if v := r.deliver(a); v[0] != suppressed(Redelivery) || v[1] != suppressed(Redelivery) {
			t.Fatalf("the first batch again, delivered: %+v, want its redelivery", v)
		}
	})
}

// The batch of TestABatchAnotherInstancesClaimLandedInKeepsItsStateChange,
// the ignition turning on and the car setting off, with two requests of
// other instances landing between its claims: the driver's card read and
// an alarm (the batch carries another vehicle's ping between its two,
// as a gateway's may). All fail. The departure took the record from the alarm's
// request, which had taken it from the driver's, which held the ignition
// already; looking one request back, the departure found the driver's and
// took it. Its release put back a track that held the ignition, the
// ignition's release found its request's record spent and forgot nothing,
// and the retry suppressed the ignition as jitter.
func TestABatchTwoRequestsLandedInKeepsItsStateChange(t *testing.T) {
	const ignition = "position.attributes.ignition=true"
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d)
		r := &interleaving{t: t, d: newTestDeduper(d.Store, d.Policy.Shape)}
		elsewhere := offset(85, 500, 500)
		elsewhere.Asset = "veh-elsewhere"
		batch := []ping.Ping{withState(offset(80, 1, 1), ignition), elsewhere, withSpeed(offset(90, 40, 0), 5)}
		others := [][]ping.Ping{{withState(offset(85, -1, 1), "position.attributes.driverUniqueId=D1")},
			{withEvent(offset(87, 2, 0), "alarm=sos")}}
		var landed []*Claim
		d.Store = &landingBetween{Store: d.Store, between: func() {
			for _, p := range others {
				claims, v := r.claimAll(p)
				if v[0].Decision != Accepted {
					t.Fatalf("%+v: %+v, want accepted", p[0], v[0])
				}
				landed = append(landed, claims...)
			}
		}}
		claims, first, err := d.ClaimAll(t.Context(), observeAll(d, batch))
		if err != nil || !allAccepted(first) || len(landed) != 2 {
			t.Fatalf("the batch: %+v %v, %d others landed between, want all accepted", first, err, len(landed))
		}
		r.release(claims)
		r.release(landed)
		if v := r.deliver(batch); !allAccepted(v) {
			t.Fatalf("the batch's retry: %+v, want the ignition and the departure accepted", v)
		}
		for _, p := range others {
			if v := r.deliver(p); v[0].Decision != Accepted {
				t.Fatalf("the retry of %+v: %+v, want accepted", p[0], v[0])
			}
		}
		for _, v := range r.deliver(batch) {
			if v != suppressed(Redelivery) {
				t.Fatalf("the batch again, delivered: %+v, want its redelivery", v)
			}
		}
	})
}

func allAccepted(vs []Verdict) bool {
	return !slices.ContainsFunc(vs, func(v Verdict) bool { return v.Decision != Accepted })
}

// landingBetween is a store on which other requests' claims land between
// a batch's first claim and the rest, as they can when instances share a
// Redis: between runs once, at the first batch of two claims or more.
type landingBetween struct {
	Store
	between func()
}

func (s *landingBetween) Decide(ctx context.Context, claims []*Claim) ([]Verdict, error) {
	if len(claims) < 2 || s.between == nil {
		return s.Store.Decide(ctx, claims)
	}
	head, err := s.Store.Decide(ctx, claims[:1])
	if err != nil {
		return nil, err
	}
	s.between()
	s.between = nil
	tail, err := s.Store.Decide(ctx, claims[1:])
	return append(head, tail...), err
}

// The fix 30 m off and the ignition of TestARetryReleasedBehindAnotherRequestIsAccepted
// both fail; the ignition's retry is delivered, and the fix 30 m off (now
// 'r') comes back in a batch with the next fix, a departure, which fails
// again. Released newest first, the departure puts back the track from
// before the batch, which holds the fix 30 m off still; the fix's own
// release, finding its request's release had put the track back, deleted
// its seen entry, and its next retry was judged against itself and
// suppressed: the backend never got it.
func TestARetryOfAReleasedPingInAFailedBatchIsAcceptedAgain(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d)
		r := &interleaving{t: t, d: d}
		moved, ignition := offset(62, 30, 0), withState(offset(80, 1, 1), "position.attributes.ignition=true")
		cm, _ := d.claim(t, moved)
		ci, _ := d.claim(t, ignition)
		for _, c := range []*Claim{cm, ci} {
			if n, err := d.Release(t.Context(), c); err != nil || n != 1 {
				t.Fatalf("release: %d %v", n, err)
			}
		}
		if v := d.settled(t, ignition); v.Decision != Accepted {
			t.Fatalf("the ignition's retry: %+v, want accepted", v)
		}
		batch := []ping.Ping{moved, withSpeed(offset(120, 90, 0), 5)}
		claims, vs := r.claimAll(batch)
		if vs[0].Decision != Accepted || vs[1].Decision != Accepted {
			t.Fatalf("the batch: %+v, want both accepted", vs)
		}
		r.release(claims)
		if v := r.deliver(batch); v[0].Decision != Accepted || v[1].Decision != Accepted {
			t.Fatalf("the batch's retry: %+v, want both accepted (the fix 30 m off never reached the backend)", v)
		}
		if v := r.deliver(batch); v[0] != suppressed(Redelivery) || v[1] != suppressed(Redelivery) {
			t.Fatalf("the batch again, delivered: %+v, want its redelivery", v)
		}
	})
}
