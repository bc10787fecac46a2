// Command bench measures telemetry_dedup against plain Caddy in one run: it
// builds Caddy with the module (as pinned in xcaddy.json), starts one Caddy
// serving every variant on its own port in front of a fast upstream (a Caddy
// respond site), starts a throwaway redis-server, and drives each variant
// with the same Go load generator and the same bodies, each between two runs
// of its baseline, over several rounds. It prints throughput as ratios
// against the baselines measured seconds apart, since machines are noisy,
// and the CPU time Caddy, Redis and the load generator each spent per
// request, which says where a variant's time goes.
//
//	go run ./tools/bench                      # 7 rounds of 2 s runs, 32 connections
//	go run ./tools/bench -rounds 9 -duration 5s -conns 64
//	go run ./tools/bench -rounds 1 -profile "new pings, redis"   # and a CPU profile of Caddy under it
//	go run ./tools/bench -rounds 1 -profile "new pings, redis" -profile-kind allocs   # or what it allocates
//	go run ./tools/bench -only 'new pings, (redis|sliding)'   # only the variants whose label matches, with their baselines
package main

import (
	"cmp"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

func main() {
	rounds := flag.Int("rounds", 7, "rounds over all variants")
	duration := flag.Duration("duration", 2*time.Second, "load per run (a variant runs once a round, a baseline once more than the variants compared with it)")
	conns := flag.Int("conns", 32, "concurrent connections of the load generator")
	profile := flag.String("profile", "", "after the rounds, load this variant (its label, as printed) once more, for -profile-seconds, while taking a profile of Caddy")
	profileKind := flag.String("profile-kind", "cpu", "what -profile records: cpu (where Caddy's CPU time goes) or allocs (what it allocates, and where)")
	profileOut := flag.String("profile-out", "caddy.pprof", "where -profile writes the profile (read it with go tool pprof)")
	profileSeconds := flag.Int("profile-seconds", 10, "how long -profile's load and profile last")
	only := flag.String("only", "", "measure only the variants whose label matches this regular expression (and their baselines); the targets table then lists only theirs")
	against := flag.String("against", "", "another Caddy binary with telemetry_dedup (built from an earlier commit with tools/xbuild, say) to run side by side with this checkout's: each run is made on both, one right after the other, and the two are compared round by round")
	flag.Parse()
	if *against != "" {
		if info, err := os.Stat(*against); err != nil || info.IsDir() {
			refuse("-against %q is not a Caddy binary: build one with go run ./tools/xbuild -o <file> in the checkout to compare with", *against)
		}
	}
	if *only != "" {
		re, err := regexp.Compile(*only)
		if err != nil {
			refuse("-only %q: %v", *only, err)
		}
		selected := selectVariants(re)
		if len(selected) == 0 {
			refuse("-only %q matches no variant; the labels are:\n%s", *only, variantLabels())
		}
		variants = selected
	}
	var prof *profiling
	if *profile != "" {
		v, ok := variantLabelled(*profile)
		if !ok {
			refuse("-profile %q is no variant; give one of:\n%s", *profile, variantLabels())
		}
		if *profileSeconds < 1 {
			refuse("-profile-seconds %d: give at least 1", *profileSeconds)
		}
		if !slices.Contains(profileKinds, *profileKind) {
			refuse("-profile-kind %q: give one of %s", *profileKind, strings.Join(profileKinds, ", "))
		}
		prof = &profiling{variant: v, kind: *profileKind, out: *profileOut, seconds: *profileSeconds}
	}
	if err := run(*rounds, *duration, *conns, prof, *against); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// refuse ends the run, before anything is built, over a flag it cannot use.
func refuse(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
	os.Exit(2)
}

// site is one Caddy site of the benchmark.
type site struct {
	name   string
	config string // the site block's body; %s is the upstream address
	port   int
}

// variant is one measured combination of a site and a kind of body.
type variant struct {
	label, site string
	bodies      bodyKind
	baseline    string // the variant this one is compared with
}

type bodyKind int

const (
	allNew bodyKind = iota
	allDuplicate
	fleetMix
)

// The baselines, measured in the same run as everything compared with them.
const (
	plainNew = "plain reverse_proxy, new pings (baseline)"
	static   = "static respond (ceiling for a suppressed ping)"
	plainMix = "fleet mix, plain reverse_proxy"
)

var variants = []variant{
	{plainNew, "plain", allNew, ""},
	{"new pings, redis", "redis-near", allNew, plainNew},
	{"new pings, memory", "memory", allNew, plainNew},
	{"new pings, sliding on redis", "sliding", allNew, plainNew},
	{"new pings, session on redis", "session", allNew, plainNew},
	{static, "static", allDuplicate, ""},
	// What the answer alone costs: a static respond that also sends the
	// two headers every suppressed ping is answered with (X-Dedup and
	// X-Dedup-Reason, fixed by the contract), so the gap between it and a
	// duplicate is the handler's reading, keying and claiming of the ping.
	{"static respond with a duplicate's two X-Dedup headers", "static-headers", allDuplicate, static},
	{"duplicate pings, redis without near cache", "redis", allDuplicate, static},
	{"duplicate pings, redis with near cache", "redis-near", allDuplicate, static},
	{"duplicate pings, memory", "memory", allDuplicate, static},
	{"duplicate pings, sliding on redis", "sliding", allDuplicate, static},
	{"duplicate pings, session on redis", "session", allDuplicate, static},
	{plainMix, "plain", fleetMix, ""},
	{"fleet mix, redis with near cache", "redis-near", fleetMix, plainMix},
	{"fleet mix, memory", "memory", fleetMix, plainMix},
	{"fleet mix, sliding on redis", "sliding", fleetMix, plainMix},
}

// targets are the ratios the issue holds the module to, by variant.
var targets = []struct {
	variant string
	atLeast float64
}{
	{"new pings, redis", 0.85},
	{"new pings, memory", 0.95},
	{"duplicate pings, redis with near cache", 0.85},
	{"duplicate pings, memory", 0.90},
	{"new pings, sliding on redis", 0.75},
	{"duplicate pings, sliding on redis", 0.70},
}

func run(rounds int, duration time.Duration, conns int, prof *profiling, against string) error {
	dir, err := os.MkdirTemp("", "telemetry-dedup-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	caddyBin := filepath.Join(dir, "caddy")
	fmt.Fprintln(os.Stderr, "building Caddy with telemetry_dedup ...")
	if err := build(caddyBin); err != nil {
		return err
	}
	rdb, stopRedis, err := startRedis(dir)
	if err != nil {
		return err
	}
	defer stopRedis()

	this, stop, err := startCaddyUnderTest(filepath.Join(dir, "this"), "this checkout", caddyBin, "", rdb)
	if err != nil {
		return err
	}
	defer stop()
	caddies := []*caddyUnderTest{this}
	if against != "" {
		other, stop, err := startCaddyUnderTest(filepath.Join(dir, "against"), against, against, "against-", rdb)
		if err != nil {
			return err
		}
		defer stop()
		caddies = append(caddies, other)
	}

	// A first pass, not recorded, warms every variant up: the first load a
	// fresh process and a fresh Redis see (new connections, a heap and a
	// key space still growing) ran measurably slower than the rest.
	for _, c := range caddies {
		for _, v := range variants {
			load(siteNamed(c.sites, v.site).url(), v.bodies, conns, duration/3, uint64(rounds))
		}
	}

	for r := range rounds {
		order := roundOrder(r)
		runs := map[*caddyUnderTest][]result{}
		for _, v := range order {
			for _, c := range inTurn(caddies, r) { // side by side, each first every other round
				runs[c] = append(runs[c], c.measure(v, conns, duration, uint64(r)))
			}
		}
		for _, c := range caddies {
			c.record(order, runs[c])
		}
	}
	for _, c := range caddies {
		report(c, rounds, duration, conns)
	}
	if len(caddies) > 1 {
		compare(caddies[0], caddies[1], rounds)
	}
	if err := redisMemory(rdb); err != nil {
		return err
	}
	if prof != nil {
		return prof.take(this.adminURL, siteNamed(this.sites, prof.variant.site).url(), conns, uint64(rounds))
	}
	return nil
}

// caddyUnderTest is one Caddy process serving every site of the benchmark,
// and what was measured of it.
type caddyUnderTest struct {
	name     string // this checkout, or the -against binary
	sites    []*site
	adminURL string
	meter    cpuMeter
	// results are each variant's runs, a round's after another's.
	results map[string][]result
}

// startCaddyUnderTest starts bin in dir, serving every site with keys
// under prefix in the shared Redis.
func startCaddyUnderTest(dir, name, bin, prefix string, rdb *redisServer) (*caddyUnderTest, func(), error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, err
	}
	dedupSite := func(name, options string) *site {
		return &site{name: name, config: "telemetry_dedup {\n\t\tkey_prefix " + prefix + "bench-" + name + ":\n" + options + "\t}\n\treverse_proxy %s"}
	}
	redis := "\t\tstore redis " + rdb.url + "\n"
	sites := []*site{
		{name: "plain", config: "reverse_proxy %s"},
		dedupSite("memory", ""),
		dedupSite("redis", redis+"\t\tnear_cache off\n"),
		dedupSite("redis-near", redis),
		dedupSite("sliding", "\t\tshape sliding\n"+redis),
		dedupSite("session", "\t\tshape session\n"+redis),
		{name: "static", config: "respond 200"},
		{name: "static-headers", config: "header X-Dedup suppressed\n\theader X-Dedup-Reason redelivery\n\trespond 200"},
	}
	stop, adminURL, pid, err := startCaddy(dir, bin, sites)
	if err != nil {
		return nil, nil, err
	}
	return &caddyUnderTest{name: name, sites: sites, adminURL: adminURL, meter: cpuMeter{caddyPID: pid, redisPID: rdb.pid},
		results: map[string][]result{}}, stop, nil
}

// measure loads variant v for d and reads what it cost each process.
func (c *caddyUnderTest) measure(v variant, conns int, d time.Duration, round uint64) result {
	s := siteNamed(c.sites, v.site)
	metricsURL := c.adminURL + "/metrics"
	rtBefore, cmdsBefore := redisTotals(metricsURL)
	cpuBefore := c.meter.read()
	res := load(s.url(), v.bodies, conns, d, round)
	res.cpu = c.meter.read().perRequest(cpuBefore, res.requests)
	res.roundTrips, res.commands = -1, -1
	if s.usesRedis() {
		rt, cmds := redisTotals(metricsURL)
		res.roundTrips = (rt - rtBefore) / float64(res.requests)
		res.commands = (cmds - cmdsBefore) / float64(res.requests)
	}
	fmt.Fprintf(os.Stderr, "round %d  %-50s %8.0f req/s  p50 %-9s p99 %-9s errors %d %s\n",
		round+1, v.label, res.rps, res.p50, res.p99, res.errors, res.firstError)
	return res
}

// record keeps a round's runs, made in order, each variant with the mean
// of the runs of its baseline around it.
func (c *caddyUnderTest) record(order []variant, runs []result) {
	for i, v := range order {
		if v.baseline != "" { // between two runs of its baseline: see roundOrder
			runs[i].baselineRPS = (runs[i-1].rps + runs[i+1].rps) / 2
		}
		c.results[v.label] = append(c.results[v.label], runs[i])
	}
}

// inTurn returns s in the order round r takes it: every other round
// backwards, so that a machine speeding up or slowing down over a round
// favours neither end of it.
func inTurn[T any](s []T, r int) []T {
	s = slices.Clone(s)
	if r%2 == 1 {
		slices.Reverse(s)
	}
	return s
}

// roundOrder is the order in which round r runs the variants: each
// baseline, then every variant compared with it, each followed by the
// baseline again. A variant is then measured between two runs of its
// baseline, seconds apart, and compared with their mean, so that a machine
// that speeds up or slows down (a shared VM's neighbours come and go)
// moves both sides of a ratio alike: with every variant run once a round,
// a ratio compared runs up to 15 s apart, and its rounds spread over
// 0.5-1.2 on a noisy machine.
func roundOrder(r int) []variant {
	var order []variant
	for _, b := range variants {
		if b.baseline != "" {
			continue
		}
		order = append(order, b)
		for _, v := range variants {
			if v.baseline == b.label {
				order = append(order, v, b)
			}
		}
	}
	return inTurn(order, r)
}

// url is where the site is served.
func (s *site) url() string { return fmt.Sprintf("http://127.0.0.1:%d/", s.port) }

func siteNamed(sites []*site, name string) *site {
	for _, s := range sites {
		if s.name == name {
			return s
		}
	}
	panic("no site " + name)
}

// report prints the medians of the rounds as ratios to their baselines,
// then the ratios the issue sets targets for.
func report(c *caddyUnderTest, rounds int, duration time.Duration, conns int) {
	results := c.results
	median := func(label string) result {
		byRPS := slices.Clone(results[label])
		slices.SortFunc(byRPS, func(a, b result) int { return cmp.Compare(a.rps, b.rps) })
		return byRPS[len(byRPS)/2]
	}
	// A ratio is the median of the rounds' ratios: each round compares a
	// variant with the runs of its baseline just before and just after it.
	ratioOf := func(v variant) float64 {
		_, median, _ := quartiles(c.ratios(v))
		return median
	}
	fmt.Printf("\n%s: %d rounds x %s per run, every variant between two runs of its baseline, %d connections, one Caddy; "+
		"req/s and latencies are medians of the runs, ratios the medians of the rounds' ratios:\n\n", c.name, rounds, duration, conns)
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.Debug)
	fmt.Fprintln(tw, "variant\treq/s\tratio\tp50\tp99\tRedis round trips / ping\tcommands / ping\tCPU µs / request: Caddy, Redis, load\terrors\t")
	for _, v := range variants {
		m := median(v.label)
		ratio := "1.00 (baseline)"
		if v.baseline != "" {
			ratio = fmt.Sprintf("%.2fx %s", ratioOf(v), shortName(v.baseline))
		}
		rt, cmds := "-", "-"
		if m.roundTrips >= 0 {
			rt, cmds = fmt.Sprintf("%.3f", m.roundTrips), fmt.Sprintf("%.2f", m.commands)
		}
		c := medianCPU(results[v.label])
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s, %s, %s\t%d\t\n", v.label, m.rps, ratio, m.p50, m.p99, rt, cmds,
			micros(c.caddy), micros(c.redis), micros(c.load), m.errors)
	}
	tw.Flush()

	// The middle half of the rounds' ratios says how far one run can be
	// trusted: a target inside it is missed or met by the machine's noise.
	fmt.Printf("\nAgainst the targets (median of the rounds' ratios; the middle half of them, a quarter of the rounds below it and a quarter above):\n\n")
	tw = tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.Debug)
	fmt.Fprintln(tw, "ratio\tmeasured\tmiddle half of the rounds\ttarget\t\t")
	for _, tg := range targets {
		v, measured := variantLabelled(tg.variant)
		if !measured { // left out by -only
			continue
		}
		low, r, high := quartiles(c.ratios(v))
		fmt.Fprintf(tw, "%s / %s\t%.2f\t%.2f-%.2f\t>= %.2f\t%s\t\n", v.label, shortName(v.baseline), r, low, high, tg.atLeast,
			verdict(r, low, high, tg.atLeast))
	}
	tw.Flush()
}

