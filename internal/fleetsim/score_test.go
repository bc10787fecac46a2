package fleetsim

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/geo"
)

// deciderFunc adapts a function deciding one ping to a Decider.
type deciderFunc func(p Ping) bool

func (f deciderFunc) Deliver(_ context.Context, d Delivery) ([]bool, error) {
	accepted := make([]bool, len(d.Pings))
	for i, p := range d.Pings {
		accepted[i] = f(p)
	}
	return accepted, nil
}

func acceptEverything() Decider {
	return deciderFunc(func(Ping) bool { return true })
}

// acceptFirstPerAsset accepts the first ping of each asset and nothing else.
func acceptFirstPerAsset() Decider {
	seen := map[string]bool{}
	return deciderFunc(func(p Ping) bool {
		first := !seen[p.Asset]
		seen[p.Asset] = true
		return first
	})
}

// scoredConfig is a small fleet with every kind of duplicate.
func scoredConfig() Config {
	return Config{Assets: 10, Duration: 3 * time.Hour, Start: testStart, OfflineShare: 0.3}
}

func TestScoreOfAcceptEverything(t *testing.T) {
	cfg := scoredConfig()
	s, err := Run(context.Background(), cfg, acceptEverything())
	if err != nil {
		t.Fatal(err)
	}
	if s.Accepted != s.Pings || s.Pings != s.MovingPings+s.ParkedPings+s.RedeliveriesSent {
		t.Errorf("accepted %d of %d pings = %d moving + %d parked + %d redeliveries",
			s.Accepted, s.Pings, s.MovingPings, s.ParkedPings, s.RedeliveriesSent)
	}
	if s.RedeliveriesSent == 0 || s.RedeliveriesAdmitted != s.RedeliveriesSent {
		t.Errorf("admitted %d of %d redeliveries", s.RedeliveriesAdmitted, s.RedeliveriesSent)
	}
	if s.LostMoves != 0 || s.MaxSuppressedMoveM != 0 {
		t.Errorf("%d lost moves, farthest suppressed %.1f m", s.LostMoves, s.MaxSuppressedMoveM)
	}
	if want := float64(s.ParkedPings) / s.ParkedWindows; s.ParkedAdmissionsPerWindow != want {
		t.Errorf("%.3f parked admissions per window, want the %.3f parked pings per window", s.ParkedAdmissionsPerWindow, want)
	}
	// A parked asset reports every 10 s: 30 times a 5 minute window.
	if math.Abs(s.ParkedAdmissionsPerWindow-30) > 0.5 {
		t.Errorf("%.3f parked pings per window, want about 30", s.ParkedAdmissionsPerWindow)
	}
	// The first fix after a departure is at most one cadence of driving
	// away, at no more than the top speed.
	if s.Departures == 0 || s.DeparturesNeverAdmitted != 0 || s.DepartureDelayMaxM <= 0 || s.DepartureDelayMaxM > 27*10 {
		t.Errorf("%d departures, %d never admitted, delay up to %.1f m", s.Departures, s.DeparturesNeverAdmitted, s.DepartureDelayMaxM)
	}
	if s.Batches != 3+countBatchRedeliveries(cfg) {
		t.Errorf("%d batches, want 3 offline stretches and their redeliveries", s.Batches)
	}
}

// countBatchRedeliveries counts the batches the Config sends again.
func countBatchRedeliveries(cfg Config) int {
	n := 0
	for _, d := range Generate(cfg) {
		if d.Batch && d.Pings[0].Redelivery {
			n++
		}
	}
	return n
}

func TestScoreOfAcceptFirstPerAsset(t *testing.T) {
	cfg := scoredConfig()
	s, err := Run(context.Background(), cfg, acceptFirstPerAsset())
	if err != nil {
		t.Fatal(err)
	}
	if s.Accepted != cfg.Assets {
		t.Errorf("accepted %d, want one per asset", s.Accepted)
	}
	if s.LostMoves < s.MovingPings*9/10 || s.MaxLostMoveM < 1000 {
		t.Errorf("%d lost moves of %d, farthest %.0f m: want nearly all, kilometres away", s.LostMoves, s.MovingPings, s.MaxLostMoveM)
	}
	if s.Departures == 0 || s.DeparturesNeverAdmitted != s.Departures {
		t.Errorf("%d of %d departures never admitted, want all", s.DeparturesNeverAdmitted, s.Departures)
	}
	if s.ParkedAdmissionsPerWindow > 0.1 {
		t.Errorf("%.3f parked admissions per window", s.ParkedAdmissionsPerWindow)
	}
}

// handBuilt builds pings along a meridian, where metres convert to degrees
// exactly enough to state distances by hand.
type handBuilt struct {
	fleet    fleet
	accepted [][]bool
}

