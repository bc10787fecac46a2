package telemetrydedup

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// exportedMetricNames returns the names the module's collectors expose.
func exportedMetricNames(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	for _, f := range everyMetric(t) {
		names[f.GetName()] = true
	}
	return names
}

// dashboard is what the tests read of grafana/telemetry_dedup.json.
type dashboard struct {
	Panels []struct {
		Title       string `json:"title"`
		FieldConfig struct {
			Defaults struct {
				Unit string `json:"unit"`
			} `json:"defaults"`
			Overrides []struct {
				Matcher struct {
					ID      string `json:"id"`
					Options string `json:"options"`
				} `json:"matcher"`
				Properties []struct {
					ID    string `json:"id"`
					Value any    `json:"value"`
				} `json:"properties"`
			} `json:"overrides"`
		} `json:"fieldConfig"`
		Targets []struct {
			Expr         string `json:"expr"`
			LegendFormat string `json:"legendFormat"`
		} `json:"targets"`
	} `json:"panels"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	raw, err := os.ReadFile("grafana/telemetry_dedup.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash dashboard
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	return dash
}

// The dashboard must only chart what the module exports: a renamed metric
// would leave a panel silently empty.
func TestDashboardUsesOnlyExportedMetrics(t *testing.T) {
	raw, err := os.ReadFile("grafana/telemetry_dedup.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash any
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard is not JSON: %v", err)
	}
	exported := exportedMetricNames(t)
	name := regexp.MustCompile(`caddy_telemetry_dedup_[a-z_]+`)
	used := map[string]bool{}
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if expr, ok := v["expr"].(string); ok {
				for _, m := range name.FindAllString(expr, -1) {
					used[m] = true
				}
			}
			for _, c := range v {
				walk(c)
			}
		case []any:
			for _, c := range v {
				walk(c)
			}
		}
	}
	walk(dash)
	if len(used) == 0 {
		t.Fatal("the dashboard queries no telemetry_dedup metric")
	}
	for m := range used {
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_sum"), "_count")
		if !exported[base] {
			t.Errorf("the dashboard queries %s, which the module does not export (exported: %v)", m, exported)
		}
	}
	for m := range exported {
		if !used[m] && !used[m+"_bucket"] {
			t.Errorf("%s is exported but not on the dashboard", m)
		}
	}
}

// Two handlers in one config, and a reload, register the same collectors
// again: no duplicate-registration error.
func TestMetricsRegisterTwice(t *testing.T) {
	for range 2 {
		reg := prometheus.NewPedanticRegistry()
		if err := registerMetrics(reg); err != nil {
			t.Fatal(err)
		}
		if err := registerMetrics(reg); err != nil {
			t.Fatalf("second handler in the same config: %v", err)
		}
	}
}

// The counters summed over the shared stores never go down when a reload
// lets a store go: to Prometheus a counter that drops was reset, and a
// partial drop showed as a false spike in rate().
func TestStoreCountersSurviveAReloadThatReplacesTheStore(t *testing.T) {
	rdb := redistest.Start(t)
	load := func(timeout time.Duration) (*tableTester, func()) {
		return loadConfig(t, fmt.Sprintf(`{"key_prefix":"counters:","store":{"type":"redis","url":%q,"timeout":%d}}`, rdb.URL(), timeout.Nanoseconds()))
	}
	old, unloadOld := load(time.Second)
	at := time.Now().UTC().Add(-time.Hour).Format(time.RFC3339)
	if res := old.post(fmt.Sprintf(`{"asset_id":"veh-1","occurred_at":%q,"lat":52.5,"lon":13.4}`, at), "application/json", nil); res.status != http.StatusCreated {
		t.Fatalf("ping: %d %s", res.status, res.body)
	}
	before := sumStoreStats()
	_, unloadNew := load(2 * time.Second) // another timeout: another connection
	defer unloadNew()
	unloadOld()
	if after := sumStoreStats(); after.roundTrips < before.roundTrips || after.commands < before.commands {
		t.Fatalf("round trips %d -> %d, commands %d -> %d across the reload: the counters went down",
			before.roundTrips, after.roundTrips, before.commands, after.commands)
	}
}

// A connection a reload lets go of leaves the usage pool before its
// Destruct has closed its pipeline and reconciler, which against a hung
// Redis takes a while: its counts must stay counted until they are
// retired, or a scrape in between sees the counters drop.
func TestStoreCountersNeverDropWhileAConnectionCloses(t *testing.T) {
	rdb := redistest.Start(t)
	tt, unload := loadConfig(t, fmt.Sprintf(`{"key_prefix":"retire:","store":{"type":"redis","url":%q,"timeout":%d}}`,
		rdb.URL(), (300*time.Millisecond).Nanoseconds()))
	at := time.Now().UTC().Add(-time.Hour).Format(time.RFC3339)
	if res := tt.post(fmt.Sprintf(`{"asset_id":"veh-1","occurred_at":%q,"lat":52.5,"lon":13.4}`, at), "application/json", nil); res.status != http.StatusCreated {
		t.Fatalf("ping: %d %s", res.status, res.body)
	}
	rdb.Pause() // the next claim times out; its release waits in the reconciler
	defer rdb.Resume()
	tt.post(fmt.Sprintf(`{"asset_id":"veh-2","occurred_at":%q,"lat":48.1,"lon":11.6}`, at), "application/json", nil)

	before := sumStoreStats()
	unloaded := make(chan struct{})
	go func() { unload(); close(unloaded) }()
	lowest := before.roundTrips
	for closing := true; closing; {
		select {
		case <-unloaded:
			closing = false
		default:
		}
		lowest = min(lowest, sumStoreStats().roundTrips)
	}
	if lowest < before.roundTrips {
		t.Fatalf("redis_round_trips_total went from %d down to %d while the connection closed", before.roundTrips, lowest)
	}
}

// Guard: the README's Metrics table names every metric the module exports,
// with its type and labels, and no other; and its Placeholders table every
// placeholder the handler answers, and no other. The dashboard is held to
// the exported names (TestDashboardUsesOnlyExportedMetrics), the README
// was not: a metric renamed or a label added would leave its row wrong.
func TestREADMEMetricsAndPlaceholdersAreTheCodes(t *testing.T) {
	families := everyMetric(t)
	exported := map[string]string{} // name -> "type labels"
	for _, f := range families {
		var labels []string
		if len(f.GetMetric()) > 0 {
			for _, l := range f.GetMetric()[0].GetLabel() {
				labels = append(labels, l.GetName())
			}
		}
		slices.Sort(labels)
		exported[f.GetName()] = strings.ToLower(f.GetType().String()) + " " + strings.Join(labels, ",")
	}
	section := readmeSection(t, "Operations")
	documented := map[string]string{}
	for _, row := range regexp.MustCompile("(?m)^\\| `(caddy_telemetry_dedup_[a-z_]+)` \\| ([a-z]+) \\|([^|]*)\\|").FindAllStringSubmatch(section, -1) {
		var labels []string
		for _, l := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(row[3], -1) {
			labels = append(labels, l[1])
		}
		slices.Sort(labels)
		documented[row[1]] = row[2] + " " + strings.Join(labels, ",")
	}
	for name, want := range exported {
		if got, ok := documented[name]; !ok {
			t.Errorf("README's Metrics table has no row for %s (%s)", name, want)
		} else if got != want {
			t.Errorf("README's Metrics table gives %s as %q; the module exports %q", name, got, want)
		}
	}
	for name := range documented {
		if _, ok := exported[name]; !ok {
			t.Errorf("README's Metrics table lists %s, which the module does not export", name)
		}
	}

	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, placeholders, _ := strings.Cut(string(readme), "\n### Placeholders and logs\n")
	placeholders, _, _ = strings.Cut(placeholders, "\n### ")
	var named []string
	for _, row := range regexp.MustCompile("(?m)^\\| (`\\{http\\.telemetry_dedup\\.[^|]*) \\|").FindAllStringSubmatch(placeholders, -1) {
		for _, m := range regexp.MustCompile("`\\{(http\\.telemetry_dedup\\.[a-z_]+)\\}`|`\\.([a-z_]+)`").FindAllStringSubmatch(row[1], -1) {
			if m[1] != "" {
				named = append(named, m[1])
			} else {
				named = append(named, placeholderPrefix+m[2])
			}
		}
	}
	slices.Sort(named)
	code := slices.Clone(placeholderNames)
	slices.Sort(code)
	if !slices.Equal(named, code) {
		t.Errorf("README's Placeholders table names %q; the handler answers %q", named, code)
	}
}

