package fleetsim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/geo"
)

const (
	// startSpreadDeg is how far from Config.Center an asset may start.
	startSpreadDeg = 0.05
	// accuracyPerSigma turns a per-axis σ into the radius holding 68% of a
	// 2-D Gaussian's fixes, which is how receivers state their accuracy.
	accuracyPerSigma = 1.51
	// accuracySpread is the relative spread of a reported accuracy.
	accuracySpread = 0.2
	// speedNoiseMS is the σ of a reported speed, in m/s.
	speedNoiseMS = 0.3
)

// asset is one simulated asset: its true state, and the receiver that
// observes it.
type asset struct {
	cfg Config
	rng *rand.Rand
	id  string

	// now is the instant the true state below describes.
	now, first, end time.Time
	lat, lon        float64 // degrees
	heading         float64 // degrees clockwise from north
	odometer        float64 // metres travelled

	driving       bool
	phase         int
	phaseEnd      time.Time
	departure     bool
	phaseStartOdo float64
	speed         float64 // m/s, while driving

	// parked sums the parked time between the first fix and end.
	parked time.Duration
	noise  receiverNoise
}

// newAsset starts the asset with the given index at a random place, heading
// and phase, shortly after cfg.Start. Each asset has its own random stream,
// so it behaves the same whatever the size of the fleet.
func newAsset(cfg Config, index int) *asset {
	a := &asset{
		cfg: cfg,
		rng: rand.New(rand.NewPCG(cfg.Seed, uint64(index))),
		id:  fmt.Sprintf("%s%04d", cfg.AssetPrefix, index+1),
		end: cfg.Start.Add(cfg.Duration),
	}
	a.lat = cfg.Center.Lat + a.uniform(-startSpreadDeg, startSpreadDeg)
	a.lon = geo.WrapLongitude(cfg.Center.Lon + a.uniform(-startSpreadDeg, startSpreadDeg))
	a.heading = a.uniform(0, 360)
	a.now = cfg.Start.Add(a.durationIn(0, cfg.Cadence)).Truncate(time.Millisecond)
	a.first = a.now
	a.driving = a.rng.IntN(2) == 0
	a.startPhase()
	return a
}

// track returns the asset's fixes from its first to Config.Duration after
// Config.Start, numbering the observations from seq.
func (a *asset) track(seq int) []Ping {
	var pings []Ping
	for t := a.now; t.Before(a.end); t = t.Add(a.interval()) {
		pings = append(pings, a.fix(t, seq+len(pings)))
	}
	// The parked time runs to the end, not to the last fix.
	a.advance(a.end)
	return pings
}

// interval returns the time to the next report, on whole milliseconds.
func (a *asset) interval() time.Duration {
	jitter := a.uniform(-a.cfg.CadenceJitter, a.cfg.CadenceJitter)
	d := time.Duration(float64(a.cfg.Cadence) * (1 + jitter)).Truncate(time.Millisecond)
	return max(d, time.Millisecond)
}

// fix moves the asset to t and returns what its receiver reports there.
func (a *asset) fix(t time.Time, seq int) Ping {
	a.advance(t)
	// The noise process runs under an outlier too: multipath replaces one
	// fix, it does not reset the receiver's wander.
	east, north := a.noise.next(a.rng, a.cfg.SigmaM, a.cfg.NoiseTau, t)
	multipath := a.rng.Float64() < a.cfg.MultipathShare
	if multipath {
		east, north = a.outlier()
	}
	lat, lon := offset(a.lat, a.lon, east, north)
	// Both readings are drawn whether reported or not, so switching
	// reporting on does not change the positions a seed generates.
	accuracy := accuracyPerSigma * a.cfg.SigmaM * (1 + a.uniform(-accuracySpread, accuracySpread))
	speed := a.speedReading()
	p := Ping{
		Asset:  a.id,
		Time:   t,
		Lat:    roundTo(lat, 7),
		Lon:    roundTo(lon, 7),
		Parked: !a.driving,
		truth: truth{
			seq:           seq,
			lat:           a.lat,
			lon:           a.lon,
			multipath:     multipath,
			phase:         a.phase,
			departure:     a.departure,
			phaseStartOdo: a.phaseStartOdo,
			odometer:      a.odometer,
		},
	}
	if a.cfg.ReportAccuracy {
		p.Accuracy = roundTo(accuracy, 2)
	}
	if a.cfg.ReportSpeed {
		p.Speed, p.HasSpeed = roundTo(speed, 2), true
	}
	return p
}

// outlier returns a multipath fix's error: k·σ in a random direction.
func (a *asset) outlier() (east, north float64) {
	r := a.uniform(a.cfg.MultipathSigmasMin, a.cfg.MultipathSigmasMax) * a.cfg.SigmaM
	theta := a.uniform(0, 2*math.Pi)
	return r * math.Sin(theta), r * math.Cos(theta)
}

// speedReading returns the speed the receiver reports now.
func (a *asset) speedReading() float64 {
	noise := speedNoiseMS * a.rng.NormFloat64()
	if !a.driving {
		return math.Abs(noise)
	}
	return max(0, a.speed+noise)
}

// advance moves the true state forward to t, phase by phase.
func (a *asset) advance(t time.Time) {
	for a.now.Before(t) {
		step := t
		if a.phaseEnd.Before(step) {
			step = a.phaseEnd
		}
		if a.driving {
			a.drive(step.Sub(a.now))
		} else {
			a.parked += step.Sub(a.now)
		}
		a.now = step
		if !a.now.Before(a.phaseEnd) {
			a.switchPhase()
		}
	}
}