// at is where a hand-built ping is: metres north of 52° N, 13.4° E, on its
// asset's odometer (the true distance driven), in which phase.
type at struct {
	m, odo    float64
	phase     int
	departure bool
}

// send adds a delivery of one ping, sec seconds into the run.
func (h *handBuilt) send(asset string, sec int, parked bool, where at, accepted bool) Ping {
	p := Ping{
		Asset:  asset,
		Time:   testStart.Add(time.Duration(sec) * time.Second),
		Lat:    52 + where.m/geo.EarthRadiusM/degree,
		Lon:    13.4,
		Parked: parked,
		truth: truth{
			phase:     where.phase,
			departure: where.departure,
			odometer:  where.odo,
		},
	}
	h.deliver(Delivery{Pings: []Ping{p}, Arrival: p.Time}, accepted)
	return p
}

func (h *handBuilt) deliver(d Delivery, accepted ...bool) {
	h.fleet.deliveries = append(h.fleet.deliveries, d)
	h.accepted = append(h.accepted, accepted)
}

func TestScoreOfAHandBuiltStream(t *testing.T) {
	var h handBuilt
	h.fleet.parked = 10 * time.Minute
	// veh-a is parked, leaves, and is admitted 100 m into the drive.
	first := h.send("veh-a", 0, true, at{m: 0}, true)
	// Jitter while parked: not a move.
	h.send("veh-a", 10, true, at{m: 1}, false)
	// Lost: 50 m from the fix at 0 s.
	h.send("veh-a", 20, false, at{m: 50, odo: 50, phase: 1, departure: true}, false)
	h.send("veh-a", 30, false, at{m: 100, odo: 100, phase: 1, departure: true}, true)
	// 30 m from the fix at 30 s; the one at 50 s is later in device time.
	h.send("veh-a", 40, false, at{m: 130, odo: 130, phase: 1, departure: true}, false)
	h.send("veh-a", 50, false, at{m: 300, odo: 300, phase: 1, departure: true}, true)
	again := first
	again.Redelivery = true
	h.deliver(Delivery{Pings: []Ping{again}, Arrival: first.Time.Add(time.Minute)}, true)
	// veh-b is driving from the start, and never accepted: nothing to
	// measure a move against, and not a departure.
	h.send("veh-b", 0, false, at{m: 500, odo: 10}, false)
	// veh-c leaves and is never admitted.
	h.send("veh-c", 0, true, at{m: 0}, true)
	h.send("veh-c", 10, false, at{m: 20, odo: 20, phase: 1, departure: true}, false)
	h.send("veh-c", 20, false, at{m: 45, odo: 45, phase: 1, departure: true}, false)
	// veh-d leaves as the run ends, 20 m into its drive: nothing the
	// backend must hear of yet, so not counted.
	h.send("veh-d", 0, true, at{m: 0}, true)
	h.send("veh-d", 10, false, at{m: 20, odo: 20, phase: 1, departure: true}, false)

	cfg := Config{Start: testStart}.withDefaults()
	got := score(cfg, h.fleet, h.accepted)
	want := Score{
		Pings: 13, Deliveries: 13, Accepted: 6,
		RedeliveriesSent: 1, RedeliveriesAdmitted: 1,
		MovingPings: 8, MovingAccepted: 2, LostMoves: 2, MaxLostMoveM: 50, MaxSuppressedMoveM: 50,
		ParkedPings: 4, ParkedAdmissions: 3, ParkedWindows: 2, ParkedAdmissionsPerWindow: 1.5,
		Departures: 2, DeparturesNeverAdmitted: 1, DepartureDelayMaxM: 100,
		LostMoveM: 40, WindowSeconds: 300,
	}
	// Distances come out of haversine; a micrometre is exact here.
	for _, f := range []*float64{&got.MaxLostMoveM, &got.MaxSuppressedMoveM} {
		*f = math.Round(*f*1e6) / 1e6
	}
	if got != want {
		t.Errorf("score\n got %+v\nwant %+v", got, want)
	}
}

func TestWriteTableNamesTheMeasures(t *testing.T) {
	s, err := Run(context.Background(), scoredConfig(), acceptEverything())
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := s.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"redeliveries admitted", "lost moves (> 40 m)", "parked admissions per window", "departure delay"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

func TestRunReportsAWrongNumberOfDecisions(t *testing.T) {
	_, err := Run(context.Background(), scoredConfig(), wrongLength{acceptEverything()})
	if err == nil || !strings.Contains(err.Error(), "decisions for") {
		t.Fatalf("Run = %v, want the decider's short answer reported", err)
	}
}

// wrongLength answers one decision too many.
type wrongLength struct{ Decider }

func (w wrongLength) Deliver(ctx context.Context, d Delivery) ([]bool, error) {
	ok, err := w.Decider.Deliver(ctx, d)
	return append(ok, true), err
}
