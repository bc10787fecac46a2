package analyze

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/fleetsim"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// What an operator does with analyze, on the fleet simulator: capture a
// fleet, take the recommended radius and window, run the fleet with them.
// Parked assets then cost about one admission a window, with no lost move,
// for receivers whose error wanders slowly (the anchor follows the wander,
// a multipath outlier lands beyond it, and at a 1 s cadence there are many
// outliers a window: there the p99 alone undersizes the radius, and the
// replay widens it) as for the others, where it keeps the p99's radius.
func TestAnalyzeRecommendationHoldsTheSimulatedFleet(t *testing.T) {
	fiveMinutes := []time.Duration{5 * time.Minute}
	for _, tc := range []struct {
		name    string
		cfg     fleetsim.Config
		windows []time.Duration // analyze's candidates; nil: the defaults
		widened bool            // the replay must widen the p99's radius
	}{
		{"1s cadence, sigma 5 m wandering over 2 min, 5 min window", fleetsim.Config{Cadence: time.Second, SigmaM: 5, NoiseTau: 2 * time.Minute, Duration: 2 * time.Hour}, fiveMinutes, true},
		{"1s cadence, sigma 4 m wandering over 10 min, 5 min window", fleetsim.Config{Cadence: time.Second, SigmaM: 4, NoiseTau: 10 * time.Minute, Duration: 2 * time.Hour}, fiveMinutes, true},
		{"1s cadence, sigma 6 m wandering over 30 s", fleetsim.Config{Cadence: time.Second, SigmaM: 6, NoiseTau: 30 * time.Second, Duration: 2 * time.Hour}, nil, false},
		{"10s cadence, sigma 8 m", fleetsim.Config{SigmaM: 8}, nil, false},
		// Phones parked indoors scatter wider than a run's 25 m, and say so
		// in their accuracy: without it no run was found, and the defaults
		// admitted 19-30 parked fixes a window.
		{"10s cadence, sigma 30 m, accuracy reported", fleetsim.Config{SigmaM: 30, ReportAccuracy: true}, nil, false},
		{"1s cadence, sigma 20 m, accuracy reported", fleetsim.Config{Cadence: time.Second, SigmaM: 20, Duration: 2 * time.Hour, ReportAccuracy: true}, nil, false},
		// Outliers no radius removes from a replay's runs: the p99's radius stays.
		{"5s cadence, sigma 6 m, 10% multipath at 3 to 6 sigma, 5 min window", fleetsim.Config{Cadence: 5 * time.Second, SigmaM: 6,
			MultipathShare: 0.1, MultipathSigmasMin: 3, MultipathSigmasMax: 6, Duration: 3 * time.Hour}, fiveMinutes, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Assets, cfg.Seed = 20, 7
			rep := analyze(t, captureOf(t, fleetsim.Generate(cfg)), Options{Parser: accuracyParser(), Windows: tc.windows})
			rec := rep.Recommended
			base := math.Ceil(radiusOverP99 * rep.Jitter.P99M)
			if widened := rec.RadiusM > base; widened != tc.widened {
				t.Errorf("radius %g m against the p99's %g m: widened %v, want %v", rec.RadiusM, base, widened, tc.widened)
			}
			if rec.RadiusM > base*radiusSteps[len(radiusSteps)-1]+1 {
				t.Errorf("radius %g m, more than the steps allow over %g m", rec.RadiusM, base)
			}

			sc := simulate(t, cfg, rec.RadiusM, rec.Window)
			t.Logf("radius %g m (p99 %.1f m), window %s: replay %.2f, simulator %.2f parked admissions a window",
				rec.RadiusM, rep.Jitter.P99M, rec.Window, rec.ParkedAdmissionsPerWindow, sc.ParkedAdmissionsPerWindow)
			if sc.ParkedAdmissionsPerWindow > maxParkedPerWindow {
				t.Errorf("%.2f parked admissions a window at the recommended radius, want at most %g", sc.ParkedAdmissionsPerWindow, maxParkedPerWindow)
			}
			if tc.widened {
				at := simulate(t, cfg, base, rec.Window)
				t.Logf("at the p99's radius %g m: simulator %.2f parked admissions a window", base, at.ParkedAdmissionsPerWindow)
				if at.ParkedAdmissionsPerWindow <= maxParkedPerWindow {
					t.Errorf("the p99's radius %g m already holds the fleet (%.2f a window): nothing to widen", base, at.ParkedAdmissionsPerWindow)
				}
			}
			if sc.LostMoves != 0 || sc.RedeliveriesAdmitted != 0 || sc.DeparturesNeverAdmitted != 0 {
				t.Errorf("%d lost moves, %d redeliveries admitted, %d departures never admitted; want none",
					sc.LostMoves, sc.RedeliveriesAdmitted, sc.DeparturesNeverAdmitted)
			}
		})
	}
}

