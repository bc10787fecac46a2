package fleetsim

import (
	"bytes"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/geo"
)

// testStart is a fixed Start, so that generated deliveries can be compared.
var testStart = time.Date(2026, 3, 1, 8, 0, 0, 0, time.UTC)

// quiet is a Config without noise, outliers, redeliveries or offline
// stretches, for tests that switch on one thing at a time.
func quiet() Config {
	return Config{
		Assets:          10,
		Duration:        3 * time.Hour,
		Start:           testStart,
		SigmaM:          None,
		MultipathShare:  None,
		RedeliveryShare: None,
		OfflineShare:    None,
	}
}

// originals returns every ping of the deliveries that is not a redelivery.
func originals(deliveries []Delivery) []Ping {
	var pings []Ping
	for _, d := range deliveries {
		for _, p := range d.Pings {
			if !p.Redelivery {
				pings = append(pings, p)
			}
		}
	}
	return pings
}

// byAssetAndTime returns the pings grouped per asset, each group in device
// time order.
func byAssetAndTime(pings []Ping) map[string][]Ping {
	tracks := map[string][]Ping{}
	for _, p := range pings {
		tracks[p.Asset] = append(tracks[p.Asset], p)
	}
	for _, t := range tracks {
		slices.SortFunc(t, func(a, b Ping) int { return a.Time.Compare(b.Time) })
	}
	return tracks
}

// errorM returns a fix's error in metres east and north of the true
// position.
func errorM(p Ping) (east, north float64) {
	north = (p.Lat - p.truth.lat) * degree * geo.EarthRadiusM
	east = (p.Lon - p.truth.lon) * degree * geo.EarthRadiusM * math.Cos(p.truth.lat*degree)
	return east, north
}

func TestGenerateIsDeterministic(t *testing.T) {
	cfg := Config{Assets: 10, Duration: time.Hour, Start: testStart}
	a, b := Generate(cfg), Generate(cfg)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("two runs of the same Config differ")
	}
	cfg.Seed = 2
	if reflect.DeepEqual(a, Generate(cfg)) {
		t.Fatal("seeds 1 and 2 generate the same deliveries")
	}
}

func TestGenerateSortsByArrival(t *testing.T) {
	deliveries := Generate(Config{Assets: 10, Duration: 2 * time.Hour, Start: testStart})
	if !slices.IsSortedFunc(deliveries, func(a, b Delivery) int { return a.Arrival.Compare(b.Arrival) }) {
		t.Fatal("deliveries are not sorted by arrival")
	}
}

func TestGenerateNumbersEveryObservationOnce(t *testing.T) {
	pings := originals(Generate(Config{Assets: 10, Duration: 2 * time.Hour, Start: testStart}))
	seen := make([]bool, len(pings))
	for _, p := range pings {
		if p.truth.seq < 0 || p.truth.seq >= len(pings) || seen[p.truth.seq] {
			t.Fatalf("observation %d is out of range or sent twice live", p.truth.seq)
		}
		seen[p.truth.seq] = true
	}
}

func TestDefaultStartKeepsDeviceTimesInThePast(t *testing.T) {
	before := time.Now()
	deliveries := Generate(Config{Assets: 5})
	after := time.Now()
	earliest := before.Add(-6*time.Hour - 10*time.Minute - time.Millisecond)
	for _, p := range originals(deliveries) {
		if p.Time.After(after) || p.Time.Before(earliest) {
			t.Fatalf("device time %v is outside [%v, %v]", p.Time, earliest, after)
		}
		if p.Time.Location() != time.UTC || p.Time.Nanosecond()%int(time.Millisecond) != 0 {
			t.Fatalf("device time %v is not UTC on a millisecond", p.Time)
		}
	}
}