// ratios are a variant's ratios to its baseline, one a round, sorted. A
// ratio compares the variant with the runs of its baseline just before and
// just after it.
func (c *caddyUnderTest) ratios(v variant) []float64 {
	runs := c.results[v.label]
	ratios := make([]float64, len(runs))
	for r, res := range runs {
		ratios[r] = res.rps / res.baselineRPS
	}
	slices.Sort(ratios)
	return ratios
}

// quartiles returns the lower quartile, the median and the upper quartile
// of sorted values.
func quartiles(sorted []float64) (low, median, high float64) {
	n := len(sorted)
	return sorted[n/4], sorted[n/2], sorted[3*n/4]
}

// verdict says whether a median ratio meets its target, and whether the
// rounds' spread leaves that in doubt.
func verdict(median, low, high, target float64) string {
	switch {
	case median >= target && low >= target:
		return "met"
	case median >= target:
		return "met (a quarter of the rounds or more missed it)"
	case high >= target:
		return "MISSED (a quarter of the rounds or more met it)"
	}
	return "MISSED"
}

// medianCPU is each process's median CPU time per request over the rounds.
func medianCPU(rounds []result) cpuTimes {
	of := func(pick func(cpuTimes) time.Duration) time.Duration {
		ds := make([]time.Duration, len(rounds))
		for i, r := range rounds {
			ds[i] = pick(r.cpu)
		}
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	return cpuTimes{
		caddy: of(func(c cpuTimes) time.Duration { return c.caddy }),
		redis: of(func(c cpuTimes) time.Duration { return c.redis }),
		load:  of(func(c cpuTimes) time.Duration { return c.load }),
	}
}

// selectVariants is what -only keeps: the variants whose label matches re,
// and the baselines they are compared with, in their usual order.
func selectVariants(re *regexp.Regexp) []variant {
	keep := map[string]bool{}
	for _, v := range variants {
		if re.MatchString(v.label) {
			keep[v.label], keep[v.baseline] = true, true // a baseline's own baseline is "", no label
		}
	}
	return slices.DeleteFunc(slices.Clone(variants), func(v variant) bool { return !keep[v.label] })
}

func variantLabelled(label string) (variant, bool) {
	for _, v := range variants {
		if v.label == label {
			return v, true
		}
	}
	return variant{}, false
}

func variantLabels() string {
	var b strings.Builder
	for _, v := range variants {
		fmt.Fprintf(&b, "  %q\n", v.label)
	}
	return b.String()
}

// usesRedis reports a site whose store is Redis.
func (s *site) usesRedis() bool { return strings.Contains(s.config, "store redis") }

func shortName(label string) string {
	switch label {
	case plainNew:
		return "plain proxy"
	case static:
		return "static respond"
	default:
		return "plain proxy (mix)"
	}
}
