package dedup

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// TestStoresAgreeOnOperationSequences drives both stores with what
// TestStoresAgreeOnRandomStreams never generates: batches decided in one
// call (ClaimAll's shared request tokens, device-time order, copies within
// a batch), batches released in one call (releaseOrder), releases made
// twice, after a settlement, and of a whole batch that was not all
// accepted (the reconciler's unsure path), settlements after a release,
// retries of released batches and redeliveries of batches in flight. Every
// verdict, every release's answer and every holder a decision reports must
// be the same from both.
func TestStoresAgreeOnOperationSequences(t *testing.T) {
	srv := redistest.Start(t)
	redisStore, client := newRedisStore(t, srv), srv.Client()
	for _, shape := range Shapes {
		for _, still := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/still=%v", shape, still), func(t *testing.T) {
				for seed := range uint64(8) {
					if err := client.FlushAll(context.Background()).Err(); err != nil {
						t.Fatal(err)
					}
					s := newStream(seed)
					s.still = still
					runDifferential(t, s, testPolicy(shape), NewMemoryStore(0), redisStore)
				}
			})
		}
	}
}

// request is one request's claims as each store got them: the same
// claims, one copy per store, so that what a decision records in a claim
// (its holder) is compared too.
type request struct {
	mem, red []*Claim
	verdicts []Verdict
	state    string // "pending", "settled", "released"
}

// accepted are the request's accepted claims, as a handler settles or
// releases them.
func (r *request) accepted() (mem, red []*Claim) {
	for i, v := range r.verdicts {
		if v.Decision == Accepted {
			mem, red = append(mem, r.mem[i]), append(red, r.red[i])
		}
	}
	return mem, red
}

// differential runs operations on two stores and says, when they
// disagree, what led there.
type differential struct {
	t        *testing.T
	s        *stream
	pol      *Policy
	mem, red Store
	requests []*request
	trace    []string
}

func runDifferential(t *testing.T, s *stream, pol *Policy, mem, red Store) {
	t.Helper()
	d := &differential{t: t, s: s, pol: pol, mem: mem, red: red}
	for range 250 {
		s.tick()
		d.step()
	}
}

func (d *differential) fail(format string, args ...any) {
	d.t.Helper()
	d.t.Fatalf("seed %d, %s: %s\noperations:\n%s", d.s.seed, d.pol.Shape, fmt.Sprintf(format, args...), strings.Join(d.trace, "\n"))
}

func (d *differential) log(format string, args ...any) {
	d.trace = append(d.trace, fmt.Sprintf("%3d ", len(d.trace))+fmt.Sprintf(format, args...))
}

// pick returns a random request in state, the latest more often, or nil.
func (d *differential) pick(state string) *request {
	var in []*request
	for _, r := range d.requests {
		if r.state == state {
			in = append(in, r)
		}
	}
	if len(in) == 0 {
		return nil
	}
	if d.s.rng.Float64() < 0.5 {
		return in[len(in)-1]
	}
	return in[d.s.rng.IntN(len(in))]
}

func (d *differential) step() {
	rng := d.s.rng
	switch r := rng.Float64(); {
	case r < 0.35:
		n := 1
		if rng.Float64() < 0.4 {
			n = 2 + rng.IntN(7)
		}
		var pings []ping.Ping
		for range n {
			p, _ := d.s.next()
			pings = append(pings, p)
			if rng.Float64() < 0.05 {
				pings = append(pings, p) // a copy within the batch
			}
			if rng.Float64() < 0.05 {
				p.Lat += 2e-5 // another fix of the same second, 2 m north
				pings = append(pings, p)
			}
		}
		d.claim("new", pings)
	case r < 0.45:
		if req := d.pick("released"); req != nil {
			d.claim("retry of released", pingsOf(req))
		}
	case r < 0.52:
		state := []string{"pending", "settled", "released"}[rng.IntN(3)]
		if req := d.pick(state); req != nil {
			d.claim("redelivery of "+state, pingsOf(req))
		}
	case r < 0.72:
		if req := d.pick("pending"); req != nil {
			mem, red := req.accepted()
			if rng.Float64() < 0.15 {
				mem, red = req.mem, req.red // the reconciler, unsure what the call wrote
			}
			d.settle("settle", mem, red)
			req.state = "settled"
		}
	case r < 0.86:
		if req := d.pick("pending"); req != nil {
			mem, red := req.accepted()
			if rng.Float64() < 0.2 {
				mem, red = req.mem, req.red
			}
			d.release("release", mem, red)
			req.state = "released"
		}
	case r < 0.93:
		if req := d.pick("released"); req != nil {
			mem, red := req.accepted()
			if rng.Float64() < 0.5 {
				d.release("release again", mem, red)
			} else {
				d.settle("settle after release", mem, red)
			}
		}
	default:
		if req := d.pick("settled"); req != nil {
			mem, red := req.accepted()
			d.release("release after settle", mem, red)
		}
	}
}

