package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape reads the metrics endpoint of caddytest's Caddy.
func scrape(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	return scrapeAt(t, adminURL)
}

// scrapeAt reads the metrics endpoint of the Caddy whose admin API is at
// admin.
func scrapeAt(t *testing.T, admin string) map[string]*dto.MetricFamily {
	t.Helper()
	res, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(res.Body)
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return families
}

// decisionCounts is caddy_telemetry_dedup_decisions_total by "decision/reason",
// a shadow handler's as "shadow decision/reason".
func decisionCounts(t *testing.T) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	f := scrape(t)["caddy_telemetry_dedup_decisions_total"]
	if f == nil {
		return out
	}
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		key := labels["decision"] + "/" + labels["reason"]
		if labels["mode"] == "shadow" {
			key = "shadow " + key
		}
		out[key] = m.GetCounter().GetValue()
	}
	return out
}

func delta(before, after map[string]float64) map[string]float64 {
	d := map[string]float64{}
	for k, v := range after {
		if v != before[k] {
			d[k] = v - before[k]
		}
	}
	return d
}

// knownSequence sends one ping of every kind for asset and returns the
// decisions it must add to the metrics.
func knownSequence(t *testing.T, client *http.Client, asset string) map[string]float64 {
	at := base()
	post(t, client, ping(asset, at, 52.5200087, 13.4049547)).expect(t, http.StatusCreated, "accepted")
	post(t, client, ping(asset, at, 52.5200087, 13.4049547)).expect(t, http.StatusOK, "suppressed")
	post(t, client, ping(asset, at.Add(10*time.Second), 52.5200087, 13.4049547)).expect(t, http.StatusOK, "suppressed")
	post(t, client, ping(asset, at.Add(20*time.Second), 52.5200410, 13.4049920)).expect(t, http.StatusOK, "suppressed")
	post(t, client, ping(asset, at.Add(30*time.Second), 52.5200410, 13.4049920)).expect(t, http.StatusOK, "suppressed")
	post(t, client, ping(asset, at, 91, 13.4)).expect(t, http.StatusUnprocessableEntity, "rejected")
	post(t, client, []byte(`{"asset_id":`)).expect(t, http.StatusBadRequest, "rejected")
	return map[string]float64{
		"accepted/": 1, "suppressed/redelivery": 1, "suppressed/reobservation": 1, "suppressed/jitter": 2,
		"rejected/range": 1, "rejected/malformed": 1,
	}
}

func TestMetricsCountEveryDecisionAcrossReloads(t *testing.T) {
	up := newUpstream(t)
	tester := startCaddy(t, up, "")
	before := decisionCounts(t)
	want := knownSequence(t, tester.Client, "veh-metrics-1")
	after := decisionCounts(t)
	if got := delta(before, after); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("decisions counted %v, want %v", got, want)
	}

	// A reload keeps the counters and keeps counting.
	tester = startCaddy(t, up, "max_future 6m")
	if reloaded := decisionCounts(t); fmt.Sprint(reloaded) != fmt.Sprint(after) {
		t.Fatalf("the reload changed the counters: %v, then %v", after, reloaded)
	}
	knownSequence(t, tester.Client, "veh-metrics-2")
	if got := delta(after, decisionCounts(t)); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after the reload, decisions counted %v, want %v", got, want)
	}

	families := scrape(t)
	if decides := storeCalls(families, "decide"); decides < 10 {
		t.Errorf("store_duration_seconds saw %d decisions, want at least the 10 of this test", decides)
	}
	for _, name := range []string{"caddy_telemetry_dedup_in_flight", "caddy_telemetry_dedup_memory_store_keys", "caddy_telemetry_dedup_stuck_assets"} {
		if families[name] == nil {
			t.Errorf("%s is not exported", name)
		}
	}
}

// Two sites, each with its own telemetry_dedup, load and count into the
// same metrics without a duplicate-registration panic.
func TestTwoSitesWithTheDirective(t *testing.T) {
	up := newUpstream(t)
	tester := caddyTester(t, fmt.Sprintf(caddytestGlobals+`
http://a.localhost:{$TD_TEST_HTTP_PORT} {
	telemetry_dedup {
		key_prefix "two-sites-a:"
	}
	reverse_proxy %[1]s
}

http://b.localhost:{$TD_TEST_HTTP_PORT} {
	telemetry_dedup {
		key_prefix "two-sites-b:"
		shape sliding
	}
	reverse_proxy %[1]s
}`, strings.TrimPrefix(up.URL, "http://")))
	body := ping("veh-two", base(), 52.5200087, 13.4049547)
	for _, site := range []string{"http://a." + siteAddr + "/", "http://b." + siteAddr + "/"} {
		for i, want := range []string{"accepted", "suppressed"} {
			res, err := tester.Client.Post(site, "application/json", strings.NewReader(string(body)))
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.Header.Get("X-Dedup") != want {
				t.Errorf("%s ping %d: %s, want %s", site, i+1, res.Header.Get("X-Dedup"), want)
			}
		}
	}
}

