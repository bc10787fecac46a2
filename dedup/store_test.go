package dedup

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// eachStore runs one test against both stores. Both must give the same
// answers; the Redis one talks to a real redis-server started for the test.
func eachStore(t *testing.T, test func(t *testing.T, s Store)) {
	t.Run("memory", func(t *testing.T) { test(t, NewMemoryStore(0)) })
	t.Run("redis", func(t *testing.T) { test(t, newRedisStore(t, redistest.Start(t))) })
}

func newRedisStore(t *testing.T, srv *redistest.Server) *RedisStore {
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return NewRedisStore(c, time.Second)
}

func testRecord(token uint64) Record {
	return Record{
		Token:     token,
		ClaimedAt: articleBase.Add(time.Duration(token) * time.Millisecond),
		Time:      articleBase.Add(123456789 * time.Nanosecond),
		Lat:       52.5200087,
		Lon:       -13.4049547,
	}
}

func TestStoreFirstClaimWins(t *testing.T) {
	eachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		first, second := testRecord(1), testRecord(2)
		if _, won, err := s.Claim(ctx, "k", first, time.Hour); err != nil || !won {
			t.Fatalf("first claim: won=%v err=%v", won, err)
		}
		held, won, err := s.Claim(ctx, "k", second, time.Hour)
		if err != nil || won {
			t.Fatalf("second claim: won=%v err=%v", won, err)
		}
		if held.Token != first.Token || !held.Time.Equal(first.Time) || held.Lat != first.Lat || held.Lon != first.Lon ||
			!held.ClaimedAt.Equal(first.ClaimedAt) || held.Settled {
			t.Fatalf("holder %+v, want the first record %+v", held, first)
		}
		if _, won, _ := s.Claim(ctx, "other", second, time.Hour); !won {
			t.Fatal("a claim on another key lost")
		}
	})
}

func TestStoreRaceHasExactlyOneWinner(t *testing.T) {
	eachStore(t, func(t *testing.T, s Store) {
		var wins, losses atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 50 {
			wg.Go(func() {
				<-start
				_, won, err := s.Claim(context.Background(), "race", testRecord(uint64(i+1)), time.Hour)
				switch {
				case err != nil:
					t.Errorf("claim %d: %v", i, err)
				case won:
					wins.Add(1)
				default:
					losses.Add(1)
				}
			})
		}
		close(start)
		wg.Wait()
		if wins.Load() != 1 || losses.Load() != 49 {
			t.Fatalf("%d winners and %d losers, want 1 and 49", wins.Load(), losses.Load())
		}
	})
}

func TestStoreHonoursExpiry(t *testing.T) {
	eachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		if _, won, _ := s.Claim(ctx, "short", testRecord(1), 300*time.Millisecond); !won {
			t.Fatal("first claim lost")
		}
		if _, won, _ := s.Claim(ctx, "short", testRecord(2), 300*time.Millisecond); won {
			t.Fatal("claim before expiry won")
		}
		time.Sleep(450 * time.Millisecond)
		if _, won, err := s.Claim(ctx, "short", testRecord(3), time.Hour); err != nil || !won {
			t.Fatalf("claim after expiry: won=%v err=%v", won, err)
		}
	})
}

func TestStoreReleasesOnlyWithTheRightToken(t *testing.T) {
	eachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		mine, theirs := testRecord(1), testRecord(2)
		s.Claim(ctx, "k", mine, time.Hour)
		if ok, err := s.Release(ctx, "k", theirs); err != nil || ok {
			t.Fatalf("release with another token: released=%v err=%v", ok, err)
		}
		if _, won, _ := s.Claim(ctx, "k", theirs, time.Hour); won {
			t.Fatal("key was released by the wrong token")
		}
		if ok, err := s.Release(ctx, "k", mine); err != nil || !ok {
			t.Fatalf("release with the right token: released=%v err=%v", ok, err)
		}
		if ok, _ := s.Release(ctx, "k", mine); ok {
			t.Fatal("released a key twice")
		}
		if _, won, _ := s.Claim(ctx, "k", theirs, time.Hour); !won {
			t.Fatal("released key could not be claimed again")
		}
	})
}

