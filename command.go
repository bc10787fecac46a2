package telemetrydedup

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/uber/h3-go/v4"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/analyze"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "telemetry-dedup",
		Usage: "<analyze|key> [flags]",
		Short: "Size telemetry_dedup from a capture, or show the key of one ping",
		Long: `
analyze reads a capture of pings (one request body per line: a JSON ping,
a JSON array or the preset's wrapped batch of them, or a form-encoded ping
with a form-reading preset or --encoding; or the OwnTracks Recorder's .rec
files; gzip-compressed or not) and
reports, for a grid of H3 resolutions and windows, what telemetry_dedup
would admit and suppress and why, the measured parked jitter, and the share
of real moves one cell would swallow; then recommends a resolution, a window, the radius of the sliding
and session shapes, and the TTL for a retry ladder.

key prints the bucket, cell and store key of one ping, to find a production
key by hand.

Both read pings with the same paths and presets as the directive.`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.AddCommand(keyCommand(), analyzeCommand())
			cmd.Args = cobra.ArbitraryArgs
			cmd.RunE = func(cmd *cobra.Command, args []string) error {
				if len(args) == 0 {
					return cmd.Help()
				}
				return fmt.Errorf("unknown subcommand %q: use analyze or key", args[0])
			}
		},
	})
}

// pingFlags are the directive's options for reading a ping, and its shape,
// as flags: what both commands need.
func pingFlags(fs *pflag.FlagSet) {
	fs.String("preset", "", "tracker format: owntracks, overland, osmand, traccar or geojson")
	fs.StringSlice("asset", nil, "JSON path(s) of the asset id (default the preset's, else asset_id)")
	fs.StringSlice("time", nil, "JSON path(s) of the device timestamp (default the preset's, else occurred_at)")
	fs.String("time-format", "", "auto, rfc3339, unix or unix_ms (default the preset's, else auto)")
	fs.String("time-zone", "", "IANA zone of timestamps written without an offset, as time_zone")
	fs.String("encoding", "", "json, form or auto, as encoding (a form ping is a query string, a form body or a whole URL)")
	fs.String("lat", "", "JSON path of the latitude (default the preset's, else lat)")
	fs.String("lon", "", "JSON path of the longitude (default the preset's, else lon)")
	fs.String("crs", "", "coordinate system: EPSG:4326, EPSG:3857, EPSG:326xx, EPSG:327xx")
	fs.String("shape", "", "tumbling, sliding or session (default tumbling)")
	fs.String("null-island", "reject", "reject or allow the position (0, 0), as null_island")
}

// handlerFromFlags reads pingFlags into a Handler, so that the commands
// resolve options exactly as the directive does.
func handlerFromFlags(fs caddycmd.Flags) (*Handler, error) {
	h := &Handler{
		Preset:     fs.String("preset"),
		TimeFormat: fs.String("time-format"),
		TimeZone:   fs.String("time-zone"),
		Encoding:   fs.String("encoding"),
		Lat:        fs.String("lat"),
		Lon:        fs.String("lon"),
		CRS:        fs.String("crs"),
		Shape:      fs.String("shape"),
		NullIsland: fs.String("null-island"),
		MaxFuture:  caddy.Duration(100 * 365 * 24 * time.Hour), // a capture or a log line may be old
		MaxPast:    caddy.Duration(math.MaxInt64),
	}
	if err := readListFlags(fs, map[string]*[]string{"asset": &h.Asset, "time": &h.Time}); err != nil {
		return nil, err
	}
	for _, a := range h.Asset {
		if strings.Contains(a, "{") {
			return nil, fmt.Errorf("--asset %s: a placeholder template needs a request, and a capture has bodies only; give the JSON path of an id, "+
				"or %s", a, writeAnAssetIn)
		}
	}
	return h, nil
}