// Guard: every label a dashboard query groups or filters by, and every
// label its legend shows, is a label of a metric that query reads (le for
// a histogram's buckets). TestDashboardUsesOnlyExportedMetrics holds the
// metric names; a label misspelt (by (outcomes), {results="hit"}) would
// leave a panel empty or its legend blank just the same.
func TestDashboardQueriesOnlyLabelsTheirMetricsHave(t *testing.T) {
	families := everyMetric(t)
	labelsOf := map[string][]string{}
	for _, f := range families {
		for _, l := range f.GetMetric()[0].GetLabel() {
			labelsOf[f.GetName()] = append(labelsOf[f.GetName()], l.GetName())
		}
		if f.GetType().String() == "HISTOGRAM" {
			labelsOf[f.GetName()+"_bucket"] = append(slices.Clone(labelsOf[f.GetName()]), "le")
		}
	}
	dash := readDashboard(t)
	metricName := regexp.MustCompile(`caddy_telemetry_dedup_[a-z_]+`)
	grouped := regexp.MustCompile(`by \(([a-z_, ]+)\)`)
	matched := regexp.MustCompile(`([a-z_]+)\s*(?:=~|!=|!~|=)\s*"`)
	legend := regexp.MustCompile(`\{\{\s*([a-z_]+)\s*\}\}`)
	checked := 0
	for _, p := range dash.Panels {
		for _, q := range p.Targets {
			have := []string{"instance", "job"} // the labels Prometheus gives every series it scrapes
			for _, m := range metricName.FindAllString(q.Expr, -1) {
				have = append(have, labelsOf[m]...)
			}
			var used []string
			for _, g := range grouped.FindAllStringSubmatch(q.Expr, -1) {
				for _, l := range strings.Split(g[1], ",") {
					used = append(used, strings.TrimSpace(l))
				}
			}
			for _, m := range matched.FindAllStringSubmatch(q.Expr, -1) {
				used = append(used, m[1])
			}
			for _, m := range legend.FindAllStringSubmatch(q.LegendFormat, -1) {
				used = append(used, m[1])
			}
			for _, l := range used {
				checked++
				if !slices.Contains(have, l) {
					t.Errorf("panel %q: %q uses the label %s, which none of its metrics has (%v)", p.Title, q.Expr, l, have)
				}
			}
		}
	}
	if checked < 10 {
		t.Fatalf("checked only %d labels: the dashboard's queries are no longer read", checked)
	}
}

