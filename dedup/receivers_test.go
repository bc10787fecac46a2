package dedup

// The decision quality of sliding and session on receivers the fleet
// simulator does not model, scripted (helper 2's review, stop 62). The
// figures each logs (go test -v) are the review's. README's promises
// checked (Window shapes; Sizing
// `window`, `resolution`, `radius` and TTL; Events and states):
//
//   - "no moving fix is suppressed farther than the lag bound (or its own
//     accuracy) from the last accepted one" ("and it lies within 1.5 radii
//     (37.5 m) of the asset's last accepted ping (or the fix's own
//     uncertainty, when that is larger)");
//   - "In every shape a redelivery of any ping, accepted or suppressed, is
//     suppressed for the whole TTL";
//   - "a ping whose state differs from the asset's last reported one is
//     admitted", and an event "is deduplicated only against its own exact
//     redeliveries";
//   - the radius table of Sizing and the multipath figures beside it;
//   - "Both implement one Go interface and give the same decisions for the
//     same stream of pings" (DESIGN.md, Stores), on these receivers.

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/fleetsim"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// scriptPolicy is the default policy of shape with a TTL past the scripts,
// and radius when not 0.
func scriptPolicy(shape Shape, radius float64) Policy {
	pol := longTTLPolicy(shape)
	if radius > 0 {
		pol.Radius = radius
	}
	return pol
}

// trafficQueue is a car in a traffic queue: it waits 40 to 90 s, then creeps
// 10 to 30 m on (1.5 m/s² up to 4 m/s, 2 m/s² to a stop), for 2 h, a fix
// every cadence seconds with σ 3 m; with speed, its speed (noise 0.3 m/s)
// and a 5 m accuracy.
func trafficQueue(seed uint64, cadence float64, speed bool) []gpsFix {
	r := rand.New(rand.NewPCG(seed, uint64(cadence)))
	const dt, dur = 0.1, 2 * 3600.0
	type state struct{ x, v float64 }
	var truth []state
	x, v, stopped, until, target := 0.0, 0.0, true, 300.0, 0.0
	for tt := 0.0; tt < dur; tt += dt {
		switch {
		case stopped:
			v = 0
			if tt >= until {
				stopped, target = false, x+10+20*r.Float64()
			}
		case target-x <= v*v/(2*2.0):
			if v = max(0, v-2*dt); v == 0 {
				stopped, until = true, tt+40+50*r.Float64()
			}
		default:
			v = min(4, v+1.5*dt)
		}
		x += v * dt
		truth = append(truth, state{x, v})
	}
	var out []gpsFix
	for sec := 0.0; sec < dur-1; sec += cadence {
		s := truth[int(sec/dt)]
		f := gpsFix{sec: sec, tx: s.x, rx: s.x + r.NormFloat64()*3, ry: r.NormFloat64() * 3, moving: s.v > 0}
		if speed {
			f.hasSpeed, f.speed, f.acc = true, max(0, s.v+r.NormFloat64()*0.3), 5
		}
		out = append(out, f)
	}
	return out
}

// boatAtAnchor swings on its anchor for 6 h: 20 to 60 m out, its heading
// drifting, accuracy 10 to 30 m and its swinging speed reported. Every
// fix is judged as a move.
func boatAtAnchor(seed uint64, cadence float64) []gpsFix {
	r := rand.New(rand.NewPCG(seed, uint64(cadence)))
	var out []gpsFix
	h, R := 0.0, 40.0
	for sec := 0.0; sec < 6*3600; sec += cadence {
		dh := r.NormFloat64() * 0.02 * math.Sqrt(cadence)
		h += dh
		R = min(60, max(20, R+r.NormFloat64()*0.2*math.Sqrt(cadence)))
		tx, ty := R*math.Cos(h), R*math.Sin(h)
		acc := 10 + 20*r.Float64()
		out = append(out, gpsFix{sec: sec, tx: tx, ty: ty, rx: tx + r.NormFloat64()*acc/1.51, ry: ty + r.NormFloat64()*acc/1.51,
			acc: acc, hasSpeed: true, speed: math.Abs(dh) * R / cadence, moving: true})
	}
	return out
}

