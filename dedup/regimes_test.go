package dedup

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// scriptResult is what a replay found: the verdicts in order, the parked
// admissions per window of parked device time (parkedSecs, or the sum of
// the gaps between parked fixes when 0), and the farthest a suppressed
// moving fix lay beyond its bound (the lag bound, or its own accuracy when
// larger, as README's Window shapes states it) from the last accepted fix.
type scriptResult struct {
	verdicts  []Verdict
	perWindow float64
	overBound float64
	worstAt   float64
}

func replayScript(t *testing.T, s Store, pol Policy, fixes []gpsFix, parkedSecs float64) scriptResult {
	t.Helper()
	d := newTestDeduper(s, pol.Shape)
	d.Policy = pol
	d.Keyer.Window = pol.Window
	var res scriptResult
	var admitted, gaps, lastX, lastY float64
	for i, f := range fixes {
		p := withAccuracy(offset(f.sec, f.rx, f.ry), f.acc)
		if f.asset != "" {
			p.Asset = f.asset
		}
		if f.hasSpeed {
			p = withSpeed(p, f.speed)
		}
		d.clock = p.Time.Add(time.Duration(f.lead * float64(time.Second)))
		if i > 0 && !f.moving && !fixes[i-1].moving {
			gaps += max(0, f.sec-fixes[i-1].sec)
		}
		v := d.settled(t, p)
		res.verdicts = append(res.verdicts, v)
		switch {
		case v.Decision == Accepted:
			if !f.moving {
				admitted++
			}
			lastX, lastY = f.rx, f.ry
		case f.moving:
			if over := math.Hypot(f.rx-lastX, f.ry-lastY) - max(LagFactor*pol.Radius, f.acc); over > res.overBound {
				res.overBound, res.worstAt = over, f.sec
			}
		}
	}
	if parkedSecs == 0 {
		parkedSecs = gaps
	}
	if parkedSecs > 0 {
		res.perWindow = admitted / (parkedSecs / pol.Window.Seconds())
	}
	return res
}

// longTTLPolicy is the default policy of shape, with a TTL past the scripts.
func longTTLPolicy(shape Shape) Policy {
	pol := *testPolicy(shape)
	pol.TTL = 30 * time.Hour
	return pol
}

