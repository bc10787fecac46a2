package dedup

import (
	"context"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// In tumbling, a ping that carries an event has a key of its own: it is
// admitted at a parked asset, with reason event, and only its own exact
// redeliveries are suppressed; the jitter around it still meets the plain
// pings' key.
func TestTumblingAdmitsEventsAndSuppressesOnlyTheirRedeliveries(t *testing.T) {
	eachStore(t, func(t *testing.T, s Store) {
		d := newTestDeduper(s, Tumbling)
		parked := at(0, 52.5200087, 13.4049547)
		d.settled(t, parked)
		sos := at(20*time.Second, 52.5200410, 13.4049920)
		sos.Event = "alarm=sos"

		c, v := d.claim(t, sos)
		if v != (Verdict{Decision: Accepted, Reason: ReasonEvent}) {
			t.Fatalf("an alarm at a parked asset: %+v, want accepted/event", v)
		}
		if v := d.verdict(t, sos); v.Decision != InFlight || v.Reason != Redelivery {
			t.Fatalf("its redelivery while in flight: %+v, want in_flight/redelivery", v)
		}
		if err := d.Settle(context.Background(), c); err != nil {
			t.Fatal(err)
		}
		for name, tt := range map[string]struct {
			ping ping.Ping
			want Verdict
		}{
			"its redelivery":                 {sos, suppressed(Redelivery)},
			"jitter around it":               {at(30*time.Second, 52.5200300, 13.4049800), suppressed(Jitter)},
			"the plain fix it was sent with": {at(20*time.Second, 52.5200410, 13.4049920), suppressed(Jitter)},
			"the next alarm":                 {withEvent(at(40*time.Second, 52.5200410, 13.4049920), "alarm=sos"), Verdict{Decision: Accepted, Reason: ReasonEvent}},
			"another event at the same fix":  {withEvent(sos, "alarm=lowBattery"), Verdict{Decision: Accepted, Reason: ReasonEvent}},
		} {
			if got := d.settled(t, tt.ping); got != tt.want {
				t.Errorf("%s: %+v, want %+v", name, got, tt.want)
			}
		}
	})
}

// A state's value is part of the tumbling key: a change admits the ping,
// and the pings that keep the new value are judged among themselves.
func TestTumblingAdmitsAStateChange(t *testing.T) {
	eachStore(t, func(t *testing.T, s Store) {
		d := newTestDeduper(s, Tumbling)
		on := withState(at(0, 52.5200087, 13.4049547), "ignition=true")
		off := withState(at(30*time.Second, 52.5200410, 13.4049920), "ignition=false")
		for i, step := range []struct {
			ping ping.Ping
			want Decision
		}{
			{on, Accepted},
			{withState(at(10*time.Second, 52.5200300, 13.4049800), "ignition=true"), Suppressed},
			{off, Accepted}, // switched off where it stood
			{off, Suppressed},
			{withState(at(50*time.Second, 52.5200300, 13.4049800), "ignition=false"), Suppressed},
		} {
			if v := d.settled(t, step.ping); v.Decision != step.want || (v.Decision == Accepted && v.Reason != "") {
				t.Errorf("step %d: %+v, want %s without a reason", i, v, step.want)
			}
		}
	})
}

// A ping with neither state nor event keys exactly as the article does; a
// state or an event makes another key, an event one per exact sighting.
func TestStatesAndEventsExtendTheKeyOnlyWhenPresent(t *testing.T) {
	k := defaultKeyer()
	p := at(0, 52.5200087, 13.4049547)
	plain := k.Observe(p)
	if plain.Key != k.Key(p.Asset, plain.Bucket, plain.Cell) {
		t.Fatalf("a plain ping's key %s is not the article's %s", plain.Key, k.Key(p.Asset, plain.Bucket, plain.Cell))
	}
	keys := map[string]string{"plain": plain.Key}
	for name, q := range map[string]ping.Ping{
		"state":               withState(p, "ignition=true"),
		"other state":         withState(p, "ignition=false"),
		"event":               withEvent(p, "t=u"),
		"event, a second on":  withEvent(at(time.Second, 52.5200087, 13.4049547), "t=u"),
		"event, other fix":    withEvent(at(0, 52.5200088, 13.4049547), "t=u"),
		"event and state":     withState(withEvent(p, "t=u"), "ignition=true"),
		"state spelling more": withState(p, "ignition=true|e3:t=u"),
	} {
		key := k.Observe(q).Key
		for other, seen := range keys {
			if seen == key {
				t.Errorf("%s has the key of %s", name, other)
			}
		}
		keys[name] = key
	}
	if sightingPrint(withEvent(p, "t=u")) == sightingPrint(p) {
		t.Error("the event is not part of the sighting")
	}
}

func withEvent(p ping.Ping, event string) ping.Ping { p.Event = event; return p }

func withState(p ping.Ping, state string) ping.Ping { p.State = state; return p }