// everyMetric registers the module's collectors into a fresh registry and
// gathers them, each vector with one series: vectors only show up, with
// their labels, once a series exists.
func everyMetric(t *testing.T) []*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := registerMetrics(reg); err != nil {
		t.Fatal(err)
	}
	metrics.decisions.WithLabelValues("accepted", "", modeEnforce)
	metrics.storeDuration.WithLabelValues("memory", "decide")
	metrics.storeErrors.WithLabelValues("memory", "decide")
	metrics.releases.WithLabelValues("released")
	metrics.breakerTransitions.WithLabelValues("open")
	metrics.reconciled.WithLabelValues("released")
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return families
}

// A fresh Caddy's metrics endpoint must already show, at 0, every series a
// counter's README-documented labels can take. A labelled counter that is
// born on its first event is born at that event's value, and Prometheus's
// rate() and increase() cannot see the step from "absent" to N: the first
// upstream failure of a process (a whole batch's claims, up to max_batch,
// released at once) and the first breaker opening of an outage are
// invisible on grafana/telemetry_dedup.json's "releases" and breaker panels,
// which show "No data" until then. Seen on a live xcaddy build: after the
// first 500 from upstream, /metrics showed
// caddy_telemetry_dedup_releases_total{outcome="released"} 1 where a scrape
// before showed no releases_total series at all. Prometheus's own guidance
// (instrumentation best practices, "avoid missing metrics") is to
// initialise label values known in advance; the README's Metrics table lists
// them. The check runs in a child process, since other tests of the package
// touch these series in the shared registry.
func TestFreshMetricsShowEveryKnownCounterSeriesAtZero(t *testing.T) {
	if os.Getenv("TD_FRESH_METRICS_CHILD") == "1" {
		checkFreshMetrics(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestFreshMetricsShowEveryKnownCounterSeriesAtZero$", "-test.count", "1")
	cmd.Env = append(os.Environ(), "TD_FRESH_METRICS_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("in a fresh process:\n%s", out)
	}
}

func checkFreshMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	if err := registerMetrics(reg); err != nil {
		t.Fatal(err)
	}
	// A memory-store handler provisioned and serving, as Caddyfile.example.
	_, unload := loadConfig(t, `{}`)
	defer unload()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			sort.Strings(labels)
			have[f.GetName()+"{"+strings.Join(labels, ",")+"}"] = true
		}
	}
	want := []string{
		// already initialised by the module (a check of this test itself)
		`caddy_telemetry_dedup_near_cache_lookups_total{result=hit}`,
		// README, Metrics: releases_total, outcome released | not_held | error
		`caddy_telemetry_dedup_releases_total{outcome=released}`,
		`caddy_telemetry_dedup_releases_total{outcome=not_held}`,
		`caddy_telemetry_dedup_releases_total{outcome=error}`,
		// near_cache_lookups_total is initialised (hit, miss): the same for
		// breaker_transitions_total, to open | half_open | closed
		`caddy_telemetry_dedup_breaker_transitions_total{to=open}`,
		`caddy_telemetry_dedup_breaker_transitions_total{to=half_open}`,
		`caddy_telemetry_dedup_breaker_transitions_total{to=closed}`,
	}
	for _, outcome := range []string{"released", "released_late", "not_held", "settled", "dropped", "expired", "unconfirmed"} {
		want = append(want, `caddy_telemetry_dedup_reconciled_total{outcome=`+outcome+`}`)
	}
	var missing []string
	for _, w := range want {
		if !have[w] {
			missing = append(missing, w)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("a freshly provisioned handler exports no series for %v: their first event is lost to rate()/increase()", missing)
	}
}