// stopAndGo is a car in city traffic: from a 10 min park it drives to
// lights 150 to 600 m apart at 8 to 14 m/s (1.5 m/s² away, 2.5 m/s² to a
// stop), waits 30 to 90 s at each, and reports every cadence seconds with
// σ 3 m of noise, and, when speed is set, its speed and a 5 m accuracy.
func stopAndGo(seed uint64, cadence float64, speed bool, dur float64) []gpsFix {
	r := rand.New(rand.NewPCG(seed, uint64(cadence)))
	const dt = 0.1
	type state struct{ x, v float64 }
	var truth []state
	x, v, stopped, until, target, vmax := 0.0, 0.0, true, 600.0, 0.0, 10.0
	for tt := 0.0; tt < dur; tt += dt {
		if stopped {
			v = 0
			if tt >= until {
				stopped, target, vmax = false, x+150+450*r.Float64(), 8+6*r.Float64()
			}
		} else if target-x <= v*v/(2*2.5) {
			if v = max(0, v-2.5*dt); v == 0 {
				stopped, until = true, tt+30+60*r.Float64()
			}
		} else {
			v = min(vmax, v+1.5*dt)
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

// motorwayDrive parks 30 min, then drives east at v m/s for 30 min, then parks
// again for 30 min, a fix every cadence seconds, σ 3 m.
func motorwayDrive(seed uint64, cadence, v float64, speed bool) (fixes []gpsFix, parkedSecs float64) {
	r := rand.New(rand.NewPCG(seed, uint64(cadence)))
	x := 0.0
	for sec := 0.0; sec < 5400; sec += cadence {
		moving := sec >= 1800 && sec < 3600
		if moving {
			x += v * cadence
		}
		f := gpsFix{sec: sec, tx: x, rx: x + r.NormFloat64()*3, ry: r.NormFloat64() * 3, moving: moving}
		if speed {
			f.hasSpeed, f.acc = true, 5
			if moving {
				f.speed = v + r.NormFloat64()*0.3
			} else {
				f.speed = math.Abs(r.NormFloat64() * 0.2)
			}
		}
		fixes = append(fixes, f)
	}
	return fixes, 3600
}

// walkerAt10s walks at 1.4 m/s (heading wandering) and pauses 10 to 30 min
// in turn, a fix every 10 s with a phone's accuracy (8 to 20 m, its
// fixes scattered as far) and OwnTracks' speed, whole km/h truncated.
func walkerAt10s(seed uint64) []gpsFix {
	r := rand.New(rand.NewPCG(seed, 10))
	var out []gpsFix
	sec, x, y, h := 0.0, 0.0, 0.0, 0.0
	for range 6 {
		for end := sec + 600 + 1200*r.Float64(); sec < end; sec += 10 {
			out = append(out, gpsFix{sec: sec, tx: x, ty: y})
		}
		for end := sec + 600 + 1200*r.Float64(); sec < end; sec += 10 {
			h += r.NormFloat64() * 0.3
			x, y = x+14*math.Cos(h), y+14*math.Sin(h)
			out = append(out, gpsFix{sec: sec, tx: x, ty: y, moving: true})
		}
	}
	for i := range out {
		f := &out[i]
		f.acc = 8 + 12*r.Float64()
		f.rx, f.ry = f.tx+r.NormFloat64()*f.acc/1.51, f.ty+r.NormFloat64()*f.acc/1.51
		v := 0.0
		if f.moving {
			v = 1.4 + r.NormFloat64()*0.15
		}
		f.hasSpeed, f.speed = true, math.Floor(v*3.6)/3.6
	}
	return out
}

// Guard (passes on main): cadences and speeds the simulator's tests do not
// run lose no move in sliding and session. City stop-and-go at 10 s, 2 min
// and 5 min (lights every 150 to 600 m, 30 to 90 s at each), a car at
// 130 km/h on a motorway at 1 s and 30 s, and a walker at 1.4 m/s at 10 s
// reporting OwnTracks' truncated speed: no moving fix is suppressed
// farther than the lag bound (or its own accuracy) from the last accepted
// one, so each departure from a light or a park is admitted at once, and
// the motorway car's parks cost about one admission a window in sliding.
func TestCadencesAndSpeedsTheSimulatorSkipsLoseNoMove(t *testing.T) {
	type tc struct {
		name       string
		fixes      []gpsFix
		parkedSecs float64
		sliding    float64 // most parked admissions per window in sliding, 0: unchecked
	}
	var cases []tc
	for _, cad := range []float64{10, 120, 300} {
		for _, speed := range []bool{false, true} {
			cases = append(cases, tc{fmt.Sprintf("stop-and-go, %.0fs, speed %v", cad, speed), stopAndGo(3, cad, speed, 2*3600), 0, 0})
		}
	}
	for _, cad := range []float64{1, 30} {
		for _, speed := range []bool{false, true} {
			fx, parked := motorwayDrive(4, cad, 36.1, speed)
			cases = append(cases, tc{fmt.Sprintf("motorway 130 km/h, %.0fs, speed %v", cad, speed), fx, parked, 1.3})
		}
	}
	cases = append(cases, tc{"walker 1.4 m/s, 10s, OwnTracks", walkerAt10s(5), 0, 0})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, shape := range []Shape{Sliding, Session} {
				res := replayScript(t, NewMemoryStore(0), longTTLPolicy(shape), c.fixes, c.parkedSecs)
				t.Logf("%s: %.2f parked admissions per window", shape, res.perWindow)
				if res.overBound > 0 {
					t.Errorf("%s: a moving fix at %.0f s suppressed %.0f m beyond its bound from the last accepted one", shape, res.worstAt, res.overBound)
				}
				if shape == Sliding && c.sliding > 0 && res.perWindow > c.sliding {
					t.Errorf("sliding: %.2f parked admissions per window, want at most %.1f", res.perWindow, c.sliding)
				}
			}
		})
	}
}

