package dedup

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

func TestStuckTrackerSpotsACachedFix(t *testing.T) {
	tr := NewStuckTracker(DefaultStuckRatio, 15*time.Minute, 100)
	now := articleBase
	// A device repeating one cached fix: accepted once, then every copy is a
	// redelivery. The tracker counts from the first copy, 10 s later.
	tr.Observe("cached", accepted, now)
	firstCopy := now.Add(10 * time.Second)
	for i := range 200 {
		now = now.Add(10 * time.Second)
		warn := tr.Observe("cached", suppressed(Redelivery), now)
		stuckNow := now.Sub(firstCopy) >= 15*time.Minute
		if warn != (stuckNow && i == 90) { // warned once, the first time it is stuck
			t.Fatalf("ping %d at +%s: warn=%v", i, now.Sub(articleBase), warn)
		}
	}
	// A parked asset, admitted again every 5 minutes, is not stuck.
	now = articleBase
	for i := range 200 {
		now = now.Add(10 * time.Second)
		v := suppressed(Jitter)
		if i%30 == 0 {
			v = accepted
		}
		tr.Observe("parked", v, now)
	}
	// A moving asset, nearly always accepted, is not stuck.
	for range 200 {
		tr.Observe("moving", accepted, now)
	}
	stuck := tr.Stuck(now)
	if len(stuck) != 1 || stuck[0].Asset != "cached" || stuck[0].Ratio != 1 || stuck[0].LastReason != Redelivery ||
		stuck[0].Pings != 200 || !stuck[0].Since.Equal(firstCopy) {
		t.Fatalf("stuck %+v, want only the cached fix, stuck since its first copy", stuck)
	}
}

// A fleet of moving assets, many more than the tracker holds, does not push
// a stuck one out: an asset whose pings are all accepted takes no room.
func TestStuckTrackerIsNotCrowdedOutByMovingAssets(t *testing.T) {
	tr := NewStuckTracker(DefaultStuckRatio, 15*time.Minute, 10)
	now := articleBase
	tr.Observe("cached", accepted, now)
	for range 200 {
		now = now.Add(10 * time.Second)
		for i := range 100 {
			tr.Observe(fmt.Sprintf("moving-%d", i), accepted, now)
		}
		tr.Observe("cached", suppressed(Redelivery), now)
	}
	if stuck := tr.Stuck(now); len(stuck) != 1 || stuck[0].Asset != "cached" {
		t.Fatalf("stuck %+v, want the cached fix among 100 moving assets and room for 10", stuck)
	}
	if tr.Len() != 1 {
		t.Fatalf("tracking %d assets, want only the one that was ever suppressed", tr.Len())
	}
}

func TestStuckTrackerNeedsAFullWindow(t *testing.T) {
	tr := NewStuckTracker(DefaultStuckRatio, 0, 10)
	for range 63 {
		tr.Observe("new", suppressed(Jitter), articleBase)
	}
	if len(tr.Stuck(articleBase)) != 0 {
		t.Fatal("63 pings are not enough history to call an asset stuck")
	}
	tr.Observe("new", suppressed(Jitter), articleBase)
	if len(tr.Stuck(articleBase)) != 1 {
		t.Fatal("64 suppressed pings in a row, and none accepted: stuck")
	}
}

// Memory stays bounded however many assets pass by.
func TestStuckTrackerMemoryIsBounded(t *testing.T) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	tr := NewStuckTracker(DefaultStuckRatio, time.Minute, DefaultStuckTrack)
	for i := range 100_000 {
		tr.Observe(fmt.Sprintf("asset-%06d", i), suppressed(Jitter), articleBase)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if tr.Len() != DefaultStuckTrack {
		t.Fatalf("tracking %d assets, want at most %d", tr.Len(), DefaultStuckTrack)
	}
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d assets tracked in %d KiB (%d bytes each)", tr.Len(), grown/1024, grown/int64(tr.Len()))
	if grown > 8<<20 {
		t.Fatalf("heap grew %d MiB for %d tracked assets", grown>>20, tr.Len())
	}
	runtime.KeepAlive(tr)
}

// The parser's asset id shares memory with the request body, which is not
// copied on the hot path; the tracker, which remembers thousands of ids,
// keeps its own copies so that no body stays alive through it.
func TestStuckTrackerKeepsItsOwnCopyOfTheAsset(t *testing.T) {
	body := []byte(`{"asset_id":"veh-88","occurred_at":"2026-08-08T11:59:00Z","lat":1,"lon":2}`)
	p, err := ping.NewParser().Parse(body, articleBase)
	if err != nil {
		t.Fatal(err)
	}
	tr := NewStuckTracker(DefaultStuckRatio, 0, 10)
	for range stuckWindow {
		tr.Observe(p.Asset, suppressed(Jitter), articleBase)
	}
	copy(body, strings.Repeat("x", len(body)))
	if p.Asset == "veh-88" {
		t.Fatal("the asset no longer shares the body; this test's premise changed")
	}
	if stuck := tr.Stuck(articleBase); len(stuck) != 1 || stuck[0].Asset != "veh-88" {
		t.Fatalf("the tracker's copy changed with the body: %+v", stuck)
	}
}

