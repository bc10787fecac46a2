package dedup

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/fleetsim"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// deduperDecider decides the simulator's deliveries in process, through a
// production Deduper, settling every accepted claim as an upstream that took
// it would.
type deduperDecider struct{ d *Deduper }

func newDeduperDecider(s Store, pol Policy) *deduperDecider {
	k := defaultKeyer()
	k.Window = pol.Window
	return &deduperDecider{d: &Deduper{Store: s, Keyer: k, Policy: pol}}
}

func (dd *deduperDecider) Deliver(ctx context.Context, del fleetsim.Delivery) ([]bool, error) {
	dd.d.Now = func() time.Time { return del.Arrival }
	obs := make([]Observation, len(del.Pings))
	for i, p := range del.Pings {
		obs[i] = dd.d.Keyer.Observe(ping.Ping{Asset: p.Asset, Time: p.Time, Lat: p.Lat, Lon: p.Lon,
			Accuracy: p.Accuracy, Speed: p.Speed, HasSpeed: p.HasSpeed})
	}
	claims, verdicts, err := dd.d.ClaimAll(ctx, obs)
	if err != nil {
		return nil, err
	}
	accepted := make([]bool, len(verdicts))
	var settle []*Claim
	for i, v := range verdicts {
		if accepted[i] = v.Decision == Accepted; accepted[i] {
			settle = append(settle, claims[i])
		}
	}
	if len(settle) > 0 {
		return accepted, dd.d.Settle(ctx, settle...)
	}
	return accepted, nil
}

// singlesDecider delivers a batch one ping a request, in the order it
// came: a sender that uploads its offline backlog shuffled, ping by ping.
type singlesDecider struct{ *deduperDecider }

func (s singlesDecider) Deliver(ctx context.Context, d fleetsim.Delivery) ([]bool, error) {
	var out []bool
	for _, p := range d.Pings {
		ok, err := s.deduperDecider.Deliver(ctx, fleetsim.Delivery{Pings: []fleetsim.Ping{p}, Arrival: d.Arrival})
		if err != nil {
			return nil, err
		}
		out = append(out, ok...)
	}
	return out, nil
}

