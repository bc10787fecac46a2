package dedup

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

var benchBody = []byte(`{"asset_id":"veh-88","occurred_at":"2026-08-08T12:00:00Z","lat":52.5200087,"lon":13.4049547,` +
	`"speed_kmh":0,"heading":270,"battery":0.82,"firmware":"4.2.1"}`)

// The CPU cost of one ping before it touches a store: extraction,
// validation, bucket, H3 cell and key.
func BenchmarkParseValidateKey(b *testing.B) {
	p, k := NewParser(), defaultKeyer()
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

// One claim per new key, then one lost claim per duplicate, per store.
func BenchmarkClaim(b *testing.B) {
	stores := map[string]func(b *testing.B) Store{
		"memory": func(*testing.B) Store { return NewMemoryStore(0) },
		"redis": func(b *testing.B) Store {
			srv := redistest.Start(b)
			return NewRedisStore(srv.Client(), time.Second)
		},
	}
	for _, name := range []string{"memory", "redis"} {
		for _, kind := range []string{"new", "duplicate"} {
			b.Run(name+"/"+kind, func(b *testing.B) {
				s := stores[name](b)
				ctx := context.Background()
				rec := testRecord(1)
				s.Claim(ctx, "dup", rec, time.Hour)
				i := 0
				b.ReportAllocs()
				for b.Loop() {
					key := "dup"
					if kind == "new" {
						key = fmt.Sprintf("k%d", i)
						i++
					}
					rec.Token++
					if _, _, err := s.Claim(ctx, key, rec, time.Hour); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