// resolveFlags resolves the options as the directive does, naming the flag
// at fault (--radius, not radius) when the directive's option has one.
func resolveFlags(fs caddycmd.Flags, h *Handler) (settings, error) {
	s, err := h.resolve()
	return s, namingFlag(fs, err)
}

// namingFlag names the flag at fault in a directive option's error: the
// option's own (--radius, not radius), or the list of candidates it was
// one of (--windows for a window), when that flag was given.
func namingFlag(fs caddycmd.Flags, err error) error {
	var ce *dedup.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	name := strings.ReplaceAll(ce.Option, "_", "-")
	for _, flag := range []string{name, name + "s"} {
		if f := fs.Lookup(flag); f != nil && f.Changed {
			return fmt.Errorf("--%s %s: %s", f.Name, f.Value, ce.Problem)
		}
	}
	return err
}

// readListFlags sets each list option whose flag was given; a flag not
// given leaves the preset's fields, as an option not given does.
func readListFlags(fs caddycmd.Flags, options map[string]*[]string) error {
	for name, dst := range options {
		values, err := fs.GetStringSlice(name)
		if err != nil {
			return err
		}
		if len(values) > 0 {
			*dst = values
		}
	}
	return nil
}

func keyCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "key [<ping JSON> | -]",
		Short: "Print the bucket, cell and store key of one ping",
		Long: `Print the bucket, cell and store key of one ping, read from the argument
or from standard input, e.g.

  caddy telemetry-dedup key '{"asset_id":"veh-88","occurred_at":"2026-08-08T12:00:00Z","lat":52.5200087,"lon":13.4049547}'

then look the key up in Redis: redis-cli GET <key>, PTTL <key>.`,
		Args: cobra.MaximumNArgs(1),
	}
	pingFlags(cmd.Flags())
	cmd.Flags().String("window", dedup.DefaultWindow.String(), "window (bucket width), as the directive's: 5m, 1h, 1d")
	cmd.Flags().Int("resolution", dedup.DefaultResolution, "H3 resolution")
	cmd.Flags().StringSlice("event", nil, "the event fields, as event (a ping with an event has keys of its own)")
	cmd.Flags().StringSlice("state", nil, "the state fields, as state (the state enters the key)")
	cmd.Flags().String("key-prefix", dedup.DefaultKeyPrefix, "key prefix")
	cmd.Flags().String("scope", "", "the key_scope value the ping was keyed in, as it entered the key "+
		"(a host from {http.request.host}: lower case, no trailing dot, no port)")
	cmd.Flags().Bool("json", false, "print JSON")
	cmd.RunE = caddycmd.WrapCommandFuncForCobra(func(fs caddycmd.Flags) (int, error) {
		return runKey(fs, os.Stdin, os.Stdout)
	})
	return cmd
}

// keyReport is what the key command prints.
type keyReport struct {
	// Asset is the ping's asset id, Scope its key scope (--scope).
	Asset string `json:"asset"`
	Scope string `json:"scope,omitempty"`
	// Time is the device time read from the ping.
	Time time.Time `json:"time"`
	// Bucket is the device time floored to the window, in epoch seconds.
	Bucket int64 `json:"bucket"`
	// Cell is the H3 cell of the position, in lower-case hex.
	Cell string `json:"cell"`
	// Key is the ping's key in the store: with sliding or session the
	// asset's state key, which is also the ping's key placeholder.
	Key string `json:"key"`
	// StateKey and SeenKey are the keys of the asset's track and of the
	// pings seen in the ping's minute (shapes sliding and session only).
	StateKey string `json:"state_key,omitempty"`
	SeenKey  string `json:"seen_key,omitempty"`
}

