package dedup

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/geo"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// The memory store runs the decisions in Go, the Redis store in SET NX GET
// and Lua. Random streams of pings from several assets (parked jitter,
// re-observations, moves, redeliveries, out-of-order arrivals, idle gaps,
// claims settled, released or left in flight) must get identical verdicts
// from both, in every shape.
func TestStoresAgreeOnRandomStreams(t *testing.T) {
	srv := redistest.Start(t)
	redisStore, client := newRedisStore(t, srv), srv.Client()
	for _, shape := range Shapes {
		for _, radius := range []float64{DefaultRadius, 4} {
			if shape == Tumbling && radius != DefaultRadius {
				continue
			}
			t.Run(fmt.Sprintf("%s/radius=%v", shape, radius), func(t *testing.T) {
				for seed := range uint64(20) {
					if err := client.FlushAll(context.Background()).Err(); err != nil {
						t.Fatal(err)
					}
					pol := testPolicy(shape)
					pol.Radius = radius
					compareStreams(t, newStream(seed), pol, NewMemoryStore(0), redisStore)
				}
			})
		}
	}
}

// Phones parked indoors: most fixes standing still, with accuracies up to
// and past 100 m, scattered as far, so that the bound of two still fixes'
// uncertainties decides often.
func TestStoresAgreeOnStillStreams(t *testing.T) {
	srv := redistest.Start(t)
	redisStore, client := newRedisStore(t, srv), srv.Client()
	for _, shape := range []Shape{Sliding, Session} {
		for _, radius := range []float64{DefaultRadius, 4} {
			t.Run(fmt.Sprintf("%s/radius=%v", shape, radius), func(t *testing.T) {
				for seed := range uint64(60) {
					if err := client.FlushAll(context.Background()).Err(); err != nil {
						t.Fatal(err)
					}
					pol := testPolicy(shape)
					pol.Radius = radius
					s := newStream(seed)
					s.still = true
					compareStreams(t, s, pol, NewMemoryStore(0), redisStore)
				}
			})
		}
	}
}

// A parser lists one to eight state fields, each given slots of its own in
// the state print (statePrint): the Lua scripts compare those slots as Go
// does, whichever fields a message carries. (A gap helper 7 noted at stop
// 63: the random streams above carry unlisted fields only.)
func TestStoresAgreeWithListedStateFields(t *testing.T) {
	srv := redistest.Start(t)
	redisStore, client := newRedisStore(t, srv), srv.Client()
	names := []string{"ignition", "driverUniqueId", "alarm", "motion", "door", "charge", "blocked", "armed"}
	for _, shape := range []Shape{Sliding, Session} {
		for n := 1; n <= MaxStateFields; n++ {
			t.Run(fmt.Sprintf("%s/fields=%d", shape, n), func(t *testing.T) {
				for seed := range uint64(6) {
					if err := client.FlushAll(context.Background()).Err(); err != nil {
						t.Fatal(err)
					}
					s := newStream(seed)
					s.fields = names[:n]
					compareStreams(t, s, testPolicy(shape), NewMemoryStore(0), redisStore)
				}
			})
		}
	}
}

// Assets on the antimeridian: their fixes either side of ±180°, the
// anchor averaged across it.
func TestStoresAgreeOnTheAntimeridian(t *testing.T) {
	srv := redistest.Start(t)
	redisStore, client := newRedisStore(t, srv), srv.Client()
	for _, shape := range []Shape{Sliding, Session} {
		for _, still := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/still=%v", shape, still), func(t *testing.T) {
				for seed := range uint64(30) {
					if err := client.FlushAll(context.Background()).Err(); err != nil {
						t.Fatal(err)
					}
					s := newStream(seed)
					s.seam, s.still = true, still
					for _, a := range s.assets {
						a.anLon = 180
					}
					compareStreams(t, s, testPolicy(shape), NewMemoryStore(0), redisStore)
				}
			})
		}
	}
}

