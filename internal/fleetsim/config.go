// Package fleetsim simulates a fleet of moving assets reporting GPS pings,
// with the receiver noise, multipath outliers, redeliveries and offline
// batches of real senders, and scores a deduplication decider against the
// ground truth only the simulator knows: which pings were parked, which were
// redeliveries, and how far each asset really travelled.
//
// Generate produces the deliveries, Run sends them to a Decider and scores
// its answers, and HTTPDecider is a Decider that sends them to a Caddy with
// telemetry_dedup over HTTP.
package fleetsim

import (
	"cmp"
	"errors"
	"fmt"
	"time"
)

// None asks for zero in the Config fields whose zero value selects their
// default (see Config).
const None = -1

// LatLon is a WGS 84 position in degrees.
type LatLon struct {
	Lat, Lon float64
}

// Config describes a simulated fleet, how its pings are sent, and how the
// answers are scored. A zero field takes its default. Where zero is itself a
// sensible value (SigmaM, MultipathShare, SpeedMin,
// HeadingDriftDegPerSqrtS, RedeliveryShare, OfflineShare), a negative value
// such as None asks for it.
type Config struct {
	// Assets is the number of assets in the fleet. Default 50.
	Assets int
	// AssetPrefix starts every asset id, which goes on with the asset's
	// number: veh-0001, veh-0002, ... A deduplicator keeps state per asset,
	// so runs against the same store need different prefixes. Default veh-.
	AssetPrefix string
	// Duration is the device time simulated per asset. Default 6h.
	Duration time.Duration
	// Cadence is the interval between an asset's reports. Default 10s.
	Cadence time.Duration
	// CadenceJitter makes each interval Cadence·(1±CadenceJitter), uniform,
	// as a sender that reports "about every 10 s" does. Default 0.
	CadenceJitter float64

	// SigmaM is the receiver's position error σ per axis, in metres.
	// Default 3.
	SigmaM float64
	// NoiseTau is the correlation time of the position error. 0 (the
	// default) draws each fix's error independently; a positive value makes
	// the error a first-order Gauss-Markov process per axis with this time
	// constant and the same stationary σ, the slow wander of a real
	// receiver.
	NoiseTau time.Duration
	// MultipathShare is the share of fixes that are multipath outliers.
	// Default 0.02.
	MultipathShare float64
	// MultipathSigmasMin and MultipathSigmasMax bound k: an outlier lies
	// exactly k·SigmaM from the true position in a uniformly random
	// direction, k uniform in [min, max]. Default 4 and 4; a zero max takes
	// the min.
	MultipathSigmasMin, MultipathSigmasMax float64

	// ParkedMin and ParkedMax bound the length of a parked phase, uniform.
	// Default 5m and 45m.
	ParkedMin, ParkedMax time.Duration
	// DrivingMin and DrivingMax bound the length of a driving phase,
	// uniform. Default 5m and 45m.
	DrivingMin, DrivingMax time.Duration
	// SpeedMin and SpeedMax bound the speed of a driving phase in m/s, drawn
	// once per phase. The asset reaches it instantly at the phase's start
	// and stops instantly at its end, the hardest case for noticing a
	// departure. Default 2 and 27.
	SpeedMin, SpeedMax float64
	// HeadingDriftDegPerSqrtS makes the heading a random walk while
	// driving: over dt seconds it changes by a normal amount with standard
	// deviation HeadingDriftDegPerSqrtS·√dt degrees. Default 3.
	HeadingDriftDegPerSqrtS float64

	// ReportAccuracy makes each ping carry an accuracy radius in metres:
	// 1.51·SigmaM (the radius holding 68% of a 2-D Gaussian) times 1±20%,
	// uniform. Outliers carry the same kind of value, since the receiver
	// does not know they are outliers.
	ReportAccuracy bool
	// ReportSpeed makes each ping carry a speed in m/s: |N(0, 0.3)| when
	// parked, max(0, v + N(0, 0.3)) when driving at v.
	ReportSpeed bool

	// RedeliveryShare is the share of deliveries that the sender makes
	// again, identically, later. Default 0.05.
	RedeliveryShare float64
	// RedeliveryMaxDelay bounds the delay of a redelivery after its
	// original's arrival, uniform in [Cadence, RedeliveryMaxDelay].
	// Default 30m.
	RedeliveryMaxDelay time.Duration
	// OfflineShare is the share of assets that go offline once: the pings
	// of the stretch are not sent live but together when it ends, shuffled,
	// in batches of at most MaxBatch. Default 0.1.
	OfflineShare float64
	// OfflineMin and OfflineMax bound the length of the offline stretch,
	// uniform; it starts at a uniformly random time. Default 10m and 30m.
	OfflineMin, OfflineMax time.Duration
	// MaxBatch caps the pings of one batch: a longer offline stretch is
	// sent as several batches, the oldest pings first, as a sender flushing
	// a long queue does. Default 1000, the largest batch Overland sends (its
	// batch_size setting) and the module's default max_batch.
	MaxBatch int

	// Seed makes the run reproducible: the same Config generates the same
	// deliveries. Default 1.
	Seed uint64
	// Start is the earliest device time. Each asset's first fix falls
	// within one Cadence after it, so the fleet does not report in
	// lockstep. Default: Duration plus 10 minutes ago, so that no device
	// time lies in the future of a server checking max_future.
	Start time.Time
	// Center is the middle of the area the assets start in, within ±0.05°
	// of it. Default 52.52, 13.40 (Berlin).
	Center LatLon

	// Window is the time unit of Score.ParkedAdmissionsPerWindow; it only
	// affects scoring. Default 5m, the module's default window.
	Window time.Duration
	// LostMoveM is the distance in metres beyond which a suppressed moving
	// ping counts as a lost move. Default 40.
	LostMoveM float64
	// Concurrency is how many deliveries Run has in flight at once. Each
	// asset's deliveries are still made one at a time, in order; with more
	// than 1 the Decider must be safe for concurrent use. Default 1.
	Concurrency int
}

