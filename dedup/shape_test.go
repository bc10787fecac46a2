package dedup

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/uber/h3-go/v4"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/geo"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// The article's Figure 2: one vehicle, six pings, two of them 4 s apart
// across a 5-minute boundary, then an idle gap. Tumbling admits both sides
// of the boundary; sliding suppresses the second; session suppresses the
// whole burst and admits the first ping after the idle gap.
func TestFigure2(t *testing.T) {
	const lat, lon = 52.5200087, 13.4049547
	boundary := articleBase.Add(5 * time.Minute) // 12:05:00
	pings := []ping.Ping{
		{Time: boundary.Add(-64 * time.Second)},                // 12:03:56, first of the burst
		{Time: boundary.Add(-4 * time.Second), Lat: 0.0000120}, // 12:04:56, jitter
		{Time: boundary},                      // 12:05:00, 4 s later, across the boundary
		{Time: boundary.Add(3 * time.Minute)}, // 12:08:00
		{Time: boundary.Add(6*time.Minute + 10*time.Second), Lat: 0.0000080}, // 12:11:10, >5 m after the first
		{Time: boundary.Add(25 * time.Minute)},                               // 12:30:00, after a 19 minute idle gap
	}
	want := map[Shape][]Verdict{
		Tumbling: {accepted, suppressed(Jitter), accepted, suppressed(Reobservation), accepted, accepted},
		Sliding:  {accepted, suppressed(Jitter), suppressed(ReasonSliding), suppressed(ReasonSliding), accepted, accepted},
		Session:  {accepted, suppressed(Jitter), suppressed(ReasonSession), suppressed(ReasonSession), suppressed(ReasonSession), accepted},
	}
	eachStoreAndShape(t, func(t *testing.T, s Store, pol *Policy) {
		d := newTestDeduper(s, pol.Shape)
		for i, p := range pings {
			p.Asset, p.Lat, p.Lon = "veh-88", lat+p.Lat, lon
			if v := d.settled(t, p); v != want[pol.Shape][i] {
				t.Errorf("ping %d at %s: %+v, want %+v", i+1, p.Time.Format(time.TimeOnly), v, want[pol.Shape][i])
			}
		}
	})
}

// A redelivery is suppressed for the whole TTL in every shape, even after
// the asset moved on and its last accepted place is elsewhere.
func TestRedeliveryAfterMovementIsSuppressed(t *testing.T) {
	eachStoreAndShape(t, func(t *testing.T, s Store, pol *Policy) {
		d := newTestDeduper(s, pol.Shape)
		parkedPing := at(0, 52.5200087, 13.4049547)
		jitter := at(30*time.Second, 52.5200410, 13.4049920)
		d.settled(t, parkedPing)
		d.settled(t, jitter)
		d.settled(t, at(60*time.Second, 52.5241000, 13.4102000)) // it leaves
		d.settled(t, at(90*time.Second, 52.5290000, 13.4150000))
		d.clock = d.clock.Add(2 * time.Hour)
		if v := d.verdict(t, parkedPing); v != suppressed(Redelivery) {
			t.Errorf("redelivery of the accepted ping after the move: %+v, want suppressed/redelivery", v)
		}
		// Tumbling's key remembers only its first sighting, so it can only
		// call the suppressed ping's redelivery what the ping itself was.
		want := suppressed(Redelivery)
		if pol.Shape == Tumbling {
			want = suppressed(Jitter)
		}
		if v := d.verdict(t, jitter); v != want {
			t.Errorf("redelivery of the suppressed ping after the move: %+v, want %+v", v, want)
		}
	})
}

// A return to a place the asset left is a move in sliding and session:
// tumbling cannot tell it from a re-observation in the same bucket.
func TestReturnToAPlaceIsAdmittedBySlidingAndSession(t *testing.T) {
	eachStoreAndShape(t, func(t *testing.T, s Store, pol *Policy) {
		d := newTestDeduper(s, pol.Shape)
		d.settled(t, at(0, 52.5200087, 13.4049547))
		d.settled(t, at(20*time.Second, 52.5241000, 13.4102000))
		back := d.settled(t, at(40*time.Second, 52.5200110, 13.4049560))
		if want := pol.Shape != Tumbling; (back.Decision == Accepted) != want {
			t.Fatalf("return after leaving: %+v, want accepted=%v", back, want)
		}
	})
}