// A dashboard panel in a rate unit (reqps) charts rates, or says the unit
// of each series that is none: "Claims of timed-out store calls,
// reconciled by token" charted the gauge of claims waiting beside the
// rates, and 40 claims waiting read "40 req/s" during the very outage the
// panel is for (helper 4's finding).
func TestDashboardRatePanelsChartOnlyRates(t *testing.T) {
	dash := readDashboard(t)
	isRate := regexp.MustCompile(`\b(rate|irate)\(`)
	checked := 0
	for _, p := range dash.Panels {
		if p.FieldConfig.Defaults.Unit != "reqps" {
			continue
		}
		ownUnit := map[string]bool{} // series given a unit of their own
		for _, o := range p.FieldConfig.Overrides {
			for _, prop := range o.Properties {
				if o.Matcher.ID == "byName" && prop.ID == "unit" && prop.Value != "reqps" {
					ownUnit[o.Matcher.Options] = true
				}
			}
		}
		for _, q := range p.Targets {
			checked++
			if !isRate.MatchString(q.Expr) && !ownUnit[q.LegendFormat] {
				t.Errorf("panel %q is in req/s, and its series %q charts %s, no rate: give it a unit of its own", p.Title, q.LegendFormat, q.Expr)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no reqps panel: the dashboard is no longer read")
	}
}

// A dashboard ratio filters both its sides by the mode variable, or
// neither: the Redis round trips and commands are the whole process's, a
// shadow trial's among them, and divided by the live handler's pings alone
// (mode enforce picked while a trial runs) they read about twice what they
// are (helper 6's finding).
func TestDashboardRatiosFilterBothSidesByMode(t *testing.T) {
	dash := readDashboard(t)
	ratios := 0
	for _, p := range dash.Panels {
		for _, target := range p.Targets {
			sides := strings.Split(target.Expr, " / ")
			if len(sides) < 2 {
				continue
			}
			ratios++
			filtered := 0
			for _, s := range sides {
				if strings.Contains(s, `mode=~"$mode"`) {
					filtered++
				}
			}
			if filtered != 0 && filtered != len(sides) {
				t.Errorf("panel %q divides a series the mode variable does not filter by one it does: %s", p.Title, target.Expr)
			}
		}
	}
	if ratios == 0 {
		t.Fatal("no ratio on the dashboard: its queries are no longer read")
	}
}

// Each Caddy keeps a stuck list of its own, and each mode too (a shadow
// trial's): the "Stuck assets" panel shows each instance's and mode's
// count. It showed their max, one number, so an instance with stuck assets
// beside one with more hid its own, and a fleet behind three instances
// read as one. (Helper 6's review, stop 62.)
func TestTheStuckPanelShowsEachInstanceApart(t *testing.T) {
	grouped := regexp.MustCompile(`^sum by \(([a-z_, ]+)\) \(caddy_telemetry_dedup_stuck_assets\b`)
	for _, p := range readDashboard(t).Panels {
		if p.Title != "Stuck assets" {
			continue
		}
		for _, q := range p.Targets {
			m := grouped.FindStringSubmatch(q.Expr)
			if m == nil || !strings.Contains(m[1], "instance") || !strings.Contains(m[1], "mode") {
				t.Errorf("the stuck panel charts %q; want the stuck_assets gauge summed by instance and mode", q.Expr)
			}
		}
		return
	}
	t.Fatal("the dashboard has no \"Stuck assets\" panel")
}

// A store operation is timed and counted failed as what reached the store
// went: one the open breaker skipped whole is neither, but a Cluster
// batch of which one master's claims were skipped went to the other
// masters, and was neither timed nor counted. (Helper 6's review, stop 62.)
func TestAStoreOperationIsTimedIfAnyOfItReachedTheStore(t *testing.T) {
	for _, tt := range []struct {
		name          string
		err           error
		timed, failed bool
	}{
		{"answered", nil, true, false},
		{"failed", context.DeadlineExceeded, true, true},
		{"skipped whole by the breaker", dedup.ErrBreakerOpen, false, false},
		{"one master skipped, the other answered", &dedup.DecideError{Err: dedup.ErrBreakerOpen, Failed: []bool{true, false}}, true, false},
		{"one master skipped, the other timed out", &dedup.DecideError{Err: context.DeadlineExceeded, Failed: []bool{true, true}}, true, true},
		{"one master skipped, the other failed one claim", &dedup.DecideError{Err: context.DeadlineExceeded, Failed: []bool{true, false}}, true, true},
		{"every claim skipped", &dedup.DecideError{Err: dedup.ErrBreakerOpen, Failed: []bool{true, true}}, false, false},
	} {
		duration := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "d"})
		errs := prometheus.NewCounter(prometheus.CounterOpts{Name: "e"})
		observeOp(duration, errs, time.Now(), tt.err)
		var h, c dto.Metric
		if err := duration.Write(&h); err != nil {
			t.Fatal(err)
		}
		if err := errs.Write(&c); err != nil {
			t.Fatal(err)
		}
		if timed, failed := h.GetHistogram().GetSampleCount() == 1, c.GetCounter().GetValue() == 1; timed != tt.timed || failed != tt.failed {
			t.Errorf("%s: timed %v, counted failed %v; want %v, %v", tt.name, timed, failed, tt.timed, tt.failed)
		}
	}
}

