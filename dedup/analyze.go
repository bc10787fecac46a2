package dedup

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/uber/h3-go/v4"
)

// Default candidate grid of Analyze.
var (
	// DefaultAnalyzeResolutions spans city-block cells (9, 174 m edges) to
	// survey-grade ones (14, 1.3 m).
	DefaultAnalyzeResolutions = []int{9, 10, 11, 12, 13, 14}
	// DefaultAnalyzeWindows are the windows operators usually weigh.
	DefaultAnalyzeWindows = []time.Duration{time.Minute, 5 * time.Minute, 15 * time.Minute}
)

// The definitions behind Analyze's measurements and recommendations.
const (
	// stationaryRadiusM and stationaryMinDuration define a stationary run:
	// wide enough for consumer-GPS jitter, long enough that a traffic light
	// is not mistaken for parking.
	stationaryRadiusM     = 25.0
	stationaryMinDuration = 2 * time.Minute
	// minMoveM is the floor of the real-move threshold, so that a capture
	// with (almost) no jitter does not count rounding noise as moves.
	minMoveM = 1.0
	// windowIntervals is how many report intervals the recommended window
	// spans: a parked asset then keeps at most one ping in ten.
	windowIntervals = 10
	// maxLineBytes matches the handler's default max_body: a longer line
	// would be answered 413, not decided.
	maxLineBytes = 1 << 20
	// analyzeTTL keeps every claim for the whole capture: the replay asks
	// what the window and resolution do, and the TTL is answered apart.
	analyzeTTL = 100 * 365 * 24 * time.Hour
	// analyzePrefix starts the keys of the replay's private stores.
	analyzePrefix = "analyze:"
)

// Reasons a capture line is skipped, besides the Rule an invalid ping broke.
const (
	// SkipMalformed: the line is not a JSON object.
	SkipMalformed = "malformed"
	// SkipNotAPing: the parser's kind filter says the line is another
	// message type (ErrNotAPing).
	SkipNotAPing = "not_a_ping"
	// SkipTooLarge: the line is longer than the handler's default max_body
	// (1 MiB).
	SkipTooLarge = "too_large"
)

// AnalyzeOptions says how to read a capture and which candidates to try.
type AnalyzeOptions struct {
	// Parser reads each NDJSON line (paths, preset, CRS) and applies the
	// handler's validation rules, except max_future: Analyze ignores
	// MaxFuture, since a capture is judged after the fact and its server
	// clock is gone. A Parser without TimePaths (the zero value) means
	// NewParser().
	Parser Parser
	// Resolutions are the candidate H3 resolutions; nil means
	// DefaultAnalyzeResolutions.
	Resolutions []int
	// Windows are the candidate windows; nil means DefaultAnalyzeWindows.
	Windows []time.Duration
	// Shape is the window shape to replay with; empty means Tumbling.
	Shape Shape
	// SessionIdle is the gap that opens a new session (Session only); zero
	// means DefaultSessionIdle.
	SessionIdle time.Duration
	// Hysteresis is as in Policy. A candidate resolution whose cell edge is
	// shorter is not replayed, and a note says so.
	Hysteresis float64
	// RetryLadder holds the sender's retry offsets for the TTL; nil means
	// DefaultRetryLadder.
	RetryLadder []time.Duration
	// OutageMargin is added to the last retry for the TTL; nil means
	// DefaultOutageMargin.
	OutageMargin *time.Duration
}

