// Package analyze sizes telemetry_dedup from a capture of an operator's own
// pings: it replays them through the production decision code for a grid of
// resolutions and windows, measures the parked jitter and the real moves,
// and recommends a configuration. Printing the report for people (table.go)
// is apart from computing it.
package analyze

import (
	"bufio"
	"bytes"
	"cmp"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"iter"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// Default candidate grid of Analyze.
var (
	// DefaultResolutions spans city-block cells (9, 174 m edges) to
	// survey-grade ones (14, 1.3 m).
	DefaultResolutions = []int{9, 10, 11, 12, 13, 14}
	// DefaultWindows are the windows operators usually weigh.
	DefaultWindows = []time.Duration{time.Minute, 5 * time.Minute, 15 * time.Minute}
)

// The definitions behind Analyze's measurements and recommendations.
const (
	// stationaryRadiusM and stationaryMinDuration define a stationary run:
	// wide enough for consumer-GPS jitter, long enough that a traffic light
	// is not mistaken for parking.
	stationaryRadiusM     = 25.0
	stationaryMinDuration = 2 * time.Minute
	// maxExcursion and maxStrayShare say which fixes beyond
	// stationaryRadiusM a stationary run goes on through: at most
	// maxExcursion in a row, the fix after them back, and at most
	// maxStrayShare of the run's fixes in all. A receiver's multipath
	// outliers come alone or in pairs, now and then; an asset that leaves
	// does not come back a fix later. Were a run to end at every outlier,
	// the receiver's jitter would be measured without its outliers, and
	// each outlier would count as two moves.
	maxExcursion  = 2
	maxStrayShare = 0.25
	// departureFixes is how many fixes in a row, each farther from a
	// span's median than the one before, end it as a departure (see
	// withoutDeparture).
	departureFixes = 3
	// maxJitterAccuracyM and maxJitterM (measure.go) leave out of the
	// jitter what no stay radius should hold: a fix whose own accuracy is
	// worse than a satellite fix's (a phone's cell or Wi-Fi fix, which the
	// stay holds by its accuracy, whatever the radius), and a stray farther
	// than four run radii from the run's median. Counted, 2% of a parked
	// phone's fixes 1-3 km out made the recommended radius one no policy
	// takes, and analyze failed; 1% at 0.5-1 km recommended 672 m, whose
	// lag bound hid moves of a kilometre.
	maxJitterAccuracyM = 100.0
	// lateShare is the share of a capture's fixes that may come after a
	// later fix of their asset before it reads as a capture out of order:
	// an offline backlog makes some late, a capture sorted newest first
	// all of them, two rotated logs joined newest first the older's.
	lateShare = 0.2
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

// Reasons a ping of the capture is skipped, besides the Rule an invalid
// ping broke.
const (
	// SkipMalformed: the ping is not a JSON object, or its line is a batch
	// the handler could not split (no array at the wrapper, an empty
	// array), which counts as one ping.
	SkipMalformed = "malformed"
	// SkipNotAPing: the parser's kind filter says the ping is another
	// message type (ErrNotAPing).
	SkipNotAPing = "not_a_ping"
	// SkipTooLarge: the line is longer than the handler's default max_body
	// (1 MiB; it counts as one ping), or its batch holds more pings than
	// the splitter's Max (each of them counts), which the handler would
	// answer 413.
	SkipTooLarge = "too_large"
)

// Options says how to read a capture and which candidates to try.
type Options struct {
	// Parser reads each JSON ping (paths, preset, CRS) and applies the
	// handler's validation rules, except max_future and max_past: Analyze
	// ignores MaxFuture and MaxPast, since a capture is judged after the
	// fact and its server clock is gone. A Parser without TimePaths (the zero value) means
	// NewParser().
	Parser ping.Parser
	// Form, when it has TimePaths, reads the lines that are not JSON
	// objects as form-encoded pings (a query string, a form body or the
	// whole URL, as an OsmAnd tracker sends them and an access log keeps
	// them), as the directive's encoding form and auto do; Analyze ignores
	// its MaxFuture and MaxPast too. The zero value reads every line as
	// JSON.
	Form ping.Parser
	// FormOnly refuses the lines that are JSON (an object or an array),
	// as the directive's encoding form refuses a JSON body; encoding auto
	// reads them as JSON.
	FormOnly bool
	// Batch splits each line that is not a form ping into its pings, as
	// the handler splits a request body: the elements of a JSON array, or
	// of the array at Batch.Wrapper in an object (Overland's locations:
	// the preset's Wrapper, or the directive's batch), else the line
	// itself. A zero Max means ping.DefaultMaxBatch.
	Batch ping.Splitter
	// Resolutions are the candidate H3 resolutions; nil means
	// DefaultResolutions.
	Resolutions []int
	// Windows are the candidate windows; nil means DefaultWindows.
	Windows []time.Duration
	// Shape is the window shape to replay with; empty means Tumbling.
	Shape dedup.Shape
	// SessionIdle is the gap that opens a new session (Session only); zero
	// means DefaultSessionIdle.
	SessionIdle time.Duration
	// Radius is the stay radius the sliding and session shapes are replayed
	// with; zero means dedup.DefaultRadius.
	Radius float64
	// RetryLadder holds the sender's retry offsets for the TTL; nil means
	// DefaultRetryLadder.
	RetryLadder []time.Duration
	// OutageMargin is added to the last retry for the TTL; nil means
	// DefaultOutageMargin.
	OutageMargin *time.Duration
}

// Analyze reads a capture of pings (one request body per line: a JSON
// ping or batch, or, with Options.Form, a form-encoded ping; or a line of
// the OwnTracks Recorder's .rec files, read as its message; blank lines
// ignored; or a GPX document, as Traccar exports a route, see readGPX;
// gzip-compressed or not) and replays it through
// the production Deduper for every (resolution, window) candidate, in
// capture order, one asset at a time with fresh memory stores: the keys carry the asset, so decisions never
// span assets. It measures the parked jitter, the report interval and the
// real moves each resolution swallows, and recommends a resolution, a
// window, a stay radius (checked by a replay in sliding) and a TTL. A ping
// that cannot be read is counted in Report.Skipped, never fatal; invalid
// options and read errors are.
func Analyze(r io.Reader, opts Options) (*Report, error) {
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
	if err := a.finish(assets); err != nil {
		return nil, err
	}
	return a.report, nil
}

func (o Options) withDefaults() Options {
	if len(o.Parser.TimePaths) == 0 {
		o.Parser = ping.NewParser()
	}
	o.Parser = judgedAfterTheFact(o.Parser)
	if len(o.Form.TimePaths) > 0 {
		o.Form = judgedAfterTheFact(o.Form)
	}
	if o.Resolutions == nil {
		o.Resolutions = DefaultResolutions
	}
	if o.Windows == nil {
		o.Windows = DefaultWindows
	}
	o.Resolutions, o.Windows = sortedUnique(o.Resolutions), sortedUnique(o.Windows)
	o.Shape = cmp.Or(o.Shape, dedup.Tumbling)
	o.SessionIdle = cmp.Or(o.SessionIdle, dedup.DefaultSessionIdle)
	o.Radius = cmp.Or(o.Radius, dedup.DefaultRadius)
	o.Batch.Max = cmp.Or(o.Batch.Max, ping.DefaultMaxBatch)
	return o
}

// judgedAfterTheFact turns off a parser's max_future and max_past: with
// the largest duration nothing is ever ahead or behind.
func judgedAfterTheFact(p ping.Parser) ping.Parser {
	p.MaxFuture, p.MaxPast = math.MaxInt64, math.MaxInt64
	return p.Prepared()
}

func sortedUnique[T cmp.Ordered](s []T) []T {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

func (o Options) policy(window time.Duration) dedup.Policy {
	return dedup.Policy{Shape: o.Shape, Window: window, SessionIdle: o.SessionIdle, Radius: o.Radius,
		TTL: analyzeTTL, InFlightTimeout: dedup.DefaultInFlightTimeout}
}

func (o Options) ttl(window time.Duration) (time.Duration, string, error) {
	p := dedup.TTLPolicy{Window: window, RetryLadder: o.RetryLadder, OutageMargin: o.OutageMargin}
	if o.Shape == dedup.Session {
		p.SessionIdle = o.SessionIdle
	}
	return p.Resolve()
}

// fixPoint is one ping of a known asset: its position, and the accuracy
// and speed it reports, which the stay of sliding and session judges it by.
type fixPoint struct {
	t               time.Time
	lat, lon        float64
	accuracy, speed float64
	hasSpeed        bool
	// event and state are the ping's, which the handler keys and judges
	// it by: an alarm is admitted where a plain fix would be suppressed.
	// stateFields are its parser's, by which each state field is judged
	// on its own (ping.Ping.StateFields).
	event, state, stateFields string
}

// assetFixes holds one asset's pings in capture order, each request's in
// device-time order (see lineFixes).
type assetFixes struct {
	name  string
	fixes []fixPoint
	// parked marks, by capture index, the fixes of a stationary run but
	// its first (the arrival, a move): the ones a stay should suppress.
	parked []bool
}

// read parses the capture and groups its pings by asset, in order of first
// appearance, keeping capture order within each asset, but for the pings
// of one request (a line), which the handler decides in device-time order.
func (a *analyzer) read(r io.Reader) ([]*assetFixes, error) {
	var assets []*assetFixes
	byName := map[string]*assetFixes{}
	br, err := decompressed(bufio.NewReaderSize(r, 64<<10))
	if err != nil {
		return nil, err
	}
	if err := notUTF16(br); err != nil {
		return nil, err
	}
	skipUTF8BOM(br)
	if isGPX(br) {
		return a.readGPX(br)
	}
	lr := lineReader{r: br}
	var touched []lineFixes
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
			a.skip(SkipTooLarge, "line", lr.n, fmt.Errorf("longer than %d bytes, the handler's default max_body", maxLineBytes))
			continue
		}
		touched = touched[:0]
		for p, err := range a.pings(line) {
			if err != nil {
				a.skip(skipReason(err), "line", lr.n, err)
				continue
			}
			a.report.Elements++
			a.report.Pings++
			as := byName[p.Asset]
			if as == nil {
				// Clone: the parser's strings may share the reused line buffer.
				as = &assetFixes{name: strings.Clone(p.Asset)}
				byName[as.name] = as
				assets = append(assets, as)
			}
			if !slices.ContainsFunc(touched, func(l lineFixes) bool { return l.asset == as }) {
				touched = append(touched, lineFixes{as, len(as.fixes)})
			}
			as.fixes = append(as.fixes, fixPoint{t: p.Time, lat: p.Lat, lon: p.Lon, accuracy: p.Accuracy, speed: p.Speed, hasSpeed: p.HasSpeed,
				event: strings.Clone(p.Event), state: strings.Clone(p.State), stateFields: p.StateFields})
		}
		for _, l := range touched {
			l.inDeviceTimeOrder()
		}
	}
}

// lineFixes are the fixes of one asset that one line (one request) holds:
// those of asset from index from on.
type lineFixes struct {
	asset *assetFixes
	from  int
}

// inDeviceTimeOrder puts a request's fixes of one asset in the order the
// handler decides them: by device time, as sent where two tie
// (dedup.Deduper.ClaimAll). A Transistorsoft SDK set to upload newest
// first, or a shuffled offline backlog, had analyze admit twice what the
// handler did in sliding.
func (l lineFixes) inDeviceTimeOrder() {
	slices.SortStableFunc(l.asset.fixes[l.from:], func(a, b fixPoint) int { return a.t.Compare(b.t) })
}

// notUTF16 refuses a capture that starts with UTF-16's byte order mark, as
// Windows PowerShell's > and Out-File write text: read as UTF-8, each of
// its lines was a malformed ping, and the advice pointed at the path
// flags.
func notUTF16(br *bufio.Reader) error {
	head, _ := br.Peek(2)
	if !bytes.Equal(head, []byte{0xff, 0xfe}) && !bytes.Equal(head, []byte{0xfe, 0xff}) {
		return nil
	}
	return errors.New("the capture is UTF-16 text (it starts with a UTF-16 byte order mark, as Windows PowerShell's > and Out-File write it); " +
		"convert it to UTF-8 first: iconv -f UTF-16 -t UTF-8 capture.txt > capture.ndjson (in PowerShell: Out-File -Encoding utf8)")
}

// utf8BOM is the byte order mark some writers put at the start of a
// UTF-8 file: .NET's XmlWriter before a GPX document, and Windows
// PowerShell 5.1's Out-File -Encoding utf8, which notUTF16's advice names.
var utf8BOM = []byte("\xEF\xBB\xBF")

// skipUTF8BOM skips the capture file's byte order mark: it is the file's,
// not its first request's. Read as part of the first line, it made that
// line malformed, and a capture of one JSON array lost every ping.
func skipUTF8BOM(br *bufio.Reader) {
	if head, _ := br.Peek(len(utf8BOM)); bytes.Equal(head, utf8BOM) {
		_, _ = br.Discard(len(utf8BOM))
	}
}

// skip counts one ping of the capture that cannot be used, and why,
// keeping where the first of each reason was (the n-th line or track
// point) and its error.
func (a *analyzer) skip(reason, unit string, n int, err error) {
	a.report.Elements++
	a.report.Skipped[reason]++
	if a.report.Skipped[reason] == 1 {
		a.report.FirstSkipped[reason] = fmt.Sprintf("%s %d: %v", unit, n, err)
	}
}

// gzipMagic starts every gzip stream (RFC 1952).
var gzipMagic = []byte{0x1f, 0x8b}

// decompressed reads a gzip-compressed capture through gzip (every member
// of it, as zcat does), and any other as it is.
func decompressed(br *bufio.Reader) (*bufio.Reader, error) {
	if magic, _ := br.Peek(len(gzipMagic)); !bytes.Equal(magic, gzipMagic) {
		return br, nil
	}
	zr, err := gzip.NewReader(br)
	if err != nil {
		return nil, fmt.Errorf("the capture starts as gzip (1f 8b) but cannot be read as gzip: %w; decompress it first, or give the file as it is", err)
	}
	return bufio.NewReaderSize(gzipErrors{zr}, 64<<10), nil
}

// gzipErrors says of a read error that it came from the gzip stream, so
// that a truncated capture is not taken for a broken disk.
type gzipErrors struct{ r io.Reader }

func (g gzipErrors) Read(p []byte) (int, error) {
	n, err := g.r.Read(p)
	if err != nil && err != io.EOF {
		err = fmt.Errorf("decompressing the gzip capture: %w", err)
	}
	return n, err
}

// pings reads the pings of one line of the capture (of a line of the
// OwnTracks Recorder's .rec files, of its message), each with the error
// that keeps it from being used: a form ping when Form is set and the line
// is not JSON (an object or an array), else the elements the Batch
// splitter finds, each read as a JSON ping. A batch that cannot be split
// is one error, or one for each of its pings when there are too many.
// Any clock will do: max_future and max_past are off.
func (a *analyzer) pings(line []byte) iter.Seq2[ping.Ping, error] {
	return func(yield func(ping.Ping, error) bool) {
		text := bytes.TrimSpace(line)
		if message, ok := recorderMessage(text); ok {
			text = message
		}
		isJSON := bytes.HasPrefix(text, []byte("{")) || bytes.HasPrefix(text, []byte("["))
		if a.opts.FormOnly && isJSON {
			yield(ping.Ping{}, ping.JSONAsFormError())
			return
		}
		if len(a.opts.Form.TimePaths) > 0 && !isJSON {
			yield(a.parseForm(text))
			return
		}
		batch, err := a.opts.Batch.Split(nil, text, false)
		var tooLarge *ping.BatchTooLargeError
		switch {
		case errors.As(err, &tooLarge):
			for range tooLarge.Count {
				if !yield(ping.Ping{}, err) {
					return
				}
			}
			return
		case err != nil:
			yield(ping.Ping{}, err)
			return
		}
		for _, element := range batch.Elements {
			if !yield(a.opts.Parser.Parse(element, time.Time{})) {
				return
			}
		}
	}
}

// recorderStamp is the shape of the time stamp that starts each line of
// the OwnTracks Recorder's .rec files (isotime in its util.c: the
// message's tst, in UTC), a 0 for each digit.
const recorderStamp = "0000-00-00T00:00:00Z"

// recorderMessage returns the message of a line of the OwnTracks
// Recorder's .rec files, which its recorder.c writes as "%s\t%-18s\t%s":
// the time stamp, a tab, the topic below owntracks/<user>/<device> padded
// with spaces ("*", "event", "lwt"), a tab, then the message. The message
// is what follows the second tab; ok is false for a line that does not
// start with the time stamp and a tab. No JSON text starts so (a number has
// no "-" after a digit), nor does a query string or a URL.
func recorderMessage(line []byte) (message []byte, ok bool) {
	if len(line) <= len(recorderStamp) || line[len(recorderStamp)] != '\t' {
		return nil, false
	}
	for i := range len(recorderStamp) {
		c, want := line[i], recorderStamp[i]
		if want == '0' && (c < '0' || c > '9') || want != '0' && c != want {
			return nil, false
		}
	}
	_, message, ok = bytes.Cut(line[len(recorderStamp)+1:], []byte{'\t'})
	return message, ok
}

// parseForm reads a line holding a form ping: a query string, a form body
// or a whole URL.
func (a *analyzer) parseForm(text []byte) (ping.Ping, error) {
	element, err := a.opts.Form.FormLine(string(text))
	if err != nil {
		return ping.Ping{}, err
	}
	return a.opts.Form.Parse(element, time.Time{})
}

// skipReason names why a ping is not used.
func skipReason(err error) string {
	var invalid *ping.InvalidPingError
	var tooLarge *ping.BatchTooLargeError
	switch {
	case errors.As(err, &invalid):
		return string(invalid.Rule)
	case errors.Is(err, ping.ErrNotAPing):
		return SkipNotAPing
	case errors.As(err, &tooLarge):
		return SkipTooLarge
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
			// a last line without a newline: the next call finds io.EOF
		case err != nil:
			return nil, false, err
		}
		lr.n++
		return lr.buf, tooLong, nil
	}
}