func runKey(fs caddycmd.Flags, stdin io.Reader, stdout io.Writer) (int, error) {
	h, err := handlerFromFlags(fs)
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	if err := readListFlags(fs, map[string]*[]string{"event": &h.Event, "state": &h.State}); err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	window, err := durationFlag(fs, "window", false)
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	resolution, prefix := fs.Int("resolution"), fs.String("key-prefix")
	h.Window, h.Resolution, h.KeyPrefix = caddy.Duration(window), &resolution, &prefix
	s, err := resolveFlags(fs, h)
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	body, err := pingArgument(fs.Arg(0), stdin)
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	if member := s.splitter.BatchMember(body); member != "" {
		return caddy.ExitCodeFailedStartup, fmt.Errorf("this is a batch, its pings in %s: the key command reads one ping; "+
			"give one of them, such as jq -c '.%s[0]' of the body", member, member)
	}
	ping, err := s.parseOne(body, time.Now())
	if err != nil {
		return caddy.ExitCodeFailedStartup, unkeyableError(fs, err)
	}
	asset, scope := ping.Asset, fs.String("scope")
	if checkTemplate("key_scope", scope) == nil { // a whole template, placeholder and all
		return caddy.ExitCodeFailedStartup, fmt.Errorf("--scope %s: that is the key_scope template; give the value it expanded to "+
			"for the ping's request, such as the host tenant-a.example for {http.request.host}", scope)
	}
	ping.Asset = dedup.ScopedAsset(scope, asset)
	obs := s.keyer.Observe(ping)
	r := keyReport{Asset: asset, Scope: scope, Time: obs.Time, Bucket: obs.Bucket, Cell: obs.Cell.String(), Key: obs.Key}
	if s.policy.Shape != dedup.Tumbling {
		r.StateKey, r.SeenKey = s.keyer.TrackKeys(ping.Asset, obs.Time)
		// The key these shapes decide on, as {http.telemetry_dedup.key}
		// names it: they write no tumbling key.
		r.Key = r.StateKey
	}
	if fs.Bool("json") {
		return 0, json.NewEncoder(stdout).Encode(r)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "asset\t%s\n", r.Asset)
	if r.Scope != "" {
		fmt.Fprintf(tw, "scope\t%s\t(identity %q)\n", r.Scope, ping.Asset)
	}
	fmt.Fprintf(tw, "time\t%s\n", r.Time.Format(time.RFC3339Nano))
	fmt.Fprintf(tw, "bucket\t%d\t(%s, window %s)\n", r.Bucket, time.Unix(r.Bucket, 0).UTC().Format(time.RFC3339), s.keyer.Window)
	fmt.Fprintf(tw, "cell\t%s\t(resolution %d, edges of ~%.1f m)\n", r.Cell, s.keyer.Resolution, h3.HexagonEdgeLengthAvgM(s.keyer.Resolution))
	fmt.Fprintf(tw, "key\t%s\n", r.Key)
	if r.StateKey != "" {
		fmt.Fprintf(tw, "state key\t%s\t(shape %s)\n", r.StateKey, s.policy.Shape)
		fmt.Fprintf(tw, "seen key\t%s\n", r.SeenKey)
	}
	return 0, tw.Flush()
}

// unkeyableError says why the key command cannot key a ping, with the
// fix in the command's flags (inFlags): the parser's errors name the
// directive's options, which the command does not take.
func unkeyableError(fs caddycmd.Flags, err error) error {
	return errors.New("the ping cannot be keyed: " + inFlags(fs, err.Error()))
}

// parseOne reads one ping as the directive would: from form fields where
// its encoding reads them and the text is not a JSON object (a query
// string, a form body, or a whole request URL), as JSON otherwise; a JSON
// object under encoding form is refused, as the directive refuses it.
func (s *settings) parseOne(body []byte, now time.Time) (ping.Ping, error) {
	text := strings.TrimSpace(string(body))
	if s.encoding == encodingForm && (strings.HasPrefix(text, "{") || strings.HasPrefix(text, "[")) {
		return ping.Ping{}, ping.JSONAsFormError()
	}
	if s.encoding == encodingJSON || strings.HasPrefix(text, "{") {
		return s.parser.Parse(body, now)
	}
	element, err := s.formParser.FormLine(text)
	if err != nil {
		return ping.Ping{}, err
	}
	return s.formParser.Parse(element, now)
}