// A parked asset that reports every 10 s in tumbling (5 m window) is
// admitted once a window, 1 ping in 30: its last 64 decisions are ≥ 95%
// suppressed, by design. When it then stops reporting (ignition off, the
// end of a shift), it has not had a ping accepted for stuck_after, but it
// has had no ping at all: it is not repeating a cached fix. It must not be
// listed (and counted in caddy_telemetry_dedup_stuck_assets) as stuck for
// as long as the tracker remembers it.
func TestStuckTrackerDoesNotListAParkedAssetThatWentSilent(t *testing.T) {
	window := 5 * time.Minute
	tr := NewStuckTracker(DefaultStuckRatio, 3*window, DefaultStuckTrack)
	now := articleBase
	for i := range 360 { // one hour parked at 10 s
		now = articleBase.Add(time.Duration(i) * 10 * time.Second)
		v := suppressed(Jitter)
		if i%30 == 0 {
			v = accepted
		}
		if tr.Observe("parked", v, now) {
			t.Fatalf("warned about a parked asset while it reported, at +%s", now.Sub(articleBase))
		}
	}
	if stuck := tr.Stuck(now); len(stuck) != 0 {
		t.Fatalf("a parked asset reporting every window is listed as stuck: %+v", stuck)
	}
	// It goes silent. An hour later, it is still just parked and off.
	if stuck := tr.Stuck(now.Add(time.Hour)); len(stuck) != 0 {
		t.Fatalf("a parked asset that stopped reporting is listed as stuck an hour later: %+v", stuck)
	}
	if _, stuck := tr.Lookup("parked", now.Add(time.Hour)); stuck {
		t.Fatal("Lookup calls a parked asset that stopped reporting stuck")
	}
}

// A device stuck on a cached fix that then goes silent (its battery died,
// it was taken out of service) leaves the list once it has been silent
// for StuckSilence, or stuck_after if longer: listed for as long as the
// tracker remembered it, an alert on the stuck gauge never cleared.
// (Helper 3's review, stop 64.)
func TestStuckTrackerForgetsAStuckAssetThatWentSilent(t *testing.T) {
	for _, after := range []time.Duration{15 * time.Minute, 3 * time.Hour} {
		tr := NewStuckTracker(DefaultStuckRatio, after, DefaultStuckTrack)
		now := observeCopies(tr, "cached", articleBase, 64+int(after/time.Minute), time.Minute)
		silence := max(after, StuckSilence)
		if stuck := tr.Stuck(now.Add(silence)); len(stuck) != 1 {
			t.Errorf("stuck_after %s: silent for %s, the asset is listed %d times, want once", after, silence, len(stuck))
		}
		if stuck := tr.Stuck(now.Add(silence + time.Minute)); len(stuck) != 0 {
			t.Errorf("stuck_after %s: silent for %s, the asset is still listed: %+v", after, silence+time.Minute, stuck)
		}
		if _, stuck := tr.Lookup("cached", now.Add(7*24*time.Hour)); stuck {
			t.Errorf("stuck_after %s: Lookup calls the asset stuck a week after its last ping", after)
		}
	}
}

// Configure keeps what the tracker remembers: an asset stuck under the old
// stuck_after is listed at once under a higher one it also passes, and no
// longer under one it does not. (Helper 3's review, stop 64.)
func TestStuckTrackerConfiguredAnewKeepsItsAssets(t *testing.T) {
	tr := NewStuckTracker(DefaultStuckRatio, 15*time.Minute, DefaultStuckTrack)
	now := observeCopies(tr, "cached", articleBase, 120, time.Minute)
	tr.Configure(DefaultStuckRatio, time.Hour, DefaultStuckTrack)
	if stuck := tr.Stuck(now); len(stuck) != 1 {
		t.Errorf("stuck for 2 h, stuck_after raised to 1 h: listed %d times, want once", len(stuck))
	}
	tr.Configure(DefaultStuckRatio, 3*time.Hour, DefaultStuckTrack)
	if stuck := tr.Stuck(now); len(stuck) != 0 {
		t.Errorf("stuck for 2 h, stuck_after raised to 3 h: listed %+v, want none", stuck)
	}
	tr.Configure(DefaultStuckRatio, time.Hour, 0)
	if tr.Len() != 1 {
		t.Errorf("stuck_track lowered below one: the tracker holds %d assets, want 1", tr.Len())
	}
}