func pingsOf(r *request) []ping.Ping {
	pings := make([]ping.Ping, len(r.mem))
	for i, c := range r.mem {
		pings[i] = c.Ping
	}
	return pings
}

// claim decides pings as one request, as ClaimAll does: one token per
// claim, sharing their upper 48 bits, decided in device-time order, the
// lower 16 bits the claim's rank in it.
func (d *differential) claim(what string, pings []ping.Ping) {
	d.t.Helper()
	d.s.token = d.s.rng.Uint64() &^ 0xffff
	k := defaultKeyer()
	req := &request{state: "pending"}
	for _, p := range pings {
		c := &Claim{Observation: k.Observe(p), Policy: d.pol, At: d.s.clock}
		if d.pol.Shape != Tumbling {
			c.StateKey, c.SeenKey = k.TrackKeys(p.Asset, p.Time)
		}
		twin := *c
		req.mem, req.red = append(req.mem, c), append(req.red, &twin)
	}
	order := func(claims []*Claim) {
		slices.SortStableFunc(claims, func(a, b *Claim) int { return a.Time.Compare(b.Time) })
		for rank, c := range claims {
			c.Token = d.s.token + uint64(rank)
		}
	}
	order(req.mem)
	order(req.red)
	markCopies(req.mem, nil)
	markCopies(req.red, nil)
	ctx := context.Background()
	vm, errM := d.mem.Decide(ctx, req.mem)
	vr, errR := d.red.Decide(ctx, req.red)
	d.log("%s at %s: %s → %v", what, d.s.clock.Format("15:04:05.000"), describe(req.mem), vm)
	if errM != nil || errR != nil {
		d.fail("decide: %v / %v", errM, errR)
	}
	for i := range vm {
		m, r := req.mem[i], req.red[i]
		if vm[i] != vr[i] {
			d.fail("claim %d: memory says %+v, redis says %+v", i, vm[i], vr[i])
		}
		if m.held != r.held || m.holder != r.holder {
			d.fail("claim %d: memory's holder %v %+v, redis's %v %+v", i, m.held, m.holder, r.held, r.holder)
		}
	}
	req.verdicts = vm
	d.requests = append(d.requests, req)
}

func (d *differential) settle(what string, mem, red []*Claim) {
	d.t.Helper()
	d.log("%s: %s", what, describe(mem))
	ctx := context.Background()
	if errM, errR := WaitSettled(ctx, d.mem, mem), WaitSettled(ctx, d.red, red); errM != nil || errR != nil {
		d.fail("%s: %v / %v", what, errM, errR)
	}
}

func (d *differential) release(what string, mem, red []*Claim) {
	d.t.Helper()
	ctx := context.Background()
	rm, errM := d.mem.Release(ctx, mem)
	rr, errR := d.red.Release(ctx, red)
	d.log("%s: %s → %v", what, describe(mem), rm)
	if errM != nil || errR != nil {
		d.fail("%s: %v / %v", what, errM, errR)
	}
	if !slices.Equal(rm, rr) {
		d.fail("%s: memory released %v, redis %v", what, rm, rr)
	}
}

// describe names claims for the trace: asset, device time, position and
// what else the ping says, and the token's claim number.
func describe(claims []*Claim) string {
	var b strings.Builder
	for i, c := range claims {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s@%s(%.7f,%.7f", c.Asset, c.Time.Format("15:04:05.000"), c.Lat, c.Lon)
		if c.Accuracy > 0 {
			fmt.Fprintf(&b, " acc=%.1f", c.Accuracy)
		}
		if c.HasSpeed {
			fmt.Fprintf(&b, " v=%.2f", c.Speed)
		}
		if c.Event != "" {
			b.WriteString(" " + c.Event)
		}
		if c.State != "" {
			b.WriteString(" " + c.State)
		}
		fmt.Fprintf(&b, ")#%x/%d", c.Token>>16&0xfff, c.Token&0xffff)
	}
	return b.String()
}