// formParserIfRead is the parser of form pings when the encoding reads
// them, else the zero Parser, which reads none.
func (s *settings) formParserIfRead() ping.Parser {
	if s.encoding == encodingJSON {
		return ping.Parser{}
	}
	return s.formParser
}

// pingArgument is the ping given on the command line, or standard input
// for "-" or nothing.
func pingArgument(arg string, stdin io.Reader) ([]byte, error) {
	if arg != "" && arg != "-" {
		return []byte(arg), nil
	}
	b, err := io.ReadAll(stdin)
	if err != nil {
		return nil, err
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil, errors.New("no ping given: pass it as the argument or on standard input")
	}
	return b, nil
}

func analyzeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "analyze [<capture.ndjson> | <route.gpx> | -]",
		Short: "Recommend resolution, radius, window and TTL from a capture of your own pings",
		Long: `Read a capture of pings (one request body per line: a JSON ping, a
JSON array of pings, or a batch wrapped as the preset's or --batch says,
such as Overland's {"locations":[...]}, each element a ping; or a form ping
as a query string or a whole URL with --preset osmand or --encoding form or
auto; or a line of the OwnTracks Recorder's .rec files, read as its
message, the text after the second tab; or a GPX file, as Traccar's web UI
exports a device's route, each trkpt a ping of one asset; a file, or
standard input for "-" or nothing; gzip-compressed or not)
and report, for a grid of H3 resolutions and windows, what telemetry_dedup
would admit and suppress and why, the measured parked jitter (p50/p95/p99 metres), and the share of real
moves one cell would swallow; then a recommended resolution (the finest whose cell edge stays
above the p95 jitter), window (at least ten report intervals), radius of the
sliding and session shapes (a quarter above the p99 jitter, widened while a
replay of the parked stretches at it admits more than 1.15 of their fixes a
window) and the TTL for the retry ladder, e.g.

  caddy telemetry-dedup analyze --preset traccar capture.ndjson
  caddy telemetry-dedup analyze --preset osmand requested-urls.txt
  caddy telemetry-dedup analyze --preset overland --shape sliding bodies.ndjson.gz
  caddy telemetry-dedup analyze --preset owntracks store/rec/jane/phone/2025-01.rec
  caddy telemetry-dedup analyze route.gpx
  zstdcat pings.ndjson.zst | caddy telemetry-dedup analyze --json -`,
		Args: cobra.MaximumNArgs(1),
	}
	pingFlags(cmd.Flags())
	cmd.Flags().IntSlice("resolutions", analyze.DefaultResolutions, "candidate H3 resolutions")
	cmd.Flags().StringSlice("windows", []string{"1m", "5m", "15m"}, "candidate windows")
	cmd.Flags().String("batch", "", "JSON path of the array a line's object holds its pings in, or off, as batch (default the preset's: locations for overland)")
	cmd.Flags().String("accuracy", "", "JSON path of the fix's accuracy in metres, as accuracy (default the preset's, else none): "+
		"it finds the parked stretches of receivers that scatter wider than 25 m, and the stay holds a fix by it")
	cmd.Flags().String("speed", "", "JSON path of the speed the device reports, as speed (default the preset's, else none)")
	cmd.Flags().String("speed-unit", "", "unit of --speed: m/s, km/h, knots or mph (default the preset's, else m/s)")
	cmd.Flags().String("radius", strconv.FormatFloat(dedup.DefaultRadius, 'g', -1, 64), "stay radius in metres to replay shapes sliding and session with, 25 or 25m (those shapes only, as radius)")
	cmd.Flags().String("session-idle", dedup.DefaultSessionIdle.String(), "session idle gap (shape session only, as session_idle): 10m, 1h")
	cmd.Flags().String("retry-ladder", "1m 5m 30m 2h 6h", "the sender's retry offsets after the first delivery")
	cmd.Flags().String("outage-margin", dedup.DefaultOutageMargin.String(), "outage to survive beyond the last retry, as the directive's: 30m, 1h, 0s")
	cmd.Flags().Bool("json", false, "print JSON")
	cmd.RunE = caddycmd.WrapCommandFuncForCobra(func(fs caddycmd.Flags) (int, error) {
		return runAnalyze(fs, os.Stdin, os.Stdout)
	})
	return cmd
}