// The physics, on the fleet simulator: parked assets (Gaussian
// noise, multipath outliers at 4 σ) cost about one admission per window in
// sliding (session keeps a parked burst to one), while no redelivery is
// admitted and no moving ping is suppressed farther than LagFactor radii
// (40 m at the default radius) from the last accepted one: at every
// cadence from 1 s to 5 min, walking speeds, noisier receivers with the
// radius sized for them, slow wander, and multipath outliers more frequent
// and farther than the default's.
func TestParkedFleetCostsAboutOneAdmissionPerWindow(t *testing.T) {
	for _, tc := range []struct {
		name             string
		cfg              fleetsim.Config
		sliding, session float64 // most parked admissions per window
		singles          bool    // backlogs one ping a request
		radius           float64 // the policy's, if not the default
	}{
		{"10s cadence, sigma 3 m", fleetsim.Config{}, 1.2, 1.2, false, 0},
		{"10s cadence, sigma 5 m", fleetsim.Config{SigmaM: 5}, 1.4, 1.4, false, 0},
		{"2s cadence, sigma 3 m", fleetsim.Config{Cadence: 2 * time.Second, Duration: 3 * time.Hour}, 1.3, 1.3, false, 0},
		{"2s cadence, backlogs one ping a request", fleetsim.Config{Cadence: 2 * time.Second, Duration: 3 * time.Hour}, 1.3, 1.3, true, 0},
		{"1s cadence, slow wander", fleetsim.Config{Cadence: time.Second, SigmaM: 3, NoiseTau: 2 * time.Minute, Duration: 2 * time.Hour}, 1.3, 1.3, false, 0},
		// Backlogs of 1,200 to 1,800 pings, each sent as two batches (max_batch 1000), the oldest first.
		{"1s cadence, backlogs over max_batch", fleetsim.Config{Cadence: time.Second, SigmaM: 3, OfflineShare: 0.2, OfflineMin: 20 * time.Minute, Duration: 2 * time.Hour}, 1.3, 1.3, false, 0},
		{"30s cadence, speed and accuracy reported", fleetsim.Config{Cadence: 30 * time.Second, SigmaM: 4, ReportSpeed: true, ReportAccuracy: true}, 1.3, 1.3, false, 0},
		{"60s cadence", fleetsim.Config{Cadence: time.Minute}, 1.3, 1.3, false, 0},
		{"2 min cadence, 12 h", fleetsim.Config{Cadence: 2 * time.Minute, Duration: 12 * time.Hour}, 1.3, 1.3, false, 0},
		{"5s cadence, each interval ±50%", fleetsim.Config{Cadence: 5 * time.Second, CadenceJitter: 0.5, Duration: 3 * time.Hour}, 1.3, 1.3, false, 0},
		// Slow movers must never be lost track of, nor their stops missed.
		{"walking, 0.5 to 2 m/s", fleetsim.Config{SpeedMin: 0.5, SpeedMax: 2}, 1.3, 1.3, false, 0},
		{"5 min cadence, 24 h", fleetsim.Config{Cadence: 5 * time.Minute, Duration: 24 * time.Hour}, 1.3, 1.3, false, 0},
		{"sigma 4 m, slow wander over 10 min", fleetsim.Config{SigmaM: 4, NoiseTau: 10 * time.Minute}, 1.3, 1.3, false, 0},
		// A stay learns how far its outliers lie: at a 1 s cadence the anchor
		// follows the wander and outliers land just beyond the radius.
		{"1s cadence, sigma 5 m wandering over 2 min", fleetsim.Config{Cadence: time.Second, SigmaM: 5, NoiseTau: 2 * time.Minute, Duration: 2 * time.Hour}, 1.3, 1.3, false, 0},
		// Multipath worse than the default's 2% at 4 σ: more often, and farther.
		{"multipath on 10% of fixes, 3 to 5 sigma", fleetsim.Config{MultipathShare: 0.1, MultipathSigmasMin: 3, MultipathSigmasMax: 5}, 1.3, 1.3, false, 0},
		{"multipath on 5% of fixes, 4 to 8 sigma", fleetsim.Config{MultipathShare: 0.05, MultipathSigmasMin: 4, MultipathSigmasMax: 8}, 1.3, 1.3, false, 0},
		{"walking slowly, 0.3 to 1 m/s", fleetsim.Config{SpeedMin: 0.3, SpeedMax: 1}, 1.3, 1.3, false, 0},
		// Multipath beyond the lag bound (50 to 150 m out, on 3% of the
		// fixes) is never held: each such fix is admitted as a possible
		// departure, and so is the fix back, since the backend last heard
		// of the outlier. A radius whose lag bound (1.5 radii) holds them
		// holds the receiver, at the price of that lag.
		{"5s cadence, multipath on 3% of fixes, 50 to 150 m", fleetsim.Config{Cadence: 5 * time.Second, Duration: 3 * time.Hour, MultipathShare: 0.03, MultipathSigmasMin: 50.0 / 3, MultipathSigmasMax: 50}, 4.3, 4.0, false, 0},
		{"5s cadence, multipath on 3% of fixes, 50 to 150 m, radius 100", fleetsim.Config{Cadence: 5 * time.Second, Duration: 3 * time.Hour, MultipathShare: 0.03, MultipathSigmasMin: 50.0 / 3, MultipathSigmasMax: 50}, 1.4, 1.3, false, 100},
		// A poorer receiver, with a radius that holds its 4 σ outliers (32 m),
		// as analyze recommends: the lag bound grows with the radius.
		{"sigma 8 m, radius 40", fleetsim.Config{SigmaM: 8}, 1.3, 1.3, false, 40},
		// The same receivers at a 1 s cadence meet their multipath (2% of
		// fixes, at 4 σ) several times a window: at the default radius σ 8
		// costs 6.5 a window and σ 15 88, because each outlier beyond the
		// lag bound from the last accepted fix is admitted. A radius of
		// about 5 σ holds them.
		{"1s cadence, sigma 8 m, radius 40", fleetsim.Config{Cadence: time.Second, SigmaM: 8, Duration: 2 * time.Hour}, 1.3, 1.3, false, 40},
		{"1s cadence, sigma 15 m, radius 75", fleetsim.Config{Cadence: time.Second, SigmaM: 15, Duration: 2 * time.Hour}, 1.3, 1.3, false, 75},
		// A phone parked indoors: its fixes scatter as far as the accuracy
		// it reports (a 68% radius), and a fix standing still gets a margin
		// of as much again. Two such fixes lie farther apart than that
		// about one time in ten, so a fix standing still may lie from the
		// last accepted one as far as both uncertainties together (before:
		// 2.70 and 2.04 here, 6.17 and 5.79 at 10 s, 3.38 and 2.91 at σ 50,
		// 9.79 and 9.62 at σ 15 and 5 s). The simulator's parked receivers
		// report speeds of |N(0, 0.3)| m/s: one fix in ten reports 0.5 m/s
		// or more, and keeps the bound of its own uncertainty. A moving fix
		// may lag by its accuracy, up to 1.2·1.51·σ: 55 m at σ 30.
		{"phone indoors, sigma 30 m, speed and accuracy reported, 30s cadence",
			fleetsim.Config{SigmaM: 30, Cadence: 30 * time.Second, ReportSpeed: true, ReportAccuracy: true, LostMoveM: 55}, 2.2, 1.6, false, 0},
		{"phone indoors, sigma 30 m, speed and accuracy reported, 10s cadence",
			fleetsim.Config{SigmaM: 30, ReportSpeed: true, ReportAccuracy: true, LostMoveM: 55}, 4.5, 4.1, false, 0},
		{"phone indoors, sigma 50 m, speed and accuracy reported, 30s cadence",
			fleetsim.Config{SigmaM: 50, Cadence: 30 * time.Second, ReportSpeed: true, ReportAccuracy: true, LostMoveM: 91}, 2.6, 2.1, false, 0},
		// Every fix has a small chance of lying past its bound, and a 5 s
		// cadence makes 60 fixes a window.
		{"phone, sigma 15 m, speed and accuracy reported, 5s cadence",
			fleetsim.Config{SigmaM: 15, Cadence: 5 * time.Second, Duration: 3 * time.Hour, ReportSpeed: true, ReportAccuracy: true}, 5.7, 5.3, false, 0},
		// Creeping under 0.5 m/s reads as standing still: with a phone's
		// accuracy (up to 36 m, 72 m with the margin of a still fix) a
		// suppressed fix may lie √2 times that from the last accepted one.
		{"creeping at 0.2 to 0.45 m/s, sigma 20 m, speed and accuracy reported",
			fleetsim.Config{SigmaM: 20, SpeedMin: 0.2, SpeedMax: 0.45, ReportSpeed: true, ReportAccuracy: true, LostMoveM: 103}, 4.0, 3.5, false, 0},
		// Without a speed nothing says a fix is at rest: the radius must be
		// sized for the receiver, as analyze recommends (its p99 jitter,
		// about 3 σ, and a quarter more).
		{"phone, sigma 15 m, accuracy but no speed, radius 60",
			fleetsim.Config{SigmaM: 15, ReportAccuracy: true}, 1.3, 1.3, false, 60},
	} {
		for _, shape := range []Shape{Sliding, Session} {
			t.Run(tc.name+"/"+string(shape), func(t *testing.T) {
				pol := *testPolicy(shape)
				pol.TTL = 13 * time.Hour // past the simulated day and its latest redelivery
				cfg := tc.cfg
				cfg.Assets = 20
				if tc.radius != 0 {
					pol.Radius = tc.radius
					cfg.LostMoveM = LagFactor*tc.radius + 1
				}
				var decider fleetsim.Decider = newDeduperDecider(NewMemoryStore(0), pol)
				if tc.singles {
					decider = singlesDecider{newDeduperDecider(NewMemoryStore(0), pol)}
				}
				sc, err := fleetsim.Run(context.Background(), cfg, decider)
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("%d pings: %.2f parked admissions per window, %d lost moves (worst suppressed moving ping %.0f m away), %d of %d redeliveries admitted",
					sc.Pings, sc.ParkedAdmissionsPerWindow, sc.LostMoves, sc.MaxSuppressedMoveM, sc.RedeliveriesAdmitted, sc.RedeliveriesSent)
				limit := tc.sliding
				if shape == Session {
					limit = tc.session
				}
				if sc.ParkedAdmissionsPerWindow > limit {
					t.Errorf("%.2f parked admissions per window, want at most %.1f", sc.ParkedAdmissionsPerWindow, limit)
				}
				if sc.LostMoves != 0 || sc.RedeliveriesAdmitted != 0 {
					t.Errorf("%d lost moves (up to %.0f m), %d redeliveries admitted; want none", sc.LostMoves, sc.MaxLostMoveM, sc.RedeliveriesAdmitted)
				}
				if sc.DeparturesNeverAdmitted != 0 {
					t.Errorf("%d departures never admitted", sc.DeparturesNeverAdmitted)
				}
			})
		}
	}
}