func TestParkedFixesScatterWithSigma(t *testing.T) {
	for _, tc := range []struct {
		name     string
		sigma    float64
		tau      time.Duration
		wantLag1 float64 // correlation of consecutive errors
	}{
		{"white", 3, 0, 0},
		{"white wide", 8, 0, 0},
		{"gauss-markov", 3, time.Minute, math.Exp(-10.0 / 60)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := quiet()
			cfg.SigmaM, cfg.NoiseTau = tc.sigma, tc.tau
			if tc.tau > 0 {
				// Correlated errors carry less information per fix.
				cfg.Assets = 30
			}
			var sumE, sumN, lag float64
			var n, pairs int
			for _, track := range byAssetAndTime(originals(Generate(cfg))) {
				for i, p := range track {
					if !p.Parked {
						continue
					}
					e, no := errorM(p)
					sumE, sumN, n = sumE+e*e, sumN+no*no, n+1
					if i > 0 && track[i-1].Parked {
						pe, _ := errorM(track[i-1])
						lag, pairs = lag+e*pe, pairs+1
					}
				}
			}
			sdE, sdN := math.Sqrt(sumE/float64(n)), math.Sqrt(sumN/float64(n))
			for _, sd := range []float64{sdE, sdN} {
				if math.Abs(sd-tc.sigma) > 0.1*tc.sigma {
					t.Errorf("σ east %.2f, north %.2f m over %d fixes; want %.2f ± 10%%", sdE, sdN, n, tc.sigma)
				}
			}
			if got := lag / float64(pairs) / (tc.sigma * tc.sigma); math.Abs(got-tc.wantLag1) > 0.05 {
				t.Errorf("lag-1 correlation %.3f, want %.3f", got, tc.wantLag1)
			}
		})
	}
}

func TestMultipathOutliersLieAtKSigma(t *testing.T) {
	for _, tc := range []struct {
		name     string
		min, max float64
	}{
		{"fixed k", 4, 4},
		{"k range", 6, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := quiet()
			cfg.SigmaM, cfg.MultipathShare = 3, 0.1
			cfg.MultipathSigmasMin, cfg.MultipathSigmasMax = tc.min, tc.max
			pings := originals(Generate(cfg))
			lo, hi, outliers := math.Inf(1), math.Inf(-1), 0
			for _, p := range pings {
				if !p.truth.multipath {
					continue
				}
				outliers++
				k := geo.DistanceM(p.truth.lat, p.truth.lon, p.Lat, p.Lon) / cfg.SigmaM
				lo, hi = min(lo, k), max(hi, k)
			}
			// Rounding to 7 decimals moves a fix by up to about a centimetre.
			const slack = 0.01
			if lo < tc.min-slack || hi > tc.max+slack {
				t.Errorf("outliers at %.3f to %.3f σ, want within [%v, %v]", lo, hi, tc.min, tc.max)
			}
			if tc.max-tc.min > 1 && (lo > tc.min+0.1 || hi < tc.max-0.1) {
				t.Errorf("outliers at %.3f to %.3f σ do not span [%v, %v]", lo, hi, tc.min, tc.max)
			}
			if share := float64(outliers) / float64(len(pings)); math.Abs(share-0.1) > 0.01 {
				t.Errorf("outlier share %.3f, want 0.1", share)
			}
		})
	}
}

func TestReportedAccuracyAndSpeed(t *testing.T) {
	cfg := quiet()
	cfg.SigmaM, cfg.ReportAccuracy, cfg.ReportSpeed = 4, true, true
	track := byAssetAndTime(originals(Generate(cfg)))
	for _, pings := range track {
		for i, p := range pings {
			if p.Accuracy < 0.8*1.51*4-0.01 || p.Accuracy > 1.2*1.51*4+0.01 {
				t.Fatalf("accuracy %v outside 1.51·σ ± 20%%", p.Accuracy)
			}
			if !p.HasSpeed || p.Speed < 0 {
				t.Fatalf("speed %v (reported %v)", p.Speed, p.HasSpeed)
			}
			want := 0.0
			if !p.Parked {
				// The true speed is the phase's; the first fix of a phase
				// has no predecessor to measure it from.
				if i == 0 || pings[i-1].truth.phase != p.truth.phase {
					continue
				}
				prev := pings[i-1]
				want = (p.truth.odometer - prev.truth.odometer) / p.Time.Sub(prev.Time).Seconds()
			}
			if math.Abs(p.Speed-want) > 6*speedNoiseMS {
				t.Fatalf("reported speed %v, true %v", p.Speed, want)
			}
		}
	}
}

