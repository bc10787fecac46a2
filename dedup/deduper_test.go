package dedup

import (
	"context"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

type testDeduper struct {
	*Deduper
	clock time.Time
}

func newTestDeduper(s Store, shape Shape) *testDeduper {
	td := &testDeduper{clock: articleBase}
	td.Deduper = &Deduper{Store: s, Keyer: defaultKeyer(), Policy: *testPolicy(shape), Now: func() time.Time { return td.clock }}
	return td
}

func (td *testDeduper) claim(t *testing.T, p ping.Ping) (*Claim, Verdict) {
	t.Helper()
	c, v, err := td.Claim(context.Background(), td.Observe(p))
	if err != nil {
		t.Fatalf("claim %+v: %v", p, err)
	}
	return c, v
}

func (td *testDeduper) verdict(t *testing.T, p ping.Ping) Verdict {
	t.Helper()
	_, v := td.claim(t, p)
	return v
}

// settled claims p and settles it, as a request whose upstream answered.
func (td *testDeduper) settled(t *testing.T, p ping.Ping) Verdict {
	t.Helper()
	c, v := td.claim(t, p)
	if v.Decision == Accepted {
		if err := td.Settle(context.Background(), c); err != nil {
			t.Fatalf("settle: %v", err)
		}
	}
	return v
}

func at(offset time.Duration, lat, lon float64) ping.Ping {
	return ping.Ping{Asset: "veh-88", Time: articleBase.Add(offset), Lat: lat, Lon: lon}
}

// A deduper quantises a ping as its shape decides: tumbling by the key of
// the key contract, the track shapes by the asset's stay, which needs the
// bucket (a re-report's reason names the shape when the window turned) and
// no cell or key: they are not computed there.
func TestDeduperObservesWhatItsShapeDecidesOn(t *testing.T) {
	p := ping.Ping{Asset: "veh-88", Time: articleBase.Add(90 * time.Second), Lat: 52.5200087, Lon: 13.4049547}
	full := defaultKeyer().Observe(p)
	for _, shape := range Shapes {
		got := (&Deduper{Keyer: defaultKeyer(), Policy: *testPolicy(shape)}).Observe(p)
		want := full
		if shape != Tumbling {
			want.Cell, want.Key = 0, ""
		}
		if got != want {
			t.Errorf("%s: %+v, want %+v", shape, got, want)
		}
	}
}

// The claims of one request are told apart by the lower 16 bits of their
// tokens: a batch of more would look like two requests to a track, so it
// is refused, not decided.
func TestDeduperRefusesMoreClaimsThanItsTokensTellApart(t *testing.T) {
	d := &Deduper{Keyer: defaultKeyer(), Policy: *testPolicy(Sliding), Store: NewMemoryStore(0)}
	batch := make([]Observation, MaxClaims+1)
	for i := range batch {
		batch[i] = d.Observe(ping.Ping{Asset: "veh-88", Time: articleBase.Add(time.Duration(i) * time.Second), Lat: 52.52, Lon: 13.40})
	}
	if _, _, err := d.ClaimAll(context.Background(), batch); err == nil {
		t.Fatalf("a batch of %d observations was decided", len(batch))
	}
	if _, verdicts, err := d.ClaimAll(context.Background(), batch[:MaxClaims]); err != nil || len(verdicts) != MaxClaims {
		t.Fatalf("a batch of %d: %d verdicts, %v", MaxClaims, len(verdicts), err)
	}
}

func TestDeduperNamesEachDuplicate(t *testing.T) {
	eachStoreAndShape(t, func(t *testing.T, s Store, pol *Policy) {
		d := newTestDeduper(s, pol.Shape)
		first := at(0, 52.5200087, 13.4049547)
		d.settled(t, first)
		tests := []struct {
			name   string
			ping   ping.Ping
			reason Reason
		}{
			{"redelivery", first, Redelivery},
			{"re-observation", at(20*time.Second, 52.5200087, 13.4049547), Reobservation},
			{"jitter", at(40*time.Second, 52.5200410, 13.4049920), Jitter},
			{"jitter at the same time", at(0, 52.5200410, 13.4049920), Jitter},
		}
		for _, tt := range tests {
			if v := d.settled(t, tt.ping); v != suppressed(tt.reason) {
				t.Errorf("%s: %+v, want suppressed/%s", tt.name, v, tt.reason)
			}
		}
	})
}

func TestDeduperAsksInFlightRedeliveriesToComeBack(t *testing.T) {
	eachStoreAndShape(t, func(t *testing.T, s Store, pol *Policy) {
		d := newTestDeduper(s, pol.Shape)
		first := at(0, 52.5200087, 13.4049547)
		c, _ := d.claim(t, first)
		if v := d.verdict(t, first); v.Decision != InFlight || v.Reason != Redelivery {
			t.Fatalf("redelivery while the first is in flight: %+v, want in_flight/redelivery", v)
		}
		if v := d.verdict(t, at(time.Second, 52.5200410, 13.4049920)); v != suppressed(Jitter) {
			t.Fatalf("jitter while the first is in flight: %+v, want suppressed/jitter", v)
		}
		d.Settle(context.Background(), c)
		if v := d.verdict(t, first); v != suppressed(Redelivery) {
			t.Fatalf("redelivery after settling: %+v, want suppressed/redelivery", v)
		}
	})
}

// A batch that holds the same ping twice delivers it once: the copy is
// the element's redelivery, not an in-flight one the sender would be asked
// to send again (with the same copy in it, forever).
func TestACopyWithinABatchIsItsOwnRedelivery(t *testing.T) {
	eachStoreAndShape(t, func(t *testing.T, s Store, pol *Policy) {
		d := newTestDeduper(s, pol.Shape)
		p := at(0, 52.5200087, 13.4049547)
		alarm := at(time.Second, 52.5200087, 13.4049547)
		alarm.Event = "sos"
		batch := []ping.Ping{p, alarm, p, alarm, at(2*time.Second, 52.5200087, 13.4049547)}
		obs := make([]Observation, len(batch))
		for i, b := range batch {
			obs[i] = d.Observe(b)
		}
		_, got, err := d.ClaimAll(context.Background(), obs)
		if err != nil {
			t.Fatal(err)
		}
		want := []Verdict{accepted, {Decision: Accepted, Reason: ReasonEvent}, suppressed(Redelivery), suppressed(Redelivery), got[4]}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("element %d: %+v, want %+v", i, got[i], want[i])
			}
		}
		if got[4].Decision == InFlight {
			t.Errorf("a later fix at the same place: %+v, not the batch's copy", got[4])
		}
		// A copy of a ping another request holds still waits for it.
		if v := d.verdict(t, p); v.Decision != InFlight || v.Reason != Redelivery {
			t.Fatalf("the ping again, in another request while the batch is in flight: %+v, want in_flight/redelivery", v)
		}
	})
}

