package telemetrydedup

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
)

// With key_scope, the admin endpoint lists a stuck asset as its id and its
// scope, not as the scoped identity its keys are made of.
func TestStuckAssetsShowTheirScopeApart(t *testing.T) {
	var s settings
	s.keyer.Prefix = "test:" + t.Name() + ":"
	s.stuckRatio, s.stuckAfter, s.stuckTrack = 0.9, time.Minute, 10
	tracker, key, err := loadStuckTracker(s)
	if err != nil {
		t.Fatal(err)
	}
	defer stuckTrackers.Delete(key)
	start := time.Now()
	for i := range 70 {
		tracker.Observe(dedup.ScopedAsset("acme.example", "truck-1"), dedup.Verdict{Decision: dedup.Suppressed, Reason: dedup.Redelivery},
			start.Add(time.Duration(i)*2*time.Second))
	}
	var mine []stuckAsset
	for _, a := range allStuckAssets(start.Add(3 * time.Minute)) {
		if a.KeyPrefix == s.keyer.Prefix {
			mine = append(mine, a)
		}
	}
	if len(mine) != 1 || mine[0].Asset != "truck-1" || mine[0].Scope != "acme.example" {
		t.Fatalf("stuck assets %+v, want truck-1 in scope acme.example", mine)
	}
}

// makeStuck has h see an asset accepted 3 h ago, then suppressed every 2
// minutes since: stuck by the default settings.
func makeStuck(h *Handler, asset string, reason dedup.Reason) {
	start := time.Now().Add(-3 * time.Hour)
	h.watchForStuck(asset, dedup.Verdict{Decision: dedup.Accepted}, start)
	for i := range 70 {
		h.watchForStuck(asset, dedup.Verdict{Decision: dedup.Suppressed, Reason: reason}, start.Add(time.Duration(i+1)*2*time.Minute))
	}
}

// A shadow trial keeps a stuck list of its own (a list shared with the
// live handler counted each ping twice), and caddy_telemetry_dedup_stuck_assets
// counts each list under its mode: counted together, one asset stuck to
// both was two stuck assets (helper 6's finding).
func TestOneAssetStuckInTheTrialAndTheLiveHandlerCountsOnceAMode(t *testing.T) {
	prefix := "stuck-modes:"
	trial := provisioned(t, &Handler{KeyPrefix: &prefix, Mode: "shadow", Shape: "session"})
	live := provisioned(t, &Handler{KeyPrefix: &prefix})
	reg := prometheus.NewPedanticRegistry()
	if err := registerMetrics(reg); err != nil {
		t.Fatal(err)
	}
	gauges := func() map[string]float64 {
		out := map[string]float64{}
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() != "caddy_telemetry_dedup_stuck_assets" {
				continue
			}
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "mode" {
						out[l.GetValue()] = m.GetGauge().GetValue()
					}
				}
			}
		}
		return out
	}
	before := gauges()
	makeStuck(trial, "veh-stuck-both", "session")
	makeStuck(live, "veh-stuck-both", "redelivery")
	after := gauges()
	for _, mode := range []string{modeEnforce, modeShadow} {
		if got := after[mode] - before[mode]; got != 1 {
			t.Errorf("one asset stuck to the trial and to the live handler moved stuck_assets{mode=%q} by %v, want 1 (all: %v)", mode, got, after)
		}
	}
}

// A shadow trial's stuck warning says it is the trial's, and whose key
// space: a session trial in front of the live handler (which suppresses a
// parked asset by design) warned of live assets exactly as the live
// handler would (helper 6's finding).
func TestAShadowTrialsStuckWarningSaysItIsTheTrials(t *testing.T) {
	prefix := "stuck-warn:"
	trial := provisioned(t, &Handler{KeyPrefix: &prefix, Mode: "shadow", Shape: "session"})
	core, logs := observer.New(zap.WarnLevel)
	trial.logger = zap.New(core)
	makeStuck(trial, "veh-stuck-warn", "session")
	warned := logs.FilterMessageSnippet("looks stuck").All()
	if len(warned) == 0 {
		t.Fatal("setup: no stuck warning")
	}
	if fields := warned[0].ContextMap(); fields["mode"] != modeShadow || fields["key_prefix"] != prefix {
		t.Errorf("the shadow trial's stuck warning has %v; want mode shadow and key_prefix %q", fields, prefix)
	}
}
