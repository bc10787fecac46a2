package telemetrydedup

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// With key_scope, the admin endpoint lists a stuck asset as its id and its
// scope, not as the scoped identity its keys are made of.
func TestStuckAssetsShowTheirScopeApart(t *testing.T) {
	h := &Handler{storeData: "memory"}
	s := &h.settings
	s.keyer.Prefix = "test:" + t.Name() + ":"
	s.stuckRatio, s.stuckAfter, s.stuckTrack = 0.9, time.Minute, 10
	h.loadStuckTracker()
	defer h.releaseStuckTracker()
	start := time.Now()
	for i := range 70 {
		h.stuck.Observe(dedup.ScopedAsset("acme.example", "truck-1"), dedup.Verdict{Decision: dedup.Suppressed, Reason: dedup.Redelivery},
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

// adminStuckRows is what an operator's `curl localhost:2019/telemetry_dedup/stuck`
// lists for one key_prefix.
func adminStuckRows(t *testing.T, prefix string) []stuckAsset {
	t.Helper()
	w := httptest.NewRecorder()
	if err := serveStuck(w, httptest.NewRequest(http.MethodGet, "/telemetry_dedup/stuck", nil)); err != nil {
		t.Fatal(err)
	}
	var report stuckReport
	if err := json.Unmarshal(w.Body.Bytes(), &report); err != nil {
		t.Fatalf("admin answer %q: %v", w.Body.String(), err)
	}
	var rows []stuckAsset
	for _, a := range report.Stuck {
		if a.KeyPrefix == prefix {
			rows = append(rows, a)
		}
	}
	return rows
}

// Two sites on two Redis servers with one key_prefix share no key, and no
// stuck list: site A's truck-1, stuck on a cached fix (every ping after
// the first suppressed), is listed, with its store, though site B's
// truck-1 drives on, every ping accepted. Sharing one list by key_prefix
// and mode, B's accepted pings went into A's truck's history, and a row
// could not say whose truck it was. (Helper 6's review, stop 62.)
//
// Setup: two real Redis servers, two handlers with one key_prefix,
// window 1s, stuck_after 2s; A's truck posts the same ping 70 times over
// about 2.8 s while B's posts a new position every 0.4 s.
func TestAStuckAssetIsNotHiddenByAnotherSitesAssetOfTheSameIDOnAnotherStore(t *testing.T) {
	ra, rb := redistest.Start(t), redistest.Start(t)
	prefix := "stuck-sites:"
	config := func(url string) string {
		return fmt.Sprintf(`{"key_prefix":%q,"window":1000000000,"stuck_after":2000000000,"near_cache":0,"store":{"type":"redis","url":%q,"timeout":1000000000}}`, prefix, url)
	}
	siteA, siteB := tableHandler(t, config(ra.URL())), tableHandler(t, config(rb.URL()))

	fixed := time.Now().UTC().Add(-time.Minute).Truncate(time.Second)
	cached := fmt.Sprintf(`{"asset_id":"truck-1","occurred_at":%q,"lat":52.5200087,"lon":13.4049547}`, fixed.Format(time.RFC3339))
	suppressed := 0
	for i := range 70 {
		res := siteA.post(cached, "application/json", nil)
		if i > 0 && res.header.Get("X-Dedup") != "accepted" {
			suppressed++
		}
		if i%10 == 5 { // site B's truck-1 drives on: a new position, accepted
			at := time.Now().UTC().Truncate(time.Second)
			moving := fmt.Sprintf(`{"asset_id":"truck-1","occurred_at":%q,"lat":%.6f,"lon":13.4049547}`, at.Format(time.RFC3339), 48.0+float64(i)*0.01)
			if res := siteB.post(moving, "application/json", nil); res.header.Get("X-Dedup") != "accepted" {
				t.Fatalf("setup: site B's moving truck-1 got %d %v", res.status, res.header)
			}
		}
		time.Sleep(40 * time.Millisecond)
	}
	if suppressed != 69 {
		t.Fatalf("setup: site A's cached fix was suppressed %d times of 69", suppressed)
	}
	rows := adminStuckRows(t, prefix)
	if len(rows) != 1 || rows[0].Asset != "truck-1" {
		t.Fatalf("site A's truck-1, all 69 of its pings after the first suppressed over %s (stuck_after 2s), is not listed stuck: "+
			"the admin endpoint lists %+v for key_prefix %q; site B's accepted truck-1 (another Redis) was counted in its history", 70*40*time.Millisecond, rows, prefix)
	}
	if !strings.Contains(rows[0].Store, ra.Addr()) {
		t.Errorf("the row names the store %q; want site A's Redis, %s, so that the operator can tell the sites' truck-1 apart", rows[0].Store, ra.Addr())
	}
}

// The README advises raising stuck_after when the list is noise, and says
// the list survives a reload. A reload that changed stuck_after (or
// window, whose 3× is its default) started an empty tracker: an asset
// stuck for 3 h, still stuck under the new setting, left the admin list
// and the gauge for 64 more pings (5 h 20 min at a 5-minute interval).
// (Helper 3's review, stop 64.)
func TestAReloadThatRaisesStuckAfterKeepsAStuckAssetListed(t *testing.T) {
	for _, tc := range []struct{ name, before, after string }{
		{"stuck_after raised", `"stuck_after":900000000000`, `"stuck_after":3600000000000`},
		{"window changed", `"window":300000000000`, `"window":600000000000`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := "stuck-reload-" + strings.ReplaceAll(tc.name, " ", "-") + ":"
			old, cleanupOld := loadConfig(t, fmt.Sprintf(`{"key_prefix":%q,%s}`, prefix, tc.before))
			makeStuck(old.h, "veh-stuck-reload", dedup.Redelivery)
			if rows := adminStuckRows(t, prefix); len(rows) != 1 {
				t.Fatalf("setup: %d rows before the reload, want 1", len(rows))
			}
			_, cleanupNew := loadConfig(t, fmt.Sprintf(`{"key_prefix":%q,%s}`, prefix, tc.after))
			defer cleanupNew()
			cleanupOld() // Caddy provisions the new config, then cleans up the old one
			if rows := adminStuckRows(t, prefix); len(rows) != 1 {
				t.Errorf("after a reload with %s, an asset stuck for 3 h (none accepted, every ping suppressed) is listed %d times, want 1",
					tc.after, len(rows))
			}
		})
	}
}

// A reload that Caddy rolls back (the new config provisions, then fails
// to start: a listener it cannot bind, another module's error) leaves the
// old config running as it was. The shared stuck tracker is reconfigured
// by the new config's Provision (loadStuckTracker calls Configure) and
// nothing puts the old settings back when the new config is cleaned up:
// the running handlers, still configured stuck_after 15m, now list
// nothing stuck for less than 3 h, and a lowered stuck_track has dropped
// assets for good. (Helper 5's review, stop 64.)
func TestARolledBackReloadLeavesTheRunningStuckSettingsAlone(t *testing.T) {
	prefix := "stuck-rollback:"
	old, cleanupOld := loadConfig(t, fmt.Sprintf(`{"key_prefix":%q,"stuck_after":900000000000}`, prefix))
	defer cleanupOld()
	makeStuck(old.h, "veh-stuck-rollback", "redelivery")
	if rows := adminStuckRows(t, prefix); len(rows) != 1 {
		t.Fatalf("setup: %d rows, want 1", len(rows))
	}
	_, cleanupNew := loadConfig(t, fmt.Sprintf(`{"key_prefix":%q,"stuck_after":10800000000000}`, prefix))
	cleanupNew() // the new config failed to start: Caddy cleans it up, the old one runs on
	if rows := adminStuckRows(t, prefix); len(rows) != 1 {
		t.Errorf("after a rolled-back reload, the running config (stuck_after 15m) lists the asset stuck for 2 h 20 min %d times, want 1", len(rows))
	}
}

// Two handlers of one store, key_prefix and mode (two routes of a site,
// say the Overland and the OsmAnd endpoints) share one stuck list, whose
// settings are the last loaded handler's, as the README says; and it says
// the list survives a reload. With the first handler at stuck_track 1 and
// the last at 10000, the list holds 10000 assets, but every reload
// provisions the first handler again, and its Configure resizes the shared
// tracker to 1 on the way: all but one stuck asset are dropped, though the
// settings the reload ends with keep them all. (Helper 5's review, stop 64.)
func TestAReloadKeepsTheStuckAssetsTheLastHandlersTrackHolds(t *testing.T) {
	prefix := "stuck-resize:"
	small := fmt.Sprintf(`{"key_prefix":%q,"stuck_track":1}`, prefix)
	large := fmt.Sprintf(`{"key_prefix":%q,"stuck_track":10000}`, prefix)
	_, cleanupSmall := loadConfig(t, small)
	live, cleanupLarge := loadConfig(t, large)
	for _, a := range []string{"veh-1", "veh-2", "veh-3"} {
		makeStuck(live.h, a, "redelivery")
	}
	if rows := adminStuckRows(t, prefix); len(rows) != 3 {
		t.Fatalf("setup: %d rows, want 3", len(rows))
	}
	// The reload: the new config's handlers in their order, then the old
	// config cleaned up.
	_, cleanupSmall2 := loadConfig(t, small)
	defer cleanupSmall2()
	_, cleanupLarge2 := loadConfig(t, large)
	defer cleanupLarge2()
	cleanupSmall()
	cleanupLarge()
	if rows := adminStuckRows(t, prefix); len(rows) != 3 {
		t.Errorf("after a reload that changed nothing (the last handler's stuck_track 10000), %d of 3 stuck assets are listed, want all 3", len(rows))
	}
}

// stuckSettingsProbe is an app that, once the http app is provisioned,
// notes the stuck_after the shared tracker of key_prefix stuck-servers:
// runs with.
type stuckSettingsProbe struct{}

var stuckSettingsSeen []time.Duration

func (stuckSettingsProbe) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "stuck_settings_probe", New: func() caddy.Module { return new(stuckSettingsProbe) }}
}