// DefaultConfig returns the Config that the zero Config stands for, except
// that Start stays zero: its default depends on when the run begins.
func DefaultConfig() Config {
	c := Config{}.withDefaults()
	c.Start = time.Time{}
	return c
}

// withDefaults returns c with every zero field set to its default and every
// None set to zero.
func (c Config) withDefaults() Config {
	c.Assets = cmp.Or(c.Assets, 50)
	c.AssetPrefix = cmp.Or(c.AssetPrefix, "veh-")
	c.Duration = cmp.Or(c.Duration, 6*time.Hour)
	c.Cadence = cmp.Or(c.Cadence, 10*time.Second)
	c.SigmaM = orNone(c.SigmaM, 3)
	c.MultipathShare = orNone(c.MultipathShare, 0.02)
	c.MultipathSigmasMin = cmp.Or(c.MultipathSigmasMin, 4)
	c.MultipathSigmasMax = cmp.Or(c.MultipathSigmasMax, c.MultipathSigmasMin)
	c.ParkedMin = cmp.Or(c.ParkedMin, 5*time.Minute)
	c.ParkedMax = cmp.Or(c.ParkedMax, 45*time.Minute)
	c.DrivingMin = cmp.Or(c.DrivingMin, 5*time.Minute)
	c.DrivingMax = cmp.Or(c.DrivingMax, 45*time.Minute)
	c.SpeedMin = orNone(c.SpeedMin, 2)
	c.SpeedMax = cmp.Or(c.SpeedMax, 27)
	c.HeadingDriftDegPerSqrtS = orNone(c.HeadingDriftDegPerSqrtS, 3)
	c.RedeliveryShare = orNone(c.RedeliveryShare, 0.05)
	c.RedeliveryMaxDelay = cmp.Or(c.RedeliveryMaxDelay, 30*time.Minute)
	c.OfflineShare = orNone(c.OfflineShare, 0.1)
	c.OfflineMin = cmp.Or(c.OfflineMin, 10*time.Minute)
	c.OfflineMax = cmp.Or(c.OfflineMax, 30*time.Minute)
	c.MaxBatch = cmp.Or(c.MaxBatch, 1000)
	c.Seed = cmp.Or(c.Seed, 1)
	if c.Start.IsZero() {
		c.Start = time.Now().Add(-c.Duration - 10*time.Minute)
	}
	// Device times are sent with millisecond precision; starting on a
	// millisecond keeps every simulated instant exactly representable.
	c.Start = c.Start.UTC().Truncate(time.Millisecond)
	c.Center = cmp.Or(c.Center, LatLon{Lat: 52.52, Lon: 13.40})
	c.Window = cmp.Or(c.Window, 5*time.Minute)
	c.LostMoveM = cmp.Or(c.LostMoveM, 40)
	c.Concurrency = cmp.Or(c.Concurrency, 1)
	return c
}