func TestDrivingFixesAdvanceAtThePhaseSpeed(t *testing.T) {
	cfg := quiet()
	cfg.CadenceJitter = 0.3
	type phaseOf struct {
		asset string
		phase int
	}
	phaseSpeed := map[phaseOf]float64{}
	var steps int
	for asset, pings := range byAssetAndTime(originals(Generate(cfg))) {
		for i := 1; i < len(pings); i++ {
			prev, p := pings[i-1], pings[i]
			if prev.truth.phase != p.truth.phase {
				continue
			}
			moved := geo.DistanceM(prev.Lat, prev.Lon, p.Lat, p.Lon)
			if p.Parked {
				if moved > 0.02 {
					t.Fatalf("%s moved %.3f m while parked", asset, moved)
				}
				continue
			}
			steps++
			driven := p.truth.odometer - prev.truth.odometer
			speed := driven / p.Time.Sub(prev.Time).Seconds()
			if speed < cfg.withDefaults().SpeedMin || speed > cfg.withDefaults().SpeedMax {
				t.Fatalf("%s drove at %.2f m/s", asset, speed)
			}
			key := phaseOf{asset, p.truth.phase}
			if v, ok := phaseSpeed[key]; ok && math.Abs(v-speed) > 1e-6 {
				t.Fatalf("%s changed speed within a phase: %.6f then %.6f m/s", asset, v, speed)
			}
			phaseSpeed[key] = speed
			// Without noise the reported positions are the true ones, to the
			// centimetre of 7 decimals.
			if math.Abs(moved-driven) > 0.05 {
				t.Fatalf("%s moved %.3f m between fixes but drove %.3f m", asset, moved, driven)
			}
		}
	}
	if steps < 1000 {
		t.Fatalf("only %d driving steps", steps)
	}
}

func TestRedeliveriesAreIdenticalAndLater(t *testing.T) {
	cfg := Config{Assets: 10, Duration: 3 * time.Hour, Start: testStart, RedeliveryShare: 0.1}
	deliveries := Generate(cfg)
	fields := Fields{}.withDefaults()
	original := map[int]int{} // seq of the first ping → index of the delivery
	redelivered := 0
	for i, d := range deliveries {
		first := d.Pings[0].truth.seq
		if !d.Pings[0].Redelivery {
			original[first] = i
			continue
		}
		redelivered++
		o, ok := original[first]
		if !ok {
			t.Fatalf("redelivery %d arrives before its original", i)
		}
		want := deliveries[o]
		if !bytes.Equal(fields.body(d.Pings, d.Batch), fields.body(want.Pings, want.Batch)) || d.Batch != want.Batch {
			t.Fatalf("redelivery %d differs from delivery %d", i, o)
		}
		for j, p := range d.Pings {
			if !p.Redelivery {
				t.Fatalf("redelivery %d mixes in an original", i)
			}
			p.Redelivery = false
			if !reflect.DeepEqual(p, want.Pings[j]) {
				t.Fatalf("redelivery %d ping %d differs from the original", i, j)
			}
		}
		delay := d.Arrival.Sub(want.Arrival)
		if delay < cfg.withDefaults().Cadence-time.Millisecond || delay > 30*time.Minute {
			t.Fatalf("redelivery %d after %v", i, delay)
		}
	}
	if share := float64(redelivered) / float64(len(original)); math.Abs(share-0.1) > 0.01 {
		t.Fatalf("redelivered %.3f of deliveries, want 0.1", share)
	}
}

func TestOfflineStretchesArriveAsOneLateShuffledBatch(t *testing.T) {
	cfg := quiet()
	cfg.Assets, cfg.Duration, cfg.OfflineShare = 50, time.Hour, 0.1
	deliveries := Generate(cfg)
	batched := map[string]int{}
	for i, d := range deliveries {
		if !d.Batch {
			continue
		}
		asset := d.Pings[0].Asset
		batched[asset]++
		if len(d.Pings) < 2 {
			t.Fatalf("batch %d holds %d pings", i, len(d.Pings))
		}
		first, last := d.Pings[0].Time, d.Pings[0].Time
		for _, p := range d.Pings {
			if p.Asset != asset {
				t.Fatalf("batch %d mixes assets", i)
			}
			first, last = minTime(first, p.Time), maxTime(last, p.Time)
		}
		if !d.Arrival.After(last) {
			t.Fatalf("batch %d arrives at %v, not after its last fix %v", i, d.Arrival, last)
		}
		if slices.IsSortedFunc(d.Pings, func(a, b Ping) int { return a.Time.Compare(b.Time) }) {
			t.Fatalf("batch %d is in device-time order", i)
		}
		checkLiveAround(t, deliveries, i, first, last)
	}
	if len(batched) != 5 {
		t.Fatalf("%d assets sent batches, want 5 of 50", len(batched))
	}
	for asset, n := range batched {
		if n != 1 {
			t.Fatalf("%s sent %d batches", asset, n)
		}
	}
}

