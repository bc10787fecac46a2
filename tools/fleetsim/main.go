// Command fleetsim scores a telemetry_dedup deployment against a simulated
// fleet. It generates every asset's pings with GPS noise, multipath
// outliers, parked and driving phases, redeliveries and offline batches
// (see package internal/fleetsim), POSTs them to a Caddy in order of
// arrival, and compares what got through with the ground truth: how many
// redeliveries were admitted, how many real moves were lost, how often a
// parked asset was let through per window, and how far an asset drove
// before its departure reached the backend.
//
// With -upstream, fleetsim is the backend too, and sees exactly which pings
// arrived, batches included. Caddy must proxy to it:
//
//	:8080 {
//		telemetry_dedup /telemetry {
//			shape sliding
//		}
//		reverse_proxy 127.0.0.1:9001
//	}
//
// and then:
//
//	go run ./tools/fleetsim -url http://127.0.0.1:8080/telemetry -upstream 127.0.0.1:9001 -cadence 10s -sigma 3
//
// Without -upstream, fleetsim reads each answer's X-Dedup header instead,
// and sends the pings of an offline batch as single requests. Ranges are
// given as one value or lo-hi, e.g. -multipath-sigmas 4-8 or -parked
// 5m-45m. A zero -sigma, -multipath, -heading-drift, -redeliveries or
// -offline switches that off. An offline stretch is sent in batches of at
// most -max-batch pings (1000 by default, as the module's max_batch), the
// oldest first: lower it with a lower max_batch. Each run names its assets
// afresh (-asset-prefix), so that it is not judged against the state an
// earlier run left in the module's store.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/fleetsim"
)

// options are the flags that are not part of the simulation.
type options struct {
	url, upstream string
	fields        fleetsim.Fields
	json          bool
}

func main() {
	cfg, opts, err := parseFlags(os.Args[1:])
	if err == nil {
		err = run(cfg, opts)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetsim:", err)
		os.Exit(1)
	}
}

