package dedup

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

var benchBody = []byte(`{"asset_id":"veh-88","occurred_at":"2026-08-08T12:00:00Z","lat":52.5200087,"lon":13.4049547,` +
	`"speed_kmh":0,"heading":270,"battery":0.82,"firmware":"4.2.1"}`)

// The CPU cost of one ping before it touches a store: extraction,
// validation, and what its shape decides on (tumbling: bucket, H3 cell and
// key; sliding and session: the bucket); for coordinates seen before (a
// redelivery, whose cell is cached), for new ones near them (a parked
// asset's jitter or a slow asset's next fixes, whose cell the cache holds
// as a hexagon), and for new ones scattered over the globe (where it holds
// none, and H3 computes every cell).
func BenchmarkParseValidateKey(b *testing.B) {
	p, k := ping.NewParser().Prepared(), defaultKeyer()
	k.Cells = new(CellCache)
	now := articleBase.Add(time.Minute)
	nearby := make([][]byte, 16*cellCacheSlots) // more than the cache holds
	scattered := make([][]byte, len(nearby))
	rng := rand.New(rand.NewPCG(1, 1))
	for i := range nearby {
		nearby[i] = benchPing("52."+strconv.Itoa(5000000+i), "13.4049547")
		scattered[i] = benchPing(strconv.FormatFloat(rng.Float64()*140-70, 'f', 7, 64), strconv.FormatFloat(rng.Float64()*360-180, 'f', 7, 64))
	}
	for _, shape := range []Shape{Tumbling, Sliding} {
		d := &Deduper{Keyer: k, Policy: *testPolicy(shape)}
		for _, bodies := range []struct {
			name string
			next func(i int) []byte
		}{
			{"repeated", func(int) []byte { return benchBody }},
			{"nearby", func(i int) []byte { return nearby[i%len(nearby)] }},
			{"scattered", func(i int) []byte { return scattered[i%len(scattered)] }},
		} {
			b.Run(string(shape)+"/"+bodies.name, func(b *testing.B) {
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					i++
					ping, err := p.Parse(bodies.next(i), now)
					if err != nil {
						b.Fatal(err)
					}
					_ = d.Observe(ping)
				}
			})
		}
	}
}

// benchPing is benchBody at another place.
func benchPing(lat, lon string) []byte {
	return []byte(`{"asset_id":"veh-88","occurred_at":"2026-08-08T12:00:00Z","lat":` + lat + `,"lon":` + lon +
		`,"speed_kmh":0,"heading":270,"battery":0.82,"firmware":"4.2.1"}`)
}

// Each store operation of a ping, for each store and shape: the decision
// of a new observation and of a duplicate, and the settlement of an
// accepted claim (the second command of every new ping).
func BenchmarkStore(b *testing.B) {
	for _, shape := range Shapes {
		for _, store := range []string{"memory", "redis"} {
			for _, kind := range []string{"new", "duplicate", "settle"} {
				b.Run(string(shape)+"/"+store+"/"+kind, func(b *testing.B) {
					var s Store = NewMemoryStore(0)
					if store == "redis" {
						s = newRedisStore(b, redistest.Start(b))
					}
					pol := testPolicy(shape)
					ctx := context.Background()
					dup := claimOf(pol, parked, 1, articleBase)
					decideOne(ctx, s, dup)
					settleOne(ctx, s, dup)
					i := 0
					b.ReportAllocs()
					for b.Loop() {
						c := dup
						if kind == "new" { // a new asset: fresh keys, nothing else recomputed
							i++
							fresh := *dup
							id := strconv.Itoa(i)
							fresh.Observation.Key, fresh.StateKey, fresh.SeenKey = "k"+id, "s"+id, "m"+id
							c = &fresh
						}
						if kind == "settle" { // the claim stays held by its token: each settle does the whole work
							if err := settleOne(ctx, s, c); err != nil {
								b.Fatal(err)
							}
							continue
						}
						if _, err := decideOne(ctx, s, c); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}