func runAnalyze(fs caddycmd.Flags, stdin io.Reader, stdout io.Writer) (int, error) {
	opts, err := analyzeOptions(fs)
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	in := stdin
	if path := fs.Arg(0); path != "" && path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return caddy.ExitCodeFailedStartup, err
		}
		defer f.Close()
		in = f
	}
	report, err := analyze.Analyze(in, opts)
	if err != nil {
		return caddy.ExitCodeFailedStartup, namingFlag(fs, err)
	}
	for reason, first := range report.FirstSkipped {
		report.FirstSkipped[reason] = inFlags(fs, first)
	}
	if report.Pings == 0 {
		return caddy.ExitCodeFailedStartup, noPingsError(report, len(opts.Form.TimePaths) > 0, fs.String("preset") == "overland")
	}
	noteIfRecommendationRefused(report)
	if fs.Bool("json") {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return 0, enc.Encode(report)
	}
	return 0, report.WriteTable(stdout)
}

// inFlags rewrites the fix a ping's error gives in the directive's words
// into the commands' flags (asFlags), and for --preset osmand the fix of a
// form ping read as JSON, which names that preset, into the encoding
// that reads it.
func inFlags(fs caddycmd.Flags, msg string) string {
	if fs.String("preset") == "osmand" {
		msg = strings.ReplaceAll(msg, ping.FormEncodedFix, "give --encoding auto, which reads form fields and JSON alike")
	}
	return asFlags.Replace(msg)
}

// asFlags rewrites the fixes a skipped ping's error gives in the
// directive's words into analyze's flags: "set null_island allow" told
// the user of the command an option it does not take.
var asFlags = strings.NewReplacer(
	"set null_island allow", "give --null-island allow",
	"name it with time_zone (e.g. time_zone ", "name it with --time-zone (e.g. --time-zone ",
	"and encoding form reads form fields (the query string, or a form body): send JSON with Content-Type: application/json and "+
		"set encoding auto, which reads it as JSON, or encoding json",
	"and --encoding form reads form fields: give --encoding auto, which reads it as JSON, or --encoding json",
	"read as one ping: set batch ", "read as one ping: give --batch ",
	"or set batch off for a route whose senders post single pings", "or give --batch off for a capture of single pings",
	"are allowed (max_batch): ", "are allowed (the handler's default max_batch): ",
	ping.FormEncodedFix, "give --preset osmand, else --encoding form",
)

// noteIfRecommendationRefused notes a recommended window and TTL that the
// directive refuses as they are (a TTL no longer than the default
// in_flight_timeout, from a short window and retry ladder), with what to
// change: printed without a word, they failed the config they were
// written into.
func noteIfRecommendationRefused(report *analyze.Report) {
	rec := report.Recommended
	h := &Handler{Window: caddy.Duration(rec.Window), TTL: caddy.Duration(rec.TTL)}
	if _, err := h.resolve(); err != nil {
		report.Notes = append(report.Notes, fmt.Sprintf("window %s with ttl %s, as recommended, does not load as it is: %v", rec.Window, rec.TTL, err))
	}
}