// Tumbling admits a parked asset once per bucket for every cell its fixes
// reach in it, and a consumer receiver's scatter reaches several cells of
// resolution 12 (9.4 m edges): the one ping a window Sizing once promised
// at the default resolution measured 3.28 here. Coarser cells cost less
// and hide moves (a moving fix suppressed in a cell the asset passed
// earlier in the bucket). The figures are README's (Sizing).
func TestTumblingParkedCostIsWhatSizingSays(t *testing.T) {
	for _, tc := range []struct {
		sigma      float64
		resolution int
		perWindow  float64 // parked admissions per window
		farthest   float64 // farthest suppressed moving fix from the last accepted one, m
	}{
		{2, 12, 2.57, 16}, {2, 11, 1.64, 51}, {2, 10, 1.26, 136},
		{3, 12, 3.28, 23}, {3, 11, 1.86, 52}, {3, 10, 1.31, 140},
		{5, 12, 4.80, 31}, {5, 11, 2.38, 48}, {5, 10, 1.46, 139},
	} {
		t.Run(fmt.Sprintf("sigma %g m, resolution %d", tc.sigma, tc.resolution), func(t *testing.T) {
			pol := *testPolicy(Tumbling)
			pol.TTL = 7 * time.Hour // past the simulated 6 h and its latest redelivery
			decider := newDeduperDecider(NewMemoryStore(0), pol)
			decider.d.Keyer.Resolution = tc.resolution
			// A fixed start lays the buckets over the fleet the same way in every run.
			cfg := fleetsim.Config{Assets: 20, SigmaM: tc.sigma, Start: time.Date(2026, 8, 8, 6, 0, 0, 0, time.UTC)}
			sc, err := fleetsim.Run(context.Background(), cfg, decider)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%.2f parked admissions per window, worst suppressed moving ping %.0f m away", sc.ParkedAdmissionsPerWindow, sc.MaxSuppressedMoveM)
			if math.Abs(sc.ParkedAdmissionsPerWindow-tc.perWindow) > 0.1*tc.perWindow {
				t.Errorf("%.2f parked admissions per window, README says %.2f", sc.ParkedAdmissionsPerWindow, tc.perWindow)
			}
			if math.Abs(sc.MaxSuppressedMoveM-tc.farthest) > 0.1*tc.farthest {
				t.Errorf("a moving ping suppressed %.0f m from the last accepted one, README says %.0f m", sc.MaxSuppressedMoveM, tc.farthest)
			}
		})
	}
}