// Report is what Analyze found in a capture. Medians and percentiles are
// nearest-rank: the smallest value with at least that share of the values
// at or below it.
type Report struct {
	// Shape is the window shape the candidates were replayed with.
	Shape Shape `json:"shape"`
	// Lines counts the non-blank lines read: Pings plus every Skipped.
	Lines int `json:"lines"`
	// Pings counts the lines that parsed and validated into a ping.
	Pings int `json:"pings"`
	// Skipped counts the other lines by why: the Rule an invalid ping
	// broke, SkipMalformed, SkipNotAPing or SkipTooLarge.
	Skipped map[string]int `json:"skipped"`
	// Assets counts the distinct asset ids.
	Assets int `json:"assets"`
	// MedianInterval is the median device-time gap between consecutive
	// fixes of one asset, pooled over all assets; gaps <= 0 (redeliveries,
	// disorder) are left out.
	MedianInterval time.Duration `json:"median_interval_ns"`
	// Jitter is how far a parked asset's fixes wander.
	Jitter JitterStats `json:"jitter"`
	// Moves describes the real moves the resolutions are judged on.
	Moves MoveStats `json:"moves"`
	// Resolutions holds, per candidate resolution, how many real moves
	// stay inside one cell.
	Resolutions []ResolutionStats `json:"resolutions"`
	// Candidates holds the replay of every (resolution, window) candidate,
	// by resolution, then window.
	Candidates []CandidateStats `json:"candidates"`
	// Recommended is the configuration this capture argues for.
	Recommended Recommendation `json:"recommended"`
	// Notes explain recommendations that fell back to a default and
	// candidates that were not replayed.
	Notes []string `json:"notes"`
}

// JitterStats measures parked jitter on stationary runs: per asset, in
// device-time order, maximal runs of consecutive fixes that all lie within
// 25 m (haversine) of the run's first fix and that last at least 2 minutes
// of device time. Each fix of a run is one sample: its distance to the
// run's median position (the component-wise median of lat and lon).
type JitterStats struct {
	// Runs counts the stationary runs.
	Runs int `json:"runs"`
	// Samples counts the fixes in them.
	Samples int `json:"samples"`
	// P50M is the median sample, in metres.
	P50M float64 `json:"p50_m"`
	// P95M is the 95th percentile, in metres: the jitter a cell edge must
	// span.
	P95M float64 `json:"p95_m"`
	// P99M is the 99th percentile, in metres.
	P99M float64 `json:"p99_m"`
}

// MoveStats counts real moves: consecutive fixes of one asset (device-time
// order) that are not both inside the same stationary run, and lie more
// than ThresholdM apart.
type MoveStats struct {
	// ThresholdM is max(p95 jitter, 1 m): a shorter displacement may be
	// noise.
	ThresholdM float64 `json:"threshold_m"`
	// Count is the number of real moves.
	Count int `json:"count"`
}

// ResolutionStats is what one candidate resolution makes of real moves.
type ResolutionStats struct {
	// Resolution is the H3 resolution.
	Resolution int `json:"resolution"`
	// EdgeM is its average cell edge (h3.HexagonEdgeLengthAvgM), in metres.
	EdgeM float64 `json:"edge_m"`
	// Swallowed counts real moves whose two fixes share a cell: a move the
	// dedup cannot see.
	Swallowed int `json:"swallowed"`
	// SwallowedShare is Swallowed / Moves.Count, 0 without moves.
	SwallowedShare float64 `json:"swallowed_share"`
}

// CandidateStats is the production Deduper's verdict on the capture for
// one (resolution, window) candidate.
type CandidateStats struct {
	// Resolution is the candidate's H3 resolution.
	Resolution int `json:"resolution"`
	// Window is the candidate's window.
	Window time.Duration `json:"window_ns"`
	// Pings counts the pings replayed.
	Pings int `json:"pings"`
	// Admitted counts the pings accepted, which the replay assumes the
	// upstream took.
	Admitted int `json:"admitted"`
	// Suppressed counts the other pings by reason.
	Suppressed map[Reason]int `json:"suppressed"`
	// SuppressionRatio is (Pings - Admitted) / Pings, 0 without pings.
	SuppressionRatio float64 `json:"suppression_ratio"`
}

// Recommendation is the configuration a capture argues for.
type Recommendation struct {
	// Resolution is the finest H3 resolution (of all, 0 to 15) whose
	// average edge is at least the p95 jitter; DefaultResolution without
	// stationary samples.
	Resolution int `json:"resolution"`
	// EdgeM is that resolution's average cell edge, in metres.
	EdgeM float64 `json:"edge_m"`
	// Window is the smallest candidate window of at least ten median report
	// intervals, else the largest candidate; DefaultWindow when no interval
	// was measured.
	Window time.Duration `json:"window_ns"`
	// TTL is TTLPolicy{Window, RetryLadder, OutageMargin}.Resolve().
	TTL time.Duration `json:"ttl_ns"`
	// TTLFrom is Resolve's explanation of the TTL.
	TTLFrom string `json:"ttl_from"`
}