// A backlog longer than MaxBatch goes as several batches, all at the end of
// the stretch, the oldest pings first, together holding every ping of it
// once: a 1 s cadence offline for 30 minutes would otherwise be one batch of
// 1,800 pings, which no sender makes and the module's default max_batch
// refuses.
func TestALongBacklogIsSplitIntoBatchesOfAtMostMaxBatch(t *testing.T) {
	cfg := quiet()
	cfg.Assets, cfg.Duration, cfg.Cadence, cfg.OfflineShare = 1, time.Hour, time.Second, 1
	cfg.OfflineMin, cfg.OfflineMax = 30*time.Minute, 30*time.Minute
	var batches []Delivery
	for _, d := range Generate(cfg) {
		if d.Batch {
			batches = append(batches, d)
		}
	}
	if len(batches) != 2 {
		t.Fatalf("%d batches for 1,800 pings, want 2 of at most %d", len(batches), DefaultConfig().MaxBatch)
	}
	seen := map[time.Time]bool{}
	var latest time.Time
	for i, d := range batches {
		if len(d.Pings) > DefaultConfig().MaxBatch {
			t.Errorf("batch %d holds %d pings, more than MaxBatch", i, len(d.Pings))
		}
		if !d.Arrival.Equal(batches[0].Arrival) {
			t.Errorf("batch %d arrives at %v, the first at %v: both end the stretch", i, d.Arrival, batches[0].Arrival)
		}
		oldest, newest := d.Pings[0].Time, d.Pings[0].Time
		for _, p := range d.Pings {
			if seen[p.Time] {
				t.Fatalf("the fix at %v is in two batches", p.Time)
			}
			seen[p.Time] = true
			oldest, newest = minTime(oldest, p.Time), maxTime(newest, p.Time)
		}
		if !oldest.After(latest) {
			t.Errorf("batch %d holds a fix of %v, before the latest of the batch before (%v): the oldest go first", i, oldest, latest)
		}
		latest = newest
	}
	if n := len(seen); n < 1799 || n > 1801 {
		t.Errorf("the batches hold %d fixes, want the stretch's 1,800", n)
	}
}

// checkLiveAround checks that the batch at index b is the asset's only
// delivery of its stretch [first, last] and comes before the asset's next
// live ping.
func checkLiveAround(t *testing.T, deliveries []Delivery, b int, first, last time.Time) {
	t.Helper()
	asset := deliveries[b].Pings[0].Asset
	for i, d := range deliveries {
		p := d.Pings[0]
		if d.Batch || p.Asset != asset {
			continue
		}
		if !p.Time.Before(first) && !p.Time.After(last) {
			t.Fatalf("%s sent the ping at %v live during its offline stretch", asset, p.Time)
		}
		if p.Time.After(last) && i < b {
			t.Fatalf("%s sent the live ping at %v before its batch", asset, p.Time)
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func TestValidateNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{CadenceJitter: 1}, "CadenceJitter"},
		{Config{MultipathShare: 1.5}, "MultipathShare"},
		{Config{MultipathSigmasMin: 8, MultipathSigmasMax: 6}, "MultipathSigmas"},
		{Config{ParkedMin: time.Hour}, "Parked"},
		{Config{SpeedMin: 30}, "Speed"},
		{Config{RedeliveryMaxDelay: time.Second}, "RedeliveryMaxDelay"},
		{Config{Center: LatLon{Lat: 89, Lon: 0}}, "Center"},
		{Config{Concurrency: -1}, "Concurrency"},
		{Config{MaxBatch: -1}, "MaxBatch"},
	} {
		err := tc.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want an error naming %s", tc.cfg, err, tc.want)
		}
	}
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("the defaults are invalid: %v", err)
	}
}
