package telemetrydedup

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// exportedMetricNames registers the module's collectors into a fresh
// registry and returns the names it exposes.
func exportedMetricNames(t *testing.T) map[string]bool {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := registerMetrics(reg); err != nil {
		t.Fatal(err)
	}
	// Vectors only show up once a series exists.
	metrics.decisions.WithLabelValues("accepted", "")
	metrics.storeDuration.WithLabelValues("memory", "decide")
	metrics.storeErrors.WithLabelValues("memory", "decide")
	metrics.releases.WithLabelValues("released")
	metrics.breakerTransitions.WithLabelValues("open")
	metrics.reconciled.WithLabelValues("released")
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range families {
		names[f.GetName()] = true
	}
	return names
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
