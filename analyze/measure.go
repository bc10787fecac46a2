package analyze

import (
	"slices"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/geo"
)

// measure adds one asset's report intervals, stationary runs and move
// candidates, all in device-time order.
func (a *analyzer) measure(as *assetFixes) {
	fixes := as.fixes
	a.order = a.order[:0]
	for i := range fixes {
		a.order = append(a.order, int32(i))
	}
	slices.SortStableFunc(a.order, func(x, y int32) int { return fixes[x].t.Compare(fixes[y].t) })

	first := len(a.gaps)
	for k := 1; k < len(a.order); k++ {
		if gap := fixes[a.order[k]].t.Sub(fixes[a.order[k-1]].t); gap > 0 {
			a.gaps = append(a.gaps, gap)
		}
	}
	// Sorted in place: finish sorts the pooled gaps anyway.
	if own := a.gaps[first:]; len(own) > 0 {
		slices.Sort(own)
		a.intervals = append(a.intervals, nearestRank(own, 50))
	}
	a.findRuns(as)
	a.findMoves(fixes)
}

// findRuns marks the stationary runs in a.runOf (by position in a.order;
// 0 is none, else run number) and in as.parked, adds up their time and
// samples their jitter.
func (a *analyzer) findRuns(as *assetFixes) {
	fixes := as.fixes
	as.parked = make([]bool, len(fixes))
	a.runOf = slices.Grow(a.runOf[:0], len(a.order))[:len(a.order)]
	clear(a.runOf)
	at := func(k int) fixPoint { return fixes[a.order[k]] }
	for start := 0; start < len(a.order); {
		first := at(start)
		spanEnd := a.stationaryEnd(at, start)
		// Too short, or a slow move: a later start may still open a run
		// within this span.
		if at(spanEnd-1).t.Sub(first.t) < stationaryMinDuration || a.drifts(fixes, a.order[start:spanEnd]) {
			start++
			continue
		}
		end := start + a.withoutDeparture(fixes, a.order[start:spanEnd])
		if at(end-1).t.Sub(first.t) < stationaryMinDuration {
			start++
			continue
		}
		a.report.Jitter.Runs++
		for k := start; k < end; k++ {
			a.runOf[k] = int32(a.report.Jitter.Runs)
			as.parked[a.order[k]] = k > start
		}
		a.parkedTime += at(end - 1).t.Sub(first.t)
		a.sampleRun(fixes, a.order[start:end])
		start = spanEnd
	}
}

// withoutDeparture is how many fixes of span are the stay: all but a
// departure at its end, departureFixes or more fixes each farther from
// the span's median than the one before (the last fix there before it
// stays). A span holds every fix within stationaryRadiusM of its first:
// a car setting off from an RTK-grade receiver's 0.3 m scatter had its
// first 22 m of driving measured as parked jitter, and was recommended a
// 24 m radius where 10 m holds it. A parked receiver's jitter is seldom
// that many fixes farther and farther out, and then costs the run a few
// samples.
func (a *analyzer) withoutDeparture(fixes []fixPoint, span []int32) int {
	lat, lon := a.medianPosition(fixes, span)
	out := func(k int) float64 { return geo.DistanceM(lat, lon, fixes[span[k]].lat, fixes[span[k]].lon) }
	end := len(span)
	for end > 1 && out(end-1) > out(end-2) {
		end--
	}
	if len(span)-end < departureFixes {
		return len(span)
	}
	return end
}

// stationaryEnd returns where the stationary span opened by the fix at
// position start in a.order ends (exclusive): the fixes within
// runRadiusM of that first fix, through the excursions beyond it
// that maxExcursion and maxStrayShare allow, and only of fixes that lie
// beyond that radius of the span's mean position too. A fix beyond the
// first fix but near the mean says the first fix lay off the parking's
// centre (the last fix of the move that parked there, say), not that the
// receiver threw an outlier: the span ends there, as it always did, and a
// later start opens the parking's run.
func (a *analyzer) stationaryEnd(at func(k int) fixPoint, start int) int {
	first := at(start)
	within := func(lat, lon float64, k int) bool {
		return geo.DistanceM(lat, lon, at(k).lat, at(k).lon) <= runRadiusM(first, at(k))
	}
	// Longitudes are summed as offsets from the first fix's, the short way
	// round: a stay on the antimeridian has fixes near +180 and -180.
	sumLat, sumEast, n := first.lat, 0.0, 1.0
	end, strays := start+1, 0
	for end < len(a.order) {
		if within(first.lat, first.lon, end) {
			sumLat, sumEast, n = sumLat+at(end).lat, sumEast+geo.WrapLongitude(at(end).lon-first.lon), n+1
			end++
			continue
		}
		back := end
		meanLon := geo.WrapLongitude(first.lon + sumEast/n)
		for back < len(a.order) && back-end < maxExcursion &&
			!within(first.lat, first.lon, back) && !within(sumLat/n, meanLon, back) {
			back++
		}
		if back == end || back == len(a.order) || !within(first.lat, first.lon, back) {
			break // no outlier, or no return from it
		}
		if float64(strays+back-end) > maxStrayShare*float64(back+1-start) {
			break
		}
		strays += back - end
		end = back
	}
	return end
}