// Guard (passes on main): a device clock set minutes wrong changes no
// decision. Every shape judges device time, and the server clock only
// times claims in flight and the TTL: a tracker whose clock is 30 or 2
// minutes behind, or 4 minutes ahead (inside max_future), gets the very
// verdicts the same stream gets from a true clock, in both stores.
func TestADeviceClockMinutesOffChangesNoDecision(t *testing.T) {
	base := stopAndGo(6, 10, true, 3600)
	for _, shape := range Shapes {
		t.Run(string(shape), func(t *testing.T) {
			eachStore(t, func(t *testing.T, s Store) {
				want := replayScript(t, NewMemoryStore(0), longTTLPolicy(shape), base, 0).verdicts
				for i, lead := range []float64{1800, 120, -240} {
					fixes := append([]gpsFix(nil), base...)
					for j := range fixes {
						fixes[j].lead, fixes[j].asset = lead, fmt.Sprintf("veh-%d", i)
					}
					got := replayScript(t, s, longTTLPolicy(shape), fixes, 0).verdicts
					for j := range got {
						if got[j] != want[j] {
							t.Errorf("clock %+.0f s off: fix %d (%.0f s) %+v, with a true clock %+v", -lead, j, fixes[j].sec, got[j], want[j])
							break
						}
					}
				}
			})
		})
	}
}

// Guard (passes on main): a train or a ferry out of coverage, or a car in
// a tunnel, falls silent for 5 to 20 min and reappears kilometres on; or
// its tracker, without GPS there, repeats its last fix every 10 s with a
// fresh timestamp and a speed of 0 (a stale fix). The first fix after the
// gap is admitted in every shape and store, and the stale repeats, one
// place, cost at most one admission a window.
func TestAFixAfterATunnelIsAdmitted(t *testing.T) {
	for _, gap := range []float64{300, 540, 720, 1200} {
		for _, stale := range []bool{false, true} {
			t.Run(fmt.Sprintf("%.0f s gap, stale fix repeated %v", gap, stale), func(t *testing.T) {
				eachStoreAndShape(t, func(t *testing.T, s Store, pol *Policy) {
					d := newTestDeduper(s, pol.Shape)
					r := rand.New(rand.NewPCG(9, uint64(gap)))
					sec, x := 0.0, 0.0
					for ; sec < 600; sec += 10 {
						d.settled(t, offset(sec, x+r.NormFloat64()*3, r.NormFloat64()*3))
					}
					for ; sec < 900; sec += 10 {
						x += 250
						d.settled(t, withSpeed(offset(sec, x, r.NormFloat64()*3), 25))
					}
					last, admitted := offset(sec-10, x, 0), 0
					for end := sec + gap; stale && sec < end; sec += 10 {
						p := withSpeed(last, 0)
						p.Time = articleBase.Add(time.Duration(sec) * time.Second)
						d.clock = p.Time
						if d.settled(t, p).Decision == Accepted {
							admitted++
						}
					}
					if most := int(math.Ceil(gap/pol.Window.Seconds())) + 1; admitted > most {
						t.Errorf("%d of the stale fixes repeated over %.0f s admitted, want at most %d", admitted, gap, most)
					}
					sec, x = max(sec, 900+gap), x+25*gap
					d.clock = articleBase.Add(time.Duration(sec) * time.Second)
					if v := d.settled(t, withSpeed(offset(sec, x, 0), 25)); v.Decision != Accepted {
						t.Errorf("the first fix %.0f m on after a %.0f s gap: %+v, want accepted", 25*gap, gap, v)
					}
				})
			})
		}
	}
}