func TestDeduperTreatsAnOldUnsettledClaimAsSettled(t *testing.T) {
	eachStoreAndShape(t, func(t *testing.T, s Store, pol *Policy) {
		d := newTestDeduper(s, pol.Shape)
		d.Policy.InFlightTimeout = 200 * time.Millisecond
		first := at(0, 52.5200087, 13.4049547)
		d.claim(t, first) // its process dies: never settled, never released
		// Both clocks: the claim's own, and the store's since it landed.
		d.clock = d.clock.Add(d.Policy.InFlightTimeout)
		time.Sleep(d.Policy.InFlightTimeout)
		if v := d.verdict(t, first); v != suppressed(Redelivery) {
			t.Fatalf("redelivery %s after the claim: %+v, want suppressed/redelivery", d.Policy.InFlightTimeout, v)
		}
	})
}

// An instance whose clock runs ahead of the claiming one's sees a fresh
// claim as older than in_flight_timeout; the store's own clock says it has
// just landed, so a redelivery still waits for it.
func TestDeduperWithAClockAheadStillWaitsForAPendingClaim(t *testing.T) {
	eachStoreAndShape(t, func(t *testing.T, s Store, pol *Policy) {
		d := newTestDeduper(s, pol.Shape)
		first := at(0, 52.5200087, 13.4049547)
		d.claim(t, first)
		d.clock = d.clock.Add(2 * d.Policy.InFlightTimeout)
		if v := d.verdict(t, first); v.Decision != InFlight || v.Reason != Redelivery {
			t.Fatalf("redelivery on a clock %s ahead: %+v, want in_flight/redelivery", 2*d.Policy.InFlightTimeout, v)
		}
	})
}

// Release undoes everything the failed request changed: in the track
// shapes the asset's last accepted ping is the one before again, so the
// retry is judged as if the failure had never happened.
func TestDeduperReleaseRestoresTheState(t *testing.T) {
	eachStoreAndShape(t, func(t *testing.T, s Store, pol *Policy) {
		d := newTestDeduper(s, pol.Shape)
		d.settled(t, at(0, 52.5200087, 13.4049547))
		moved := at(10*time.Minute+20*time.Second, 52.5241000, 13.4102000)
		failed, v := d.claim(t, moved)
		if v.Decision != Accepted {
			t.Fatalf("move: %+v", v)
		}
		if n, err := d.Release(context.Background(), failed); err != nil || n != 1 {
			t.Fatalf("release: %v %v", n, err)
		}
		if v := d.settled(t, moved); v.Decision != Accepted {
			t.Fatalf("retry after release: %+v, want accepted", v)
		}
		if v := d.verdict(t, at(10*time.Minute+30*time.Second, 52.5241000, 13.4102000)); v.Decision != Suppressed {
			t.Fatalf("the retry did not become the last accepted ping: %+v", v)
		}
	})
}