// simulate runs the fleet through sliding at radius r and window w.
func simulate(t *testing.T, cfg fleetsim.Config, r float64, w time.Duration) fleetsim.Score {
	t.Helper()
	pol := dedup.Policy{Shape: dedup.Sliding, Window: w, SessionIdle: dedup.DefaultSessionIdle, Radius: r,
		TTL: 13 * time.Hour, InFlightTimeout: dedup.DefaultInFlightTimeout}
	cfg.Window, cfg.LostMoveM = w, dedup.LagFactor*r+1
	sc, err := fleetsim.Run(context.Background(), cfg, &simDecider{dedup.Deduper{Store: dedup.NewMemoryStore(0),
		Keyer: dedup.Keyer{Window: w, Prefix: analyzePrefix}, Policy: pol}})
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// captureOf writes the simulator's pings as the NDJSON capture analyze
// reads by default, in the order they were sent, with their accuracy
// where the simulator reports one (accuracyParser reads it).
func captureOf(t *testing.T, deliveries []fleetsim.Delivery) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for _, d := range deliveries {
		for _, p := range d.Pings {
			ping := map[string]any{"asset_id": p.Asset, "occurred_at": p.Time.Format(time.RFC3339Nano), "lat": p.Lat, "lon": p.Lon}
			if p.Accuracy != 0 {
				ping["accuracy"] = p.Accuracy
			}
			if err := enc.Encode(ping); err != nil {
				t.Fatal(err)
			}
		}
	}
	return buf.Bytes()
}

// accuracyParser reads captureOf's pings with their accuracy, as the
// directive does with accuracy accuracy.
func accuracyParser() ping.Parser {
	p := ping.NewParser()
	p.AccuracyPath = "accuracy"
	return p
}

// simDecider decides the simulator's deliveries through a production
// Deduper in process, settling each accepted claim as an upstream that took
// it would.
type simDecider struct{ d dedup.Deduper }

func (s *simDecider) Deliver(ctx context.Context, del fleetsim.Delivery) ([]bool, error) {
	s.d.Now = func() time.Time { return del.Arrival }
	obs := make([]dedup.Observation, len(del.Pings))
	for i, p := range del.Pings {
		obs[i] = s.d.Observe(ping.Ping{Asset: p.Asset, Time: p.Time, Lat: p.Lat, Lon: p.Lon, Accuracy: p.Accuracy})
	}
	claims, verdicts, err := s.d.ClaimAll(ctx, obs)
	if err != nil {
		return nil, err
	}
	accepted := make([]bool, len(verdicts))
	var settle []*dedup.Claim
	for i, v := range verdicts {
		if accepted[i] = v.Decision == dedup.Accepted; accepted[i] {
			settle = append(settle, claims[i])
		}
	}
	if len(settle) == 0 {
		return accepted, nil
	}
	return accepted, s.d.Settle(ctx, settle...)
}

// Trackers in static navigation (the same coordinates repeated while
// parked) measure p95 jitter 0, and analyze recommended resolution 15
// (0.5 m edges), outside its own candidates: the resolution has a floor,
// as the radius has (10 m).
func TestTheResolutionHasAFloorForTrackersThatRepeatTheirPosition(t *testing.T) {
	rep := analyze(t, parksThenDrivesOff(""), Options{})
	if r := rep.Recommended.Resolution; r > DefaultResolutions[len(DefaultResolutions)-1] {
		t.Errorf("p95 jitter %.1f m: recommended resolution %d (%.1f m edges); notes %q", rep.Jitter.P95M, r, rep.Recommended.EdgeM, rep.Notes)
	}
}

