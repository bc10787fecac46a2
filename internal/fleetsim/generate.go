package fleetsim

import (
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Ping is one position report as the sender sends it, with the ground truth
// the scorer judges it by.
type Ping struct {
	// Asset is the sender's asset id.
	Asset string
	// Time is the device time of the fix: UTC, millisecond precision.
	Time time.Time
	// Lat and Lon are the reported position in degrees, rounded to 7
	// decimals (about a centimetre) as trackers send them.
	Lat, Lon float64
	// Accuracy is the reported accuracy radius in metres, 0 when the
	// Config does not report it.
	Accuracy float64
	// Speed is the reported speed in m/s, valid only when HasSpeed is set.
	Speed float64
	// HasSpeed says that the Config reports speed, so Speed is sent.
	HasSpeed bool

	// Parked is ground truth: the asset was parked at Time.
	Parked bool
	// Redelivery is ground truth: this is a copy of an earlier send.
	Redelivery bool

	truth truth
}

// truth is what the simulator knows about a ping and a decider must not.
type truth struct {
	// seq identifies the observation; a redelivery has its original's.
	seq int
	// lat and lon are the true position.
	lat, lon float64
	// multipath marks an outlier fix.
	multipath bool
	// phase is the ordinal of the asset's parked or driving phase.
	phase int
	// departure marks a driving phase that began by leaving a parked one.
	departure bool
	// phaseStartOdo is the odometer, in metres, when the phase began.
	phaseStartOdo float64
	// odometer is the distance in metres the asset had travelled at Time.
	odometer float64
}

// Delivery is one HTTP request of the sender.
type Delivery struct {
	// Pings are the pings of the request, in the order sent.
	Pings []Ping
	// Batch says the body is a JSON array, even of one ping.
	Batch bool
	// Arrival is when the request arrives in simulated time, for an
	// in-process decider to use as its server clock.
	Arrival time.Time
}

// fleet is one generated run: its deliveries, and the ground truth that no
// single ping carries.
type fleet struct {
	deliveries []Delivery
	// parked is the parked device time of all assets together.
	parked time.Duration
}

// Generate returns the deliveries of the fleet cfg describes, sorted by
// arrival (stably, so a batch precedes a live ping arriving at the same
// instant). The same cfg, Start included, always generates the same
// deliveries. Live pings arrive at their device time, redeliveries after
// their original, and an offline stretch's batch when the stretch ends.
// Generate panics if cfg is invalid; check input with Validate first.
func Generate(cfg Config) []Delivery {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		panic("fleetsim: " + err.Error())
	}
	return generate(cfg).deliveries
}

// generate simulates every asset of cfg, which has its defaults applied and
// is valid.
func generate(cfg Config) fleet {
	offline := offlineAssets(cfg)
	var f fleet
	seq := 0
	for i := range cfg.Assets {
		a := newAsset(cfg, i)
		pings := a.track(seq)
		seq += len(pings)
		f.parked += a.parked
		f.deliveries = append(f.deliveries, a.send(pings, offline[i])...)
	}
	slices.SortStableFunc(f.deliveries, func(a, b Delivery) int {
		return a.Arrival.Compare(b.Arrival)
	})
	return f
}

// offlineStream is the PCG stream choosing the offline assets; assets use
// the streams 0 to Assets-1.
const offlineStream = math.MaxUint64

// offlineAssets picks exactly the OfflineShare of the assets, so a small
// fleet gets the share it was asked for rather than a coin-flip's worth.
func offlineAssets(cfg Config) []bool {
	rng := rand.New(rand.NewPCG(cfg.Seed, offlineStream))
	n := int(math.Round(cfg.OfflineShare * float64(cfg.Assets)))
	offline := make([]bool, cfg.Assets)
	for _, i := range rng.Perm(cfg.Assets)[:n] {
		offline[i] = true
	}
	return offline
}
