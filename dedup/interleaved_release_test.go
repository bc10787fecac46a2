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
	const (
		ignOn  = "position.attributes.ignition=true"
		ignOff = "position.attributes.ignition=false"
		driver = "position.attributes.driverUniqueId=D1"
	)
	// after park: a settled stay at the origin, fixes 0 to 40 s
	pool := map[string][]ping.Ping{
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
	for _, shape := range []Shape{Sliding, Session} {
		t.Run(string(shape), func(t *testing.T) {
			stores := map[string]Store{"memory": NewMemoryStore(0), "redis": newRedisStore(t, redistest.Start(t))}
			logs := map[string][]string{}
			for _, name := range []string{"memory", "redis"} {
				t.Run(name, func(t *testing.T) {
					r := &interleaving{t: t, d: newTestDeduper(stores[name], shape)}
					defer func() { logs[name] = r.log }()
					names := slices.Sorted(maps.Keys(pool))
					for _, an := range names {
						for _, bn := range names {
							if an != bn {
								r.pair(an, pool[an], bn, pool[bn])
							}
						}
					}
					t.Logf("%d pairs both accepted, %d runs", r.pairs, r.runs)
				})
			}
			// the two stores answered every call alike (Go and Lua)
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
	t := r.t
	t.Helper()
	for _, p := range a {
		if slices.ContainsFunc(b, func(q ping.Ping) bool { return q == p }) {
			return // one ping in both: the second is the first's redelivery
		}
	}
	// does the track accept both (something of each)?
	id := r.fresh()
	_, va := r.claimAll(as(id, a))
	_, vb := r.claimAll(as(id, b))
	if !anyAccepted(va) || !anyAccepted(vb) {
		return
	}
	r.pairs++
	reqs := [2][]ping.Ping{a, b}
	names := [2]string{an, bn}
	// what each request gets sent alone after the other was delivered
	var after [2][]Verdict
	for i := range 2 {
		id := r.fresh()
		r.deliver(as(id, reqs[1-i]))
		after[i] = r.deliver(as(id, reqs[i]))
	}
	// split k > 0: B's call lands between A's k-th and next claim (two
	// instances on one Redis, each pipelining its request's claims)
	for split := range len(a) {
		for _, order := range interleavings {
			r.run(names, reqs, after, split, order)
		}
	}
}

func (r *interleaving) run(names [2]string, reqs [2][]ping.Ping, after [2][]Verdict, split int, order string) {
	t := r.t
	t.Helper()
	id := r.fresh()
	var claims [2][]*Claim
	var first [2][]Verdict
	if split == 0 {
		for i := range 2 {
			claims[i], first[i] = r.claimAll(as(id, reqs[i]))
		}
	} else {
		claims, first = r.interleavedClaims(as(id, reqs[0]), as(id, reqs[1]), split)
	}
	if !anyAccepted(first[0]) || !anyAccepted(first[1]) {
		return
	}
	r.runs++
	an, bn := names[0], names[1]
	var trace []string
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf("A=%q B=%q, split %d, %s (first attempt A %v, B %v; %s): %s", an, bn, split, order, decisions(first[0]), decisions(first[1]),
			strings.Join(trace, ", "), fmt.Sprintf(format, args...))
	}
	var delivered []ping.Ping // what the backend got, in the order it got it
	for k := 0; k < len(order); k += 2 {
		i := int(order[k+1] - 'A')
		switch order[k] {
		case 'r':
			r.release(acceptedOf(claims[i], first[i]))
		case 'f':
			retryClaims, retry := r.claimAll(as(id, reqs[i]))
			trace = append(trace, fmt.Sprintf("failed retry %c %v", 'A'+i, decisions(retry)))
			for j, v := range retry {
				if v.Decision != Accepted && first[i][j].Decision == Accepted && after[i][j].Decision == Accepted {
					fail("(a) failed retry of %c's ping %d (%s) %+v, but accepted alone after %s delivered", 'A'+i, j, names[i], v, names[1-i])
				}
			}
			r.release(acceptedOf(retryClaims, retry))
		case 's':
			p := as(id, reqs[i])
			retry := r.deliver(p)
			trace = append(trace, fmt.Sprintf("retry %c %v", 'A'+i, decisions(retry)))
			for j, v := range retry {
				switch {
				case v.Decision == Accepted:
					delivered = append(delivered, p[j])
				case v.Decision == InFlight:
					fail("retry of %c's ping %d: %+v", 'A'+i, j, v)
				case first[i][j].Decision == Accepted && after[i][j].Decision == Accepted:
					fail("(a) retry of %c's ping %d (%s) %+v, but accepted alone after %s delivered", 'A'+i, j, names[i], v, names[1-i])
				}
			}
		}
	}
	// (c) redeliveries of both requests, now delivered
	for i := range 2 {
		for j, v := range r.deliver(as(id, reqs[i])) {
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
	for _, p := range append(slices.Clone(reqs[0]), reqs[1]...) {
		if p.Time.After(probe.Time) {
			probe.Time = p.Time
		}
	}
	for i := range 2 {
		for _, p := range reqs[i] {
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
}

// interleavedClaims decides a and b as two requests would from two
// instances on one Redis: each request's claims in device-time order, as
// ClaimAll makes them, and b's between a's split-th and the next.
func (r *interleaving) interleavedClaims(a, b []ping.Ping, split int) (claims [2][]*Claim, verdicts [2][]Verdict) {
	var sorted [2][]*Claim
	for i, pings := range [2][]ping.Ping{a, b} {
		request := rand.Uint64() &^ 0xffff
		for j, p := range pings {
			c := &Claim{Observation: r.d.Observe(p), Policy: &r.d.Policy, Token: request + uint64(j), At: r.d.clock}
			c.StateKey, c.SeenKey = r.d.Keyer.TrackKeys(c.Asset, c.Time)
			claims[i] = append(claims[i], c)
		}
		sorted[i] = slices.Clone(claims[i])
		slices.SortStableFunc(sorted[i], func(x, y *Claim) int { return x.Time.Compare(y.Time) })
		markCopies(sorted[i], nil)
	}
	decided := map[*Claim]Verdict{}
	for _, part := range [][]*Claim{sorted[0][:split], sorted[1], sorted[0][split:]} {
		vs, err := r.d.Store.Decide(context.Background(), part)
		if err != nil {
			r.t.Fatal(err)
		}
		for k, c := range part {
			decided[c] = vs[k]
		}
		r.log = append(r.log, fmt.Sprint(vs))
	}
	for i := range 2 {
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
		if v := d.settled(t, moved); v.Decision != Accepted {
			t.Fatalf("the retry of the fix 30 m off: %+v, want accepted (as alone after the ignition)", v)
		}
		if v := d.settled(t, moved); v != suppressed(Redelivery) {
			t.Fatalf("its redelivery, delivered: %+v, want suppressed", v)
		}
	})
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
		claims, first := r.interleavedClaims(a, b, 1)
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
