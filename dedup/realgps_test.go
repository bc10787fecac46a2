package dedup

import (
	"math"
	"math/rand/v2"
	"testing"
)

// gpsFix is one fix of a scripted sender: its device time, where the
// asset truly is and where the fix says it is (metres east and north of
// the parked spot), what else the fix reports, and whether the asset
// moves; and, where a script sets them, the asset (when another than the
// test's) and how far the server clock is ahead of the device's, in s.
type gpsFix struct {
	sec        float64
	tx, ty     float64
	rx, ry     float64
	acc, speed float64
	hasSpeed   bool
	moving     bool
	asset      string
	lead       float64
}

// replayFixes decides fixes in order, each settled, and reports the parked
// admissions per window of parked device time, the farthest a suppressed
// moving fix lay beyond its bound from the last accepted one (the lag
// bound, or the fix's own accuracy when larger), and the share of moving
// fixes suppressed.
func replayFixes(t *testing.T, shape Shape, fixes []gpsFix) (perWindow, overBound, movingSuppressed float64) {
	t.Helper()
	d := newTestDeduper(NewMemoryStore(0), shape)
	var admitted, parkedSecs, lastX, lastY, moving, suppressed float64
	for i, f := range fixes {
		p := withAccuracy(offset(f.sec, f.rx, f.ry), f.acc)
		if f.hasSpeed {
			p = withSpeed(p, f.speed)
		}
		d.clock = p.Time
		if f.moving {
			moving++
		}
		if i > 0 && !f.moving {
			parkedSecs += max(0, f.sec-fixes[i-1].sec)
		}
		if d.settled(t, p).Decision == Accepted {
			if !f.moving {
				admitted++
			}
			lastX, lastY = f.rx, f.ry
		} else if f.moving {
			suppressed++
			overBound = max(overBound, math.Hypot(f.rx-lastX, f.ry-lastY)-max(LagFactor*DefaultRadius, f.acc))
		}
	}
	return admitted / (parkedSecs / DefaultWindow.Seconds()), overBound, suppressed / moving
}

// driveOff appends n fixes of a drive east at v m/s, one every cadence
// seconds, reporting a satellite fix's accuracy and the speed.
func driveOff(fixes []gpsFix, n int, v, cadence float64) []gpsFix {
	last := fixes[len(fixes)-1]
	x := last.tx
	for i := 1; i <= n; i++ {
		x += v * cadence
		fixes = append(fixes, gpsFix{sec: last.sec + cadence*float64(i), tx: x, rx: x, acc: 10, speed: v, hasSpeed: true, moving: true})
	}
	return fixes
}

