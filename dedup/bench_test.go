package dedup

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

var benchBody = []byte(`{"asset_id":"veh-88","occurred_at":"2026-08-08T12:00:00Z","lat":52.5200087,"lon":13.4049547,` +
	`"speed_kmh":0,"heading":270,"battery":0.82,"firmware":"4.2.1"}`)

// The CPU cost of one ping before it touches a store: extraction,
// validation, bucket, H3 cell and key.
func BenchmarkParseValidateKey(b *testing.B) {
	p, k := ping.NewParser().Prepared(), defaultKeyer()
	now := articleBase.Add(time.Minute)
	b.ReportAllocs()
	for b.Loop() {
		ping, err := p.Parse(benchBody, now)
		if err != nil {
			b.Fatal(err)
		}
		_ = k.Observe(ping)
	}
}

// One decision per new observation, then per duplicate, for each store and
// shape: the store's share of a ping's cost.
func BenchmarkDecide(b *testing.B) {
	for _, shape := range Shapes {
		for _, store := range []string{"memory", "redis"} {
			for _, kind := range []string{"new", "duplicate"} {
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
						if _, err := decideOne(ctx, s, c); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}