// Guard (passes on main): a vehicle tracker (10 s, σ 3 m) and the
// driver's phone (30 s, accuracy 8 to 18 m, speed) report under one asset
// id, clocks in step, through parks and drives. No moving fix of either
// is suppressed beyond its bound from the last accepted one, and the two
// sources at one park cost sliding and session what one would.
func TestTwoDevicesOnOneAssetLoseNoMove(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 99))
	var xs, ys []float64
	var mv []bool
	x, y, h := 0.0, 0.0, 0.0
	for sec := 0.0; sec < 4*3600; {
		for end := sec + 600 + 1800*r.Float64(); sec < end; sec++ {
			xs, ys, mv = append(xs, x), append(ys, y), append(mv, false)
		}
		v := 5 + 15*r.Float64()
		for end := sec + 300 + 1200*r.Float64(); sec < end; sec++ {
			h += r.NormFloat64() * 0.05
			x, y = x+v*math.Cos(h), y+v*math.Sin(h)
			xs, ys, mv = append(xs, x), append(ys, y), append(mv, true)
		}
	}
	var fixes []gpsFix
	parked := 0.0
	for sec := range xs {
		if !mv[sec] {
			parked++
		}
		if sec%10 == 0 {
			fixes = append(fixes, gpsFix{sec: float64(sec), tx: xs[sec], ty: ys[sec], rx: xs[sec] + r.NormFloat64()*3, ry: ys[sec] + r.NormFloat64()*3, moving: mv[sec]})
		}
		if sec%30 == 7 {
			acc, v := 8+10*r.Float64(), 0.0
			if mv[sec] {
				v = math.Hypot(xs[sec]-xs[sec-1], ys[sec]-ys[sec-1])
			}
			fixes = append(fixes, gpsFix{sec: float64(sec), tx: xs[sec], ty: ys[sec], rx: xs[sec] + r.NormFloat64()*acc/1.51, ry: ys[sec] + r.NormFloat64()*acc/1.51,
				acc: acc, speed: v, hasSpeed: true, moving: mv[sec]})
		}
	}
	for _, tc := range []struct {
		shape Shape
		most  float64
	}{{Sliding, 1.3}, {Session, 0.5}} {
		t.Run(string(tc.shape), func(t *testing.T) {
			res := replayScript(t, NewMemoryStore(0), longTTLPolicy(tc.shape), fixes, parked)
			t.Logf("%.2f parked admissions per window", res.perWindow)
			if res.overBound > 0 {
				t.Errorf("a moving fix at %.0f s suppressed %.0f m beyond its bound from the last accepted one", res.worstAt, res.overBound)
			}
			if res.perWindow > tc.most {
				t.Errorf("%.2f parked admissions per window, want at most %.1f", res.perWindow, tc.most)
			}
		})
	}
}

// A tracker without GPS (a tunnel, an underground car park) that keeps
// sending status messages reaches the backend as the last fix again at
// each message's own time: Traccar's OutdatedHandler copies the last
// position's latitude, longitude, speed, course and accuracy into every
// position without a fix of its own (traccar/traccar,
// src/main/java/org/traccar/handler/OutdatedHandler.java), and the
// traccar preset keys it by its deviceTime (README, Tracker formats: "a
// re-report of the parked position at its own time, judged as any
// other"). When the last fix was taken under way (the ramp down into a
// car park, a tunnel's mouth), every repeat reports that speed at the
// very coordinates of the last fix. Three or more fixes at one point
// over seconds are no journey, whatever speed they carry, and each tells
// the backend nothing it does not have: the shapes promise a place at
// the stay once a window in sliding and once a burst in session (README,
// Window shapes), and tumbling, whose key is the place, admits these once
// a bucket. The departure-by-speed rule (a speed of travel at a stay of
// three fixes or more is a departure, admitted at once) fires on every
// third repeat instead: the repeat is admitted, begins a stay of one fix
// at the same point, two more repeats settle it, and the next one
// "departs" again. A car in a 10 min tunnel reporting every second at
// 25 m/s had 200 of its 600 repeats admitted in sliding and session
// (tumbling: 2); a van that drove into a car park at 5 m/s and stayed
// 2 h, its tracker's heartbeat every 10 s, 240 of 720 (tumbling: 24).
func TestAStaleFixRepeatedWithItsSpeedIsNoDeparture(t *testing.T) {
	for _, tc := range []struct {
		name           string
		speed, cadence float64 // m/s, s
		repeats        int
	}{
		{"tunnel at 25 m a second, a fix a second, 10 min", 25, 1, 600},
		{"car park entered at 5 m a second, a heartbeat every 10 s, 2 h", 5, 10, 720},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachTrackShape(t, func(t *testing.T, d *testDeduper) {
				sec, x := 0.0, 0.0
				for range 60 {
					x += tc.speed * tc.cadence
					p := withSpeed(offset(sec, x, 0), tc.speed)
					d.clock = p.Time
					d.settled(t, p)
					sec += tc.cadence
				}
				stale := withSpeed(offset(sec-tc.cadence, x, 0), tc.speed)
				admitted := 0
				for range tc.repeats {
					p := stale
					p.Time = articleBase.Add(time.Duration(sec * float64(time.Second)))
					d.clock = p.Time
					if d.settled(t, p).Decision == Accepted {
						admitted++
					}
					sec += tc.cadence
				}
				// Once a window (sliding), and one more for slack.
				most := int(float64(tc.repeats)*tc.cadence/d.Policy.Window.Seconds()) + 1
				if admitted > most {
					t.Errorf("%d of %d repeats of one fix admitted, want at most %d", admitted, tc.repeats, most)
				}
			})
		})
	}
}