// Real GPS behaviour the simulator does not model keeps the backend's
// picture right in every shape: no moving fix is suppressed beyond the lag
// bound (or its own accuracy) from the last accepted one, so every
// departure is admitted at once. What it costs while parked is logged
// (go test -v) and quoted in the README (Window shapes): a phone whose
// fused provider alternates GPS and network fixes, an urban-canyon bias
// that persists minutes, iOS significant-location-change reporting, a
// device clock stepped back an hour, and two fixes stamped in one second.
func TestRealGPSBehaviourKeepsTheBackendRight(t *testing.T) {
	fused := func(cadence float64, netAccuracy func(r *rand.Rand, dist float64) float64) func() []gpsFix {
		return func() []gpsFix {
			r := rand.New(rand.NewPCG(1, uint64(cadence)))
			var out []gpsFix
			for sec := 0.0; sec < 2*3600; sec += cadence * (0.5 + r.Float64()) {
				f := gpsFix{sec: sec, acc: 10, hasSpeed: true}
				f.rx, f.ry = r.NormFloat64()*6, r.NormFloat64()*6
				if r.IntN(2) == 0 { // a network fix 50 to 800 m away
					dist, a := 50+r.Float64()*750, r.Float64()*2*math.Pi
					f.rx, f.ry, f.acc = dist*math.Cos(a), dist*math.Sin(a), netAccuracy(r, dist)
				}
				out = append(out, f)
			}
			return driveOff(out, 60, 15, cadence)
		}
	}
	covers := func(r *rand.Rand, dist float64) float64 { return dist * (1 + r.Float64()) }
	mixed := func(r *rand.Rand, _ float64) float64 { return 40 + r.Float64()*1460 }
	short := func(r *rand.Rand, _ float64) float64 { return 40 + r.Float64()*160 }
	// The most parked admissions per window session may cost, by case: a
	// phone parked with its network fixes inside their accuracy is one
	// stay, whose anchor those fixes pull tens of metres, and the backend,
	// told of a satellite fix there, is not told again where the asset is.
	sessionAtMost := map[string]float64{
		"fused, network accuracy covering its error, 5s":  0.3,
		"fused, network accuracy covering its error, 30s": 0.3,
	}
	for _, tc := range []struct {
		name  string
		fixes func() []gpsFix
	}{
		{"fused, network accuracy covering its error, 5s", fused(5, covers)},
		{"fused, network accuracy covering its error, 30s", fused(30, covers)},
		{"fused, network accuracy 40 to 1500 m, 5s", fused(5, mixed)},
		{"fused, network accuracy 40 to 1500 m, 30s", fused(30, mixed)},
		{"fused, network accuracy 40 to 1500 m, 2m", fused(120, mixed)},
		{"fused, network accuracy 40 to 200 m, 5s", fused(5, short)},
		{"fused, network accuracy 40 to 200 m, 30s", fused(30, short)},
		{"urban canyon, 30 to 80 m bias for 1 to 10 min, 10s", func() []gpsFix {
			r := rand.New(rand.NewPCG(2, 10))
			var out []gpsFix
			var bx, by, until float64
			for sec := 0.0; sec < 4*3600; sec += 10 {
				if sec >= until {
					bx, by, until = 0, 0, sec+60+r.Float64()*540
					if len(out)%2 == 0 || r.IntN(2) == 0 {
						dist, a := 30+r.Float64()*50, r.Float64()*2*math.Pi
						bx, by = dist*math.Cos(a), dist*math.Sin(a)
					}
				}
				out = append(out, gpsFix{sec: sec, rx: bx + r.NormFloat64()*4, ry: by + r.NormFloat64()*4})
			}
			return driveOff(out, 120, 10, 10)
		}},
		{"iOS significant location changes", func() []gpsFix {
			r := rand.New(rand.NewPCG(7, 15))
			var out []gpsFix
			var sec, x, y, heading float64
			fix := func(moving bool) gpsFix {
				f := gpsFix{sec: sec, tx: x, ty: y, acc: 65, moving: moving}
				sigma := 25.0
				if r.IntN(2) == 0 {
					f.acc, sigma = 1414, 500
				}
				f.rx, f.ry = x+r.NormFloat64()*sigma, y+r.NormFloat64()*sigma
				return f
			}
			for range 8 {
				for end := sec + 3600*(1+2*r.Float64()); sec < end; sec += 300 + 600*r.Float64() {
					out = append(out, fix(false))
				}
				for left := 10000 + 20000*r.Float64(); left > 0; {
					d := 500 + 1000*r.Float64()
					left -= d
					heading += r.NormFloat64() * 0.5
					x, y, sec = x+d*math.Cos(heading), y+d*math.Sin(heading), sec+d/15
					out = append(out, fix(true))
				}
			}
			return out
		}},
		{"clock stepped back an hour at the end of a drive", func() []gpsFix {
			r := rand.New(rand.NewPCG(4, 3600))
			var out []gpsFix
			for sec := 0.0; sec < 1800; sec += 10 {
				out = append(out, gpsFix{sec: sec, rx: r.NormFloat64() * 3, ry: r.NormFloat64() * 3})
			}
			out = driveOff(out, 60, 10, 10)
			for i, sec := 0, out[len(out)-1].sec+10-3600; i < 720; i, sec = i+1, sec+10 {
				out = append(out, gpsFix{sec: sec, tx: 6000, rx: 6000 + r.NormFloat64()*3, ry: r.NormFloat64() * 3})
			}
			return driveOff(out, 60, 10, 10)
		}},
		{"two fixes stamped in one second, 30 m apart", sameSecond(30)},
		{"two fixes stamped in one second, 200 m apart", sameSecond(200)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, shape := range Shapes {
				perWindow, over, lagging := replayFixes(t, shape, tc.fixes())
				t.Logf("%s: %.2f parked admissions per window, %.0f%% of moving fixes suppressed", shape, perWindow, 100*lagging)
				if shape != Tumbling && over > 0 {
					t.Errorf("%s: a moving fix suppressed %.0f m beyond its bound from the last accepted one", shape, over)
				}
				if most, ok := sessionAtMost[tc.name]; ok && shape == Session && perWindow > most {
					t.Errorf("session: %.2f parked admissions per window, want at most %.2f", perWindow, most)
				}
			}
		})
	}
}

// sameSecond is a parked asset whose every fix comes twice in its second,
// the second one sep metres east (two sources, one timestamp), then a drive.
func sameSecond(sep float64) func() []gpsFix {
	return func() []gpsFix {
		r := rand.New(rand.NewPCG(5, uint64(sep)))
		var out []gpsFix
		for sec := 0.0; sec < 3600; sec += 10 {
			x, y := r.NormFloat64()*3, r.NormFloat64()*3
			out = append(out, gpsFix{sec: sec, rx: x, ry: y}, gpsFix{sec: sec, rx: x + sep, ry: y})
		}
		return driveOff(out, 60, 10, 10)
	}
}
