package dedup

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// nextParked is a ping of a fleet that stays parked long: gaps near the
// window, outliers around the radius, creeps, fixes with and without
// accuracies and speeds, late pings and redeliveries, which the other
// streams, whose assets move on, seldom make.
func (s *stream) nextParked() (ping.Ping, string) {
	if len(s.sent) > 0 && s.rng.Float64() < 0.08 {
		return s.sent[s.rng.IntN(len(s.sent))], "redelivery"
	}
	a := s.assets[s.rng.IntN(len(s.assets))]
	if planned := s.braking[a.id]; len(planned) > 0 {
		p := planned[0]
		s.braking[a.id] = planned[1:]
		a.t, a.last = p.Time, p
		s.sent = append(s.sent, p)
		return p, "braking"
	}
	step := time.Duration(5+s.rng.IntN(40)) * time.Second
	if s.rng.Float64() < 0.15 {
		step = time.Duration(120+s.rng.IntN(400)) * time.Second
	}
	at := func(dx, dy float64) (float64, float64) {
		return a.anchorLat + dy/111_000, a.anLon + dx/68_000
	}
	g := func(sd float64) float64 { return s.rng.NormFloat64() * sd }
	var p ping.Ping
	kind := ""
	switch r := s.rng.Float64(); {
	case r < 0.02:
		d, ang := 30+170*s.rng.Float64(), 2*math.Pi*s.rng.Float64()
		a.anchorLat, a.anLon = at(d*math.Cos(ang), d*math.Sin(ang))
		a.t = a.t.Add(step)
		p, kind = ping.Ping{Time: a.t, Lat: a.anchorLat, Lon: a.anLon}, "move"
		if s.rng.Float64() < 0.5 {
			// The asset brakes to a stop up to 36 m further on, past
			// where the backend last heard of it.
			var planned []ping.Ping
			stop := 26 + 10*s.rng.Float64()
			for i, d := range []float64{10, 20, stop} {
				lat, lon := at(d*math.Cos(ang), d*math.Sin(ang))
				planned = append(planned, ping.Ping{Asset: a.id, Time: a.t.Add(time.Duration(i+1) * time.Second), Lat: lat, Lon: lon})
			}
			a.anchorLat, a.anLon = planned[2].Lat, planned[2].Lon
			if s.braking == nil {
				s.braking = map[string][]ping.Ping{}
			}
			s.braking[a.id] = planned
		}
	case r < 0.10:
		// A creep the same way each time (a car edging to its bay), a
		// fix at the stay each step: the stay's anchor follows it away
		// from the last accepted ping.
		ang := float64(a.id[len(a.id)-1])
		d := 4 + 6*s.rng.Float64()
		a.anchorLat, a.anLon = at(d*math.Cos(ang), d*math.Sin(ang))
		a.t = a.t.Add(10 * time.Second)
		p, kind = ping.Ping{Time: a.t, Lat: a.anchorLat, Lon: a.anLon}, "creep"
	case r < 0.12:
		d, ang := 18+30*s.rng.Float64(), 2*math.Pi*s.rng.Float64()
		a.t = a.t.Add(step)
		lat, lon := at(d*math.Cos(ang), d*math.Sin(ang))
		p, kind = ping.Ping{Time: a.t, Lat: lat, Lon: lon}, "outlier"
	case r < 0.20:
		lat, lon := at(g(5), g(5))
		p, kind = ping.Ping{Time: a.t.Add(-time.Duration(s.rng.IntN(900)) * time.Second), Lat: lat, Lon: lon}, "late"
	case r < 0.23:
		a.t = a.t.Add(time.Millisecond * time.Duration(1+s.rng.IntN(999)))
		lat, lon := at(g(5), g(5))
		p, kind = ping.Ping{Time: a.t, Lat: lat, Lon: lon}, "sub-second"
	case r < 0.27 && !a.last.Time.IsZero():
		a.t = a.t.Add(step)
		p, kind = ping.Ping{Time: a.t, Lat: a.last.Lat, Lon: a.last.Lon}, "re-observation"
	default:
		a.t = a.t.Add(step)
		lat, lon := at(g(2), g(2))
		p, kind = ping.Ping{Time: a.t, Lat: lat, Lon: lon}, "jitter"
	}
	if s.rng.Float64() < 0.3 {
		p.Accuracy = []float64{3 + 10*s.rng.Float64(), 20 + 40*s.rng.Float64(), 5, 30}[s.rng.IntN(4)]
	}
	if s.rng.Float64() < 0.3 {
		p.HasSpeed = true
		p.Speed = []float64{0, 0.2, 0.6, 2}[s.rng.IntN(4)]
	}
	if s.rng.Float64() < 0.01 {
		p.Event = "alarm"
	}
	p.Asset = a.id
	a.last = p
	s.sent = append(s.sent, p)
	return p, kind
}

// TestStoresAgreeOnLongParkedSessions runs the random streams and the
// operation sequences of parked assets through session on both stores:
// every verdict, release answer and holder must be the same from both.
func TestStoresAgreeOnLongParkedSessions(t *testing.T) {
	srv := redistest.Start(t)
	redisStore, client := newRedisStore(t, srv), srv.Client()
	for _, radius := range []float64{DefaultRadius, 10} {
		for _, window := range []time.Duration{time.Minute, DefaultWindow} {
			t.Run(fmt.Sprintf("radius %v, window %v", radius, window), func(t *testing.T) {
				pol := testPolicy(Session)
				pol.Radius, pol.Window, pol.TTL = radius, window, 6*time.Hour
				for seed := range uint64(15) {
					for _, run := range []func(*testing.T, *stream, *Policy, Store, Store){runDifferential, compareStreams} {
						if err := client.FlushAll(context.Background()).Err(); err != nil {
							t.Fatal(err)
						}
						s := newStream(seed)
						s.parked = true
						run(t, s, pol, NewMemoryStore(0), redisStore)
					}
				}
			})
		}
	}
}