// histogramQuantile is PromQL's histogram_quantile over cumulative
// buckets: a quantile that falls in the +Inf bucket is the highest finite
// bound.
func histogramQuantile(q float64, buckets []*dto.Bucket, count uint64) float64 {
	rank := q * float64(count)
	prevBound, prevCount := 0.0, 0.0
	for _, b := range buckets {
		if float64(b.GetCumulativeCount()) >= rank {
			c := float64(b.GetCumulativeCount()) - prevCount
			return prevBound + (b.GetUpperBound()-prevBound)*(rank-prevCount)/c
		}
		prevBound, prevCount = b.GetUpperBound(), float64(b.GetCumulativeCount())
	}
	return prevBound
}

// The dashboard's "Store latency p50 / p99" is histogram_quantile over
// store_duration_seconds. Its highest finite bucket was 0.25 s: a Redis
// answering every call in 0.6 s, under the README's timeout 1s, read
// p50 = p99 = 0.25 s, a latency no call had, in the very incident the
// panel is for. (Helper 3's review, stop 64.)
func TestStoreLatencyPanelCanShowACallSlowerThanAQuarterSecond(t *testing.T) {
	metricsOnce.Do(initMetrics)
	for _, took := range []float64{0.6, 1.5, 4} { // a timeout of 1s, of a few seconds
		obs := metrics.storeDuration.WithLabelValues(fmt.Sprintf("slow-store-test-%v", took), "decide")
		for range 100 {
			obs.Observe(took)
		}
		var m dto.Metric
		if err := obs.(prometheus.Metric).Write(&m); err != nil {
			t.Fatal(err)
		}
		h := m.GetHistogram()
		// within a factor of two, as a bucket of the 1-2.5-5 kind allows
		if p99 := histogramQuantile(0.99, h.GetBucket(), h.GetSampleCount()); p99 < took/2 || p99 > 2*took {
			t.Errorf("100 store calls of %v s each read p99 = %.3f s on the dashboard (highest finite bucket %v s)",
				took, p99, h.GetBucket()[len(h.GetBucket())-1].GetUpperBound())
		}
	}
}