// stream generates pings the way a small fleet sends them.
type stream struct {
	seed uint64
	// still makes them phones parked indoors: scattered up to 150 m,
	// standing still, with accuracies up to and past 100 m.
	still bool
	// seam puts them on the antimeridian, their fixes either side of it.
	seam bool
	// parked makes them long stays with outliers near the radius (see
	// nextParked); braking holds, by asset, the fixes of an arrival still
	// to send.
	parked  bool
	braking map[string][]ping.Ping
	// fields are the state fields a parser lists, as a handler's pings
	// carry them (Ping.StateFields); with none, the pings carry two
	// fields unlisted, as test-made pings do.
	fields  []string
	rng     *rand.Rand
	assets  []*asset
	sent    []ping.Ping
	pending []*Claim // accepted, neither settled nor released yet
	clock   time.Time
	// token is the last claim's: the next is now and then of the same
	// request, as ClaimAll makes a batch's (see trackState.accept).
	token uint64
}

type asset struct {
	id               string
	anchorLat, anLon float64
	last             ping.Ping
	t                time.Time
}

func newStream(seed uint64) *stream {
	s := &stream{seed: seed, rng: rand.New(rand.NewPCG(seed, 0x5eed)), clock: articleBase}
	for i := range 3 {
		lat, lon := 52.52+float64(i)*0.01, 13.40
		s.assets = append(s.assets, &asset{id: fmt.Sprintf("veh-%d", i), anchorLat: lat, anLon: lon, t: articleBase})
	}
	return s
}

// next returns the next ping and a description for failure messages.
func (s *stream) next() (ping.Ping, string) {
	if s.parked {
		return s.nextParked()
	}
	if len(s.sent) > 0 && s.rng.Float64() < 0.15 {
		return s.sent[s.rng.IntN(len(s.sent))], "redelivery"
	}
	a := s.assets[s.rng.IntN(len(s.assets))]
	step := time.Duration(5+s.rng.IntN(15)) * time.Second
	jitter := func() (float64, float64) {
		if s.still {
			k := 50 * s.rng.Float64() * s.rng.Float64()
			return a.anchorLat + (s.rng.Float64()-0.5)*6e-5*k, a.anLon + (s.rng.Float64()-0.5)*9e-5*k
		}
		return a.anchorLat + (s.rng.Float64()-0.5)*6e-5, a.anLon + (s.rng.Float64()-0.5)*9e-5 // about ±3 m
	}
	var p ping.Ping
	var kind string
	switch r := s.rng.Float64(); {
	case r < 0.40:
		a.t = a.t.Add(step)
		lat, lon := jitter()
		p, kind = ping.Ping{Time: a.t, Lat: lat, Lon: lon}, "jitter"
	case r < 0.52 && !a.last.Time.IsZero():
		a.t = a.t.Add(step)
		p, kind = ping.Ping{Time: a.t, Lat: a.last.Lat, Lon: a.last.Lon}, "re-observation"
	case r < 0.70:
		a.anchorLat += (s.rng.Float64() - 0.5) * 0.004
		a.anLon += (s.rng.Float64() - 0.5) * 0.006
		a.t = a.t.Add(step)
		p, kind = ping.Ping{Time: a.t, Lat: a.anchorLat, Lon: a.anLon}, "move"
	case r < 0.85:
		lat, lon := jitter()
		p, kind = ping.Ping{Time: a.t.Add(-time.Duration(s.rng.IntN(600)) * time.Second), Lat: lat, Lon: lon}, "out of order"
	case r < 0.90:
		a.t = a.t.Add(time.Duration(11+s.rng.IntN(20)) * time.Minute)
		lat, lon := jitter()
		p, kind = ping.Ping{Time: a.t, Lat: lat, Lon: lon}, "after an idle gap"
	case r < 0.94:
		a.t = a.t.Add(step)
		// Around the radius, the lag bound and the outlier bound: 10 to 150 m.
		d := 10 + 140*s.rng.Float64()
		angle := 2 * math.Pi * s.rng.Float64()
		p, kind = ping.Ping{Time: a.t, Lat: a.anchorLat + d*math.Sin(angle)/111_000, Lon: a.anLon + d*math.Cos(angle)/68_000}, "outlier"
	default:
		a.t = a.t.Add(time.Millisecond * time.Duration(1+s.rng.IntN(999)))
		lat, lon := jitter()
		p, kind = ping.Ping{Time: a.t, Lat: lat, Lon: lon}, "sub-second"
	}
	s.sayMore(&p)
	if s.seam {
		p.Lon = geo.WrapLongitude(p.Lon)
	}
	p.Asset = a.id
	a.last = p
	s.sent = append(s.sent, p)
	return p, kind
}