// Analyze reads an NDJSON capture of pings (one JSON ping per line, blank
// lines ignored) and replays it through the production Deduper for every
// (resolution, window) candidate, in capture order, one asset at a time
// with fresh memory stores: the keys carry the asset, so decisions never
// span assets. It measures the parked jitter, the report interval and the
// real moves each resolution swallows, and recommends a resolution, a
// window and a TTL. A line that cannot be read as a ping is counted in
// Report.Skipped, never fatal; invalid options and read errors are.
func Analyze(r io.Reader, opts AnalyzeOptions) (*Report, error) {
	opts = opts.withDefaults()
	a, err := newAnalyzer(opts)
	if err != nil {
		return nil, err
	}
	assets, err := a.read(r)
	if err != nil {
		return nil, err
	}
	for _, as := range assets {
		if err := a.addAsset(as); err != nil {
			return nil, err
		}
	}
	if err := a.finish(); err != nil {
		return nil, err
	}
	return a.report, nil
}

func (o AnalyzeOptions) withDefaults() AnalyzeOptions {
	if len(o.Parser.TimePaths) == 0 {
		o.Parser = NewParser()
	}
	// Ignore max_future: with the largest duration nothing is ever ahead.
	o.Parser.MaxFuture = math.MaxInt64
	o.Parser = o.Parser.Prepared()
	if o.Resolutions == nil {
		o.Resolutions = DefaultAnalyzeResolutions
	}
	if o.Windows == nil {
		o.Windows = DefaultAnalyzeWindows
	}
	o.Resolutions, o.Windows = sortedUnique(o.Resolutions), sortedUnique(o.Windows)
	o.Shape = cmp.Or(o.Shape, Tumbling)
	o.SessionIdle = cmp.Or(o.SessionIdle, DefaultSessionIdle)
	return o
}