// Out-of-order pings are judged on device time and never move the asset's
// last accepted ping backwards.
func TestOutOfOrderPingsDoNotMoveTheStateBackwards(t *testing.T) {
	for _, shape := range []Shape{Sliding, Session} {
		t.Run(string(shape), func(t *testing.T) {
			eachStore(t, func(t *testing.T, s Store) {
				d := newTestDeduper(s, shape)
				d.settled(t, at(0, 52.5200087, 13.4049547))
				d.settled(t, at(60*time.Second, 52.5241000, 13.4102000)) // moved
				if v := d.settled(t, at(30*time.Second, 52.5220000, 13.4070000)); v.Decision != Accepted {
					t.Fatalf("a late ping from a third place: %+v, want accepted", v)
				}
				// Still judged against the latest accepted place, not the late one.
				if v := d.settled(t, at(70*time.Second, 52.5241010, 13.4102010)); v != suppressed(Jitter) {
					t.Fatalf("jitter at the latest place after the late ping: %+v, want suppressed/jitter", v)
				}
				if v := d.settled(t, at(80*time.Second, 52.5220000, 13.4070000)); v.Decision != Accepted {
					t.Fatalf("back at the late ping's place: %+v, want accepted", v)
				}
			})
		})
	}
}

// edgePair returns two fixes less than a metre apart on either side of an
// edge of the cell of (lat, lon) at the default resolution.
func edgePair(t *testing.T, lat, lon float64) (inside, outside ping.Ping) {
	t.Helper()
	cell := h3.LatLngToCell(h3.NewLatLng(lat, lon), DefaultResolution)
	b, c := cell.Boundary(), cell.LatLng()
	mid := h3.LatLng{Lat: (b[0].Lat + b[1].Lat) / 2, Lng: (b[0].Lng + b[1].Lng) / 2}
	step := func(f float64) ping.Ping {
		return ping.Ping{Asset: "veh-88", Lat: mid.Lat + (c.Lat-mid.Lat)*f, Lon: mid.Lng + (c.Lng-mid.Lng)*f}
	}
	inside, outside = step(0.05), step(-0.05)
	if cellOf(inside) != cell || cellOf(outside) == cell {
		t.Fatalf("edge pair %v %v not on both sides of %s", inside, outside, cell)
	}
	if d := geo.DistanceM(inside.Lat, inside.Lon, outside.Lat, outside.Lon); d > 1.5 {
		t.Fatalf("edge pair %.2f m apart", d)
	}
	return inside, outside
}

func cellOf(p ping.Ping) h3.Cell {
	return h3.LatLngToCell(h3.NewLatLng(p.Lat, p.Lon), DefaultResolution)
}

// A parked fix that jitters across a cell edge is still the same place: the
// track shapes judge the place by the stay, not by the cell of one fix.
func TestAParkedFixAcrossACellEdgeIsTheSamePlace(t *testing.T) {
	inside, outside := edgePair(t, 52.5200087, 13.4049547)
	eachStoreAndShape(t, func(t *testing.T, s Store, pol *Policy) {
		d := newTestDeduper(s, pol.Shape)
		inside.Time, outside.Time = articleBase, articleBase.Add(10*time.Second)
		d.settled(t, inside)
		want := suppressed(Jitter)
		if pol.Shape == Tumbling {
			want = accepted // its key is the cell
		}
		if v := d.settled(t, outside); v != want {
			t.Fatalf("fix across the edge %+v, want %+v", v, want)
		}
	})
}

func TestPolicyCheck(t *testing.T) {
	for _, tt := range []struct {
		policy Policy
		option string
	}{
		{Policy{Shape: Sliding, Radius: 0}, "radius"},
		{Policy{Shape: Sliding, Radius: -1}, "radius"},
		{Policy{Shape: Session, Radius: math.NaN(), SessionIdle: time.Minute}, "radius"},
		{Policy{Shape: Sliding, Radius: 5000}, "radius"},
		{Policy{Shape: Session, Radius: DefaultRadius, SessionIdle: 0}, "session_idle"},
	} {
		err := tt.policy.Check()
		if ce, ok := err.(*ConfigError); !ok || ce.Option != tt.option {
			t.Errorf("%+v: got %v, want an error about %s", tt.policy, err, tt.option)
		}
	}
	for _, ok := range []Policy{{Shape: Tumbling}, {Shape: Sliding, Radius: 5}, {Shape: Session, Radius: 40, SessionIdle: time.Minute}} {
		if err := ok.Check(); err != nil {
			t.Errorf("%+v rejected: %v", ok, err)
		}
	}
}

// The store decisions are made in one step: two concurrent pings of one asset
// from different places cannot both see the old state.
func TestTrackDecisionsAreAtomic(t *testing.T) {
	for _, shape := range []Shape{Sliding, Session} {
		t.Run(string(shape), func(t *testing.T) {
			eachStore(t, func(t *testing.T, s Store) {
				pol := testPolicy(shape)
				decide(t, s, claimOf(pol, parked, 1, articleBase))
				results := make(chan Verdict, 40)
				for i := range 40 {
					go func() {
						p := parked
						p.Time = articleBase.Add(time.Duration(i+1) * time.Second)
						p.Lat += 0.0000010 * float64(i%3) // jitter in the same cell
						v, _ := decideOne(context.Background(), s, claimOf(pol, p, uint64(i+2), articleBase))
						results <- v
					}()
				}
				for range 40 {
					if v := <-results; v.Decision != Suppressed {
						t.Errorf("concurrent jitter: %+v, want suppressed", v)
					}
				}
			})
		})
	}
}