// failingDecider makes each batch fail once, as an upstream answering 503
// does: the claims it accepted are released, and the sender retries it.
type failingDecider struct{ *deduperDecider }

func (f failingDecider) Deliver(ctx context.Context, del fleetsim.Delivery) ([]bool, error) {
	if len(del.Pings) > 1 {
		d := f.d
		d.Now = func() time.Time { return del.Arrival }
		obs := make([]Observation, len(del.Pings))
		for i, p := range del.Pings {
			obs[i] = d.Keyer.Observe(ping.Ping{Asset: p.Asset, Time: p.Time, Lat: p.Lat, Lon: p.Lon,
				Accuracy: p.Accuracy, Speed: p.Speed, HasSpeed: p.HasSpeed})
		}
		claims, verdicts, err := d.ClaimAll(ctx, obs)
		if err != nil {
			return nil, err
		}
		if _, err := d.Release(ctx, acceptedOf(claims, verdicts)...); err != nil {
			return nil, err
		}
	}
	return f.deduperDecider.Deliver(ctx, del)
}

// Overland uploads a phone's offline hours (a fix a second, speed and
// accuracy reported) in batches of 100, and the backend answers each
// batch 503 once. Every retry must be judged as its first attempt was,
// and the fleet scored as if no batch had failed. The retries suppressed
// about 500 moving fixes the first attempts had accepted (and the backend
// never got), leaving 190 moving fixes suppressed beyond 40 m, up to 60 m,
// from the backend's last fix of the asset: a retry finds the batch's
// suppressed fixes as redeliveries, and they folded nothing into its stays
// (see refold).
func TestAFleetWhoseBatchesEachFailOnceIsScoredAsIfNoneFailed(t *testing.T) {
	cfg := fleetsim.Config{Assets: 20, Cadence: time.Second, SigmaM: 5, Duration: 2 * time.Hour, ReportSpeed: true, ReportAccuracy: true,
		OfflineShare: 1, OfflineMin: 20 * time.Minute, MaxBatch: 100}
	for _, shape := range []Shape{Sliding, Session} {
		t.Run(string(shape), func(t *testing.T) {
			pol := *testPolicy(shape)
			pol.TTL = 3 * time.Hour
			want, err := fleetsim.Run(context.Background(), cfg, newDeduperDecider(NewMemoryStore(0), pol))
			if err != nil {
				t.Fatal(err)
			}
			got, err := fleetsim.Run(context.Background(), cfg, failingDecider{newDeduperDecider(NewMemoryStore(0), pol)})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d pings in %d batches: %d accepted, %d lost moves", got.Pings, got.Batches, got.Accepted, got.LostMoves)
			if got != want {
				t.Errorf("every batch failing once: %+v\nnone failing: %+v", got, want)
			}
		})
	}
}