func sortedUnique[T cmp.Ordered](s []T) []T {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

func (o AnalyzeOptions) policy(window time.Duration) Policy {
	return Policy{Shape: o.Shape, Window: window, SessionIdle: o.SessionIdle, Hysteresis: o.Hysteresis,
		TTL: analyzeTTL, InFlightTimeout: DefaultInFlightTimeout}
}

func (o AnalyzeOptions) ttl(window time.Duration) (time.Duration, string, error) {
	return TTLPolicy{Window: window, RetryLadder: o.RetryLadder, OutageMargin: o.OutageMargin}.Resolve()
}

// analyzer accumulates one capture's analysis, asset by asset.
type analyzer struct {
	opts   AnalyzeOptions
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
	gaps    []time.Duration
	samples []float64
	moves   []move
}

// candidateRun replays one (resolution, window) candidate.
type candidateRun struct {
	keyer    Keyer
	policy   Policy
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

// fixPoint is one ping of a known asset.
type fixPoint struct {
	t        time.Time
	lat, lon float64
}

// assetFixes holds one asset's pings in capture order.
type assetFixes struct {
	name  string
	fixes []fixPoint
}

func newAnalyzer(opts AnalyzeOptions) (*analyzer, error) {
	if !slices.Contains(Shapes, opts.Shape) {
		return nil, &ConfigError{Option: "shape", Problem: fmt.Sprintf("%q is not a shape; use one of %v", opts.Shape, Shapes)}
	}
	if _, _, err := opts.ttl(0); err != nil {
		return nil, err
	}
	// Resolution 0 has the longest edge: what fails there fails everywhere.
	if err := opts.policy(DefaultWindow).Check(0); err != nil {
		return nil, err
	}
	for _, res := range opts.Resolutions {
		if err := (Keyer{Window: time.Second, Resolution: res}).Check(); err != nil {
			return nil, err
		}
	}
	for _, w := range opts.Windows {
		if err := (Keyer{Window: w}).Check(); err != nil {
			return nil, err
		}
	}
	a := &analyzer{
		opts:    opts,
		report:  &Report{Shape: opts.Shape, Skipped: map[string]int{}},
		cells:   make([][]h3.Cell, len(opts.Resolutions)),
		buckets: make([][]int64, len(opts.Windows)),
		keys:    map[bucketCell]string{},
	}
	for i, res := range opts.Resolutions {
		a.report.Resolutions = append(a.report.Resolutions, ResolutionStats{Resolution: res, EdgeM: h3.HexagonEdgeLengthAvgM(res)})
		if err := opts.policy(DefaultWindow).Check(res); err != nil {
			a.note("resolution %d is not replayed: %v", res, err)
			continue
		}
		for j, w := range opts.Windows {
			k := Keyer{Window: w, Resolution: res, Prefix: analyzePrefix}
			a.report.Candidates = append(a.report.Candidates, CandidateStats{Resolution: res, Window: w, Suppressed: map[Reason]int{}})
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

// read parses the capture and groups its pings by asset, in order of first
// appearance, keeping capture order within each asset.
func (a *analyzer) read(r io.Reader) ([]*assetFixes, error) {
	var assets []*assetFixes
	byName := map[string]*assetFixes{}
	lr := lineReader{r: bufio.NewReaderSize(r, 64<<10)}
	for {
		line, tooLong, err := lr.next()
		if err == io.EOF {
			return assets, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading the capture after line %d: %w", lr.n, err)
		}
		if !tooLong && len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		a.report.Lines++
		if tooLong {
			a.report.Skipped[SkipTooLarge]++
			continue
		}
		p, err := a.opts.Parser.Parse(line, time.Time{}) // any clock: max_future is off
		if err != nil {
			a.report.Skipped[skipReason(err)]++
			continue
		}
		a.report.Pings++
		as := byName[p.Asset]
		if as == nil {
			// Clone: the parser's strings may share the reused line buffer.
			as = &assetFixes{name: strings.Clone(p.Asset)}
			byName[as.name] = as
			assets = append(assets, as)
		}
		as.fixes = append(as.fixes, fixPoint{t: p.Time, lat: p.Lat, lon: p.Lon})
	}
}

// skipReason names why a line is not a ping.
func skipReason(err error) string {
	var invalid *InvalidPingError
	switch {
	case errors.As(err, &invalid):
		return string(invalid.Rule)
	case errors.Is(err, ErrNotAPing):
		return SkipNotAPing
	default:
		return SkipMalformed
	}
}

// lineReader splits NDJSON into lines without giving up on an overlong one,
// unlike bufio.Scanner, which stops at the first.
type lineReader struct {
	r   *bufio.Reader
	buf []byte
	n   int // lines returned so far
}

// next returns the next line (valid until the following call), whether it
// was longer than maxLineBytes (then it is dropped), or io.EOF.
func (lr *lineReader) next() (line []byte, tooLong bool, err error) {
	lr.buf = lr.buf[:0]
	for {
		chunk, err := lr.r.ReadSlice('\n')
		if len(lr.buf)+len(chunk) > maxLineBytes+1 { // +1: the newline
			tooLong = true
		}
		if !tooLong {
			lr.buf = append(lr.buf, chunk...)
		}
		switch {
		case err == bufio.ErrBufferFull:
			continue
		case err == io.EOF && (len(lr.buf) > 0 || tooLong):
			err = nil // a last line without a newline
		case err != nil:
			return nil, false, err
		}
		lr.n++
		return lr.buf, tooLong, nil
	}
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
	a.measure(as.fixes)
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
		k := Keyer{Window: w}
		buckets := a.buckets[i][:0]
		for _, f := range fixes {
			buckets = append(buckets, k.Bucket(f.t))
		}
		a.buckets[i] = buckets
	}
}

// replay runs one asset's pings through a production Deduper with a fresh
// store, claiming each in capture order and settling every accepted claim,
// as if the upstream took them all.
func (a *analyzer) replay(run *candidateRun, as *assetFixes) error {
	ctx := context.Background()
	var now time.Time
	d := Deduper{Store: NewMemoryStore(0), Keyer: run.keyer, Policy: run.policy, Now: func() time.Time { return now }}
	cells, buckets := a.cells[run.res], a.buckets[run.win]
	clear(a.keys)
	for i, f := range as.fixes {
		now = f.t
		bucket, cell := buckets[i], cells[i]
		// Hashing is the replay's dearest step, and only an admitted ping
		// brings a new (bucket, cell): remember the keys of this asset.
		key, ok := a.keys[bucketCell{bucket, cell}]
		if !ok {
			key = run.keyer.Key(as.name, bucket, cell)
			a.keys[bucketCell{bucket, cell}] = key
		}
		obs := Observation{Ping: Ping{Asset: as.name, Time: f.t, Lat: f.lat, Lon: f.lon}, Bucket: bucket, Cell: cell, Key: key}
		c, v, err := d.Claim(ctx, obs)
		if err != nil {
			return err
		}
		run.stats.Pings++
		if v.Decision != Accepted {
			run.stats.Suppressed[v.Reason]++
			continue
		}
		run.stats.Admitted++
		if err := d.Settle(ctx, c); err != nil {
			return err
		}
	}
	return nil
}

// measure adds one asset's report intervals, stationary runs and move
// candidates, all in device-time order.
func (a *analyzer) measure(fixes []fixPoint) {
	a.order = a.order[:0]
	for i := range fixes {
		a.order = append(a.order, int32(i))
	}
	slices.SortStableFunc(a.order, func(x, y int32) int { return fixes[x].t.Compare(fixes[y].t) })

	for k := 1; k < len(a.order); k++ {
		if gap := fixes[a.order[k]].t.Sub(fixes[a.order[k-1]].t); gap > 0 {
			a.gaps = append(a.gaps, gap)
		}
	}
	a.findRuns(fixes)
	a.findMoves(fixes)
}

// findRuns marks the stationary runs in a.runOf (by position in a.order;
// 0 is none, else run number) and samples their jitter.
func (a *analyzer) findRuns(fixes []fixPoint) {
	a.runOf = slices.Grow(a.runOf[:0], len(a.order))[:len(a.order)]
	clear(a.runOf)
	at := func(k int) fixPoint { return fixes[a.order[k]] }
	for start := 0; start < len(a.order); {
		first := at(start)
		end := start + 1
		for end < len(a.order) && distanceM(first.lat, first.lon, at(end).lat, at(end).lon) <= stationaryRadiusM {
			end++
		}
		// Too short: a later start may still open a run within this span.
		if at(end-1).t.Sub(first.t) < stationaryMinDuration {
			start++
			continue
		}
		a.report.Jitter.Runs++
		for k := start; k < end; k++ {
			a.runOf[k] = int32(a.report.Jitter.Runs)
		}
		a.sampleRun(fixes, a.order[start:end])
		start = end
	}
}

// sampleRun adds the distance of each fix of a run to the run's median
// position.
func (a *analyzer) sampleRun(fixes []fixPoint, run []int32) {
	median := func(coord func(fixPoint) float64) float64 {
		a.scratch = a.scratch[:0]
		for _, i := range run {
			a.scratch = append(a.scratch, coord(fixes[i]))
		}
		slices.Sort(a.scratch)
		return nearestRank(a.scratch, 50)
	}
	lat := median(func(f fixPoint) float64 { return f.lat })
	lon := median(func(f fixPoint) float64 { return f.lon })
	for _, i := range run {
		a.samples = append(a.samples, distanceM(lat, lon, fixes[i].lat, fixes[i].lon))
	}
}

// findMoves keeps the consecutive pairs that may be real moves, with the
// resolutions at which they stay in one cell.
func (a *analyzer) findMoves(fixes []fixPoint) {
	for k := 1; k < len(a.order); k++ {
		if a.runOf[k] != 0 && a.runOf[k] == a.runOf[k-1] {
			continue
		}
		i, j := a.order[k-1], a.order[k]
		d := distanceM(fixes[i].lat, fixes[i].lon, fixes[j].lat, fixes[j].lon)
		if d <= minMoveM {
			continue
		}
		m := move{distM: d}
		for r, cells := range a.cells {
			if cells[i] == cells[j] {
				m.sameCell |= 1 << r
			}
		}
		a.moves = append(a.moves, m)
	}
}

// finish turns the pooled measurements into the report's statistics and
// recommendations.
func (a *analyzer) finish() error {
	rep := a.report
	slices.Sort(a.gaps)
	rep.MedianInterval = nearestRank(a.gaps, 50)

	slices.Sort(a.samples)
	rep.Jitter.Samples = len(a.samples)
	rep.Jitter.P50M = nearestRank(a.samples, 50)
	rep.Jitter.P95M = nearestRank(a.samples, 95)
	rep.Jitter.P99M = nearestRank(a.samples, 99)

	a.countMoves()
	for i := range rep.Candidates {
		c := &rep.Candidates[i]
		c.SuppressionRatio = ratio(c.Pings-c.Admitted, c.Pings)
	}
	a.recommendResolution()
	a.recommendWindow()
	ttl, from, err := a.opts.ttl(rep.Recommended.Window)
	rep.Recommended.TTL, rep.Recommended.TTLFrom = ttl, from
	return err
}

func (a *analyzer) countMoves() {
	rep := a.report
	rep.Moves.ThresholdM = max(rep.Jitter.P95M, minMoveM)
	for _, m := range a.moves {
		if m.distM <= rep.Moves.ThresholdM {
			continue
		}
		rep.Moves.Count++
		for r := range rep.Resolutions {
			if m.sameCell&(1<<r) != 0 {
				rep.Resolutions[r].Swallowed++
			}
		}
	}
	for r := range rep.Resolutions {
		rep.Resolutions[r].SwallowedShare = ratio(rep.Resolutions[r].Swallowed, rep.Moves.Count)
	}
}

func (a *analyzer) recommendResolution() {
	rec := &a.report.Recommended
	rec.Resolution = DefaultResolution
	if a.report.Jitter.Samples == 0 {
		a.note("no stationary run (%s of fixes within %g m of the first) to measure jitter on; resolution is the default %d",
			stationaryMinDuration, stationaryRadiusM, DefaultResolution)
	} else {
		rec.Resolution = finestResolutionOver(a.report.Jitter.P95M)
	}
	rec.EdgeM = h3.HexagonEdgeLengthAvgM(rec.Resolution)
	if !slices.Contains(a.opts.Resolutions, rec.Resolution) {
		a.note("recommended resolution %d is not among the candidates; add it to see its replay", rec.Resolution)
	}
}

// finestResolutionOver returns the finest H3 resolution whose average edge
// is at least m metres, so that jitter of that size stays in one cell.
func finestResolutionOver(m float64) int {
	res := 0
	for r := 1; r <= 15 && h3.HexagonEdgeLengthAvgM(r) >= m; r++ {
		res = r
	}
	return res
}

func (a *analyzer) recommendWindow() {
	rec, ws := &a.report.Recommended, a.opts.Windows
	interval := a.report.MedianInterval
	if interval == 0 {
		rec.Window = DefaultWindow
		a.note("no asset reported twice at different times; window is the default %s", DefaultWindow)
		return
	}
	i := slices.IndexFunc(ws, func(w time.Duration) bool { return w >= windowIntervals*interval })
	if i < 0 {
		i = len(ws) - 1
		a.note("no candidate window spans %d median report intervals (%s); window is the largest candidate", windowIntervals, windowIntervals*interval)
	}
	rec.Window = ws[i]
}

// nearestRank returns the pct-th percentile of sorted values, the zero
// value if there are none.
func nearestRank[T any](sorted []T, pct int) T {
	if len(sorted) == 0 {
		var zero T
		return zero
	}
	rank := max((pct*len(sorted)+99)/100, 1) // ceil(pct/100 · n), in integers to stay exact
	return sorted[rank-1]
}

func ratio(part, whole int) float64 {
	if whole == 0 {
		return 0
	}
	return float64(part) / float64(whole)
}

// WriteTable writes the report for people: a summary, the resolutions, the
// candidates and the recommendation, in aligned columns.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	r.writeSummary(tw)
	fmt.Fprintln(tw)
	r.writeResolutions(tw)
	fmt.Fprintln(tw)
	r.writeCandidates(tw)
	fmt.Fprintln(tw)
	r.writeRecommendation(tw)
	return tw.Flush()
}

func (r *Report) writeSummary(w io.Writer) {
	fmt.Fprintf(w, "capture\t%d lines, %d pings, %d assets\n", r.Lines, r.Pings, r.Assets)
	if len(r.Skipped) > 0 {
		fmt.Fprintf(w, "skipped\t%s\n", formatCounts(r.Skipped))
	}
	fmt.Fprintf(w, "interval\tmedian %s between an asset's fixes\n", r.MedianInterval)
	fmt.Fprintf(w, "jitter\tp50 %.1f m, p95 %.1f m, p99 %.1f m (%d fixes in %d stationary runs)\n",
		r.Jitter.P50M, r.Jitter.P95M, r.Jitter.P99M, r.Jitter.Samples, r.Jitter.Runs)
	fmt.Fprintf(w, "moves\t%d real moves (over %.1f m)\n", r.Moves.Count, r.Moves.ThresholdM)
}

func (r *Report) writeResolutions(w io.Writer) {
	fmt.Fprintln(w, "resolution\tedge\tmoves swallowed")
	for _, s := range r.Resolutions {
		fmt.Fprintf(w, "%d\t%.1f m\t%.1f%%\n", s.Resolution, s.EdgeM, 100*s.SwallowedShare)
	}
}

func (r *Report) writeCandidates(w io.Writer) {
	reasons := r.reasons()
	fmt.Fprint(w, "resolution\twindow\tpings\tadmitted\tsuppressed")
	for _, reason := range reasons {
		fmt.Fprintf(w, "\t%s", reason)
	}
	fmt.Fprintln(w)
	for _, c := range r.Candidates {
		fmt.Fprintf(w, "%d\t%s\t%d\t%d\t%.1f%%", c.Resolution, c.Window, c.Pings, c.Admitted, 100*c.SuppressionRatio)
		for _, reason := range reasons {
			fmt.Fprintf(w, "\t%d", c.Suppressed[reason])
		}
		if c.Resolution == r.Recommended.Resolution && c.Window == r.Recommended.Window {
			fmt.Fprint(w, "\t<- recommended")
		}
		fmt.Fprintln(w)
	}
}

// reasons lists the suppression reasons any candidate has, in a fixed
// order, so that a shape's table has no columns of zeros it cannot fill.
func (r *Report) reasons() []Reason {
	var out []Reason
	for _, reason := range []Reason{Redelivery, Reobservation, Jitter, ReasonSliding, ReasonSession} {
		if slices.ContainsFunc(r.Candidates, func(c CandidateStats) bool { return c.Suppressed[reason] > 0 }) {
			out = append(out, reason)
		}
	}
	return out
}

func (r *Report) writeRecommendation(w io.Writer) {
	rec := r.Recommended
	fmt.Fprintf(w, "recommended\tresolution %d (%.1f m edges)\n", rec.Resolution, rec.EdgeM)
	fmt.Fprintf(w, "\twindow %s\n", rec.Window)
	fmt.Fprintf(w, "\tttl %s (%s)\n", rec.TTL, rec.TTLFrom)
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note\t%s\n", n)
	}
}

// formatCounts writes counts as "a 1, b 2", sorted by key.
func formatCounts(counts map[string]int) string {
	keys := slices.Sorted(maps.Keys(counts))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, counts[k])
	}
	return strings.Join(parts, ", ")
}
