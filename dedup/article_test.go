package dedup

import (
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// The design article's verification tests, with its exact coordinates. The
// property is not "duplicates are suppressed" but "the right duplicates are
// suppressed".

var articleBase = time.Date(2026, 8, 8, 12, 0, 0, 0, time.UTC)

// windowKey is the article's window_key: validate, then key with the
// defaults (5 minute window, H3 resolution 12, prefix "dedup:").
func windowKey(t *testing.T, asset string, at time.Time, lat, lon float64) string {
	t.Helper()
	p := ping.Ping{Asset: asset, Time: at, Lat: lat, Lon: lon}
	if err := ping.NewParser().Validate(p, at); err != nil {
		t.Fatalf("article ping %+v rejected: %v", p, err)
	}
	return defaultKeyer().Observe(p).Key
}

func defaultKeyer() Keyer {
	return Keyer{Window: DefaultWindow, Resolution: DefaultResolution, Prefix: DefaultKeyPrefix}
}

func TestRedeliveryCollapses(t *testing.T) {
	a := windowKey(t, "veh-88", articleBase, 52.5200087, 13.4049547)
	b := windowKey(t, "veh-88", articleBase, 52.5200087, 13.4049547)
	if a != b {
		t.Fatalf("identical observation gave two keys: %s, %s", a, b)
	}
}

func TestJitterWhileParkedCollapses(t *testing.T) {
	a := windowKey(t, "veh-88", articleBase, 52.5200087, 13.4049547)
	b := windowKey(t, "veh-88", articleBase.Add(20*time.Second), 52.5200410, 13.4049920)
	if a != b {
		t.Fatalf("five metres of GPS noise left the res-12 cell: %s, %s", a, b)
	}
}

func TestRealMovementIsAdmitted(t *testing.T) {
	a := windowKey(t, "veh-88", articleBase, 52.5200087, 13.4049547)
	b := windowKey(t, "veh-88", articleBase.Add(20*time.Second), 52.5241000, 13.4102000)
	if a == b {
		t.Fatalf("a vehicle that left was keyed as parked: %s", a)
	}
}

func TestTwoAssetsNeverShareAKey(t *testing.T) {
	a := windowKey(t, "veh-88", articleBase, 52.5200087, 13.4049547)
	b := windowKey(t, "veh-91", articleBase, 52.5200087, 13.4049547)
	if a == b {
		t.Fatalf("two vehicles in one cell share key %s", a)
	}
}

// The third article test fails when the resolution is too coarse: a cell
// wider than the move swallows it. The move above is ~570 m; H3 resolution
// 6 cells have edges of ~3.2 km.
func TestCoarseResolutionSwallowsRealMovement(t *testing.T) {
	k := defaultKeyer()
	k.Resolution = 6
	a := k.Observe(ping.Ping{Asset: "veh-88", Time: articleBase, Lat: 52.5200087, Lon: 13.4049547})
	b := k.Observe(ping.Ping{Asset: "veh-88", Time: articleBase.Add(20 * time.Second), Lat: 52.5241000, Lon: 13.4102000})
	if a.Key != b.Key {
		t.Fatalf("expected resolution 6 to swallow the move (cells %s, %s)", a.Cell, b.Cell)
	}
}

// The key layout is part of the contract: changing it invalidates every key
// in every store. This value was computed outside Go, with Python's hashlib
// over the article's layout:
//
//	"dedup:" + blake2b(b"veh-88|1786190400|8c1f1d48945d9ff", digest_size=16).hexdigest()
func TestKeyLayoutMatchesTheArticle(t *testing.T) {
	o := defaultKeyer().Observe(ping.Ping{Asset: "veh-88", Time: articleBase, Lat: 52.5200087, Lon: 13.4049547})
	if o.Bucket != 1786190400 || o.Cell.String() != "8c1f1d48945d9ff" {
		t.Fatalf("bucket %d cell %s, want 1786190400 8c1f1d48945d9ff", o.Bucket, o.Cell)
	}
	if want := "dedup:93978d4cc1c8ffa35f6c00a4a1fc01dd"; o.Key != want {
		t.Fatalf("key %s, want %s: the key layout changed, which invalidates every stored key", o.Key, want)
	}
}
