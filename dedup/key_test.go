package dedup

import (
	"errors"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

func TestBucketFloorsDeviceTimeToTheWindow(t *testing.T) {
	k := defaultKeyer()
	tests := []struct {
		at   time.Time
		want time.Time
	}{
		{articleBase, articleBase},
		{articleBase.Add(4*time.Minute + 59*time.Second), articleBase},
		{articleBase.Add(5 * time.Minute), articleBase.Add(5 * time.Minute)},
		{articleBase.Add(-time.Second), articleBase.Add(-5 * time.Minute)},
		{time.Date(1969, 12, 31, 23, 59, 59, 0, time.UTC), time.Date(1969, 12, 31, 23, 55, 0, 0, time.UTC)},
	}
	for _, tt := range tests {
		if got := k.Bucket(tt.at); got != tt.want.Unix() {
			t.Errorf("Bucket(%v) = %v, want %v", tt.at, time.Unix(got, 0).UTC(), tt.want)
		}
	}
}

// Tumbling's price: two pings seconds apart on either side of a boundary
// land in different buckets and are both admitted.
func TestBucketBoundaryAdmitsBothSides(t *testing.T) {
	d := newTestDeduper(NewMemoryStore(0), Tumbling)
	before := ping.Ping{Asset: "veh-88", Time: articleBase.Add(4*time.Minute + 58*time.Second), Lat: 52.5200087, Lon: 13.4049547}
	after := ping.Ping{Asset: "veh-88", Time: articleBase.Add(5*time.Minute + 2*time.Second), Lat: 52.5200087, Lon: 13.4049547}
	for _, p := range []ping.Ping{before, after} {
		if v := d.verdict(t, p); v.Decision != Accepted {
			t.Fatalf("ping at %v: %s, want accepted on its side of the boundary", p.Time, v.Decision)
		}
	}
}

// A ping that arrives late is judged in the bucket of its own device time,
// never the bucket of its arrival.
func TestOutOfOrderArrivalIsKeyedOnDeviceTime(t *testing.T) {
	d := newTestDeduper(NewMemoryStore(0), Tumbling)
	parked := func(offset time.Duration, lat float64) ping.Ping {
		return ping.Ping{Asset: "veh-88", Time: articleBase.Add(offset), Lat: lat, Lon: 13.4049547}
	}
	steps := []struct {
		ping     ping.Ping
		decision Decision
	}{
		{parked(6*time.Minute, 52.5200087), Accepted},   // arrives first, bucket 12:05
		{parked(1*time.Minute, 52.5200087), Accepted},   // arrives late, bucket 12:00: new there
		{parked(3*time.Minute, 52.5200110), Suppressed}, // late jitter in 12:00
		{parked(7*time.Minute, 52.5200110), Suppressed}, // jitter in 12:05
		{parked(11*time.Minute, 52.5200110), Accepted},  // 12:10
		{parked(2*time.Minute+30*time.Second, 52.5200087), Suppressed},
	}
	for i, s := range steps {
		if v := d.settled(t, s.ping); v.Decision != s.decision {
			t.Fatalf("step %d (device time %v): %s, want %s", i, s.ping.Time.Format(time.TimeOnly), v.Decision, s.decision)
		}
	}
}

func TestKeyerCheck(t *testing.T) {
	tests := []struct {
		keyer  Keyer
		option string
	}{
		{Keyer{Window: 1500 * time.Millisecond, Resolution: 12}, "window"},
		{Keyer{Window: 0, Resolution: 12}, "window"},
		{Keyer{Window: time.Minute, Resolution: 16}, "resolution"},
		{Keyer{Window: time.Minute, Resolution: -1}, "resolution"},
	}
	for _, tt := range tests {
		var ce *ConfigError
		if err := tt.keyer.Check(); !errors.As(err, &ce) || ce.Option != tt.option {
			t.Errorf("%+v: got %v, want an error about %s", tt.keyer, err, tt.option)
		}
	}
	if err := defaultKeyer().Check(); err != nil {
		t.Errorf("defaults rejected: %v", err)
	}
}

func TestKeyPrefixStartsAFreshKeySpace(t *testing.T) {
	p := ping.Ping{Asset: "veh-88", Time: articleBase, Lat: 52.5200087, Lon: 13.4049547}
	a, b := defaultKeyer(), defaultKeyer()
	b.Prefix = "fleet-b:"
	ka, kb := a.Observe(p).Key, b.Observe(p).Key
	if ka[len(a.Prefix):] != kb[len(b.Prefix):] || kb[:len(b.Prefix)] != "fleet-b:" {
		t.Fatalf("prefix should only change the start of the key: %s vs %s", ka, kb)
	}
}

// Scoped and unscoped identities never meet: an unscoped handler accepts
// any printable asset id, and none of them is a scoped identity, because a
// scoped identity holds a control character that asset ids may not.
func TestScopedAndUnscopedIdentitiesNeverMeet(t *testing.T) {
	scoped := ScopedAsset("acme.example", "truck-2")
	forged := "12:acme.example/truck-2" // the scoped identity of the old layout, a valid asset id
	if err := ping.NewParser().Validate(ping.Ping{Asset: forged, Time: articleBase, Lat: 1, Lon: 2}, articleBase); err != nil {
		t.Fatalf("the forged id is no longer a valid asset id (%v); the test lost its point", err)
	}
	if scoped == forged {
		t.Fatal("an unscoped asset id spells acme's scoped truck-2")
	}
	if err := ping.NewParser().Validate(ping.Ping{Asset: scoped, Time: articleBase, Lat: 1, Lon: 2}, articleBase); err == nil {
		t.Fatalf("the scoped identity %q is a valid unscoped asset id", scoped)
	}
	if ScopedAsset("", "truck-2") != "truck-2" {
		t.Error("without a scope the identity must be the asset itself (the article's key layout)")
	}
	// No two scope and asset pairs spell the same identity, whatever the
	// scope holds (a user id may hold the separator).
	pairs := [][2]string{{"a", "b/c"}, {"a/b", "c"}, {"a" + ScopeSeparator + "b", "c"}, {"a", "b" + ScopeSeparator + "c"}, {"1:a", "b"}, {"a", "1:b"}}
	seen := map[string][2]string{}
	for _, p := range pairs {
		id := ScopedAsset(p[0], p[1])
		if other, ok := seen[id]; ok {
			t.Errorf("scope %q asset %q and scope %q asset %q are one identity %q", p[0], p[1], other[0], other[1], id)
		}
		seen[id] = p
		if scope, asset := SplitScopedAsset(id); scope != p[0] || asset != p[1] {
			t.Errorf("scope %q asset %q split back into %q and %q", p[0], p[1], scope, asset)
		}
	}
	for _, id := range []string{forged, "truck-2", "3:ab", "x:" + ScopeSeparator} {
		if scope, asset := SplitScopedAsset(id); scope != "" || asset != id {
			t.Errorf("the unscoped id %q split into scope %q and asset %q", id, scope, asset)
		}
	}
}