// parseFlags returns the Config and options the command line asks for,
// checked.
func parseFlags(args []string) (fleetsim.Config, options, error) {
	def := fleetsim.DefaultConfig()
	var cfg fleetsim.Config
	var opts options
	fs := flag.NewFlagSet("fleetsim", flag.ExitOnError)

	fs.IntVar(&cfg.Assets, "assets", def.Assets, "number of assets")
	fs.StringVar(&cfg.AssetPrefix, "asset-prefix", "", "start of every asset id (default: unique per run, e.g. sim-mig3x0k2-)")
	fs.DurationVar(&cfg.Duration, "duration", def.Duration, "device time simulated per asset")
	fs.DurationVar(&cfg.Cadence, "cadence", def.Cadence, "report interval")
	fs.Float64Var(&cfg.CadenceJitter, "cadence-jitter", def.CadenceJitter, "each interval is cadence·(1±this), uniform")
	sigma := fs.Float64("sigma", def.SigmaM, "GPS error σ per axis, metres")
	fs.DurationVar(&cfg.NoiseTau, "noise-tau", def.NoiseTau, "correlation time of the GPS error (0: independent per fix)")
	multipath := fs.Float64("multipath", def.MultipathShare, "share of fixes that are multipath outliers")
	multipathSigmas := floatRange{def.MultipathSigmasMin, def.MultipathSigmasMax}
	fs.Var(&multipathSigmas, "multipath-sigmas", "an outlier lies k·σ from the truth, k uniform in this range")
	parked := durationRange{def.ParkedMin, def.ParkedMax}
	fs.Var(&parked, "parked", "length of a parked phase")
	driving := durationRange{def.DrivingMin, def.DrivingMax}
	fs.Var(&driving, "driving", "length of a driving phase")
	speeds := floatRange{def.SpeedMin, def.SpeedMax}
	fs.Var(&speeds, "driving-speed", "speed of a driving phase, m/s")
	drift := fs.Float64("heading-drift", def.HeadingDriftDegPerSqrtS, "heading random walk while driving, degrees per √s")
	fs.BoolVar(&cfg.ReportAccuracy, "accuracy", false, "send an accuracy radius with each ping")
	fs.BoolVar(&cfg.ReportSpeed, "speed", false, "send a speed with each ping")
	redeliveries := fs.Float64("redeliveries", def.RedeliveryShare, "share of deliveries sent again")
	fs.DurationVar(&cfg.RedeliveryMaxDelay, "redelivery-max-delay", def.RedeliveryMaxDelay, "a redelivery follows its original after cadence to this")
	offline := fs.Float64("offline", def.OfflineShare, "share of assets that go offline once and then send a batch")
	offlineFor := durationRange{def.OfflineMin, def.OfflineMax}
	fs.Var(&offlineFor, "offline-duration", "length of the offline stretch")
	fs.IntVar(&cfg.MaxBatch, "max-batch", def.MaxBatch, "most pings in one batch: a longer offline stretch is sent as several")
	fs.Uint64Var(&cfg.Seed, "seed", def.Seed, "random seed")
	start := fs.String("start", "", "device time of the start, RFC 3339 (default: duration + 10m ago)")
	center := latLon(def.Center)
	fs.Var(&center, "center", "lat,lon of the area the assets start in")
	fs.DurationVar(&cfg.Window, "window", def.Window, "window to count parked admissions in")
	fs.Float64Var(&cfg.LostMoveM, "lost-move", def.LostMoveM, "metres beyond which a suppressed moving ping is a lost move: the site's lag bound, 1.5 times its radius, and a metre")
	fs.IntVar(&cfg.Concurrency, "conns", def.Concurrency, "requests in flight, each asset's still in order")

	fs.StringVar(&opts.url, "url", "http://localhost:8080/telemetry", "where to POST the pings")
	fs.StringVar(&opts.upstream, "upstream", "", "listen address of the backend Caddy proxies to, e.g. 127.0.0.1:9001 (empty: read X-Dedup)")
	fs.StringVar(&opts.fields.Asset, "field-asset", "asset_id", "JSON member of the asset id")
	fs.StringVar(&opts.fields.Time, "field-time", "occurred_at", "JSON member of the device time")
	fs.StringVar(&opts.fields.Lat, "field-lat", "lat", "JSON member of the latitude")
	fs.StringVar(&opts.fields.Lon, "field-lon", "lon", "JSON member of the longitude")
	fs.StringVar(&opts.fields.Accuracy, "field-accuracy", "accuracy", "JSON member of the accuracy")
	fs.StringVar(&opts.fields.Speed, "field-speed", "speed", "JSON member of the speed")
	fs.BoolVar(&opts.json, "json", false, "print the score as JSON")

	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: go run ./tools/fleetsim [flags]   (see go doc ./tools/fleetsim)")
		fs.PrintDefaults()
	}
	fs.Parse(args) // exits on an error
	if fs.NArg() > 0 {
		return cfg, opts, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	// The Config reads a negative value as none and a zero as its default:
	// a flag written out so is refused, not run as something else.
	for _, c := range []struct {
		name string
		bad  bool
		want string
	}{
		{"assets", cfg.Assets <= 0, "at least 1"},
		{"duration", cfg.Duration <= 0, "positive"},
		{"cadence", cfg.Cadence <= 0, "positive"},
		{"sigma", *sigma < 0, "0 (no noise) or more"},
		{"multipath", *multipath < 0, "0 (none) or more"},
		{"multipath-sigmas", multipathSigmas.lo <= 0, "more than 0"},
		{"parked", parked.lo <= 0, "positive"},
		{"driving", driving.lo <= 0, "positive"},
		{"driving-speed", speeds.lo < 0 || speeds.hi <= 0, "a speed, or a range of speeds, above 0"},
		{"heading-drift", *drift < 0, "0 (straight) or more"},
		{"redeliveries", *redeliveries < 0, "0 (none) or more"},
		{"redelivery-max-delay", cfg.RedeliveryMaxDelay <= 0, "positive"},
		{"offline", *offline < 0, "0 (none) or more"},
		{"offline-duration", offlineFor.lo <= 0, "positive"},
		{"max-batch", cfg.MaxBatch <= 0, "at least 1"},
		{"seed", cfg.Seed == 0, "at least 1"},
		{"window", cfg.Window <= 0, "positive"},
		{"lost-move", cfg.LostMoveM <= 0, "more than 0"},
		{"conns", cfg.Concurrency <= 0, "at least 1"},
	} {
		if c.bad {
			return cfg, opts, fmt.Errorf("-%s %s: must be %s", c.name, fs.Lookup(c.name).Value, c.want)
		}
	}
	cfg.SigmaM = zeroIsNone(*sigma)
	cfg.MultipathShare = zeroIsNone(*multipath)
	cfg.MultipathSigmasMin, cfg.MultipathSigmasMax = multipathSigmas.lo, multipathSigmas.hi
	cfg.ParkedMin, cfg.ParkedMax = parked.lo, parked.hi
	cfg.DrivingMin, cfg.DrivingMax = driving.lo, driving.hi
	cfg.SpeedMin, cfg.SpeedMax = zeroIsNone(speeds.lo), speeds.hi
	cfg.HeadingDriftDegPerSqrtS = zeroIsNone(*drift)
	cfg.RedeliveryShare = zeroIsNone(*redeliveries)
	cfg.OfflineShare = zeroIsNone(*offline)
	cfg.OfflineMin, cfg.OfflineMax = offlineFor.lo, offlineFor.hi
	cfg.Center = fleetsim.LatLon(center)
	if cfg.AssetPrefix == "" {
		cfg.AssetPrefix = runPrefix()
	}
	if *start != "" {
		t, err := time.Parse(time.RFC3339, *start)
		if err != nil {
			return cfg, opts, fmt.Errorf("-start: %v", err)
		}
		cfg.Start = t
	}
	return cfg, opts, cfg.Validate()
}