func (*stuckSettingsProbe) Provision(ctx caddy.Context) error {
	if _, err := ctx.App("http"); err != nil {
		return err
	}
	stuckTrackers.Range(func(_, v any) bool {
		if tv := v.(stuckTrackerValue); tv.keyPrefix == "stuck-servers:" {
			tv.holders.mu.Lock()
			stuckSettingsSeen = append(stuckSettingsSeen, tv.holders.settingsLocked().after)
			tv.holders.mu.Unlock()
		}
		return true
	})
	return nil
}
func (*stuckSettingsProbe) Start() error { return nil }
func (*stuckSettingsProbe) Stop() error  { return nil }

func init() { caddy.RegisterModule(stuckSettingsProbe{}) }

// Two site blocks on two ports are two servers of Caddy's http app, say
// Overland's phones on :443 and Traccar's OsmAnd port :5055, on one Redis
// and key_prefix: one stuck list, whose stuck_after the README says is
// "the newest loaded handler's" (until helper 7's review). Caddy provisions the servers in Go map
// order (caddyhttp/app.go, `for srvName, srv := range app.Servers`), so
// which handler is newest is drawn anew at every load: the same config,
// loaded again (a `caddy reload --force`, a restart), runs its stuck list
// at 15 min one time and 3 h the next, and assets appear and vanish from
// the list and the gauge with no change of config. It runs with the
// largest of each setting. (Helper 7's review, stop 64.)
func TestTheSameConfigRunsItsStuckListWithTheSameSettingsEveryLoad(t *testing.T) {
	handler := func(after time.Duration) string {
		return fmt.Sprintf(`{"handle":[{"handler":"telemetry_dedup","key_prefix":"stuck-servers:","stuck_after":%d}]}`, after)
	}
	cfg := fmt.Sprintf(`{"apps":{"stuck_settings_probe":{},"http":{"servers":{
		"overland":{"listen":["127.0.0.1:18443"],"automatic_https":{"disable":true},"routes":[%s]},
		"osmand":{"listen":["127.0.0.1:15055"],"automatic_https":{"disable":true},"routes":[%s]}}}}}`,
		handler(15*time.Minute), handler(3*time.Hour))
	var c caddy.Config
	if err := json.Unmarshal([]byte(cfg), &c); err != nil {
		t.Fatal(err)
	}
	stuckSettingsSeen = nil
	for range 100 {
		var again caddy.Config
		_ = json.Unmarshal([]byte(cfg), &again)
		if err := caddy.Validate(&again); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[time.Duration]int{}
	for _, d := range stuckSettingsSeen {
		seen[d]++
	}
	if len(stuckSettingsSeen) != 100 {
		t.Fatalf("setup: the probe saw the tracker %d times in 100 loads", len(stuckSettingsSeen))
	}
	if len(seen) > 1 {
		t.Errorf("100 loads of one config ran the shared stuck list with stuck_after %v (times each): it depends on Caddy's map order", seen)
	}
}