// A phone parked indoors now and then reports a network (cell or
// Wi-Fi) fix hundreds of metres to kilometres off, one or two fixes, then
// satellite fixes again. A stationary run goes on through such excursions
// at any distance, so they enter the jitter percentiles: with 2% of the
// parked fixes 1-3 km out, Analyze failed outright ("radius: 2477m is not
// a distance a stay can have; use ... such as the default 25m (at most
// 1000m)", naming a --radius the user never gave, and no report); with 1%
// at 0.5-1 km it recommended a 672 m radius, whose lag bound (1008 m) the
// simulator shows suppressing moving pings up to a kilometre from the last
// accepted one.
func TestFarFixesOfAParkedPhoneNeitherBreakNorBloatTheRadius(t *testing.T) {
	start := time.Date(2026, 8, 8, 6, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name     string
		min, max float64 // outlier distance, in sigmas of 10 m
		share    float64
	}{
		{"2% of fixes 1-3 km out", 100, 300, 0.02},
		{"1% of fixes 0.5-1 km out", 50, 100, 0.01},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := fleetsim.Config{Assets: 20, Seed: 7, Start: start, SigmaM: 10,
				MultipathShare: tc.share, MultipathSigmasMin: tc.min, MultipathSigmasMax: tc.max}
			rep, err := Analyze(bytes.NewReader(captureOf(t, fleetsim.Generate(cfg))), Options{Shape: dedup.Sliding})
			if err != nil {
				t.Fatalf("Analyze: %v", err)
			}
			rec := rep.Recommended
			pol := dedup.Policy{Shape: dedup.Sliding, Window: rec.Window, SessionIdle: dedup.DefaultSessionIdle, Radius: rec.RadiusM,
				TTL: 13 * time.Hour, InFlightTimeout: dedup.DefaultInFlightTimeout}
			cfg.Window, cfg.LostMoveM = rec.Window, 100
			sc, err := fleetsim.Run(context.Background(), cfg, &simDecider{dedup.Deduper{Store: dedup.NewMemoryStore(0),
				Keyer: dedup.Keyer{Window: rec.Window, Prefix: analyzePrefix}, Policy: pol}})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("p99 %.0f m: radius %g m; simulator: %.2f parked a window, %d moving pings suppressed over 100 m from the last accepted (worst %.0f m)",
				rep.Jitter.P99M, rec.RadiusM, sc.ParkedAdmissionsPerWindow, sc.LostMoves, sc.MaxLostMoveM)
			if sc.LostMoves != 0 {
				t.Errorf("radius %g m: %d moving pings suppressed over 100 m from the last accepted one (worst %.0f m)", rec.RadiusM, sc.LostMoves, sc.MaxLostMoveM)
			}
		})
	}
}

// A pedestrian's phone reports a wide accuracy in town (65-100 m, a
// satellite fix's by maxJitterAccuracyM), and walks at 1-1.5 m/s: two
// minutes of walking stay within the two fixes' accuracies added, so since
// runs are sized by reported accuracy (runRadiusM) a walker who never
// stops is measured as parked, its walk as jitter, and analyze recommends
// a coarse resolution and a radius of 100-200 m that swallows the walk.
// The same capture without accuracy finds no run and every step a move.
func TestAWalkerReportingAWideAccuracyIsNotMeasuredAsParked(t *testing.T) {
	start := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name            string
		speed, accuracy float64
	}{
		{"1.0 m/s, accuracy 65 m", 1.0, 65},
		{"1.2 m/s, accuracy 80 m", 1.2, 80},
		{"1.4 m/s, accuracy 100 m", 1.4, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// an hour's straight walk north, a fix every 10 s, as the
			// phone reports it (speed included)
			var buf bytes.Buffer
			enc := json.NewEncoder(&buf)
			for i := range 360 {
				northM := tc.speed * 10 * float64(i)
				if err := enc.Encode(map[string]any{"asset_id": "walker", "occurred_at": start.Add(time.Duration(i) * 10 * time.Second).Format(time.RFC3339),
					"lat": 52.5 + northM/111_320, "lon": 13.4, "accuracy": tc.accuracy, "speed": tc.speed}); err != nil {
					t.Fatal(err)
				}
			}
			parser := accuracyParser()
			parser.SpeedPath = "speed"
			rep := analyze(t, buf.Bytes(), Options{Parser: parser})
			without := analyze(t, buf.Bytes(), Options{})
			rec := rep.Recommended
			if rep.Jitter.Runs != 0 || rec.RadiusM != without.Recommended.RadiusM || rec.Resolution != without.Recommended.Resolution {
				t.Errorf("a walk that never stops: %d stationary runs (p95 jitter %.0f m), %d moves; recommended resolution %d, radius %g m; "+
					"want no run, as without its accuracy (%d runs, %d moves, resolution %d, radius %g m)",
					rep.Jitter.Runs, rep.Jitter.P95M, rep.Moves.Count, rec.Resolution, rec.RadiusM,
					without.Jitter.Runs, without.Moves.Count, without.Recommended.Resolution, without.Recommended.RadiusM)
			}
		})
	}
}