// noPingsError says why a capture gave nothing to size from: recommending
// a configuration from no ping would look like a sizing run that worked.
// readsForms: the configuration reads form pings, which an access log's
// URLs hold.
func noPingsError(report *analyze.Report, readsForms, overland bool) error {
	if report.Lines == 0 {
		return errors.New("the capture is empty: give a file of pings, one a line, or - for standard input")
	}
	reasons := slices.Collect(maps.Keys(report.Skipped))
	slices.SortFunc(reasons, func(a, b string) int {
		return cmp.Or(cmp.Compare(report.Skipped[b], report.Skipped[a]), cmp.Compare(a, b))
	})
	top := reasons[0]
	advice := "check --preset, --batch, --asset, --time, --lat and --lon against a line of the capture (caddy telemetry-dedup key reads one ping and says why)"
	first := report.FirstSkipped[top]
	switch {
	case top == string(ping.RuleRequired) && strings.Contains(first, "asset id") && overland:
		// Any other preset's senders name their asset: a wrong --preset is likelier, and the general advice says so.
		advice = "the pings name no asset (Overland leaves device_id empty unless the app sets one, and a site may take the asset from the request); " + writeAnAssetIn
	case top == analyze.SkipMalformed && strings.Contains(first, asFlags.Replace(ping.JSONAsFormError().Error())):
		advice = "with --encoding form a JSON line is a body the site refuses; a Caddy access log holds each request as JSON: " +
			"give analyze its URLs (jq -r .request.uri access.log), or --encoding auto for a capture of JSON bodies"
	case top == analyze.SkipMalformed && strings.Contains(first, "not valid JSON"):
		advice += "; a capture that spreads each body over several lines (pretty-printed, as jq . writes it) must hold one body a line: jq -c . pings.json > capture.ndjson"
	case top == string(ping.RuleNullIsland):
		advice = "if your assets really are at (0, 0) and your site has null_island allow, give --null-island allow"
	case top == string(ping.RuleTimezone):
		advice = "the timestamps have no UTC offset: give --time-zone with the IANA zone the devices write local time in " +
			"(e.g. --time-zone Europe/Berlin), as the site's time_zone"
	}
	if top == analyze.SkipNotAPing && readsForms {
		advice += "; a Caddy access log holds each request as JSON: give analyze its URLs (jq -r .request.uri access.log)"
	}
	return fmt.Errorf("none of %s is a ping this configuration reads (most skipped as %s: %d, the first at %s); %s",
		whatWasRead(report), top, report.Skipped[top], first, advice)
}

// writeAnAssetIn says how to size a capture whose bodies name no asset:
// one device's capture at a time, its id written into every body.
const writeAnAssetIn = "write the device's id into one device's capture and analyze it alone, for Overland: " +
	`jq -c '.locations[].properties.device_id = "phone1"' capture.ndjson | caddy telemetry-dedup analyze --preset overland -`

// whatWasRead counts the capture's lines, and the elements they hold when
// they held batches.
func whatWasRead(report *analyze.Report) string {
	lines := fmt.Sprintf("the %d lines", report.Lines)
	if report.Lines == 1 {
		lines = "the 1 line"
	}
	if report.Elements == report.Lines {
		return lines
	}
	holds := " hold"
	if report.Lines == 1 {
		holds = " holds"
	}
	return fmt.Sprintf("the %d elements %s%s", report.Elements, lines, holds)
}