// stuckReport is what GET /telemetry_dedup/stuck answers.
type stuckReport struct {
	Stuck []struct {
		KeyPrefix  string  `json:"key_prefix"`
		Mode       string  `json:"mode"`
		Asset      string  `json:"asset"`
		Ratio      float64 `json:"ratio"`
		Pings      int     `json:"pings"`
		LastReason string  `json:"last_reason"`
	} `json:"stuck"`
	Decisions []struct {
		Decision string  `json:"decision"`
		Reason   string  `json:"reason"`
		Mode     string  `json:"mode"`
		Count    float64 `json:"count"`
	} `json:"decisions"`
}

func readStuckReport(t *testing.T) stuckReport {
	t.Helper()
	res, err := http.Get(adminURL + "/telemetry_dedup/stuck")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var report stuckReport
	if err := json.NewDecoder(res.Body).Decode(&report); err != nil {
		t.Fatalf("admin endpoint: %v", err)
	}
	return report
}

func TestStuckAssetsAreListed(t *testing.T) {
	up := newUpstream(t)
	tester := startCaddy(t, up, "window 1s\n\t\tstuck_after 1100ms") // stuck_after must outlast the window a parked asset is admitted in
	at := base()
	cached := ping("veh-cached-fix", at, 52.5200087, 13.4049547)
	post(t, tester.Client, cached).expect(t, http.StatusCreated, "accepted")
	for i := range 70 {
		post(t, tester.Client, cached)
		// A moving asset: every ping a new place.
		post(t, tester.Client, ping("veh-moving", at.Add(time.Duration(i)*time.Second), 52.52+float64(i)*0.001, 13.40))
	}
	time.Sleep(1200 * time.Millisecond) // past stuck_after since its first suppressed ping
	post(t, tester.Client, cached).expect(t, http.StatusOK, "suppressed")

	report := readStuckReport(t)
	var mine []string
	for _, s := range report.Stuck {
		if s.KeyPrefix == keyPrefix(t) {
			mine = append(mine, s.Asset)
			if s.Asset == "veh-cached-fix" && (s.Ratio != 1 || s.Pings != 71 || s.LastReason != "redelivery") { // counted from its first copy
				t.Errorf("stuck entry %+v", s)
			}
		}
	}
	if fmt.Sprint(mine) != "[veh-cached-fix]" {
		t.Fatalf("stuck assets %v, want only veh-cached-fix", mine)
	}
	if len(report.Decisions) == 0 {
		t.Error("the endpoint shows no decision totals")
	}
	if f := scrape(t)["caddy_telemetry_dedup_stuck_assets"]; f == nil || f.GetMetric()[0].GetGauge().GetValue() < 1 {
		t.Errorf("stuck_assets gauge: %v", f)
	}
}

