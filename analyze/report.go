package analyze

import (
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
)

// Report is what Analyze found in a capture. Medians and percentiles are
// nearest-rank: the smallest value with at least that share of the values
// at or below it.
type Report struct {
	// Shape is the window shape the candidates were replayed with.
	Shape dedup.Shape `json:"shape"`
	// Lines counts the non-blank lines read; a GPX document counts as one,
	// holding its track points as elements.
	Lines int `json:"lines"`
	// Elements counts the pings the lines hold (a line holding a batch
	// holds several): Pings plus every Skipped.
	Elements int `json:"elements"`
	// Pings counts the elements that parsed and validated into a ping.
	Pings int `json:"pings"`
	// Skipped counts the other elements by why: the Rule an invalid ping
	// broke, SkipMalformed, SkipNotAPing or SkipTooLarge.
	Skipped map[string]int `json:"skipped"`
	// FirstSkipped says, for each reason of Skipped, where the first such
	// element was and what was wrong with it.
	FirstSkipped map[string]string `json:"first_skipped"`
	// Assets counts the distinct asset ids.
	Assets int `json:"assets"`
	// MedianInterval is the median device-time gap between consecutive
	// fixes of one asset, pooled over all assets; gaps <= 0 (redeliveries,
	// disorder) are left out.
	MedianInterval time.Duration `json:"median_interval_ns"`
	// Jitter is how far a parked asset's fixes wander.
	Jitter JitterStats `json:"jitter"`
	// Moves describes the real moves the resolutions are judged on.
	Moves MoveStats `json:"moves"`
	// Resolutions holds, per candidate resolution, how many real moves
	// stay inside one cell.
	Resolutions []ResolutionStats `json:"resolutions"`
	// Candidates holds the replay of every (resolution, window) candidate,
	// by resolution, then window.
	Candidates []CandidateStats `json:"candidates"`
	// Recommended is the configuration this capture argues for.
	Recommended Recommendation `json:"recommended"`
	// Notes explain recommendations that fell back to a default and
	// candidates that were not replayed.
	Notes []string `json:"notes"`
}

// JitterStats measures parked jitter on stationary runs: per asset, in
// device-time order, maximal runs of consecutive fixes that all lie within
// 25 m (haversine) of the run's first fix, or within the two fixes'
// reported accuracies added where those are wider (up to 100 m each),
// that last at least 2 minutes of device time, and whose two halves' median
// positions lie within 25 m of each other (a walk is no run), less a
// departure at their end (three or more fixes, each farther from the
// median than the one before). Each fix of a run is one sample: its distance to the
// run's median position (the component-wise median of lat and lon).
type JitterStats struct {
	// Runs counts the stationary runs.
	Runs int `json:"runs"`
	// Samples counts the fixes in them.
	Samples int `json:"samples"`
	// P50M is the median sample, in metres.
	P50M float64 `json:"p50_m"`
	// P95M is the 95th percentile, in metres: the jitter a cell edge must
	// span.
	P95M float64 `json:"p95_m"`
	// P99M is the 99th percentile, in metres.
	P99M float64 `json:"p99_m"`
}

// MoveStats counts real moves: consecutive fixes of one asset (device-time
// order) that are not both inside the same stationary run, and lie more
// than ThresholdM apart.
type MoveStats struct {
	// ThresholdM is max(p95 jitter, 1 m): a shorter displacement may be
	// noise.
	ThresholdM float64 `json:"threshold_m"`
	// Count is the number of real moves.
	Count int `json:"count"`
}

// ResolutionStats is what one candidate resolution makes of real moves.
type ResolutionStats struct {
	// Resolution is the H3 resolution.
	Resolution int `json:"resolution"`
	// EdgeM is its average cell edge (h3.HexagonEdgeLengthAvgM), in metres.
	EdgeM float64 `json:"edge_m"`
	// Swallowed counts real moves whose two fixes share a cell: a move the
	// dedup cannot see.
	Swallowed int `json:"swallowed"`
	// SwallowedShare is Swallowed / Moves.Count, 0 without moves.
	SwallowedShare float64 `json:"swallowed_share"`
}

// CandidateStats is the production Deduper's verdict on the capture for
// one (resolution, window) candidate.
type CandidateStats struct {
	// Resolution is the candidate's H3 resolution.
	Resolution int `json:"resolution"`
	// Window is the candidate's window.
	Window time.Duration `json:"window_ns"`
	// Pings counts the pings replayed.
	Pings int `json:"pings"`
	// Admitted counts the pings accepted, which the replay assumes the
	// upstream took.
	Admitted int `json:"admitted"`
	// Suppressed counts the other pings by reason.
	Suppressed map[dedup.Reason]int `json:"suppressed"`
	// SuppressionRatio is (Pings - Admitted) / Pings, 0 without pings.
	SuppressionRatio float64 `json:"suppression_ratio"`
}

// Recommendation is the configuration a capture argues for.
type Recommendation struct {
	// Resolution is the finest H3 resolution (of all, 0 to 15) whose
	// average edge is at least the p95 jitter; DefaultResolution without
	// stationary samples.
	Resolution int `json:"resolution"`
	// EdgeM is that resolution's average cell edge, in metres.
	EdgeM float64 `json:"edge_m"`
	// RadiusM is the stay radius of the sliding and session shapes, in
	// whole metres: the base (1.25 times the p99 parked jitter, at least
	// 10 m) if a replay of the stationary runs in sliding, at the base and
	// the recommended window, admits at most 1.15 of their fixes a window;
	// else the smallest of 1, 1.15, 1.3 and 1.5 times the base whose replay
	// admits at most 1.15, or at most 0.05 more than the fewest of the four.
	// The base without a window's worth of stationary runs;
	// dedup.DefaultRadius without stationary samples.
	RadiusM float64 `json:"radius_m"`
	// ParkedAdmissionsPerWindow is what that replay admitted at RadiusM:
	// the fixes of stationary runs, their first (the arrival) left out,
	// per window of their device time; 0 when not replayed.
	ParkedAdmissionsPerWindow float64 `json:"parked_admissions_per_window"`
	// Window is the smallest candidate window of at least ten median report
	// intervals, else the largest candidate; DefaultWindow when no interval
	// was measured.
	Window time.Duration `json:"window_ns"`
	// TTL is TTLPolicy{Window, RetryLadder, OutageMargin}.Resolve().
	TTL time.Duration `json:"ttl_ns"`
	// TTLFrom is Resolve's explanation of the TTL.
	TTLFrom string `json:"ttl_from"`
}