// departureFix is one fix of a departure script: its device time, the
// coordinates it reports and the speed it reports (m/s).
type departureFix struct {
	sec, lat, lon, speed float64
}

// pullingAway parks a receiver for 10 min (σ 2 m, speed under 0.6 m/s),
// then pulls away at 1.5 m/s² up to v, a fix every cadence seconds, for
// 3 min. Coordinates are rounded to dec decimals (0: not rounded); the
// first pinned moving fixes repeat the parked point (a receiver that
// pins its position while parked, every parked fix at one point, and
// releases it a fix late, or a speed from the vehicle's bus before the
// position moves).
func pullingAway(seed uint64, dec int, v, cadence float64, pinned int) []departureFix {
	r := rand.New(rand.NewPCG(seed, uint64(dec)*1000+uint64(v*10)+uint64(cadence)))
	const lat0, lon0 = 52.5200087, 13.4049547
	kx := metresPerDegree * math.Cos(lat0*math.Pi/180)
	round := func(x float64) float64 {
		if dec == 0 {
			return x
		}
		p := math.Pow(10, float64(dec))
		return math.Round(x*p) / p
	}
	pos := func(x, y float64) (float64, float64) { return round(lat0 + y/metresPerDegree), round(lon0 + x/kx) }
	px, py := r.NormFloat64()*2, r.NormFloat64()*2
	var out []departureFix
	for sec := 0.0; sec < 600; sec += cadence {
		x, y := r.NormFloat64()*2, r.NormFloat64()*2
		if pinned > 0 {
			x, y = px, py
		}
		lat, lon := pos(x, y)
		out = append(out, departureFix{sec, lat, lon, math.Abs(r.NormFloat64() * 0.2)})
	}
	d, vv, h := 0.0, 0.0, r.Float64()*2*math.Pi
	for i, sec := 0, 600.0; sec < 780; i, sec = i+1, sec+cadence {
		for s := 0.0; s < cadence; s += 0.1 {
			vv = min(v, vv+0.15)
			d += vv * 0.1
		}
		x, y := d*math.Cos(h)+r.NormFloat64()*2, d*math.Sin(h)+r.NormFloat64()*2
		if i < pinned {
			x, y = px, py
		}
		lat, lon := pos(x, y)
		out = append(out, departureFix{sec, lat, lon, vv + r.NormFloat64()*0.2})
	}
	return out
}

