package dedup

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// A tumbling record keeps its claim's in_flight_timeout (tenths of a
// second up to 54 minutes, whole seconds up to 9 hours, rounded up: never
// shorter) and TTL (whole seconds, in 3 bytes) through its 28-byte
// encoding, at their bounds, as the memory store keeps them in the struct:
// what Redis hands back must judge as memory does. Past the bounds (a
// timeout of 32,768 s, a TTL of 2^24 s or not whole seconds) the judge's
// own stand, as the README says; a value longer than 28 bytes, up to 44,
// reads the same fields; 23 to 27 bytes read neither; 22 or 45 are
// refused.
func TestATumblingRecordKeepsItsTimeoutAndTTLAtTheirBounds(t *testing.T) {
	judge := testPolicy(Tumbling)
	judge.InFlightTimeout, judge.TTL = 7*time.Second, 7*time.Minute
	for _, tt := range []struct {
		name              string
		wait, ttl         time.Duration
		wantWait, wantTTL time.Duration
	}{
		{"1 ms, 1 s", time.Millisecond, time.Second, 100 * time.Millisecond, time.Second},
		{"100 ms, 2 s", 100 * time.Millisecond, 2 * time.Second, 100 * time.Millisecond, 2 * time.Second},
		{"101 ms rounds up", 101 * time.Millisecond, time.Hour, 200 * time.Millisecond, time.Hour},
		{"defaults", 30 * time.Second, 6*time.Hour + 30*time.Minute, 30 * time.Second, 6*time.Hour + 30*time.Minute},
		{"ttl in all 3 bytes", time.Second, 0x0a0b0c * time.Second, time.Second, 0x0a0b0c * time.Second},
		{"the longest in tenths", 32767 * 100 * time.Millisecond, time.Hour, 32767 * 100 * time.Millisecond, time.Hour},
		{"past it, whole seconds rounded up", 32767*100*time.Millisecond + time.Millisecond, time.Hour, 3277 * time.Second, time.Hour},
		{"two hours", 2 * time.Hour, 3 * time.Hour, 2 * time.Hour, 3 * time.Hour},
		{"the largest stored", 32767 * time.Second, (1<<24 - 1) * time.Second, 32767 * time.Second, (1<<24 - 1) * time.Second},
		{"just past both", 32767*time.Second + time.Millisecond, 1 << 24 * time.Second, judge.InFlightTimeout, judge.TTL},
		{"ttl not whole seconds", time.Second, time.Hour + 500*time.Millisecond, time.Second, judge.TTL},
		{"ten years", time.Second, 10 * 365 * 24 * time.Hour, time.Second, judge.TTL},
	} {
		t.Run(tt.name, func(t *testing.T) {
			claimant := *judge
			claimant.InFlightTimeout, claimant.TTL = tt.wait, tt.ttl
			for _, settled := range []bool{false, true} {
				r := newRecord(claimOf(&claimant, parked, 0xdeadbeefcafe, articleBase))
				r.settled = settled
				enc := r.encode()
				if len(enc) != 28 {
					t.Fatalf("encoded %d bytes, want 28", len(enc))
				}
				got, err := decodeRecord(enc)
				if err != nil || got != r {
					t.Fatalf("decoded %+v %v, want %+v", got, err, r)
				}
				if w, l := got.wait(judge), got.claimTTL(judge); w != tt.wantWait || l != tt.wantTTL {
					t.Fatalf("read back waits %s and is dated by %s, want %s and %s", w, l, tt.wantWait, tt.wantTTL)
				}
				if got.wait(judge) < tt.wait && got.waitCode != 0 {
					t.Fatalf("a stored timeout of %s waits %s, shorter than its request's", tt.wait, got.wait(judge))
				}
				for n := 29; n <= 44; n++ {
					if later, err := decodeRecord(enc + strings.Repeat("\xff", n-28)); err != nil || later != r {
						t.Fatalf("a later version's %d bytes read %+v %v, want %+v", n, later, err, r)
					}
				}
				for n := 23; n < 28; n++ {
					before, err := decodeRecord(enc[:n])
					if err != nil || before.waitCode != 0 || before.ttlS != 0 || before.claimedMs != r.claimedMs || before.token != r.token {
						t.Fatalf("%d bytes read %+v %v, want the 23-byte fields alone", n, before, err)
					}
				}
				for _, bad := range []string{enc[:22], enc + strings.Repeat("\x00", 17)} {
					if _, err := decodeRecord(bad); err == nil {
						t.Fatalf("%d bytes read as a claim", len(bad))
					}
				}
			}
		})
	}
}

// Redis-specific: the README's "a key costs Redis 120 bytes" for the
// 28-byte record, pending or settled (SET XX KEEPTTL): the 5 bytes of the
// claim's in_flight_timeout and TTL fit the allocation the 23 bytes before
// them took (Redis keeps a string of up to 28 bytes with its 16-byte
// object header and 4 bytes of sds header and terminator in 48 bytes),
// so a key costs what it did.
func TestARedisClaimKeyCostsWhatItDid(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	s, rdb := newRedisStore(t, srv), srv.Client()
	c := claimOf(testPolicy(Tumbling), parked, 1, time.Now())
	decide(t, s, c)
	before := c.Key()[:len(c.Key())-1] + "x" // a key of the same length, for a record of the length before
	rdb.Set(ctx, before, strings.Repeat("p", recordSizeBefore), time.Hour)
	was := rdb.MemoryUsage(ctx, before).Val()
	for _, state := range []string{"pending", "settled"} {
		if state == "settled" {
			if err := settleOne(ctx, s, c); err != nil {
				t.Fatal(err)
			}
		}
		if v := rdb.Get(ctx, c.Key()).Val(); len(v) != recordSize || (state == "settled") != (v[0] == flagSettled) {
			t.Fatalf("%s: %d bytes stored (%q), want %d", state, len(v), v, recordSize)
		}
		n, err := rdb.MemoryUsage(ctx, c.Key()).Result()
		t.Logf("%s: MEMORY USAGE %d, a %d-byte record %d", state, n, recordSizeBefore, was)
		if err != nil || n > was {
			t.Fatalf("%s: MEMORY USAGE %d %v, more than the %d of a %d-byte record", state, n, err, was, recordSizeBefore)
		}
	}
}