// storeCalls counts the store calls of one op (decide, settle, release)
// that have been answered, as store_duration_seconds observed them.
func storeCalls(families map[string]*dto.MetricFamily, op string) uint64 {
	var n uint64
	for _, m := range families["caddy_telemetry_dedup_store_duration_seconds"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "op" && l.GetValue() == op {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

// readmePlaceholders are the README's placeholders.
var readmePlaceholders = []string{"decision", "reason", "key", "asset", "bucket", "cell", "event", "state", "accepted", "suppressed", "rejected", "in_flight"}

// shadowTrialInFrontOfLive is the README's "mode shadow trial of another
// setting in front of the live handler" (Using it): a shadow handler with a
// 10m window at the site's top, the live enforcing one (5m) in a handle,
// every placeholder copied into an X-P-<name> response header.
func shadowTrialInFrontOfLive(t *testing.T, up *upstream) {
	t.Helper()
	var hdr strings.Builder
	for _, n := range readmePlaceholders {
		fmt.Fprintf(&hdr, "\t\tX-P-%s \"v={http.telemetry_dedup.%s}\"\n", n, n)
	}
	caddyTester(t, fmt.Sprintf(caddytestGlobals+`
http://localhost:{$TD_TEST_HTTP_PORT} {
	header {
		defer
%[3]s	}
	telemetry_dedup /telemetry {
		key_prefix "%[1]strial:"
		mode shadow
		window 10m
	}
	handle /telemetry {
		telemetry_dedup {
			key_prefix "%[1]slive:"
		}
		reverse_proxy %[2]s
	}
}`, keyPrefix(t), strings.TrimPrefix(up.URL, "http://"), hdr.String()))
}

// A shadow trial in front of the live handler (README, Using it): the
// live handler accepts a ping 6 minutes after the last one (a new 5m
// bucket), which the 10m trial would suppress as a reobservation. The
// sender must not be told "X-Dedup: accepted" with "X-Dedup-Reason:
// reobservation" (helper 4's finding: the trial's reason stayed on the
// answer, the live handler's forward setting X-Dedup-Reason only when it
// had one). An accepted answer carries a reason only for an event.
func TestAShadowTrialsReasonStaysOffTheLiveHandlersAcceptedAnswer(t *testing.T) {
	up := newUpstream(t)
	shadowTrialInFrontOfLive(t, up)
	c := caddytestClient()
	at := time.Now().UTC().Truncate(10 * time.Minute).Add(-time.Hour)
	post(t, c, ping("veh-trial-reason", at, 52.5200087, 13.4049547)).expect(t, http.StatusCreated, "accepted")
	res := post(t, c, ping("veh-trial-reason", at.Add(6*time.Minute), 52.5200087, 13.4049547))
	res.expect(t, http.StatusCreated, "accepted")
	if reason := res.header.Get("X-Dedup-Reason"); reason != "" {
		t.Fatalf("the live handler accepted the ping (X-Dedup: accepted, the upstream's 201), but the answer says X-Dedup-Reason: %q, "+
			"the shadow trial's reason for what it would have suppressed", reason)
	}
}

// The same setup, seen by the operator: decisions_total tells the live
// handler's decisions from the shadow trial's by its mode label. Counted
// by decision and reason alone, two pings accepted and delivered were
// accepted 3 and suppressed 1, and the dashboard's suppression ratio read
// 25% where nothing was suppressed (helper 4's finding).
func TestAShadowTrialsDecisionsAreCountedApartFromTheLiveOnes(t *testing.T) {
	up := newUpstream(t)
	shadowTrialInFrontOfLive(t, up)
	c := caddytestClient()
	at := time.Now().UTC().Truncate(10 * time.Minute).Add(-time.Hour)
	b0 := decisionCounts(t)
	post(t, c, ping("veh-trial-count", at, 52.5200087, 13.4049547)).expect(t, http.StatusCreated, "accepted")
	res := post(t, c, ping("veh-trial-count", at.Add(6*time.Minute), 52.5200087, 13.4049547))
	res.expect(t, http.StatusCreated, "accepted")
	d := delta(b0, decisionCounts(t))
	want := map[string]float64{"accepted/": 2, "shadow accepted/": 1, "shadow suppressed/reobservation": 1}
	if fmt.Sprint(d) != fmt.Sprint(want) {
		t.Errorf("two pings, both accepted and delivered, moved decisions_total by %v; want %v: the live handler's "+
			"decisions under mode enforce, the trial's would-be ones under mode shadow", d, want)
	}
}

// A shadow trial in front of the live handler, both with the same
// key_prefix and stuck settings but different shapes, so that both judge.
// Sharing one stuck-asset tracker, every ping entered it twice, and 33
// pings listed the asset stuck with "pings": 64, where the README says
// the 64-ping window takes 64 pings (helper 4's finding). Each mode keeps
// its own list.
func TestAShadowTrialKeepsItsOwnStuckList(t *testing.T) {
	up := newUpstream(t)
	prefix := keyPrefix(t)
	caddyTester(t, fmt.Sprintf(caddytestGlobals+`
http://localhost:{$TD_TEST_HTTP_PORT} {
	telemetry_dedup /telemetry {
		key_prefix %[1]q
		mode shadow
		shape session
		window 1s
		stuck_after 1100ms
	}
	handle /telemetry {
		telemetry_dedup {
			key_prefix %[1]q
			window 1s
			stuck_after 1100ms
		}
		reverse_proxy %[2]s
	}
}`, prefix, strings.TrimPrefix(up.URL, "http://")))
	c := caddytestClient()
	cached := ping("veh-trial-stuck", base(), 52.5200087, 13.4049547)
	post(t, c, cached).expect(t, http.StatusCreated, "accepted")
	sent := 1
	for range 31 {
		post(t, c, cached).expect(t, http.StatusOK, "suppressed")
		sent++
	}
	time.Sleep(1200 * time.Millisecond)
	post(t, c, cached).expect(t, http.StatusOK, "suppressed")
	sent++

	report := readStuckReport(t)
	for _, s := range report.Stuck {
		if s.KeyPrefix == prefix {
			t.Errorf("after %d pings (%d suppressed) the asset is listed stuck with %d pings: each ping was counted once per handler, "+
				"and the 64-ping window the README requires filled at half of it", sent, sent-1, s.Pings)
		}
	}
}

// A batch over max_batch is refused whole (413, rule too_large), and each
// of its pings is lost to the sender's backend alike: decisions_total
// counts "every ping", as analyze does. It counted the request once, and
// an Overland phone whose batch of 500 was refused at every try showed
// as 1 rejected ping a try (helper 4's finding).
func TestABatchOverMaxBatchCountsEachOfItsPings(t *testing.T) {
	up := newUpstream(t)
	tester := startCaddy(t, up, "max_batch 3")
	at := base()
	var elements []string
	for i := range 5 {
		elements = append(elements, string(ping(fmt.Sprintf("veh-over-%d", i), at, 52.5200087, 13.4049547)))
	}
	before := decisionCounts(t)
	postBatch(t, tester.Client, "application/json", []byte("["+strings.Join(elements, ",")+"]")).expect(t, http.StatusRequestEntityTooLarge, "rejected")
	if got := delta(before, decisionCounts(t)); got["rejected/too_large"] != 5 {
		t.Fatalf("a batch of 5 pings over max_batch 3 moved decisions_total by %v; want rejected/too_large 5, one per ping refused", got)
	}
}

// The handler's own bookkeeping on the replacer is no placeholder: as
// {http.telemetry_dedup._outcome} it rendered Go pointers in a header or
// log line ("&{req:0x4d5a7180fc8 ...}", helper 4's finding).
func TestNoPlaceholderRendersTheHandlersInternals(t *testing.T) {
	up := newUpstream(t)
	caddyTester(t, fmt.Sprintf(caddytestGlobals+`
http://localhost:{$TD_TEST_HTTP_PORT} {
	header {
		defer
		X-Outcome "v={http.telemetry_dedup._outcome}"
	}
	telemetry_dedup /telemetry {
		key_prefix %q
	}
	reverse_proxy %s
}`, keyPrefix(t), strings.TrimPrefix(up.URL, "http://")))
	r := post(t, caddytestClient(), ping("veh-outcome", base(), 52.5200087, 13.4049547))
	r.expect(t, http.StatusCreated, "accepted")
	if v := strings.TrimPrefix(r.header.Get("X-Outcome"), "v="); strings.Contains(v, "0x") {
		t.Fatalf("{http.telemetry_dedup._outcome}, in no README table, renders as %q", v)
	}
}

// stuckListed lists this test's stuck assets on the admin endpoint.
func stuckListed(t *testing.T) []string {
	t.Helper()
	var mine []string
	for _, s := range readStuckReport(t).Stuck {
		if s.KeyPrefix == keyPrefix(t) {
			mine = append(mine, s.Asset)
		}
	}
	return mine
}

// An operator sees veh-cached-fix on GET /telemetry_dedup/stuck and, as
// the README advises for noise, raises stuck_after with `caddy reload`.
// The asset is still stuck under the new setting, and stays listed: the
// reload started an empty tracker, and the asset came back only after 64
// more pings. (Helper 3's review, stop 64.)
func TestAReloadThatRaisesStuckAfterStillListsTheStuckAsset(t *testing.T) {
	up := newUpstream(t)
	tester := startCaddy(t, up, "window 1s\n\t\tstuck_after 1100ms")
	cached := ping("veh-cached-fix", base(), 52.5200087, 13.4049547)
	post(t, tester.Client, cached).expect(t, http.StatusCreated, "accepted")
	for range 70 {
		post(t, tester.Client, cached)
	}
	time.Sleep(1500 * time.Millisecond)
	post(t, tester.Client, cached).expect(t, http.StatusOK, "suppressed")
	if got := stuckListed(t); len(got) != 1 {
		t.Fatalf("setup: stuck before the reload %v, want [veh-cached-fix]", got)
	}

	tester = startCaddy(t, up, "window 1s\n\t\tstuck_after 1200ms") // caddy reload
	post(t, tester.Client, cached).expect(t, http.StatusOK, "suppressed")
	if got := stuckListed(t); len(got) != 1 {
		t.Errorf("after a reload that raised stuck_after from 1.1 s to 1.2 s, the asset suppressed for over 1.5 s is listed %v, want [veh-cached-fix]", got)
	}
}