// indoorCarPark is a car parked 6 h in a multi-storey car park, its error
// wandering 20 m (Gauss-Markov, τ 3 min) under 3 m of white noise,
// accuracy 10 to 30 m, a speed of |N(0, 0.2)| when speed is set; then a
// drive.
func indoorCarPark(seed uint64, cadence float64, speed bool) []gpsFix {
	r := rand.New(rand.NewPCG(seed, uint64(cadence)))
	var out []gpsFix
	ex, ey := 0.0, 0.0
	a := math.Exp(-cadence / 180)
	s := 20 * math.Sqrt(1-a*a)
	for sec := 0.0; sec < 6*3600; sec += cadence {
		ex, ey = a*ex+s*r.NormFloat64(), a*ey+s*r.NormFloat64()
		out = append(out, gpsFix{sec: sec, rx: ex + r.NormFloat64()*3, ry: ey + r.NormFloat64()*3, acc: 10 + 20*r.Float64(),
			hasSpeed: speed, speed: math.Abs(r.NormFloat64() * 0.2)})
	}
	return driveOff(out, 60, 10, cadence)
}

// heartbeatTracker is a tracker that reports every 30 min parked (4 h) and
// every 10 s on its 20 min drives at 12 m/s, one parked fix in five a
// multipath jump 300 m east.
func heartbeatTracker(seed uint64) []gpsFix {
	r := rand.New(rand.NewPCG(seed, 1))
	var out []gpsFix
	sec, x := 0.0, 0.0
	for range 6 {
		for end := sec + 4*3600; sec < end; sec += 1800 {
			f := gpsFix{sec: sec, tx: x, rx: x + r.NormFloat64()*3, ry: r.NormFloat64() * 3}
			if r.IntN(5) == 0 {
				f.rx += 300
			}
			out = append(out, f)
		}
		for end := sec + 1200; sec < end; sec += 10 {
			x += 120
			out = append(out, gpsFix{sec: sec, tx: x, rx: x + r.NormFloat64()*3, ry: r.NormFloat64() * 3, moving: true})
		}
	}
	return out
}

// repeatedClock is a 1 s tracker whose clock repeats each timestamp for
// three fixes, parked and driving at 5 m/s in turn, 5 min each.
func repeatedClock(seed uint64) []gpsFix {
	r := rand.New(rand.NewPCG(seed, 1))
	var out []gpsFix
	x := 0.0
	for i := range 3600 {
		moving := (i/300)%2 == 1
		if moving {
			x += 5
		}
		out = append(out, gpsFix{sec: float64(i - i%3), tx: x, rx: x + r.NormFloat64()*3, ry: r.NormFloat64() * 3, moving: moving})
	}
	return out
}

// slowMover goes east at v m/s for 4 h, σ 5 m, accuracy 10 m and its
// speed reported (a ship at 0.5 kn, a bicycle pushed).
func slowMover(seed uint64, cadence, v float64) []gpsFix {
	r := rand.New(rand.NewPCG(seed, uint64(cadence)))
	var out []gpsFix
	x := 0.0
	for sec := 0.0; sec < 4*3600; sec += cadence {
		x += v * cadence
		out = append(out, gpsFix{sec: sec, tx: x, rx: x + r.NormFloat64()*5, ry: r.NormFloat64() * 5, acc: 10,
			hasSpeed: true, speed: max(0, v+r.NormFloat64()*0.1), moving: true})
	}
	return out
}

// lagBound is how far from the last accepted fix README's Window shapes
// lets a suppressed fix lie: 1.5 radii, or the fix's uncertainty (its
// accuracy, plus as much again up to 50 m when it reports a speed under
// 0.5 m/s), and for a fix standing still (under 0.5 m/s, accuracy 100 m
// or better) both fixes' uncertainties in quadrature (the last's no
// larger than its own), at most 50 m beyond its own.
func lagBound(pol Policy, f, last gpsFix) float64 {
	u := func(g gpsFix) float64 {
		if g.acc <= 0 {
			return 0
		}
		if g.hasSpeed && g.speed < 0.5 {
			return g.acc + min(g.acc, 50)
		}
		return g.acc
	}
	bound := max(LagFactor*pol.Radius, u(f))
	if f.hasSpeed && f.speed < 0.5 && f.acc > 0 && f.acc <= 100 {
		other := min(u(last), u(f))
		bound = max(bound, min(math.Hypot(u(f), other), u(f)+50))
	}
	return bound
}

