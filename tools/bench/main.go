// Command bench measures telemetry_dedup against plain Caddy in one run: it
// builds Caddy with the module (as pinned in xcaddy.json), starts one Caddy
// serving every variant on its own port in front of a fast upstream (a Caddy
// respond site), starts a throwaway redis-server, and drives each variant
// with the same Go load generator and the same bodies, alternating the
// variants over several rounds. It prints throughput as ratios against the
// baselines measured in the same run, since machines are noisy.
//
//	go run ./tools/bench                      # 3 rounds of 3 s per variant, 32 connections
//	go run ./tools/bench -rounds 5 -duration 5s -conns 64
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/xbuild"
)

func main() {
	rounds := flag.Int("rounds", 3, "rounds over all variants")
	duration := flag.Duration("duration", 3*time.Second, "load per variant and round")
	conns := flag.Int("conns", 32, "concurrent connections of the load generator")
	flag.Parse()
	if err := run(*rounds, *duration, *conns); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
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

func run(rounds int, duration time.Duration, conns int) error {
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

	sites := []*site{
		{name: "plain", config: "reverse_proxy %s"},
		{name: "memory", config: "telemetry_dedup {\n\t\tkey_prefix bench-memory:\n\t}\n\treverse_proxy %s"},
		{name: "redis", config: "telemetry_dedup {\n\t\tkey_prefix bench-redis:\n\t\tstore redis " + rdb.url + "\n\t\tnear_cache off\n\t}\n\treverse_proxy %s"},
		{name: "redis-near", config: "telemetry_dedup {\n\t\tkey_prefix bench-redis-near:\n\t\tstore redis " + rdb.url + "\n\t}\n\treverse_proxy %s"},
		{name: "sliding", config: "telemetry_dedup {\n\t\tkey_prefix bench-sliding:\n\t\tshape sliding\n\t\tstore redis " + rdb.url + "\n\t}\n\treverse_proxy %s"},
		{name: "session", config: "telemetry_dedup {\n\t\tkey_prefix bench-session:\n\t\tshape session\n\t\tstore redis " + rdb.url + "\n\t}\n\treverse_proxy %s"},
		{name: "static", config: "respond 200"},
	}
	stopCaddy, metricsURL, err := startCaddy(dir, caddyBin, sites)
	if err != nil {
		return err
	}
	defer stopCaddy()

	results := map[string][]result{}
	for r := range rounds {
		for _, v := range variants {
			s := siteNamed(sites, v.site)
			rtBefore, cmdsBefore := redisTotals(metricsURL)
			res := load(fmt.Sprintf("http://127.0.0.1:%d/", s.port), v.bodies, conns, duration, uint64(r))
			if usesRedis(v.site) {
				rt, cmds := redisTotals(metricsURL)
				res.roundTrips = (rt - rtBefore) / float64(res.requests)
				res.commands = (cmds - cmdsBefore) / float64(res.requests)
			}
			fmt.Fprintf(os.Stderr, "round %d  %-50s %8.0f req/s  p50 %-9s p99 %-9s errors %d\n",
				r+1, v.label, res.rps, res.p50, res.p99, res.errors)
			results[v.label] = append(results[v.label], res)
		}
	}
	report(results, rounds, duration, conns)
	return redisMemory(rdb)
}

func siteNamed(sites []*site, name string) *site {
	for _, s := range sites {
		if s.name == name {
			return s
		}
	}
	panic("no site " + name)
}

// build runs the pinned xcaddy recipe on this checkout.
func build(output string) error {
	recipe, err := xbuild.Load(".")
	if err != nil {
		return fmt.Errorf("%v (run it from the repository root)", err)
	}
	cmd, err := recipe.Command(context.Background(), ".", output)
	if err != nil {
		return err
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("xcaddy build: %v\n%s", err, out)
	}
	return nil
}

// redisServer is the benchmark's throwaway Redis.
type redisServer struct {
	url    string
	client *redis.Client
}

func startRedis(dir string) (*redisServer, func(), error) {
	port := freePort()
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir)
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("starting redis-server (is it installed?): %v", err)
	}
	stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	client := redis.NewClient(&redis.Options{Addr: addr})
	for deadline := time.Now().Add(10 * time.Second); client.Ping(context.Background()).Err() != nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			stop()
			return nil, nil, fmt.Errorf("redis-server on %s did not answer", addr)
		}
	}
	return &redisServer{url: "redis://" + addr + "/0", client: client}, stop, nil
}

