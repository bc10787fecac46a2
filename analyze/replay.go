package analyze

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/uber/h3-go/v4"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// analyzer accumulates one capture's analysis, asset by asset.
type analyzer struct {
	opts   Options
	report *Report
	runs   []*candidateRun

	// per asset, reused: cells by resolution index, buckets by window
	// index, and the fixes' device-time order
	cells   [][]h3.Cell
	buckets [][]int64
	order   []int32
	runOf   []int32
	scratch []float64
	keys    map[bucketCell]string // of one candidate

	// pooled over assets
	parkedTime time.Duration // the stationary runs' device time
	gaps       []time.Duration
	intervals  []time.Duration // each asset's median gap
	samples    []float64
	moves      []move
}

// candidateRun replays one (resolution, window) candidate.
type candidateRun struct {
	keyer    dedup.Keyer
	policy   dedup.Policy
	res, win int // indices into opts.Resolutions and opts.Windows
	stats    *CandidateStats
}

// move is a pair of consecutive fixes more than minMoveM apart, not inside
// one stationary run. Whether it is real waits for the p95 jitter.
type move struct {
	distM float64
	// sameCell has bit i set when both fixes share a cell at
	// opts.Resolutions[i]; there are at most 16 resolutions.
	sameCell uint16
}

// bucketCell is what, besides the asset, a key is made of.
type bucketCell struct {
	bucket int64
	cell   h3.Cell
}

func newAnalyzer(opts Options) (*analyzer, error) {
	if !slices.Contains(dedup.Shapes, opts.Shape) {
		return nil, &dedup.ConfigError{Option: "shape", Problem: fmt.Sprintf("%q is not a shape; use one of %v", opts.Shape, dedup.Shapes)}
	}
	if _, _, err := opts.ttl(0); err != nil {
		return nil, err
	}
	if err := opts.policy(dedup.DefaultWindow).Check(); err != nil {
		return nil, err
	}
	for _, res := range opts.Resolutions {
		if err := (dedup.Keyer{Window: time.Second, Resolution: res}).Check(); err != nil {
			return nil, err
		}
	}
	for _, w := range opts.Windows {
		if err := (dedup.Keyer{Window: w}).Check(); err != nil {
			return nil, err
		}
	}
	a := &analyzer{
		opts:    opts,
		report:  &Report{Shape: opts.Shape, Skipped: map[string]int{}, FirstSkipped: map[string]string{}},
		cells:   make([][]h3.Cell, len(opts.Resolutions)),
		buckets: make([][]int64, len(opts.Windows)),
		keys:    map[bucketCell]string{},
	}
	for i, res := range opts.Resolutions {
		a.report.Resolutions = append(a.report.Resolutions, ResolutionStats{Resolution: res, EdgeM: h3.HexagonEdgeLengthAvgM(res)})
		for j, w := range opts.Windows {
			k := dedup.Keyer{Window: w, Resolution: res, Prefix: analyzePrefix}
			a.report.Candidates = append(a.report.Candidates, CandidateStats{Resolution: res, Window: w, Suppressed: map[dedup.Reason]int{}})
			a.runs = append(a.runs, &candidateRun{keyer: k, policy: opts.policy(w), res: i, win: j})
		}
	}
	for i, run := range a.runs {
		run.stats = &a.report.Candidates[i]
	}
	return a, nil
}

func (a *analyzer) note(format string, args ...any) {
	a.report.Notes = append(a.report.Notes, fmt.Sprintf(format, args...))
}

// addAsset replays one asset's pings for every candidate and measures them.
func (a *analyzer) addAsset(as *assetFixes) error {
	a.report.Assets++
	a.quantise(as.fixes)
	for _, run := range a.runs {
		if err := a.replay(run, as); err != nil {
			return err
		}
	}
	a.measure(as)
	return nil
}

// quantise computes each fix's cell per resolution and bucket per window
// once, instead of once per candidate.
func (a *analyzer) quantise(fixes []fixPoint) {
	for i, res := range a.opts.Resolutions {
		cells := a.cells[i][:0]
		for j, f := range fixes {
			// A parked asset often repeats its fix exactly: skip the cgo call.
			if j > 0 && f.lat == fixes[j-1].lat && f.lon == fixes[j-1].lon {
				cells = append(cells, cells[j-1])
				continue
			}
			cells = append(cells, h3.LatLngToCell(h3.NewLatLng(f.lat, f.lon), res))
		}
		a.cells[i] = cells
	}
	for i, w := range a.opts.Windows {
		k := dedup.Keyer{Window: w}
		buckets := a.buckets[i][:0]
		for _, f := range fixes {
			buckets = append(buckets, k.Bucket(f.t))
		}
		a.buckets[i] = buckets
	}
}

// replay runs one asset's pings through a (resolution, window) candidate.
func (a *analyzer) replay(run *candidateRun, as *assetFixes) error {
	cells, buckets := a.cells[run.res], a.buckets[run.win]
	clear(a.keys)
	observe := func(_ *dedup.Deduper, i int, p ping.Ping) dedup.Observation {
		bucket, cell := buckets[i], cells[i]
		if p.Event != "" || p.State != "" {
			return dedup.Observation{Ping: p, Bucket: bucket, Cell: cell, Key: run.keyer.KeyOf(p, bucket, cell)}
		}
		// Hashing is the replay's dearest step, and only an admitted ping
		// brings a new (bucket, cell): remember the keys of this asset.
		key, ok := a.keys[bucketCell{bucket, cell}]
		if !ok {
			key = run.keyer.Key(as.name, bucket, cell)
			a.keys[bucketCell{bucket, cell}] = key
		}
		return dedup.Observation{Ping: p, Bucket: bucket, Cell: cell, Key: key}
	}
	return replayAsset(run.keyer, run.policy, as, observe, func(_ int, v dedup.Verdict) {
		run.stats.Pings++
		if v.Decision != dedup.Accepted {
			run.stats.Suppressed[v.Reason]++
			return
		}
		run.stats.Admitted++
	})
}

// replayAsset runs one asset's pings through a production Deduper with a
// fresh store, claiming each in capture order (observe quantises fix i as
// the candidate does) and settling every accepted claim, as if the
// upstream took them all; decided hears each fix's verdict.
func replayAsset(k dedup.Keyer, pol dedup.Policy, as *assetFixes,
	observe func(d *dedup.Deduper, i int, p ping.Ping) dedup.Observation, decided func(i int, v dedup.Verdict)) error {
	ctx := context.Background()
	var now time.Time
	d := dedup.Deduper{Store: dedup.NewMemoryStore(0), Keyer: k, Policy: pol, Now: func() time.Time { return now }}
	for i, f := range as.fixes {
		now = f.t
		p := ping.Ping{Asset: as.name, Time: f.t, Lat: f.lat, Lon: f.lon, Accuracy: f.accuracy, Speed: f.speed, HasSpeed: f.hasSpeed, Event: f.event, State: f.state, StateFields: f.stateFields}
		c, v, err := d.Claim(ctx, observe(&d, i, p))
		if err != nil {
			return err
		}
		decided(i, v)
		if v.Decision != dedup.Accepted {
			continue
		}
		if err := d.Settle(ctx, c); err != nil {
			return err
		}
	}
	return nil
}