// Scripted receivers the simulator does not model lose no move in sliding
// and session: no moving fix is suppressed beyond README's bound
// (lagBound) from the last accepted one. A boat swinging at anchor under
// 0.5 m/s reads as standing still, and its suppressed fixes lie up to √2
// times their uncertainty from the last accepted one, as README states
// for a creep under 0.5 m/s (measured against 1.5 radii or the accuracy
// alone, they lay up to 39 m beyond). Parked admissions per window and
// moving fixes admitted are logged (go test -v).
func TestScriptedReceiversLoseNoMove(t *testing.T) {
	type tc struct {
		name   string
		fixes  []gpsFix
		radius float64
	}
	var cases []tc
	for _, cad := range []float64{1, 5} {
		for _, speed := range []bool{false, true} {
			cases = append(cases,
				tc{fmt.Sprintf("lights, %.0fs, speed %v", cad, speed), stopAndGo(11, cad, speed, 2*3600), 0},
				tc{fmt.Sprintf("queue creeping 10-30 m, %.0fs, speed %v", cad, speed), trafficQueue(12, cad, speed), 0})
		}
		for _, radius := range []float64{10, 100} {
			cases = append(cases, tc{fmt.Sprintf("lights, %.0fs, radius %.0f", cad, radius), stopAndGo(19, cad, true, 2*3600), radius})
		}
	}
	for _, cad := range []float64{10, 30} {
		cases = append(cases,
			tc{fmt.Sprintf("boat at anchor, %.0fs", cad), boatAtAnchor(13, cad), 0},
			tc{fmt.Sprintf("car park, wander 20 m, %.0fs", cad), indoorCarPark(14, cad, true), 0},
			tc{fmt.Sprintf("car park, wander 20 m, no speed, %.0fs", cad), indoorCarPark(14, cad, false), 0})
	}
	cases = append(cases,
		tc{"heartbeat 30 min parked, 10 s moving, 300 m jumps", heartbeatTracker(15), 0},
		tc{"clock repeating each timestamp thrice, 1s", repeatedClock(16), 0},
		tc{"ship at 0.5 kn, 60s", slowMover(17, 60, 0.26), 0},
		tc{"ship at 0.5 kn, 10s", slowMover(17, 10, 0.26), 0},
		tc{"bicycle pushed at 1 m/s, 10s", slowMover(18, 10, 1), 0})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, shape := range Shapes {
				pol := scriptPolicy(shape, c.radius)
				res := replayScript(t, NewMemoryStore(0), pol, c.fixes, 0)
				var moving, movingAccepted int
				var over, worstAt float64
				var last gpsFix
				for i, v := range res.verdicts {
					f := c.fixes[i]
					if v.Decision == Accepted {
						last = f
					}
					if !f.moving {
						continue
					}
					moving++
					if v.Decision == Accepted {
						movingAccepted++
					} else if o := math.Hypot(f.rx-last.rx, f.ry-last.ry) - lagBound(pol, f, last); o > over {
						over, worstAt = o, f.sec
					}
				}
				t.Logf("%s: %.2f parked admissions per window, %d of %d moving fixes admitted, worst %.1f m beyond the bound",
					shape, res.perWindow, movingAccepted, moving, over)
				if shape != Tumbling && over > 0 {
					t.Errorf("%s: a moving fix at %.0f s suppressed %.1f m beyond its bound from the last accepted one", shape, worstAt, over)
				}
			}
		})
	}
}