// startCaddy serves every site, and the upstream, from one Caddy process.
func startCaddy(dir, bin string, sites []*site) (stop func(), metricsURL string, err error) {
	upstream := fmt.Sprintf("127.0.0.1:%d", freePort())
	admin := fmt.Sprintf("127.0.0.1:%d", freePort())
	var b strings.Builder
	fmt.Fprintf(&b, "{\n\tauto_https off\n\tadmin %s\n}\n\nhttp://%s {\n\trespond 201\n}\n", admin, upstream)
	for _, s := range sites {
		s.port = freePort()
		config := s.config
		if strings.Contains(config, "%s") {
			config = fmt.Sprintf(config, upstream)
		}
		fmt.Fprintf(&b, "\nhttp://127.0.0.1:%d {\n\t%s\n}\n", s.port, config)
	}
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return nil, "", err
	}
	cmd := exec.Command(bin, "run", "--config", path)
	cmd.Env = append(os.Environ(), "HOME="+dir)
	logFile, err := os.Create(filepath.Join(dir, "caddy.log"))
	if err != nil {
		return nil, "", err
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	stop = func() { _ = cmd.Process.Signal(os.Interrupt); _ = cmd.Wait() }
	for _, s := range sites {
		addr := fmt.Sprintf("127.0.0.1:%d", s.port)
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if c, err := net.Dial("tcp", addr); err == nil {
				c.Close()
				break
			}
			if time.Now().After(deadline) {
				stop()
				log, _ := os.ReadFile(logFile.Name())
				return nil, "", fmt.Errorf("caddy did not listen on %s:\n%s", addr, log)
			}
		}
	}
	return stop, "http://" + admin + "/metrics", nil
}

// result is one variant's measurement in one round.
type result struct {
	rps                  float64
	requests, errors     int64
	p50, p99             time.Duration
	roundTrips, commands float64 // Redis, per request
}

// load drives url with conns keep-alive connections for duration.
func load(url string, kind bodyKind, conns int, duration time.Duration, round uint64) result {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns}, Timeout: 10 * time.Second}
	var count, errs atomic.Int64
	latencies := make([][]time.Duration, conns)
	if kind == allDuplicate { // the one duplicate is claimed and settled before the clock starts
		if res, err := client.Post(url, "application/json", strings.NewReader(newBodies(kind, round, 0).next())); err == nil {
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
	}
	deadline := time.Now().Add(duration)
	var wg sync.WaitGroup
	for w := range conns {
		wg.Go(func() {
			gen := newBodies(kind, round, uint64(w))
			lat := make([]time.Duration, 0, 1<<16)
			for time.Now().Before(deadline) {
				body := gen.next()
				start := time.Now()
				res, err := client.Post(url, "application/json", strings.NewReader(body))
				if err != nil {
					errs.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.StatusCode >= 300 {
					errs.Add(1)
				}
				lat = append(lat, time.Since(start))
				count.Add(1)
			}
			latencies[w] = lat
		})
	}
	wg.Wait()
	client.CloseIdleConnections()
	all := slices.Concat(latencies...)
	slices.Sort(all)
	r := result{rps: float64(count.Load()) / duration.Seconds(), requests: count.Load(), errors: errs.Load()}
	if len(all) > 0 {
		r.p50, r.p99 = all[len(all)/2].Round(time.Microsecond), all[len(all)*99/100].Round(time.Microsecond)
	}
	return r
}

// bodies generates the pings of one connection.
type bodies struct {
	kind   bodyKind
	rng    *rand.Rand
	prefix string
	n      int
	sent   []string
	base   time.Time
}

func newBodies(kind bodyKind, round, worker uint64) *bodies {
	return &bodies{
		kind: kind, rng: rand.New(rand.NewPCG(round, worker)),
		prefix: fmt.Sprintf("r%d-w%d-%d", round, worker, time.Now().UnixNano()),
		base:   time.Now().UTC().Truncate(5 * time.Minute).Add(-time.Hour),
	}
}

const fleetAssets = 500

func (b *bodies) next() string {
	b.n++
	switch b.kind {
	case allNew:
		return b.ping(fmt.Sprintf("%s-%d", b.prefix, b.n), b.base, 52.52, 13.40)
	case allDuplicate:
		return b.ping("duplicate", b.base, 52.5200087, 13.4049547)
	}
	// A fleet of 500: 70% parked jitter, 20% re-observations, 5%
	// redeliveries, 5% moves.
	asset := b.rng.IntN(fleetAssets)
	lat, lon := 52.40+float64(asset)*0.001, 13.40
	at := b.base.Add(time.Duration(b.rng.IntN(300)) * time.Second)
	var body string
	switch r := b.rng.Float64(); {
	case r < 0.70:
		body = b.ping(strconv.Itoa(asset), at, lat+(b.rng.Float64()-0.5)*4e-5, lon+(b.rng.Float64()-0.5)*6e-5)
	case r < 0.90:
		body = b.ping(strconv.Itoa(asset), at, lat, lon)
	case r < 0.95 && len(b.sent) > 0:
		return b.sent[b.rng.IntN(len(b.sent))]
	default:
		body = b.ping(strconv.Itoa(asset), at, lat+b.rng.Float64()*0.01, lon+b.rng.Float64()*0.01)
	}
	if len(b.sent) < 1024 {
		b.sent = append(b.sent, body)
	}
	return body
}

func (b *bodies) ping(asset string, at time.Time, lat, lon float64) string {
	return fmt.Sprintf(`{"asset_id":"fleet-%s","occurred_at":"%s","lat":%.7f,"lon":%.7f,"speed_kmh":0,"heading":270}`,
		asset, at.Format(time.RFC3339), lat, lon)
}

// report prints the medians of the rounds as ratios to their baselines,
// then the ratios the issue sets targets for.
func report(results map[string][]result, rounds int, duration time.Duration, conns int) {
	median := func(label string) result {
		byRPS := slices.Clone(results[label])
		slices.SortFunc(byRPS, func(a, b result) int { return cmp.Compare(a.rps, b.rps) })
		return byRPS[len(byRPS)/2]
	}
	ratioOf := func(v variant) float64 { return median(v.label).rps / median(v.baseline).rps }
	fmt.Printf("\n%d rounds x %s per variant, %d connections, one Caddy, medians of the rounds:\n\n", rounds, duration, conns)
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.Debug)
	fmt.Fprintln(tw, "variant\treq/s\tratio\tp50\tp99\tRedis round trips / ping\tcommands / ping\terrors\t")
	for _, v := range variants {
		m := median(v.label)
		ratio := "1.00 (baseline)"
		if v.baseline != "" {
			ratio = fmt.Sprintf("%.2fx %s", ratioOf(v), shortName(v.baseline))
		}
		rt, cmds := "-", "-"
		if usesRedis(v.site) {
			rt, cmds = fmt.Sprintf("%.3f", m.roundTrips), fmt.Sprintf("%.2f", m.commands)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%d\t\n", v.label, m.rps, ratio, m.p50, m.p99, rt, cmds, m.errors)
	}
	tw.Flush()

	fmt.Printf("\nAgainst the targets:\n\n")
	tw = tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.Debug)
	fmt.Fprintln(tw, "ratio\tmeasured\ttarget\t\t")
	for _, tg := range targets {
		v := variantNamed(tg.variant)
		r, verdict := ratioOf(v), "met"
		if r < tg.atLeast {
			verdict = "MISSED"
		}
		fmt.Fprintf(tw, "%s / %s\t%.2f\t>= %.2f\t%s\t\n", v.label, shortName(v.baseline), r, tg.atLeast, verdict)
	}
	tw.Flush()
}