// sayMore adds what some formats carry besides the position: now and then
// an accuracy radius, a reported speed (at rest, slow or under way), an
// event, and a state that changes.
func (s *stream) sayMore(p *ping.Ping) {
	if s.still {
		if s.rng.Float64() < 0.85 {
			p.Accuracy = []float64{5 + 95*s.rng.Float64(), 100, 100 + 200*s.rng.Float64(), 20, 45}[s.rng.IntN(5)]
		}
		if s.rng.Float64() < 0.85 {
			p.HasSpeed = true
			p.Speed = []float64{0, 0.3 * s.rng.Float64(), 0.49, 0.5, 0.8, 3}[s.rng.IntN(6)]
		}
		if s.rng.Float64() < 0.03 {
			p.Event = "alarm"
		}
		return
	}
	if s.rng.Float64() < 0.3 {
		p.Accuracy = 5 + 55*s.rng.Float64()
	}
	if s.rng.Float64() < 0.4 {
		p.HasSpeed = true
		p.Speed = []float64{0.2, 1.5, 12}[s.rng.IntN(3)] * s.rng.Float64() * 2
	}
	if s.rng.Float64() < 0.05 {
		p.Event = "alarm"
	}
	if len(s.fields) > 0 {
		s.sayListedState(p)
		return
	}
	// Two state fields, each carried by some messages only.
	var state []string
	if s.rng.Float64() < 0.5 {
		state = append(state, []string{"ignition=true", "ignition=false"}[s.rng.IntN(2)])
	}
	if s.rng.Float64() < 0.2 {
		state = append(state, []string{"driverUniqueId=D1", "driverUniqueId=D2"}[s.rng.IntN(2)])
	}
	p.State = strings.Join(state, "&")
}

// sayListedState gives p some of the stream's listed state fields, each
// now and then with another of a few values, in the list's order as a
// parser writes them.
func (s *stream) sayListedState(p *ping.Ping) {
	var state []string
	for _, f := range s.fields {
		if s.rng.Float64() < 0.5 {
			state = append(state, f+"="+[]string{"0", "1", "on", "D1"}[s.rng.IntN(4)])
		}
	}
	p.State, p.StateFields = strings.Join(state, "&"), strings.Join(s.fields, "&")
}

// tick advances the server clock, now and then past the in-flight timeout.
func (s *stream) tick() {
	if s.rng.Float64() < 0.05 {
		s.clock = s.clock.Add(DefaultInFlightTimeout + time.Second)
	}
	s.clock = s.clock.Add(time.Duration(s.rng.IntN(3000)) * time.Millisecond)
}

func compareStreams(t *testing.T, s *stream, pol *Policy, a, b Store) {
	t.Helper()
	ctx := context.Background()
	seed := s.seed
	k := defaultKeyer()
	for i := range 400 {
		s.tick()
		// Finish an earlier request now and then, as its upstream answers.
		if len(s.pending) > 0 && s.rng.Float64() < 0.5 {
			j := s.rng.IntN(len(s.pending))
			c := s.pending[j]
			s.pending = append(s.pending[:j], s.pending[j+1:]...)
			if s.rng.Float64() < 0.8 {
				if errA, errB := settleOne(ctx, a, c), settleOne(ctx, b, c); errA != nil || errB != nil {
					t.Fatalf("seed %d event %d: settle: %v / %v", seed, i, errA, errB)
				}
			} else {
				okA, errA := releaseOne(ctx, a, c)
				okB, errB := releaseOne(ctx, b, c)
				if errA != nil || errB != nil || okA != okB {
					t.Fatalf("seed %d event %d: release of %+v: memory %v (%v), redis %v (%v)", seed, i, c.Ping, okA, errA, okB, errB)
				}
			}
		}

		p, kind := s.next()
		if s.token == 0 || s.rng.Float64() < 0.7 {
			s.token = s.rng.Uint64() &^ 0xffff // a new request
		} else {
			s.token++
		}
		c := &Claim{Observation: k.Observe(p), Policy: pol, Token: s.token, At: s.clock}
		if pol.Shape != Tumbling {
			c.StateKey, c.SeenKey = k.TrackKeys(p.Asset, p.Time)
		}
		va, errA := decideOne(ctx, a, c)
		vb, errB := decideOne(ctx, b, c)
		if errA != nil || errB != nil {
			t.Fatalf("seed %d event %d: %v / %v", seed, i, errA, errB)
		}
		if va != vb {
			t.Fatalf("seed %d event %d (%s, %+v): memory says %+v, redis says %+v", seed, i, kind, p, va, vb)
		}
		if va.Decision == Accepted {
			s.pending = append(s.pending, c)
		}
	}
}