// orNone returns def for 0, 0 for a negative v, and v otherwise.
func orNone(v, def float64) float64 {
	if v < 0 {
		return 0
	}
	return cmp.Or(v, def)
}

// Validate reports every field of c, with its defaults applied, that is out
// of range.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(c.Assets > 0, "Assets: %d must be at least 1", c.Assets)
	check(c.Duration > 0, "Duration: %v must be positive", c.Duration)
	check(c.Cadence > 0, "Cadence: %v must be positive", c.Cadence)
	check(c.CadenceJitter >= 0 && c.CadenceJitter < 1, "CadenceJitter: %v must be in [0, 1)", c.CadenceJitter)
	check(c.NoiseTau >= 0, "NoiseTau: %v must not be negative", c.NoiseTau)
	check(isShare(c.MultipathShare), "MultipathShare: %v must be in [0, 1]", c.MultipathShare)
	check(c.MultipathSigmasMin >= 0 && c.MultipathSigmasMin <= c.MultipathSigmasMax,
		"MultipathSigmas: [%v, %v] must be an interval of non-negative numbers", c.MultipathSigmasMin, c.MultipathSigmasMax)
	check(isDurationRange(c.ParkedMin, c.ParkedMax), "Parked: [%v, %v] must be an interval of positive durations", c.ParkedMin, c.ParkedMax)
	check(isDurationRange(c.DrivingMin, c.DrivingMax), "Driving: [%v, %v] must be an interval of positive durations", c.DrivingMin, c.DrivingMax)
	check(c.SpeedMin >= 0 && c.SpeedMin <= c.SpeedMax, "Speed: [%v, %v] must be an interval of non-negative speeds", c.SpeedMin, c.SpeedMax)
	check(c.HeadingDriftDegPerSqrtS >= 0, "HeadingDriftDegPerSqrtS: %v must not be negative", c.HeadingDriftDegPerSqrtS)
	check(isShare(c.RedeliveryShare), "RedeliveryShare: %v must be in [0, 1]", c.RedeliveryShare)
	check(c.RedeliveryMaxDelay >= c.Cadence, "RedeliveryMaxDelay: %v must be at least Cadence %v", c.RedeliveryMaxDelay, c.Cadence)
	check(isShare(c.OfflineShare), "OfflineShare: %v must be in [0, 1]", c.OfflineShare)
	check(isDurationRange(c.OfflineMin, c.OfflineMax), "Offline: [%v, %v] must be an interval of positive durations", c.OfflineMin, c.OfflineMax)
	check(c.MaxBatch > 0, "MaxBatch: %d must be at least 1", c.MaxBatch)
	// Longitudes are scaled by 1/cos(lat): near the poles a metre of
	// easting is no longer a small number of degrees.
	check(c.Center.Lat > -80 && c.Center.Lat < 80, "Center: latitude %v must be within ±80°", c.Center.Lat)
	check(c.Center.Lon >= -180 && c.Center.Lon <= 180, "Center: longitude %v must be within ±180°", c.Center.Lon)
	check(c.Window > 0, "Window: %v must be positive", c.Window)
	check(c.LostMoveM > 0, "LostMoveM: %v must be positive", c.LostMoveM)
	check(c.Concurrency > 0, "Concurrency: %d must be at least 1", c.Concurrency)
	return errors.Join(errs...)
}

// isShare says v is a share, in [0, 1].
func isShare(v float64) bool {
	return v >= 0 && v <= 1
}

// isDurationRange says [lo, hi] is an interval of positive durations.
func isDurationRange(lo, hi time.Duration) bool {
	return lo > 0 && lo <= hi
}
