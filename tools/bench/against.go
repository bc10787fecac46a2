package main

import (
	"fmt"
	"os"
	"slices"
	"text/tabwriter"
)

// compare prints, for each variant, how this checkout's process served it
// against the other process's run right beside it (the median of the
// rounds' ratios, and their middle half), then each one's ratios to its
// own baselines for the targets. Two processes of one binary differ by a
// few percent run for run: a change is told apart only beyond that.
func compare(this, other *caddyUnderTest, rounds int) {
	fmt.Printf("\nThis checkout against %s, run for run (req/s of this / req/s of that; the median of the rounds and their middle half):\n\n", other.name)
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.Debug)
	fmt.Fprintln(tw, "variant\tthis / that\tmiddle half of the rounds\t")
	for _, v := range variants {
		mine, theirs := this.results[v.label], other.results[v.label]
		ratios := make([]float64, len(mine))
		for i := range mine {
			ratios[i] = mine[i].rps / theirs[i].rps
		}
		slices.Sort(ratios)
		low, median, high := quartiles(ratios)
		fmt.Fprintf(tw, "%s\t%.3f\t%.3f-%.3f\t\n", v.label, median, low, high)
	}
	tw.Flush()

	fmt.Printf("\nThe targets' ratios, each process to its own baselines (%d rounds; median and middle half):\n\n", rounds)
	tw = tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.Debug)
	fmt.Fprintln(tw, "ratio\tthis checkout\tthat binary\ttarget\t")
	for _, tg := range targets {
		v, measured := variantLabelled(tg.variant)
		if !measured { // left out by -only
			continue
		}
		l1, m1, h1 := quartiles(this.ratios(v))
		l2, m2, h2 := quartiles(other.ratios(v))
		fmt.Fprintf(tw, "%s / %s\t%.2f (%.2f-%.2f)\t%.2f (%.2f-%.2f)\t>= %.2f\t\n", v.label, shortName(v.baseline), m1, l1, h1, m2, l2, h2, tg.atLeast)
	}
	tw.Flush()
}
