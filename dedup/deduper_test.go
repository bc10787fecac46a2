package dedup

import (
	"context"
	"testing"
	"time"
)

type testDeduper struct {
	*Deduper
	keyer Keyer
	clock time.Time
}

func newTestDeduper(s Store) *testDeduper {
	td := &testDeduper{keyer: defaultKeyer(), clock: articleBase}
	td.Deduper = &Deduper{Store: s, TTL: time.Hour, InFlightTimeout: DefaultInFlightTimeout, Now: func() time.Time { return td.clock }}
	return td
}

func (td *testDeduper) claim(t *testing.T, p Ping) Claim {
	t.Helper()
	c, err := td.Claim(context.Background(), td.keyer.Observe(p))
	if err != nil {
		t.Fatalf("claim %+v: %v", p, err)
	}
	return c
}

func (td *testDeduper) settle(t *testing.T, c Claim) {
	t.Helper()
	if err := td.Settle(context.Background(), c); err != nil {
		t.Fatalf("settle: %v", err)
	}
}

func TestDeduperNamesEachDuplicate(t *testing.T) {
	eachStore(t, func(t *testing.T, s Store) {
		d := newTestDeduper(s)
		first := Ping{Asset: "veh-88", Time: articleBase, Lat: 52.5200087, Lon: 13.4049547}
		d.settle(t, d.claim(t, first))

		tests := []struct {
			name   string
			ping   Ping
			reason Reason
		}{
			{"redelivery", first, Redelivery},
			{"re-observation", Ping{Asset: "veh-88", Time: articleBase.Add(20 * time.Second), Lat: 52.5200087, Lon: 13.4049547}, Reobservation},
			{"jitter", Ping{Asset: "veh-88", Time: articleBase.Add(20 * time.Second), Lat: 52.5200410, Lon: 13.4049920}, Jitter},
			{"jitter at the same time", Ping{Asset: "veh-88", Time: articleBase, Lat: 52.5200410, Lon: 13.4049920}, Jitter},
		}
		for _, tt := range tests {
			if c := d.claim(t, tt.ping); c.Decision != Suppressed || c.Reason != tt.reason {
				t.Errorf("%s: %s/%s, want suppressed/%s", tt.name, c.Decision, c.Reason, tt.reason)
			}
		}
	})
}

func TestDeduperAsksInFlightRedeliveriesToComeBack(t *testing.T) {
	eachStore(t, func(t *testing.T, s Store) {
		d := newTestDeduper(s)
		first := Ping{Asset: "veh-88", Time: articleBase, Lat: 52.5200087, Lon: 13.4049547}
		jitter := Ping{Asset: "veh-88", Time: articleBase.Add(time.Second), Lat: 52.5200410, Lon: 13.4049920}
		accepted := d.claim(t, first)

		if c := d.claim(t, first); c.Decision != InFlight || c.Reason != Redelivery {
			t.Fatalf("redelivery while the first is in flight: %s/%s, want in_flight/redelivery", c.Decision, c.Reason)
		}
		if c := d.claim(t, jitter); c.Decision != Suppressed || c.Reason != Jitter {
			t.Fatalf("jitter while the first is in flight: %s/%s, want suppressed/jitter", c.Decision, c.Reason)
		}
		d.settle(t, accepted)
		if c := d.claim(t, first); c.Decision != Suppressed || c.Reason != Redelivery {
			t.Fatalf("redelivery after settling: %s/%s, want suppressed/redelivery", c.Decision, c.Reason)
		}
	})
}

func TestDeduperTreatsAnOldUnsettledClaimAsSettled(t *testing.T) {
	eachStore(t, func(t *testing.T, s Store) {
		d := newTestDeduper(s)
		first := Ping{Asset: "veh-88", Time: articleBase, Lat: 52.5200087, Lon: 13.4049547}
		d.claim(t, first) // its process dies: never settled, never released
		d.clock = d.clock.Add(d.InFlightTimeout)
		if c := d.claim(t, first); c.Decision != Suppressed {
			t.Fatalf("redelivery %s after in_flight_timeout: %s, want suppressed", d.InFlightTimeout, c.Decision)
		}
	})
}

func TestDeduperReleaseLetsTheRetryIn(t *testing.T) {
	eachStore(t, func(t *testing.T, s Store) {
		d := newTestDeduper(s)
		first := Ping{Asset: "veh-88", Time: articleBase, Lat: 52.5200087, Lon: 13.4049547}
		failed := d.claim(t, first)
		released, err := d.Release(context.Background(), failed)
		if err != nil || !released {
			t.Fatalf("release: %v, %v", released, err)
		}
		if c := d.claim(t, first); c.Decision != Accepted {
			t.Fatalf("retry after release: %s, want accepted", c.Decision)
		}
		if released, _ := d.Release(context.Background(), failed); released {
			t.Fatal("the failed request released the retry's claim")
		}
	})
}