// A fix at the very coordinates of the last
// accepted one is no departure whatever speed it reports (c40bcea), but a
// real departure is still admitted at the first fix that has moved off
// that point. Receivers whose first moving fixes repeat the parked point
// to the bit: one that pins its position while parked and releases it a
// fix or three late, and ones that round their coordinates to 4 or 5
// decimals (11 m or 1.1 m of latitude), so that a vehicle pulling away
// at 3 to 10 m/s reports its last accepted point again for a few
// seconds. README (How sliding and session judge a fix): a speed of
// travel (2.5 m/s or more) away from a stay of three fixes or more is a
// departure, admitted at once even inside the radius. In sliding and
// session, both stores, the first fix reporting such a speed at
// coordinates other than the last accepted one's is admitted, and no
// moving fix is suppressed farther than the lag bound from it.
func TestADepartureIsAdmittedAtTheFirstFixOffTheRepeatedPoint(t *testing.T) {
	type tc struct {
		dec, pinned int
		v, cadence  float64
	}
	var cases []tc
	for _, v := range []float64{3, 5, 10} {
		for _, cad := range []float64{1, 5} {
			cases = append(cases, tc{0, 1, v, cad}, tc{0, 3, v, cad}, tc{4, 0, v, cad}, tc{5, 0, v, cad})
		}
	}
	for _, shape := range []Shape{Sliding, Session} {
		t.Run(string(shape), func(t *testing.T) {
			eachStore(t, func(t *testing.T, s Store) {
				for i, c := range cases {
					for seed := range uint64(3) {
						name := fmt.Sprintf("%d decimals, %d pinned, %.0f m/s, a fix every %.0f s, seed %d", c.dec, c.pinned, c.v, c.cadence, seed)
						d := newTestDeduper(s, shape)
						d.Policy.TTL = 30 * time.Hour
						asset := fmt.Sprintf("veh-%d-%d", i, seed)
						var last ping.Ping
						departed := false
						for _, f := range pullingAway(seed, c.dec, c.v, c.cadence, c.pinned) {
							p := ping.Ping{Asset: asset, Time: articleBase.Add(time.Duration(f.sec * float64(time.Second))), Lat: f.lat, Lon: f.lon, Speed: f.speed, HasSpeed: true, Accuracy: 5}
							d.clock = p.Time
							v := d.settled(t, p)
							moving := f.sec >= 600 && f.speed >= movingSpeed
							off := p.Lat != last.Lat || p.Lon != last.Lon
							if moving && !departed && off && v.Decision != Accepted {
								t.Errorf("%s: the first moving fix off the last accepted point, %.0f s after the start, %.1f m/s: %+v, want accepted",
									name, f.sec-600, f.speed, v)
							}
							if moving && v.Decision != Accepted {
								judged := fixOf(&Claim{Observation: d.Observe(p)})
								if dist := math.Sqrt(judged.distance2(last.Lat, last.Lon)); dist > LagFactor*DefaultRadius {
									t.Errorf("%s: a moving fix at +%.0f s suppressed %.1f m from the last accepted one", name, f.sec-600, dist)
								}
							}
							if v.Decision == Accepted {
								last = p
								if moving {
									departed = true
								}
							}
						}
						if !departed {
							t.Errorf("%s: no moving fix admitted in 3 min", name)
						}
					}
				}
			})
		})
	}
}

// A late ping reporting a speed of travel is
// always admitted (README: "a late ping that reports a speed of travel is
// always admitted"), also at the very coordinates of the stay's last
// accepted ping, which c40bcea's rule (a speed at the very place of the
// last accepted ping is no departure) would take for a stale repeat if
// judgeLate ran holds on a moving fix: a backlog's fix under way, queued
// where the asset had stood, fills the backend's track.
func TestALateFixUnderWayAtTheStaysPointIsAdmitted(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d) // the stay's last accepted ping is offset(0, 0, 0)
		if v := d.settled(t, withSpeed(offset(120, 300, 0), 10)); v.Decision != Accepted {
			t.Fatalf("a departure 300 m off: %+v", v)
		}
		late := withSpeed(offset(60, 0, 0), 6)
		late.Lat, late.Lon = offset(0, 0, 0).Lat, offset(0, 0, 0).Lon
		if v := d.settled(t, late); v.Decision != Accepted {
			t.Errorf("a late fix under way at the stay's accepted point: %+v, want accepted", v)
		}
		early := withSpeed(offset(-30, 0, 0), 6)
		if v := d.settled(t, early); v.Decision != Accepted {
			t.Errorf("a fix under way at the stay's accepted point before the stay began: %+v, want accepted", v)
		}
	})
}