// lag2's sum of squares of the two uncertainties, as Lua computes it (each
// product rounded, then the sum) and as a fused multiply-add does.
func bothRounded(a, b float64) float64 { return float64(a*a) + float64(b*b) }
func bothFused(a, b float64) float64   { return math.FMA(a, a, float64(b*b)) }

// probeAt finds a position whose squared distance from (lat0, lon0), as
// separation2 computes it at the position, is exactly target.
func probeAt(lat0, lon0, target float64) (lat, lon float64, ok bool) {
	d2 := func(lat, lon float64) float64 {
		f := fixOf(&Claim{Observation: Observation{Ping: ping.Ping{Lat: lat, Lon: lon}}})
		return f.distance2(lat0, lon0)
	}
	lat = lat0 + math.Sqrt(target)/metresPerDegree
	for d2(lat, lon0) >= target {
		lat = math.Nextafter(lat, math.Inf(-1))
	}
	// step north while far under, so that the east offset is small
	for range 1 << 20 {
		n := math.Nextafter(lat, math.Inf(1))
		if d2(n, lon0) >= target {
			break
		}
		lat = n
	}
	lon = lon0
	for range 1 << 24 {
		switch v := d2(lat, lon); {
		case v == target:
			return lat, lon, true
		case v > target:
			return 0, 0, false
		}
		lon = math.Nextafter(lon, math.Inf(1))
	}
	return 0, 0, false
}

// Go and Lua must round lag2 alike: a still fix lying exactly at the
// bound of both uncertainties, as Lua rounds it, gets one verdict from
// both stores. A Go compiler that fuses a*a + b*b into a multiply-add
// (arm64, ppc64le, s390x, amd64 with GOAMD64=v3) rounds it once, and
// disagrees with Lua by an ulp.
func TestLag2RoundsAsLuaDoes(t *testing.T) {
	const lat0, lon0 = 52.5200087, 13.4049547
	var lastAcc, acc, target float64
	found := false
	for i := 0; i < 100000 && !found; i++ {
		lastAcc = 30 + float64(i)*1.37e-5
		acc = 30.5 + float64(i)*2.11e-5
		a, b := uncertainty(&Claim{Observation: Observation{Ping: ping.Ping{Accuracy: acc, Speed: 0, HasSpeed: true}}}),
			uncertainty(&Claim{Observation: Observation{Ping: ping.Ping{Accuracy: lastAcc, Speed: 0, HasSpeed: true}}})
		r, f := bothRounded(a, b), bothFused(a, b)
		if r == f {
			continue
		}
		target = r
		if f > r {
			target = f
		}
		// the other store's bound must lie below target
		if _, _, ok := probeAt(lat0, lon0, target); ok {
			found = true
		}
	}
	if !found {
		t.Skip("no case found")
	}
	lat, lon, _ := probeAt(lat0, lon0, target)
	t.Logf("accuracy %v after %v: Lua's bound² %v, fused %v, probe at d² %v",
		acc, lastAcc, bothRounded(2*acc, 2*lastAcc), bothFused(2*acc, 2*lastAcc), target)
	pingAt := func(sec float64, lat, lon, accuracy float64) ping.Ping {
		p := at(time.Duration(sec*float64(time.Second)), lat, lon)
		p.Accuracy, p.Speed, p.HasSpeed = accuracy, 0, true
		return p
	}
	verdicts := map[string]Decision{}
	eachStore(t, func(t *testing.T, s Store) {
		d := newTestDeduper(s, Sliding)
		for i := range 4 {
			d.settled(t, pingAt(float64(10*i), lat0, lon0, lastAcc))
		}
		verdicts[t.Name()] = d.settled(t, pingAt(40, lat, lon, acc)).Decision
	})
	var mem, red Decision
	for name, v := range verdicts {
		if len(name) > 6 && name[len(name)-6:] == "memory" {
			mem = v
		} else {
			red = v
		}
	}
	if mem != red {
		t.Fatalf("a still fix at d² %v from the last accepted one: memory store %s, Redis store %s", target, mem, red)
	}
}