// drive moves the asset for dt at the phase's speed, after letting the
// heading wander by the random walk's share for dt.
func (a *asset) drive(dt time.Duration) {
	s := dt.Seconds()
	a.heading += a.cfg.HeadingDriftDegPerSqrtS * math.Sqrt(s) * a.rng.NormFloat64()
	d := a.speed * s
	h := a.heading * degree
	a.lat, a.lon = offset(a.lat, a.lon, d*math.Sin(h), d*math.Cos(h))
	a.odometer += d
}

// switchPhase ends the current phase now and starts the other kind.
func (a *asset) switchPhase() {
	a.departure = !a.driving
	a.driving = !a.driving
	a.phase++
	a.startPhase()
}

// startPhase draws the length of the phase beginning now and, for driving,
// its speed.
func (a *asset) startPhase() {
	lo, hi := a.cfg.ParkedMin, a.cfg.ParkedMax
	if a.driving {
		lo, hi = a.cfg.DrivingMin, a.cfg.DrivingMax
		a.speed = a.uniform(a.cfg.SpeedMin, a.cfg.SpeedMax)
		a.phaseStartOdo = a.odometer
	}
	a.phaseEnd = a.now.Add(a.durationIn(lo, hi))
}

// send returns the deliveries of the asset's pings: one request per live
// ping, the offline stretch (if any) shuffled, in batches of at most
// MaxBatch, when it ends, and the redeliveries of both.
func (a *asset) send(pings []Ping, offline bool) []Delivery {
	var from, to time.Time
	if offline && len(pings) > 0 {
		from, to = a.offlineStretch()
	}
	i, j := firstAtOrAfter(pings, from), firstAtOrAfter(pings, to)
	out := live(pings[:i])
	if i < j {
		out = append(out, a.batches(pings[i:j], to)...)
	}
	out = append(out, live(pings[j:])...)
	return append(out, a.redeliveries(out)...)
}

// offlineStretch draws when the asset is offline, within its track.
func (a *asset) offlineStretch() (from, to time.Time) {
	span := a.end.Sub(a.first)
	length := min(a.durationIn(a.cfg.OfflineMin, a.cfg.OfflineMax), span).Truncate(time.Millisecond)
	from = a.first.Add(a.durationIn(0, span-length)).Truncate(time.Millisecond)
	return from, from.Add(length)
}

// firstAtOrAfter returns the index of the first ping at or after t.
func firstAtOrAfter(pings []Ping, t time.Time) int {
	return sort.Search(len(pings), func(i int) bool { return !pings[i].Time.Before(t) })
}

// live returns one delivery per ping, arriving at its device time.
func live(pings []Ping) []Delivery {
	out := make([]Delivery, len(pings))
	for i, p := range pings {
		out[i] = Delivery{Pings: []Ping{p}, Arrival: p.Time}
	}
	return out
}

// batches returns the held pings, in device-time order, as batches of at
// most MaxBatch arriving at the end of the stretch, the oldest first, as a
// sender flushing its queue sends them (Overland's batch is the oldest
// points it holds); each batch is shuffled, as a sender holding its queue in
// no particular order would send it.
func (a *asset) batches(held []Ping, arrival time.Time) []Delivery {
	var out []Delivery
	for chunk := range slices.Chunk(held, a.cfg.MaxBatch) {
		pings := slices.Clone(chunk)
		a.rng.Shuffle(len(pings), func(i, j int) { pings[i], pings[j] = pings[j], pings[i] })
		out = append(out, Delivery{Pings: pings, Batch: true, Arrival: arrival})
	}
	return out
}

// redeliveries draws which of the deliveries are sent again, and when.
func (a *asset) redeliveries(sent []Delivery) []Delivery {
	var again []Delivery
	for _, d := range sent {
		if a.rng.Float64() >= a.cfg.RedeliveryShare {
			continue
		}
		pings := slices.Clone(d.Pings)
		for i := range pings {
			pings[i].Redelivery = true
		}
		delay := a.durationIn(a.cfg.Cadence, a.cfg.RedeliveryMaxDelay)
		again = append(again, Delivery{
			Pings:   pings,
			Batch:   d.Batch,
			Arrival: d.Arrival.Add(delay).Truncate(time.Millisecond),
		})
	}
	return again
}

// uniform returns a uniformly random number in [lo, hi).
func (a *asset) uniform(lo, hi float64) float64 {
	return lo + (hi-lo)*a.rng.Float64()
}

// durationIn returns a uniformly random duration in [lo, hi).
func (a *asset) durationIn(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(a.rng.Float64()*float64(hi-lo))
}

// receiverNoise is the receiver's position error, in metres east and north
// of the true position.
type receiverNoise struct {
	east, north float64
	last        time.Time // zero before the first fix
}

// next returns the error of the fix at t. With tau 0 every fix's error is
// drawn afresh. Otherwise the error is a first-order Gauss-Markov process:
// it decays with time constant tau and is driven just hard enough to keep
// its stationary σ at sigma, the slow wander of a real receiver.
func (n *receiverNoise) next(rng *rand.Rand, sigma float64, tau time.Duration, t time.Time) (east, north float64) {
	keep := 0.0
	if tau > 0 && !n.last.IsZero() {
		keep = math.Exp(-t.Sub(n.last).Seconds() / tau.Seconds())
	}
	drive := sigma * math.Sqrt(1-keep*keep)
	n.east = keep*n.east + drive*rng.NormFloat64()
	n.north = keep*n.north + drive*rng.NormFloat64()
	n.last = t
	return n.east, n.north
}
