package analyze

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
)

// WriteTable writes the report for people: a summary, the resolutions, the
// candidates and the recommendation, in aligned columns.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	r.writeSummary(tw)
	fmt.Fprintln(tw)
	r.writeResolutions(tw)
	fmt.Fprintln(tw)
	r.writeCandidates(tw)
	fmt.Fprintln(tw)
	r.writeRecommendation(tw)
	return tw.Flush()
}

func (r *Report) writeSummary(w io.Writer) {
	held := ""
	if r.Elements != r.Lines { // batches: say what the lines held
		held = fmt.Sprintf(" holding %d elements", r.Elements)
	}
	fmt.Fprintf(w, "capture\t%d lines%s, %d pings, %d assets\n", r.Lines, held, r.Pings, r.Assets)
	if len(r.Skipped) > 0 {
		fmt.Fprintf(w, "skipped\t%s\n", formatCounts(r.Skipped))
		for _, reason := range slices.Sorted(maps.Keys(r.FirstSkipped)) {
			fmt.Fprintf(w, "\tfirst %s at %s\n", reason, r.FirstSkipped[reason])
		}
	}
	fmt.Fprintf(w, "interval\tmedian %s between an asset's fixes\n", r.MedianInterval)
	fmt.Fprintf(w, "jitter\tp50 %.1f m, p95 %.1f m, p99 %.1f m (%d fixes in %d stationary runs)\n",
		r.Jitter.P50M, r.Jitter.P95M, r.Jitter.P99M, r.Jitter.Samples, r.Jitter.Runs)
	fmt.Fprintf(w, "moves\t%d real moves (over %.1f m)\n", r.Moves.Count, r.Moves.ThresholdM)
}

func (r *Report) writeResolutions(w io.Writer) {
	fmt.Fprintln(w, "resolution\tedge\tmoves swallowed")
	for _, s := range r.Resolutions {
		fmt.Fprintf(w, "%d\t%.1f m\t%.1f%%\n", s.Resolution, s.EdgeM, 100*s.SwallowedShare)
	}
}

func (r *Report) writeCandidates(w io.Writer) {
	reasons := r.reasons()
	fmt.Fprint(w, "resolution\twindow\tpings\tadmitted\tsuppressed")
	for _, reason := range reasons {
		fmt.Fprintf(w, "\t%s", reason)
	}
	fmt.Fprintln(w)
	for _, c := range r.Candidates {
		fmt.Fprintf(w, "%d\t%s\t%d\t%d\t%.1f%%", c.Resolution, c.Window, c.Pings, c.Admitted, 100*c.SuppressionRatio)
		for _, reason := range reasons {
			fmt.Fprintf(w, "\t%d", c.Suppressed[reason])
		}
		if c.Resolution == r.Recommended.Resolution && c.Window == r.Recommended.Window {
			fmt.Fprint(w, "\t<- recommended")
		}
		fmt.Fprintln(w)
	}
}

// reasons lists the suppression reasons any candidate has, in a fixed
// order, so that a shape's table has no columns of zeros it cannot fill.
func (r *Report) reasons() []dedup.Reason {
	var out []dedup.Reason
	for _, reason := range []dedup.Reason{dedup.Redelivery, dedup.Reobservation, dedup.Jitter, dedup.ReasonSliding, dedup.ReasonSession} {
		if slices.ContainsFunc(r.Candidates, func(c CandidateStats) bool { return c.Suppressed[reason] > 0 }) {
			out = append(out, reason)
		}
	}
	return out
}

func (r *Report) writeRecommendation(w io.Writer) {
	rec := r.Recommended
	fmt.Fprintf(w, "recommended\tresolution %d (%.1f m edges)\n", rec.Resolution, rec.EdgeM)
	fmt.Fprintf(w, "\tradius %g m (shapes sliding and session: a suppressed ping then lies at most %g m from the last accepted one)\n",
		rec.RadiusM, dedup.LagFactor*rec.RadiusM)
	if rec.ParkedAdmissionsPerWindow > 0 {
		fmt.Fprintf(w, "\t  (replayed in sliding at this radius and window, parked assets' fixes are admitted %.2f times a window)\n",
			rec.ParkedAdmissionsPerWindow)
	}
	fmt.Fprintf(w, "\twindow %s\n", rec.Window)
	fmt.Fprintf(w, "\tttl %s (%s)\n", rec.TTL, rec.TTLFrom)
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note\t%s\n", n)
	}
}

// formatCounts writes counts as "a 1, b 2", sorted by key.
func formatCounts(counts map[string]int) string {
	keys := slices.Sorted(maps.Keys(counts))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, counts[k])
	}
	return strings.Join(parts, ", ")
}