// runPrefix returns an asset prefix of its own for this run. The module
// keeps state per asset (the last accepted ping, in shapes sliding and
// session), and a run whose assets met an earlier run's state would be
// judged against places it never was.
func runPrefix() string {
	return "sim-" + strconv.FormatInt(time.Now().UnixMilli(), 36) + "-"
}

// zeroIsNone turns a flag's 0 into the Config's way of saying zero, since
// a zero Config field means its default.
func zeroIsNone(v float64) float64 {
	if v == 0 {
		return fleetsim.None
	}
	return v
}

// run sends the fleet to Caddy and prints the score.
func run(cfg fleetsim.Config, opts options) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	decider, err := fleetsim.NewHTTPDecider(opts.url, opts.upstream, opts.fields)
	if err != nil {
		return err
	}
	defer decider.Close()
	if opts.upstream != "" {
		fmt.Fprintf(os.Stderr, "sending to %s, backend listening on %s ...\n", opts.url, decider.UpstreamAddr())
	} else {
		fmt.Fprintf(os.Stderr, "sending to %s, reading X-Dedup ...\n", opts.url)
	}
	score, err := fleetsim.Run(ctx, cfg, decider)
	if err != nil {
		return err
	}
	if opts.json {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(score)
	}
	return score.WriteTable(os.Stdout)
}

// floatRange is a flag holding one number or an interval lo-hi.
type floatRange struct{ lo, hi float64 }

func (r *floatRange) String() string {
	return formatRange(strconv.FormatFloat(r.lo, 'g', -1, 64), strconv.FormatFloat(r.hi, 'g', -1, 64))
}

func (r *floatRange) Set(s string) error {
	lo, hi := splitRange(s)
	var err error
	if r.lo, err = strconv.ParseFloat(lo, 64); err != nil {
		return err
	}
	r.hi, err = strconv.ParseFloat(hi, 64)
	return err
}

// durationRange is a flag holding one duration or an interval lo-hi.
type durationRange struct{ lo, hi time.Duration }

func (r *durationRange) String() string {
	return formatRange(r.lo.String(), r.hi.String())
}

func (r *durationRange) Set(s string) error {
	lo, hi := splitRange(s)
	var err error
	if r.lo, err = time.ParseDuration(lo); err != nil {
		return err
	}
	r.hi, err = time.ParseDuration(hi)
	return err
}

// splitRange splits lo-hi; a single value is both ends.
func splitRange(s string) (lo, hi string) {
	lo, hi, ok := strings.Cut(s, "-")
	if !ok {
		return s, s
	}
	return lo, hi
}

// formatRange is the inverse of splitRange.
func formatRange(lo, hi string) string {
	if lo == hi {
		return lo
	}
	return lo + "-" + hi
}

// latLon is a flag holding lat,lon.
type latLon fleetsim.LatLon

func (p *latLon) String() string {
	return fmt.Sprintf("%g,%g", p.Lat, p.Lon)
}

func (p *latLon) Set(s string) error {
	lat, lon, ok := strings.Cut(s, ",")
	if !ok {
		return fmt.Errorf("%q is not lat,lon", s)
	}
	var err error
	if p.Lat, err = strconv.ParseFloat(strings.TrimSpace(lat), 64); err != nil {
		return err
	}
	p.Lon, err = strconv.ParseFloat(strings.TrimSpace(lon), 64)
	return err
}