// A tracker that reports every 2 h (a battery asset tracker's usual
// interval), stuck on a frozen clock (every ping a redelivery), is listed
// after its 64th ping, and then listed for an hour after each ping and
// unlisted for the next: StuckSilence (1 h, or stuck_after) is measured
// against the clock, not against the asset's own interval, so the gauge
// and the alert on it fire and clear every 2 h for as long as the device
// is stuck. The README promises the list clears for an asset that "goes
// silent"; one that reports on its schedule has not. (Helper 5's review,
// stop 64.)
func TestStuckTrackerKeepsASlowReporterListedBetweenItsPings(t *testing.T) {
	tr := NewStuckTracker(DefaultStuckRatio, 15*time.Minute, DefaultStuckTrack)
	now := observeCopies(tr, "sleepy", articleBase, 70, 2*time.Hour)
	if n := len(tr.Stuck(now)); n != 1 {
		t.Fatalf("setup: listed %d times at its ping, want once", n)
	}
	for _, gap := range []time.Duration{30 * time.Minute, 90 * time.Minute, 119 * time.Minute} {
		if n := len(tr.Stuck(now.Add(gap))); n != 1 {
			t.Errorf("%s after its latest ping (it reports every 2 h), the stuck asset is listed %d times, want once", gap, n)
		}
	}
}

// A batch sender (Overland posts up to 200 locations at once, the
// Transistorsoft SDK a location array) that reports one batch every 2 h
// while stuck: every ping of a batch shares its claim's time (ClaimAll
// stamps one `at` for the whole batch), so the asset's "interval", the
// time between its latest two pings, is 0 after every batch, and
// 3×interval never widened the silence bound. The README promises "a
// tracker reporting every two hours stays listed between its pings"; a
// batching one is unlisted an hour after each batch and listed again at
// the next, and the alert on the gauge fires and clears every 2 h.
// (Helper 7's review, stop 64.)
func TestStuckTrackerKeepsABatchSenderReportingEveryTwoHoursListed(t *testing.T) {
	tr := NewStuckTracker(DefaultStuckRatio, 15*time.Minute, DefaultStuckTrack)
	now := articleBase
	tr.Observe("batcher", accepted, now)
	for range 4 { // four batches of 20 copies of the cached fix, 2 h apart
		now = now.Add(2 * time.Hour)
		for range 20 {
			tr.Observe("batcher", suppressed(Redelivery), now) // one claim time per batch
		}
	}
	if n := len(tr.Stuck(now)); n != 1 {
		t.Fatalf("setup: listed %d times at its batch, want once", n)
	}
	if n := len(tr.Stuck(now.Add(90 * time.Minute))); n != 1 {
		t.Errorf("90 min after its latest batch (it posts one every 2 h), the stuck asset is listed %d times, want once", n)
	}
}

// A stuck tracker that reports every minute, then is parked with its
// ignition off over a week (no pings), sends one more copy of its cached
// fix when switched on and then dies (its battery, taken out of service).
// That one long gap becomes its "interval", and it stays listed, and the
// stuck gauge's alert stays firing, for three weeks after its last ping,
// though it reported every minute and the README says a stuck asset that
// goes silent leaves the list an hour after its latest ping unless it
// reports that rarely. (Helper 7's review, stop 64.)
func TestStuckTrackerUnlistsADeadAssetWhoseLastGapWasAWeek(t *testing.T) {
	tr := NewStuckTracker(DefaultStuckRatio, 15*time.Minute, DefaultStuckTrack)
	now := observeCopies(tr, "parked-then-dead", articleBase, 100, time.Minute)
	now = now.Add(7 * 24 * time.Hour) // parked for a week, ignition off
	tr.Observe("parked-then-dead", suppressed(Redelivery), now)
	// then it goes silent for good
	if n := len(tr.Stuck(now.Add(2 * 24 * time.Hour))); n != 0 {
		t.Errorf("two days after its last ping, an asset that reported every minute is still listed stuck (%d rows): "+
			"one week-long gap keeps it listed three weeks", n)
	}
}

// observeCopies has tr see asset accepted at start, then n copies of its
// cached fix, suppressed, every apart, and returns the time of the last.
func observeCopies(tr *StuckTracker, asset string, start time.Time, n int, every time.Duration) time.Time {
	tr.Observe(asset, accepted, start)
	now := start
	for range n {
		now = now.Add(every)
		tr.Observe(asset, suppressed(Redelivery), now)
	}
	return now
}