// A departure reported by its speed inside the
// radius, its request failed and released, is admitted again on retry;
// the tracker then loses GPS and its status messages repeat that fix,
// speed and all (Traccar's OutdatedHandler), at most once a window in
// sliding, once a session in session; and the first fix 40 m on when GPS
// returns is admitted.
func TestARetriedDepartureBySpeedThenItsStaleRepeats(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d)
		dep := withSpeed(offset(60, 6, 0), 5)
		c, v := d.claim(t, dep)
		if v.Decision != Accepted {
			t.Fatalf("a departure by speed: %+v", v)
		}
		if n, err := d.Release(t.Context(), c); err != nil || n != 1 {
			t.Fatalf("release: %d %v", n, err)
		}
		if v := d.settled(t, dep); v.Decision != Accepted {
			t.Fatalf("its retry: %+v, want accepted", v)
		}
		admitted := 0
		sec := 70.0
		for ; sec < 670; sec += 10 {
			p := dep
			p.Time = articleBase.Add(time.Duration(sec) * time.Second)
			d.clock = p.Time
			if d.settled(t, p).Decision == Accepted {
				admitted++
			}
		}
		if most := int(600/d.Policy.Window.Seconds()) + 1; admitted > most {
			t.Errorf("%d of 60 stale repeats admitted, want at most %d", admitted, most)
		}
		d.clock = articleBase.Add(time.Duration(sec) * time.Second)
		if v := d.settled(t, withSpeed(offset(sec, 46, 0), 5)); v.Decision != Accepted {
			t.Errorf("the first fix 40 m on: %+v, want accepted", v)
		}
	})
}

// Go and Lua agree on the rule of c40bcea (a
// speed at the very coordinates of the last accepted fix is no
// departure) on the departures above and on stale repeats of a fix taken
// under way: the memory store and the Redis store give every fix the same
// verdict. The random streams of the property tests rarely repeat the
// last accepted point with a speed of travel at a settled stay.
func TestStoresAgreeOnRepeatedPointDepartures(t *testing.T) {
	redisStore := newRedisStore(t, redistest.Start(t))
	for _, shape := range []Shape{Sliding, Session} {
		mem := NewMemoryStore(0)
		for i, c := range []struct {
			dec, pinned int
			v, cadence  float64
		}{{0, 1, 3, 1}, {0, 3, 5, 5}, {4, 0, 3, 1}, {4, 0, 10, 1}, {5, 0, 3, 1}} {
			fixes := pullingAway(uint64(i), c.dec, c.v, c.cadence, c.pinned)
			// then the tracker loses GPS and repeats its last fix, speed
			// and all, every 10 s for 15 min
			lastFix := fixes[len(fixes)-1]
			for sec := lastFix.sec + 10; sec < lastFix.sec+900; sec += 10 {
				fixes = append(fixes, departureFix{sec, lastFix.lat, lastFix.lon, lastFix.speed})
			}
			dm, dr := newTestDeduper(mem, shape), newTestDeduper(redisStore, shape)
			asset := fmt.Sprintf("%s-%d", shape, i)
			for _, f := range fixes {
				p := ping.Ping{Asset: asset, Time: articleBase.Add(time.Duration(f.sec * float64(time.Second))), Lat: f.lat, Lon: f.lon, Speed: f.speed, HasSpeed: true, Accuracy: 5}
				dm.clock, dr.clock = p.Time, p.Time
				if vm, vr := dm.settled(t, p), dr.settled(t, p); vm != vr {
					t.Fatalf("%s, case %d, fix at %.0f s: memory %+v, redis %+v", shape, i, f.sec, vm, vr)
				}
			}
		}
	}
}
