package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/redis/go-redis/v9"
)

// redisMemory prints what Redis holds per live key of each shape's sites
// (MEMORY USAGE, mean over a sample), and per kind of key.
func redisMemory(rdb *redisServer) error {
	ctx := context.Background()
	fmt.Printf("\nRedis memory per live key (MEMORY USAGE, mean of a sample of each kind):\n\n")
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.Debug)
	fmt.Fprintln(tw, "shape\tkey\tbytes\tsampled\t")
	for _, kind := range []struct{ shape, what, pattern string }{
		{"tumbling", "claim (one per admitted ping)", "bench-redis-near:*"},
		{"sliding", "track (one per asset)", "bench-sliding:*:t"},
		{"sliding", "seen set (one per asset-minute)", "bench-sliding:*:m*"},
		{"session", "track (one per asset)", "bench-session:*:t"},
		{"session", "seen set (one per asset-minute)", "bench-session:*:m*"},
	} {
		keys, err := sampleKeys(ctx, rdb.client, kind.pattern, 500)
		if err != nil {
			return err
		}
		total, sampled := int64(0), 0
		for _, k := range keys {
			if n, err := rdb.client.MemoryUsage(ctx, k).Result(); err == nil {
				total += n
				sampled++
			}
		}
		if sampled > 0 {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t\n", kind.shape, kind.what, total/int64(sampled), sampled)
		}
	}
	return tw.Flush()
}

// sampleKeys scans for up to n keys matching pattern.
func sampleKeys(ctx context.Context, c *redis.Client, pattern string, n int) ([]string, error) {
	var keys []string
	var cursor uint64
	for {
		page, next, err := c.Scan(ctx, cursor, pattern, 1000).Result()
		if err != nil {
			return nil, err
		}
		keys = append(keys, page...)
		if cursor = next; cursor == 0 || len(keys) >= n {
			return keys, nil
		}
	}
}

// redisTotals reads the module's Redis round trips and commands so far from
// Caddy's metrics.
func redisTotals(metricsURL string) (roundTrips, commands float64) {
	res, err := http.Get(metricsURL)
	if err != nil {
		return 0, 0
	}
	defer res.Body.Close()
	text, _ := io.ReadAll(res.Body)
	for _, line := range strings.Split(string(text), "\n") {
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		f, _ := strconv.ParseFloat(value, 64)
		switch name {
		case "caddy_telemetry_dedup_redis_round_trips_total":
			roundTrips = f
		case "caddy_telemetry_dedup_redis_commands_total":
			commands = f
		}
	}
	return roundTrips, commands
}