// Events, state changes and redeliveries of in-order streams with the quirks of cheap trackers: a clock that repeats
// a timestamp, a stale fix repeated (its coordinates, and now and then its
// time too), idle gaps, moves, accuracies and speeds, delivered one to
// three pings a request, with resends of earlier pings mixed in. Every
// event and every ping whose ignition differs from the last the backend
// got is admitted, and no resend is. A new ping that equals an earlier
// one in time, coordinates, event and state is a redelivery by
// definition, and is left out of the event and state checks.
func TestEventsAndStatesPassWithStaleFixesAndRepeatedClocks(t *testing.T) {
	for _, shape := range []Shape{Sliding, Session} {
		for seed := uint64(1); seed <= 300; seed++ {
			r := rand.New(rand.NewPCG(seed, 5))
			d := newTestDeduper(NewMemoryStore(0), shape)
			d.Policy.TTL = 30 * time.Hour
			var sent, stream []ping.Ping
			var last ping.Ping
			sec, x, ign := 0.0, 0.0, "true"
			for i := range 200 {
				switch r.IntN(10) {
				case 0: // the clock repeats
				case 1:
					sec += 30 + r.Float64()*900
				default:
					sec += float64(1 + r.IntN(30))
				}
				if r.IntN(8) == 0 {
					x += 20 + r.Float64()*200
				}
				p := offset(sec, x+r.NormFloat64()*4, r.NormFloat64()*4)
				if i > 0 && r.IntN(4) == 0 { // a stale fix repeated
					p.Lat, p.Lon = last.Lat, last.Lon
					if r.IntN(2) == 0 {
						p.Time = last.Time
					}
				}
				if r.IntN(3) == 0 {
					p = withAccuracy(p, 3+r.Float64()*40)
				}
				if r.IntN(3) == 0 {
					p = withSpeed(p, r.Float64()*2)
				}
				if r.IntN(6) == 0 {
					ign = map[string]string{"true": "false", "false": "true"}[ign]
				}
				if r.IntN(5) != 0 {
					p.State = "ignition=" + ign
				}
				if r.IntN(15) == 0 {
					p.Event = fmt.Sprintf("alarm=sos&n=%d", i)
				}
				last = p
				stream = append(stream, p)
				if len(sent) > 0 && r.IntN(12) == 0 {
					stream = append(stream, sent[r.IntN(len(sent))])
				}
				sent = append(sent, p)
			}
			seen, backend := map[string]bool{}, ""
			for i := 0; i < len(stream); {
				n := min(1+r.IntN(3), len(stream)-i)
				batch := stream[i : i+n]
				i += n
				obs := make([]Observation, n)
				for j, p := range batch {
					obs[j] = d.Observe(p)
				}
				d.clock = batch[n-1].Time
				claims, verdicts, err := d.ClaimAll(context.Background(), obs)
				if err != nil {
					t.Fatal(err)
				}
				var settle []*Claim
				for j, v := range verdicts {
					p, accepted := batch[j], v.Decision == Accepted
					if accepted {
						settle = append(settle, claims[j])
					}
					k := fmt.Sprintf("%d|%v|%v|%s|%s", p.Time.UnixNano(), p.Lat, p.Lon, p.Event, p.State)
					again := seen[k]
					seen[k] = true
					switch {
					case again && accepted:
						t.Errorf("%s, seed %d: a redelivery admitted: %+v", shape, seed, p)
					case again:
					case p.Event != "" && !accepted:
						t.Errorf("%s, seed %d: an event dropped: %+v %+v", shape, seed, p, v)
					case p.State != "" && p.State != backend && !accepted:
						t.Errorf("%s, seed %d: %s dropped, the backend last got %q: %+v", shape, seed, p.State, backend, v)
					}
					if accepted && p.State != "" {
						backend = p.State
					}
				}
				if len(settle) > 0 {
					if err := d.Settle(context.Background(), settle...); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
	}
}

// The figures of README's Sizing, measured: the radius table (sliding, 2% multipath at 4 σ, no speed or
// accuracy, 20 assets over 2 h) and multipath on 3% of the fixes 50 to
// 150 m out. Each must come within 0.1 of the README's figure, with no
// lost move.
func TestSizingFiguresAreWhatTheREADMESays(t *testing.T) {
	if testing.Short() {
		t.Skip("about 30 s of simulation")
	}
	run := func(t *testing.T, shape Shape, cfg fleetsim.Config, radius, want float64) {
		pol := scriptPolicy(shape, radius)
		pol.TTL = 13 * time.Hour
		cfg.Assets, cfg.LostMoveM = 20, LagFactor*pol.Radius+1
		sc, err := fleetsim.Run(context.Background(), cfg, newDeduperDecider(NewMemoryStore(0), pol))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%.2f parked admissions per window (README %.2f), %d lost moves", sc.ParkedAdmissionsPerWindow, want, sc.LostMoves)
		if math.Abs(sc.ParkedAdmissionsPerWindow-want) > 0.1 || sc.LostMoves != 0 || sc.RedeliveriesAdmitted != 0 {
			t.Errorf("%.2f parked admissions per window, %d lost moves, %d redeliveries admitted; README %.2f, none, none",
				sc.ParkedAdmissionsPerWindow, sc.LostMoves, sc.RedeliveriesAdmitted, want)
		}
	}
	for _, row := range []struct {
		sigma float64
		cad   time.Duration
		want  [3]float64 // radius 25, 40, 60
	}{
		{8, 10 * time.Second, [3]float64{1.57, 1.07, 1.02}},
		{8, time.Second, [3]float64{6.22, 1.08, 0.98}},
		{10, 10 * time.Second, [3]float64{3.02, 1.13, 1.03}},
		{10, time.Second, [3]float64{18.3, 1.54, 1.00}},
		{15, 10 * time.Second, [3]float64{8.39, 2.44, 1.09}},
		{15, time.Second, [3]float64{78.4, 15.2, 1.57}},
	} {
		for i, radius := range []float64{25, 40, 60} {
			t.Run(fmt.Sprintf("sigma %.0f, %v, radius %.0f", row.sigma, row.cad, radius), func(t *testing.T) {
				run(t, Sliding, fleetsim.Config{SigmaM: row.sigma, Cadence: row.cad, Duration: 2 * time.Hour}, radius, row.want[i])
			})
		}
	}
	for _, row := range []struct {
		cad  time.Duration
		want [4]float64 // sliding, session at radius 25; sliding, session at radius 100
	}{
		{time.Second, [4]float64{18.3, 18.3, 1.48, 1.44}},
		{15 * time.Second, [4]float64{1.97, 1.35, 1.23, 0.43}},
		{time.Minute, [4]float64{1.26, 0.47, 1.12, 0.25}},
	} {
		for i, c := range []struct {
			shape  Shape
			radius float64
		}{{Sliding, 25}, {Session, 25}, {Sliding, 100}, {Session, 100}} {
			t.Run(fmt.Sprintf("multipath 50-150 m, %v, %s, radius %.0f", row.cad, c.shape, c.radius), func(t *testing.T) {
				dur := 3 * time.Hour
				if row.cad == time.Second {
					dur = 2 * time.Hour
				}
				run(t, c.shape, fleetsim.Config{Cadence: row.cad, Duration: dur, MultipathShare: 0.03,
					MultipathSigmasMin: 50.0 / 3, MultipathSigmasMax: 50}, c.radius, row.want[i])
			})
		}
	}
}

// The Redis store gives the memory store's verdicts on the scripted
// receivers above (the still rule of a swinging
// boat, a car park's wandering error, a repeated clock, a traffic queue, a
// heartbeat tracker's jumps, a slow ship), at radius 10, 25 and 100.
func TestStoresAgreeOnScriptedReceivers(t *testing.T) {
	rs := newRedisStore(t, redistest.Start(t))
	cases := []struct {
		name  string
		fixes []gpsFix
	}{
		{"boat at anchor, 10s", boatAtAnchor(13, 10)},
		{"car park, 10s", indoorCarPark(14, 10, true)},
		{"car park, no speed, 30s", indoorCarPark(14, 30, false)},
		{"repeated clock", repeatedClock(16)[:1500]},
		{"queue, 1s", trafficQueue(12, 1, false)[:3000]},
		{"queue, 5s, speed", trafficQueue(12, 5, true)},
		{"heartbeat", heartbeatTracker(15)},
		{"ship", slowMover(17, 10, 0.26)[:800]},
	}
	n := 0
	for _, c := range cases {
		for _, shape := range []Shape{Sliding, Session} {
			for _, radius := range []float64{10, 25, 100} {
				n++
				fixes := append([]gpsFix(nil), c.fixes...)
				for i := range fixes {
					fixes[i].asset = fmt.Sprintf("script-%d", n)
				}
				pol := scriptPolicy(shape, radius)
				want := replayScript(t, NewMemoryStore(0), pol, fixes, 0).verdicts
				got := replayScript(t, rs, pol, fixes, 0).verdicts
				for i := range got {
					if got[i] != want[i] {
						t.Errorf("%s, %s, radius %.0f: fix %d (%.0f s) %+v in Redis, %+v in memory", c.name, shape, radius, i, fixes[i].sec, got[i], want[i])
						break
					}
				}
			}
		}
	}
}
