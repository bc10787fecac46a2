package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

func newPipeline(t *testing.T) *Pipeline {
	t.Helper()
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return New(c)
}

// setNX queues SET key value NX GET: nil means this call won the key.
func setNX(key, value string) Cmd {
	return Cmd{Queue: func(ctx context.Context, p redis.Pipeliner) redis.Cmder {
		return p.SetArgs(ctx, key, value, redis.SetArgs{Mode: "NX", Get: true})
	}}
}

func won(t *testing.T, c Cmd) bool {
	t.Helper()
	_, err := c.Result.(*redis.StatusCmd).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	return errors.Is(err, redis.Nil)
}

// Concurrent requests share round trips, and each command is answered as
// if it had gone alone: exactly one winner per key.
func TestConcurrentRequestsShareRoundTrips(t *testing.T) {
	const keys, copies = 200, 4
	p := newPipeline(t)
	wins := make([]int, keys)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for k := range keys {
		for c := range copies {
			wg.Go(func() {
				cmds := []Cmd{setNX(fmt.Sprintf("key-%d", k), fmt.Sprint(c))}
				if err := p.Do(context.Background(), cmds); err != nil {
					t.Error(err)
					return
				}
				if won(t, cmds[0]) {
					mu.Lock()
					wins[k]++
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	for k, n := range wins {
		if n != 1 {
			t.Fatalf("key-%d had %d winners, want 1", k, n)
		}
	}
	roundTrips, commands := p.RoundTrips()
	t.Logf("%d concurrent commands took %d round trips", commands, roundTrips)
	if commands != keys*copies || roundTrips >= commands {
		t.Fatalf("%d round trips for %d commands: concurrent requests should share them", roundTrips, commands)
	}
}

// A request alone goes at once: nobody waits for company.
func TestALoneRequestGoesAtOnce(t *testing.T) {
	p := newPipeline(t)
	for i := range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // a wait for a batch to fill would hang
		err := p.Do(ctx, []Cmd{setNX(fmt.Sprintf("alone-%d", i), "x")})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if rt, n := p.RoundTrips(); rt != uint64(i+1) || n != uint64(i+1) {
			t.Fatalf("after %d lone requests: %d round trips, %d commands", i+1, rt, n)
		}
	}
}

// A script Redis does not know yet is loaded and run in the same call.
func TestScriptsAreLoadedOnFirstUse(t *testing.T) {
	p := newPipeline(t)
	script := redis.NewScript(`return ARGV[1] .. KEYS[1]`)
	for range 2 {
		cmds := []Cmd{EvalSha(script, []string{"k"}, "v")}
		if err := p.Do(context.Background(), cmds); err != nil {
			t.Fatal(err)
		}
		if got, _ := cmds[0].Result.(*redis.Cmd).Text(); got != "vk" {
			t.Fatalf("script answered %q, want vk", got)
		}
	}
}