// analyzeOptions reads the flags, resolving the ping options exactly as the
// directive does.
func analyzeOptions(fs caddycmd.Flags) (analyze.Options, error) {
	h, err := handlerFromFlags(fs)
	if err != nil {
		return analyze.Options{}, err
	}
	if err := shapeFlags(fs, h); err != nil {
		return analyze.Options{}, err
	}
	h.Batch = fs.String("batch")
	h.Accuracy, h.Speed, h.SpeedUnit = fs.String("accuracy"), fs.String("speed"), fs.String("speed-unit")
	s, err := resolveFlags(fs, h)
	if err != nil {
		return analyze.Options{}, err
	}
	opts := analyze.Options{
		Parser:      s.parser,
		Form:        s.formParserIfRead(),
		FormOnly:    s.encoding == encodingForm,
		Batch:       s.splitter,
		Shape:       s.policy.Shape,
		Radius:      s.policy.Radius,
		SessionIdle: s.policy.SessionIdle,
	}
	if opts.Resolutions, err = fs.GetIntSlice("resolutions"); err != nil {
		return opts, err
	}
	windows, err := fs.GetStringSlice("windows")
	if err != nil {
		return opts, err
	}
	if fs.Changed("windows") && len(windows) == 0 {
		return opts, errors.New("--windows is empty; list candidate windows such as 1m,5m,15m, or leave --windows out for those")
	}
	for _, w := range windows {
		d, err := caddy.ParseDuration(w)
		if err != nil {
			return opts, fmt.Errorf("--windows %s: %v; use durations such as 1m,5m,15m", w, err)
		}
		opts.Windows = append(opts.Windows, d)
	}
	for _, r := range strings.Fields(strings.ReplaceAll(fs.String("retry-ladder"), ",", " ")) {
		d, err := caddy.ParseDuration(r)
		if err != nil {
			return opts, fmt.Errorf("--retry-ladder %s: %v; use offsets such as \"1m 5m 30m 2h 6h\"", r, err)
		}
		opts.RetryLadder = append(opts.RetryLadder, d)
	}
	if fs.Changed("retry-ladder") && len(opts.RetryLadder) == 0 {
		return opts, errors.New("--retry-ladder is empty; give the sender's retry offsets such as \"1m 5m 30m 2h 6h\", or leave --retry-ladder out for those")
	}
	margin, err := durationFlag(fs, "outage-margin", true)
	if err != nil {
		return opts, err
	}
	opts.OutageMargin = &margin
	return opts, nil
}

// shapeFlags sets --radius and --session-idle as the directive's radius
// and session_idle when they are given, so that the directive refuses them
// where it refuses those (with a shape that has none); a radius written out
// as 0 is refused here, since the directive would take it for the default.
func shapeFlags(fs caddycmd.Flags, h *Handler) error {
	if fs.Changed("radius") {
		given := fs.String("radius")
		radius, err := strconv.ParseFloat(strings.TrimSuffix(given, "m"), 64) // as the directive reads it
		if err != nil || math.IsNaN(radius) || math.IsInf(radius, 0) {
			return fmt.Errorf("--radius %q: use metres, as the directive's radius, such as 25 or 25m", given)
		}
		if h.Radius = radius; h.Radius == 0 {
			return fmt.Errorf("--radius 0: must be more than 0; use metres above your receivers' parked jitter, such as the default %g, or leave --radius out", dedup.DefaultRadius)
		}
	}
	if fs.Changed("session-idle") {
		idle, err := durationFlag(fs, "session-idle", false)
		if err != nil {
			return err
		}
		h.SessionIdle = caddy.Duration(idle)
	}
	return nil
}

// durationFlag reads a duration flag as the directive reads durations (1d
// included); zero is refused unless it means something (zeroOK), since a
// flag written out as 0 is a mistake, not a request for the default.
func durationFlag(fs caddycmd.Flags, name string, zeroOK bool) (time.Duration, error) {
	d, err := caddy.ParseDuration(fs.String(name))
	switch {
	case err != nil:
		return 0, fmt.Errorf("--%s %s: %v; use a duration such as 5m, 1h or 1d", name, fs.String(name), err)
	case d < 0:
		return 0, fmt.Errorf("--%s %s: must not be negative; use a duration such as 5m, 1h or 1d", name, fs.String(name))
	case d == 0 && !zeroOK:
		return 0, fmt.Errorf("--%s %s: must be more than 0; use a duration such as 5m, 1h or 1d", name, fs.String(name))
	}
	return d, nil
}
