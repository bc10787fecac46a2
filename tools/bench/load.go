package main

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// result is one variant's measurement in one round.
type result struct {
	rps                  float64
	requests, errors     int64
	p50, p99             time.Duration
	roundTrips, commands float64  // Redis, per request; -1 for a site without Redis
	baselineRPS          float64  // the mean of the baseline's runs before and after this one
	cpu                  cpuTimes // per request, by process
	firstError           string   // what the first failed request got
}

// load drives url with conns keep-alive connections for duration.
func load(url string, kind bodyKind, conns int, duration time.Duration, round uint64) result {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns}, Timeout: 10 * time.Second}
	var count, errs atomic.Int64
	var firstError atomic.Value // what the first failed request got, to say what the errors were
	latencies := make([][]time.Duration, conns)
	if kind == allDuplicate { // the one duplicate is claimed and settled before the clock starts
		if res, err := client.Post(url, "application/json", strings.NewReader(newBodies(kind, round, 0).next())); err == nil {
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
	}
	deadline := time.Now().Add(duration)
	var wg sync.WaitGroup
	for w := range conns {
		wg.Go(func() {
			gen := newBodies(kind, round, uint64(w))
			lat := make([]time.Duration, 0, 1<<16)
			for time.Now().Before(deadline) {
				body := gen.next()
				start := time.Now()
				res, err := client.Post(url, "application/json", strings.NewReader(body))
				if err != nil {
					errs.Add(1)
					firstError.CompareAndSwap(nil, fmt.Sprintf("(first: %v)", err))
					continue
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.StatusCode >= 300 {
					errs.Add(1)
					firstError.CompareAndSwap(nil, fmt.Sprintf("(first: %s, X-Dedup %s)", res.Status, res.Header.Get("X-Dedup")))
				}
				lat = append(lat, time.Since(start))
				count.Add(1)
			}
			latencies[w] = lat
		})
	}
	wg.Wait()
	client.CloseIdleConnections()
	all := slices.Concat(latencies...)
	slices.Sort(all)
	r := result{rps: float64(count.Load()) / duration.Seconds(), requests: count.Load(), errors: errs.Load()}
	if e, ok := firstError.Load().(string); ok {
		r.firstError = e
	}
	if len(all) > 0 {
		r.p50, r.p99 = all[len(all)/2].Round(time.Microsecond), all[len(all)*99/100].Round(time.Microsecond)
	}
	return r
}

// bodies generates the pings of one connection.
type bodies struct {
	kind   bodyKind
	rng    *rand.Rand
	prefix string
	n      int
	sent   []string
	base   time.Time
}

func newBodies(kind bodyKind, round, worker uint64) *bodies {
	return &bodies{
		kind: kind, rng: rand.New(rand.NewPCG(round, worker)),
		prefix: fmt.Sprintf("r%d-w%d-%d", round, worker, time.Now().UnixNano()),
		base:   time.Now().UTC().Truncate(5 * time.Minute).Add(-time.Hour),
	}
}

const fleetAssets = 500

func (b *bodies) next() string {
	b.n++
	switch b.kind {
	case allNew: // new assets at new coordinates: nothing cached helps
		return b.ping(fmt.Sprintf("%s-%d", b.prefix, b.n), b.base, 52.52+float64(b.n%1_000_000)*1e-6, 13.40)
	case allDuplicate:
		return b.ping("duplicate", b.base, 52.5200087, 13.4049547)
	}
	// A fleet of 500: 70% parked jitter, 20% re-observations, 5%
	// redeliveries, 5% moves.
	asset := b.rng.IntN(fleetAssets)
	lat, lon := 52.40+float64(asset)*0.001, 13.40
	at := b.base.Add(time.Duration(b.rng.IntN(300)) * time.Second)
	var body string
	switch r := b.rng.Float64(); {
	case r < 0.70:
		body = b.ping(strconv.Itoa(asset), at, lat+(b.rng.Float64()-0.5)*4e-5, lon+(b.rng.Float64()-0.5)*6e-5)
	case r < 0.90:
		body = b.ping(strconv.Itoa(asset), at, lat, lon)
	case r < 0.95 && len(b.sent) > 0:
		return b.sent[b.rng.IntN(len(b.sent))]
	default:
		body = b.ping(strconv.Itoa(asset), at, lat+b.rng.Float64()*0.01, lon+b.rng.Float64()*0.01)
	}
	if len(b.sent) < 1024 {
		b.sent = append(b.sent, body)
	}
	return body
}

func (b *bodies) ping(asset string, at time.Time, lat, lon float64) string {
	return fmt.Sprintf(`{"asset_id":"fleet-%s","occurred_at":"%s","lat":%.7f,"lon":%.7f,"speed_kmh":0,"heading":270}`,
		asset, at.Format(time.RFC3339), lat, lon)
}
