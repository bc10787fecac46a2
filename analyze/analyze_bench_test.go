package analyze

import (
	"bytes"
	"testing"
	"time"
)

// One million pings, the default grid: 2,000 assets × 500 pings, each
// parking 10 minutes then driving 40 fixes, five times. Run on one core:
//
//	GOMAXPROCS=1 go test -run XXX -bench Analyze1M -benchtime 1x ./dedup/
func BenchmarkAnalyze1M(b *testing.B) {
	fleet := synthFleet{
		assets: 2000, cycles: 5, parked: 60, moving: 40,
		cadence: 10 * time.Second, sigmaM: 3, stepM: 30, seed: 1,
	}
	capture := fleet.capture()
	pings := fleet.assets * fleet.cycles * (fleet.parked + fleet.moving)
	for b.Loop() {
		rep, err := Analyze(bytes.NewReader(capture), Options{})
		if err != nil {
			b.Fatal(err)
		}
		if rep.Pings != pings {
			b.Fatalf("%d pings analysed, want %d", rep.Pings, pings)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*pings), "ns/ping")
}