// drifts reports a span whose second half lies elsewhere than its first:
// their median positions more than stationaryRadiusM apart. A walker whose
// phone reports 65-100 m stays within two such accuracies of a fix for
// two minutes and more, and was measured as parked, its walk as jitter (a
// radius of 100-200 m recommended); a parked receiver's halves share their
// median, however wide it scatters.
func (a *analyzer) drifts(fixes []fixPoint, span []int32) bool {
	half := len(span) / 2
	lat1, lon1 := a.medianPosition(fixes, span[:half])
	lat2, lon2 := a.medianPosition(fixes, span[half:])
	return geo.DistanceM(lat1, lon1, lat2, lon2) > stationaryRadiusM
}

// runRadiusM is how far apart two fixes of one stationary run may lie:
// stationaryRadiusM, or, for a receiver that says it scatters wider (a
// phone parked indoors, at 30-50 m), the two fixes' accuracies added. A
// run of such a receiver's fixes within 25 m of its first fix ends at
// nearly every fix, and its assets were measured as never parked: the
// defaults then admitted 20-30 of their parked fixes a window. An accuracy
// worse than a satellite fix's (maxJitterAccuracyM) widens nothing: the
// stay holds such a fix by its accuracy anyway, and summed it would take
// kilometre moves for parking.
func runRadiusM(a, b fixPoint) float64 {
	return max(stationaryRadiusM, satelliteAccuracyM(a)+satelliteAccuracyM(b))
}

// satelliteAccuracyM is a fix's reported accuracy when a satellite fix
// could have it, else 0.
func satelliteAccuracyM(f fixPoint) float64 {
	if f.accuracy > maxJitterAccuracyM {
		return 0
	}
	return f.accuracy
}

// maxJitterM is how far from its run's median a fix still counts in the
// jitter: four run radii, sized by the fix's own accuracy.
func maxJitterM(f fixPoint) float64 {
	return 4 * runRadiusM(f, f)
}

// sampleRun adds the distance of each fix of a run to the run's median
// position, but for those no radius should hold (maxJitterM).
func (a *analyzer) sampleRun(fixes []fixPoint, run []int32) {
	lat, lon := a.medianPosition(fixes, run)
	for _, i := range run {
		d := geo.DistanceM(lat, lon, fixes[i].lat, fixes[i].lon)
		if d <= maxJitterM(fixes[i]) && fixes[i].accuracy <= maxJitterAccuracyM {
			a.samples = append(a.samples, d)
		}
	}
}

// medianPosition is the component-wise median of the fixes of run, its
// longitudes taken the short way round from the first's.
func (a *analyzer) medianPosition(fixes []fixPoint, run []int32) (lat, lon float64) {
	median := func(coord func(fixPoint) float64) float64 {
		a.scratch = a.scratch[:0]
		for _, i := range run {
			a.scratch = append(a.scratch, coord(fixes[i]))
		}
		slices.Sort(a.scratch)
		return nearestRank(a.scratch, 50)
	}
	ref := fixes[run[0]].lon
	return median(func(f fixPoint) float64 { return f.lat }),
		geo.WrapLongitude(ref + median(func(f fixPoint) float64 { return geo.WrapLongitude(f.lon - ref) }))
}

// findMoves keeps the consecutive pairs that may be real moves, with the
// resolutions at which they stay in one cell.
func (a *analyzer) findMoves(fixes []fixPoint) {
	for k := 1; k < len(a.order); k++ {
		if a.runOf[k] != 0 && a.runOf[k] == a.runOf[k-1] {
			continue
		}
		i, j := a.order[k-1], a.order[k]
		d := geo.DistanceM(fixes[i].lat, fixes[i].lon, fixes[j].lat, fixes[j].lon)
		if d <= minMoveM {
			continue
		}
		m := move{distM: d}
		for r, cells := range a.cells {
			if cells[i] == cells[j] {
				m.sameCell |= 1 << r
			}
		}
		a.moves = append(a.moves, m)
	}
}

func (a *analyzer) countMoves() {
	rep := a.report
	rep.Moves.ThresholdM = max(rep.Jitter.P95M, minMoveM)
	for _, m := range a.moves {
		if m.distM <= rep.Moves.ThresholdM {
			continue
		}
		rep.Moves.Count++
		for r := range rep.Resolutions {
			if m.sameCell&(1<<r) != 0 {
				rep.Resolutions[r].Swallowed++
			}
		}
	}
	for r := range rep.Resolutions {
		rep.Resolutions[r].SwallowedShare = ratio(rep.Resolutions[r].Swallowed, rep.Moves.Count)
	}
}

// nearestRank returns the pct-th percentile of sorted values, the zero
// value if there are none.
func nearestRank[T any](sorted []T, pct int) T {
	if len(sorted) == 0 {
		var zero T
		return zero
	}
	rank := max((pct*len(sorted)+99)/100, 1) // ceil(pct/100 · n), in integers to stay exact
	return sorted[rank-1]
}

func ratio(part, whole int) float64 {
	if whole == 0 {
		return 0
	}
	return float64(part) / float64(whole)
}