func TestStoreSettlesOnlyWithTheRightToken(t *testing.T) {
	eachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		mine, theirs := testRecord(1), testRecord(2)
		s.Claim(ctx, "k", mine, time.Hour)
		if err := s.Settle(ctx, "k", theirs); err != nil {
			t.Fatal(err)
		}
		if held, _, _ := s.Claim(ctx, "k", theirs, time.Hour); held.Settled {
			t.Fatal("another token settled the claim")
		}
		if err := s.Settle(ctx, "k", mine); err != nil {
			t.Fatal(err)
		}
		held, _, _ := s.Claim(ctx, "k", theirs, time.Hour)
		if !held.Settled || held.Token != mine.Token || !held.Time.Equal(mine.Time) {
			t.Fatalf("after settling: %+v", held)
		}
		if err := s.Settle(ctx, "missing", mine); err != nil {
			t.Fatalf("settling a vanished key: %v", err)
		}
		if _, won, _ := s.Claim(ctx, "missing", mine, time.Hour); !won {
			t.Fatal("settling a vanished key created it")
		}
	})
}

// Redis-specific: the expiry is set in the same command as the value, so
// no key ever exists without one, and settling keeps it.
func TestRedisKeysAlwaysCarryTheConfiguredTTL(t *testing.T) {
	srv := redistest.Start(t)
	s, c := newRedisStore(t, srv), srv.Client()
	ctx := context.Background()
	ttl := 6*time.Hour + 30*time.Minute
	for i := range 20 {
		rec := testRecord(uint64(i + 1))
		s.Claim(ctx, fmt.Sprintf("dedup:%d", i), rec, ttl)
		if i%2 == 0 {
			s.Settle(ctx, fmt.Sprintf("dedup:%d", i), rec)
		}
	}
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil || len(keys) != 20 {
		t.Fatalf("keys %v, %v", keys, err)
	}
	for _, k := range keys {
		pttl := c.PTTL(ctx, k).Val()
		if pttl <= 0 {
			t.Fatalf("%s has no expiry (PTTL %v)", k, pttl)
		}
		if d := ttl - pttl; d < 0 || d > time.Second {
			t.Fatalf("%s PTTL %v, want %v within a second", k, pttl, ttl)
		}
	}
}

func TestRedisStoreReportsAnUnreachableServer(t *testing.T) {
	srv := redistest.Start(t)
	s := newRedisStore(t, srv)
	srv.Kill()
	if _, _, err := s.Claim(context.Background(), "k", testRecord(1), time.Hour); err == nil {
		t.Fatal("claim against a dead server reported no error")
	}
	srv.Restart()
	if _, won, err := s.Claim(context.Background(), "k", testRecord(1), time.Hour); err != nil || !won {
		t.Fatalf("claim after restart: won=%v err=%v", won, err)
	}
}

func TestRedisStoreRejectsForeignValues(t *testing.T) {
	srv := redistest.Start(t)
	s, c := newRedisStore(t, srv), srv.Client()
	c.Set(context.Background(), "dedup:foreign", "hello", time.Hour)
	if _, _, err := s.Claim(context.Background(), "dedup:foreign", testRecord(1), time.Hour); err == nil {
		t.Fatal("a value written by someone else was read as a claim")
	}
}

func TestMemoryStoreEvictsClosestToExpiryWhenFull(t *testing.T) {
	m := NewMemoryStore(3)
	ctx := context.Background()
	m.Claim(ctx, "long", testRecord(1), 3*time.Hour)
	m.Claim(ctx, "short", testRecord(2), time.Hour)
	m.Claim(ctx, "middle", testRecord(3), 2*time.Hour)
	m.Claim(ctx, "new", testRecord(4), 3*time.Hour)
	if m.Len() != 3 || m.Evictions() != 1 {
		t.Fatalf("len %d evictions %d, want 3 and 1", m.Len(), m.Evictions())
	}
	for key, held := range map[string]bool{"long": true, "middle": true, "new": true, "short": false} {
		if _, won, _ := m.Claim(ctx, key, testRecord(9), time.Hour); won == held {
			t.Errorf("key %q held=%v after eviction, want %v", key, !won, held)
		}
	}
}

func TestMemoryStoreDropsExpiredKeysBeforeEvicting(t *testing.T) {
	m := NewMemoryStore(2)
	now := articleBase
	m.now = func() time.Time { return now }
	ctx := context.Background()
	m.Claim(ctx, "a", testRecord(1), time.Minute)
	m.Claim(ctx, "b", testRecord(2), time.Hour)
	now = now.Add(2 * time.Minute)
	m.Claim(ctx, "c", testRecord(3), time.Hour)
	if m.Evictions() != 0 || m.Len() != 2 {
		t.Fatalf("evictions %d len %d: an expired key should make room without evicting", m.Evictions(), m.Len())
	}
}