func variantNamed(label string) variant {
	for _, v := range variants {
		if v.label == label {
			return v
		}
	}
	panic("no variant " + label)
}

// usesRedis reports a site whose store is Redis.
func usesRedis(site string) bool {
	return site != "plain" && site != "static" && site != "memory"
}

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

// redisMemory prints what Redis holds per live key of each shape's sites
// (MEMORY USAGE, mean over a sample), and per kind of key.
func redisMemory(rdb *redisServer) error {
	ctx := context.Background()
	fmt.Printf("\nRedis memory per live key (MEMORY USAGE, mean of a sample of each kind):\n\n")
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.Debug)
	fmt.Fprintln(tw, "shape\tkey\tbytes\tsampled\t")
	for _, kind := range []struct{ shape, what, pattern string }{
		{"tumbling", "claim (one per admitted ping)", "bench-redis-near:*"},
		{"sliding", "track (one per asset)", "bench-sliding:*:s"},
		{"sliding", "seen set (one per asset-minute)", "bench-sliding:*:m*"},
		{"session", "track (one per asset)", "bench-session:*:s"},
		{"session", "seen set (one per asset-minute)", "bench-session:*:m*"},
	} {
		keys, err := sampleKeys(ctx, rdb.client, kind.pattern, 500)
		if err != nil {
			return err
		}
		total, sampled := int64(0), 0
		for _, k := range keys {
			if n, err := rdb.client.MemoryUsage(ctx, k).Result(); err == nil {
				total += n
				sampled++
			}
		}
		if sampled > 0 {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t\n", kind.shape, kind.what, total/int64(sampled), sampled)
		}
	}
	return tw.Flush()
}

// sampleKeys scans for up to n keys matching pattern.
func sampleKeys(ctx context.Context, c *redis.Client, pattern string, n int) ([]string, error) {
	var keys []string
	var cursor uint64
	for {
		page, next, err := c.Scan(ctx, cursor, pattern, 1000).Result()
		if err != nil {
			return nil, err
		}
		keys = append(keys, page...)
		if cursor = next; cursor == 0 || len(keys) >= n {
			return keys, nil
		}
	}
}

// redisTotals reads the module's Redis round trips and commands so far from
// Caddy's metrics.
func redisTotals(metricsURL string) (roundTrips, commands float64) {
	res, err := http.Get(metricsURL)
	if err != nil {
		return 0, 0
	}
	defer res.Body.Close()
	text, _ := io.ReadAll(res.Body)
	for _, line := range strings.Split(string(text), "\n") {
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		f, _ := strconv.ParseFloat(value, 64)
		switch name {
		case "caddy_telemetry_dedup_redis_round_trips_total":
			roundTrips = f
		case "caddy_telemetry_dedup_redis_commands_total":
			commands = f
		}
	}
	return roundTrips, commands
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