// The "Redis circuit breakers" panel charted max(breakers_open): behind a
// load balancer, one instance skipping Redis and all of them read alike,
// as the stuck panel did before it showed each instance. (Helper 3's
// review, stop 64.)
func TestTheBreakerPanelShowsEveryInstancesOpenBreakers(t *testing.T) {
	found := false
	for _, p := range readDashboard(t).Panels {
		for _, q := range p.Targets {
			if !strings.Contains(q.Expr, "caddy_telemetry_dedup_breakers_open") {
				continue
			}
			found = true
			if !regexp.MustCompile(`^\s*sum by \(instance\)`).MatchString(q.Expr) || !strings.Contains(q.LegendFormat, "{{instance}}") {
				t.Errorf("panel %q charts %s as %q: want each instance's open breakers apart", p.Title, q.Expr, q.LegendFormat)
			}
		}
	}
	if !found {
		t.Fatal("no panel charts breakers_open")
	}
}

// A store outage's decisions series (unchecked or unavailable, reason
// store_error) are there from the load, at 0: born at the first unchecked
// ping, a process's first outage shorter than a scrape interval was on no
// panel, rate() seeing no step from nothing. In a fresh process, as the
// series are process-wide. (Helper 3's review, stop 64.)
func TestAFreshHandlerShowsItsStoreErrorDecisionsAtZero(t *testing.T) {
	if os.Getenv("TD_FRESH_DECISIONS_CHILD") == "1" {
		reg := prometheus.NewPedanticRegistry()
		if err := registerMetrics(reg); err != nil {
			t.Fatal(err)
		}
		_, unload := loadConfig(t, `{"key_prefix":"fresh-decisions:","mode":"shadow","on_store_error":"closed","on_invalid":"dead_letter",`+
			`"store":{"type":"redis","url":"redis://127.0.0.1:1/0"}}`)
		defer unload()
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, f := range families {
			if f.GetName() != "caddy_telemetry_dedup_decisions_total" {
				continue
			}
			for _, m := range f.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				got = append(got, labels["decision"]+"/"+labels["reason"]+"/"+labels["mode"])
			}
		}
		if !slices.Equal(got, []string{"unavailable/store_error/shadow"}) {
			t.Fatalf("a freshly loaded handler (on_store_error closed, shadow) exports decisions_total %v; want unavailable/store_error/shadow at 0", got)
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestAFreshHandlerShowsItsStoreErrorDecisionsAtZero$", "-test.count", "1")
	cmd.Env = append(os.Environ(), "TD_FRESH_DECISIONS_CHILD=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("in a fresh process:\n%s", out)
	}
}
