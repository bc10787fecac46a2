package analyze

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// The radius recommendation starts from a margin over the parked jitter
// (measured from each stationary run's median, which the anchor of a stay
// approaches), with a floor, so that an RTK-grade receiver's stays are not
// ruled by rounding. The percentile alone undersizes the radius for a
// receiver whose error wanders slowly and throws outliers besides: the
// anchor follows the wander, an outlier lands beyond it, and at a fine
// cadence there are many outliers a window. So the capture's own stationary
// runs are replayed in sliding at growing radii, and the smallest that keeps
// them to maxParkedPerWindow admissions a window, or to what no wider step
// improves on, is recommended.
const (
	radiusOverP99 = 1.25
	minRadiusM    = 10
	// maxParkedPerWindow is what the recommended radius may cost a parked
	// asset: about one admission a window, as a stay promises. It leaves
	// room for the replay, which counts a little under the live stream on
	// wandering receivers (1.18 where the simulator measured 1.22).
	maxParkedPerWindow = 1.15
)

// radiusSteps are the radii tried, as multiples of the percentile's. They
// stop at half as much again: the lag bound grows with the radius.
var radiusSteps = []float64{1, 1.15, 1.3, 1.5}

// radiusGain: a radius is enough when its replay admits at most
// maxParkedPerWindow a window, or at most radiusGain more than the fewest
// any step reaches. Some admissions of a replay's stationary runs (a
// departure's first fix still inside the run, a burst of outliers where it
// begins) no radius removes, and chasing them would only widen the lag
// bound.
const radiusGain = 0.05

// replayedRadius is one radius tried, with the parked admissions a window
// its replay counted.
type replayedRadius struct {
	radiusM, perWindow float64
}

// recommendRadius recommends the stay radius of sliding and session.
func (a *analyzer) recommendRadius(assets []*assetFixes) error {
	rep := a.report
	rec := &rep.Recommended
	if rep.Jitter.Samples == 0 {
		rec.RadiusM = dedup.DefaultRadius
		a.note("%s; radius is the default %g m. If the assets do park, their receivers may scatter wider than that "+
			"(a phone parked indoors), and the default will admit many of their parked fixes: "+
			"replay wider ones with --shape sliding --radius and compare", a.noJitter(), dedup.DefaultRadius)
		return nil
	}
	base := max(minRadiusM, math.Ceil(radiusOverP99*rep.Jitter.P99M))
	rec.RadiusM = base
	windows := float64(a.parkedTime) / float64(rec.Window)
	if windows < 1 {
		return nil // too little parked time to replay
	}
	var tried []replayedRadius
	for _, step := range radiusSteps {
		r := math.Ceil(base * step)
		admitted, err := a.parkedAdmissions(assets, r, rec.Window)
		if err != nil {
			return err
		}
		tried = append(tried, replayedRadius{radiusM: r, perWindow: float64(admitted) / windows})
		if tried[0].perWindow <= maxParkedPerWindow {
			break
		}
	}
	best := slices.MinFunc(tried, func(x, y replayedRadius) int { return cmp.Compare(x.perWindow, y.perWindow) })
	enough := max(maxParkedPerWindow, best.perWindow+radiusGain)
	chosen := tried[slices.IndexFunc(tried, func(t replayedRadius) bool { return t.perWindow <= enough })]
	rec.RadiusM, rec.ParkedAdmissionsPerWindow = chosen.radiusM, chosen.perWindow
	if chosen.perWindow > maxParkedPerWindow {
		a.note("the stationary runs cost %.2f admissions a window at radius %g m, and no radius up to %g m lowers that",
			chosen.perWindow, chosen.radiusM, tried[len(tried)-1].radiusM)
	}
	return nil
}

// parkedAdmissions replays every asset's pings in sliding at radius r and
// window w, in capture order as the handler would see them, and counts the
// parked fixes it admits.
func (a *analyzer) parkedAdmissions(assets []*assetFixes, r float64, w time.Duration) (int, error) {
	pol := a.opts.policy(w)
	pol.Shape, pol.Radius = dedup.Sliding, r
	if err := pol.Check(); err != nil {
		return 0, err
	}
	observe := func(d *dedup.Deduper, _ int, p ping.Ping) dedup.Observation { return d.Observe(p) }
	admitted := 0
	for _, as := range assets {
		err := replayAsset(dedup.Keyer{Window: w, Prefix: analyzePrefix}, pol, as, observe, func(i int, v dedup.Verdict) {
			if v.Decision == dedup.Accepted && as.parked[i] {
				admitted++
			}
		})
		if err != nil {
			return 0, err
		}
	}
	return admitted, nil
}
