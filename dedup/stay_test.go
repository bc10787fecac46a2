package dedup

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// offset is a ping dx metres east and dy metres north of the parked spot,
// sec seconds into the stay.
func offset(sec, dx, dy float64) ping.Ping {
	const lat, lon = 52.5200087, 13.4049547
	p := at(time.Duration(sec*float64(time.Second)), lat+dy/metresPerDegree, lon+dx/(metresPerDegree*math.Cos(lat*math.Pi/180)))
	return p
}

// eachTrackShape runs a test for sliding and session against both stores.
func eachTrackShape(t *testing.T, test func(t *testing.T, d *testDeduper)) {
	for _, shape := range []Shape{Sliding, Session} {
		t.Run(string(shape), func(t *testing.T) {
			eachStore(t, func(t *testing.T, s Store) { test(t, newTestDeduper(s, shape)) })
		})
	}
}

// park settles a stay: a first fix and a few jitter fixes around it.
func park(t *testing.T, d *testDeduper) {
	t.Helper()
	d.settled(t, offset(0, 0, 0))
	for i, j := range [][2]float64{{2, -1}, {-3, 2}, {1, 3}, {-2, -2}} {
		if v := d.settled(t, offset(float64(10*(i+1)), j[0], j[1])); v.Decision != Suppressed {
			t.Fatalf("jitter %v at the stay: %+v", j, v)
		}
	}
}

func TestStayJudgesTheSamePlace(t *testing.T) {
	for _, tt := range []struct {
		name string
		ping ping.Ping
		want Decision
	}{
		{"jitter within the radius", offset(60, 18, -10), Suppressed},
		{"a departure beyond the radius is admitted at once", offset(60, 40, 0), Accepted},
		{"a fix whose accuracy covers the distance is no move", withAccuracy(offset(60, 32, 0), 40), Suppressed},
		{"a fix reporting travel at the stay is a departure", withSpeed(offset(60, 3, 0), 8), Accepted},
		{"an outlier it could not have reached a second later is jitter", offset(41, 34, 0), Suppressed},
		{"a fix that says it is at rest is no move", withSpeed(offset(60, 34, 0), 0.2), Suppressed},
		{"a fix at rest within twice its accuracy is no move", withSpeed(withAccuracy(offset(60, 60, 0), 35), 0), Suppressed},
		{"a fix under way beyond its accuracy is a move", withSpeed(withAccuracy(offset(60, 60, 0), 35), 1.5), Accepted},
		{"an event at the stay is admitted", withEvent(offset(60, 1, 1), "alarm"), Accepted},
		{"a change of state at the stay is admitted", withState(offset(60, 1, 1), "ignition=false"), Accepted},
	} {
		t.Run(tt.name, func(t *testing.T) {
			eachTrackShape(t, func(t *testing.T, d *testDeduper) {
				park(t, d)
				if v := d.settled(t, tt.ping); v.Decision != tt.want {
					t.Fatalf("%+v, want %s", v, tt.want)
				}
			})
		})
	}
}

func withAccuracy(p ping.Ping, m float64) ping.Ping { p.Accuracy = m; return p }
func withSpeed(p ping.Ping, ms float64) ping.Ping   { p.Speed, p.HasSpeed = ms, true; return p }

// A multipath outlier costs one admission at most: the next fix back at
// the stay is jitter. A real departure is followed by fixes that stay away.
func TestASingleOutlierCostsOneAdmission(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d)
		if v := d.settled(t, offset(60, 30, 0)); v.Decision != Accepted {
			t.Fatalf("the outlier, 10 s after the last fix: %+v, want accepted (it could be a move)", v)
		}
		for i, back := range []ping.Ping{offset(70, -2, 1), offset(80, 1, -2), offset(90, 2, 2)} {
			if v := d.settled(t, back); v.Decision != Suppressed {
				t.Fatalf("fix %d back at the stay: %+v, want suppressed", i, v)
			}
		}
		// A real departure is then admitted as usual.
		if v := d.settled(t, offset(100, 45, 0)); v.Decision != Accepted {
			t.Fatalf("a real departure: %+v", v)
		}
		if v := d.settled(t, offset(110, 80, 0)); v.Decision != Accepted {
			t.Fatalf("the drive goes on: %+v", v)
		}
	})
}

// A stay learns how far its receiver throws outliers: once it has thrown
// one (a fix no vehicle could have reached, or an accepted fix outside the
// stay that the next proved an outlier), the next about as far out (up to
// 1.25 times as far) is jitter, where a stay that has thrown none admits
// one a vehicle setting off could have reached, as a possible departure. A
// departure beyond the widened radius is still admitted at once.
func TestAStayWidensToHoldTheOutliersItThrew(t *testing.T) {
	type step struct {
		ping ping.Ping
		want Decision
	}
	settledAgain := step{offset(42, 1, 1), Suppressed}
	unreachable := step{offset(41, -28, 0), Suppressed} // a second after the last fix there
	for _, tt := range []struct {
		name  string
		teach []step
		judge step // a second after the last fix at the stay
	}{
		{"a stay that threw none admits a fix 26.5 m out", []step{settledAgain}, step{offset(43, 26.5, 0), Accepted}},
		{"one that threw an outlier 28 m out holds it", []step{unreachable, settledAgain}, step{offset(43, 26.5, 0), Suppressed}},
		{"and one 29.5 m out", []step{unreachable, settledAgain}, step{offset(43, 29.5, 0), Suppressed}},
		{"one whose fix 30 m out proved an outlier holds it", []step{{offset(50, 30, 0), Accepted}, {offset(60, 1, 1), Suppressed}},
			step{offset(61, 26.5, 0), Suppressed}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			eachTrackShape(t, func(t *testing.T, d *testDeduper) {
				park(t, d)
				for _, s := range append(tt.teach, tt.judge) {
					if v := d.settled(t, s.ping); v.Decision != s.want {
						t.Fatalf("%v: %+v, want %s", s.ping.Time.Sub(articleBase), v, s.want)
					}
				}
				if v := d.settled(t, offset(70, 0, 45)); v.Decision != Accepted {
					t.Fatalf("a departure 45 m out: %+v, want accepted", v)
				}
			})
		})
	}
}

// An asset creeping away (a traffic jam, a car park, a walk) is never
// suppressed farther than the lag bound from its last accepted ping,
// however the stay's anchor follows it, and whatever slow speed its fixes
// report: a speed below restSpeed says a fix is no departure, not that
// the asset cannot have crept off.
func TestACreepingAssetIsNeverLostTrackOf(t *testing.T) {
	for _, tt := range []struct {
		name     string
		step     float64 // metres a second
		reported bool
	}{
		{"1 m/s, no speed reported", 1, false},
		{"0.8 m/s, reported", 0.8, true},
		{"0.3 m/s, reported", 0.3, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			eachTrackShape(t, func(t *testing.T, d *testDeduper) {
				park(t, d)
				last, accepted := offset(0, 0, 0), 0
				for i := 1; i <= 600; i++ {
					p := offset(60+float64(i), tt.step*float64(i), 0)
					if tt.reported {
						p = withSpeed(p, tt.step)
					}
					if d.settled(t, p).Decision == Accepted {
						last, accepted = p, accepted+1
						continue
					}
					if dist := math.Sqrt(fixOf(&Claim{Observation: Observation{Ping: p}}).distance2(last.Lat, last.Lon)); dist > LagFactor*DefaultRadius {
						t.Fatalf("fix %d suppressed %.1f m from the last accepted one", i, dist)
					}
				}
				if accepted == 0 {
					t.Fatalf("a creep of %.0f m admitted nothing", 600*tt.step)
				}
			})
		})
	}
}

// An accuracy no location provider reports (a sentinel such as 99999, or
// metres read in another unit) is no reading: a drive whose every fix
// reports one is admitted every lag bound, as one that reports none, where
// trusting it once let session suppress 54 km of driving and sliding lag
// 4 km. An honest cell fix's 1.4 km still covers what it says.
func TestAnAccuracyNoProviderReportsIsNoReading(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		d.settled(t, withAccuracy(offset(0, 0, 0), 99999))
		if v := d.settled(t, withAccuracy(offset(10, 1000, 0), 1414)); v.Decision != Suppressed {
			t.Fatalf("a cell fix 1 km out, accuracy 1414 m: %+v, want suppressed", v)
		}
		last := offset(0, 0, 0)
		for i := 1; i <= 60; i++ {
			p := withAccuracy(offset(10+10*float64(i), 150*float64(i), 0), 99999)
			if d.settled(t, p).Decision == Accepted {
				last = p
				continue
			}
			if dist := math.Sqrt(fixOf(&Claim{Observation: Observation{Ping: p}}).distance2(last.Lat, last.Lon)); dist > LagFactor*DefaultRadius {
				t.Fatalf("fix %d suppressed %.0f m from the last accepted one", i, dist)
			}
		}
	})
}

// A late ping from away, inside the time the stay says the asset was
// there, means it came back at some time the backend has not heard of:
// the earliest late ping back is admitted as the return, later ones are
// jitter, and so are those from before the excursion. (A live ping that
// overtook a shuffled backlog, then the backlog.)
func TestALateExcursionDoesNotHideTheReturn(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d)
		for _, s := range []struct {
			sec, dx float64
			want    Decision
		}{
			{1800, 1, Accepted},   // the newest first: a window on in sliding, an idle gap in session
			{1200, 500, Accepted}, // late, away
			{600, 1, Suppressed},  // late, at the stay before the excursion
			{1500, 0, Accepted},   // late, back: the return
			{1600, 1, Suppressed}, // late, back after the return
		} {
			if v := d.settled(t, offset(s.sec, s.dx, 0)); v.Decision != s.want {
				t.Fatalf("%v s, %v m east: %+v, want %s", s.sec, s.dx, v, s.want)
			}
		}
	})
}

// A late ping that tells the stay the asset was there earlier is accepted
// again when its request failed and its claim was released: its retry is
// no jitter of itself, not even after a late ping from away has filed the
// stay it began as one the asset left.
func TestARetriedLatePingIsAcceptedAfterItsRelease(t *testing.T) {
	for _, tt := range []struct {
		name    string
		between []ping.Ping // late pings judged between the release and the retry
	}{
		{"retried at once", nil},
		{"retried after a late ping from away", []ping.Ping{offset(600, 500, 0)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			eachTrackShape(t, func(t *testing.T, d *testDeduper) {
				park(t, d)
				d.settled(t, offset(1800, 1, 1)) // a window on in sliding, an idle gap in session
				late := offset(-30, 1, -1)       // before the stay's first fix
				c, v := d.claim(t, late)
				if v.Decision != Accepted {
					t.Fatalf("a late ping from before the stay: %+v, want accepted", v)
				}
				if n, err := d.Release(t.Context(), c); err != nil || n != 1 {
					t.Fatalf("release: %d %v", n, err)
				}
				for _, p := range tt.between {
					if v := d.settled(t, p); v.Decision != Accepted {
						t.Fatalf("late ping from away: %+v, want accepted", v)
					}
				}
				if v := d.settled(t, late); v.Decision != Accepted {
					t.Fatalf("its retry: %+v, want accepted", v)
				}
				if v := d.settled(t, offset(-10, 2, 0)); v.Decision != Suppressed {
					t.Fatalf("a late ping after it, at the same place: %+v, want suppressed", v)
				}
			})
		})
	}
}

// A failed request's claims on one asset are all given back, whatever
// order the batch listed them in: its retry is judged as the batch was,
// nothing in it a reobservation of itself.
func TestAFailedBatchIsJudgedAgainWhole(t *testing.T) {
	for _, tt := range []struct {
		name  string
		batch []ping.Ping
	}{
		{"in device-time order", []ping.Ping{offset(70, 60, 0), offset(80, 140, 0), offset(90, 220, 0)}},
		{"newest first", []ping.Ping{offset(90, 220, 0), offset(80, 140, 0), offset(70, 60, 0)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			eachTrackShape(t, func(t *testing.T, d *testDeduper) {
				park(t, d)
				obs := observeAll(d, tt.batch)
				for attempt := 1; attempt <= 2; attempt++ {
					claims, verdicts, err := d.ClaimAll(t.Context(), obs)
					if err != nil {
						t.Fatal(err)
					}
					for i, v := range verdicts {
						if v.Decision != Accepted {
							t.Fatalf("attempt %d, ping %d: %+v, want accepted", attempt, i, v)
						}
					}
					if n, err := d.Release(t.Context(), claims...); err != nil || n != len(claims) {
						t.Fatalf("release: %d of %d, %v", n, len(claims), err)
					}
				}
			})
		})
	}
}

// Two requests that fail and are released oldest first (the second's
// claim was the asset's last when the first's was released, so that
// undo found nothing of its own): the first one's retry is still accepted.
func TestReleasesOfTwoRequestsOldestFirstLoseNothing(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d)
		first, second := offset(70, 60, 0), offset(80, 140, 0)
		c1, v1 := d.claim(t, first)
		c2, v2 := d.claim(t, second)
		if v1.Decision != Accepted || v2.Decision != Accepted {
			t.Fatalf("the two departures: %+v, %+v", v1, v2)
		}
		for _, c := range []*Claim{c1, c2} {
			if _, err := d.Release(t.Context(), c); err != nil {
				t.Fatal(err)
			}
		}
		if v := d.settled(t, first); v.Decision != Accepted {
			t.Fatalf("the first one's retry: %+v, want accepted", v)
		}
		if v := d.settled(t, second); v.Decision != Accepted {
			t.Fatalf("the second one's retry: %+v, want accepted", v)
		}
	})
}

// A release puts the stay back as it was: the retry of a departure whose
// request failed is judged as the departure again.
func TestReleaseRestoresTheStay(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d)
		departure := offset(60, 60, 0)
		c, v := d.claim(t, departure)
		if v.Decision != Accepted {
			t.Fatalf("departure: %+v", v)
		}
		if n, err := d.Release(t.Context(), c); err != nil || n != 1 {
			t.Fatalf("release: %d %v", n, err)
		}
		if v := d.settled(t, offset(65, 1, 1)); v.Decision != Suppressed {
			t.Fatalf("jitter at the stay after the release: %+v, want suppressed", v)
		}
		if v := d.settled(t, departure); v.Decision != Accepted {
			t.Fatalf("the retried departure: %+v, want accepted", v)
		}
	})
}

// An event, or a state change, at the very fix of another ping is no
// redelivery of it (in tumbling both are in the key): only its own exact
// redeliveries are.
func TestAnEventOrAStateChangeIsSuppressedOnlyAsItsOwnRedelivery(t *testing.T) {
	plain := offset(60, 1, 1)
	for _, tt := range []struct {
		name          string
		before, after ping.Ping
	}{
		{"an alarm at a plain ping's fix", plain, withEvent(plain, "alarm")},
		{"the ignition on at its off's fix", withState(plain, "ignition=false"), withState(plain, "ignition=true")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			eachTrackShape(t, func(t *testing.T, d *testDeduper) {
				park(t, d)
				d.settled(t, tt.before)
				if v := d.settled(t, tt.after); v.Decision != Accepted {
					t.Fatalf("%+v, want accepted", v)
				}
				if v := d.settled(t, tt.after); v != suppressed(Redelivery) {
					t.Fatalf("its redelivery: %+v, want suppressed/redelivery", v)
				}
			})
		})
	}
}

// A tracker that reports its ignition only in some messages (status
// reports) says nothing of it in the others: they keep the state, and a
// parked asset stays parked.
func TestAFixWithoutTheStateFieldsKeepsTheState(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d)
		if v := d.settled(t, withState(offset(60, 1, 1), "ignition=false")); v.Decision != Accepted {
			t.Fatalf("the ignition reported off: %+v, want accepted", v)
		}
		for i, p := range []ping.Ping{
			offset(70, 2, 0),
			withState(offset(80, -1, 2), "ignition=false"),
			offset(90, 0, -2),
		} {
			if v := d.settled(t, p); v.Decision != Suppressed {
				t.Fatalf("parked fix %d, ignition unchanged or not reported: %+v, want suppressed", i, v)
			}
		}
		if v := d.settled(t, withState(offset(100, 1, 0), "ignition=true")); v.Decision != Accepted {
			t.Fatalf("the ignition back on: %+v, want accepted", v)
		}
	})
}

// In session, a late ping is judged by where the asset was at its device
// time, not by the session it fell in: at the stay, it is suppressed even
// after a new session opened.
func TestALatePingAtTheStayIsSuppressedAfterANewSession(t *testing.T) {
	eachStore(t, func(t *testing.T, s Store) {
		d := newTestDeduper(s, Session)
		for i, min := range []float64{0, 1, 2, 3, 4, 25} {
			want := Suppressed
			if i == 0 || min == 25 {
				want = Accepted // the first of each session
			}
			if v := d.settled(t, offset(60*min, float64(i%3), 0)); v.Decision != want {
				t.Fatalf("ping at minute %v: %+v, want %s", min, v, want)
			}
		}
		if v := d.settled(t, offset(60*10, 1, 1)); v.Decision != Suppressed {
			t.Fatalf("a late ping at the stay from the session before: %+v, want suppressed", v)
		}
	})
}

// OwnTracks Android and Traccar Client send a speed of 0 when the fix has
// none, and a phone in a moving car on Wi-Fi or cell location reports an
// accuracy of hundreds of metres: counted twice as a fix at rest, it hid
// kilometres of travel. The margin a still fix adds is capped.
func TestANetworkFixWithoutASpeedHidesNoTravel(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d)
		last := offset(0, 0, 0)
		for i := 1; i <= 10; i++ { // 12 m/s, one fix every 30 s
			p := withSpeed(withAccuracy(offset(40+30*float64(i), 360*float64(i), 0), 1000), 0)
			if d.settled(t, p).Decision == Accepted {
				last = p
				continue
			}
			dist := math.Sqrt(fixOf(&Claim{Observation: Observation{Ping: p}}).distance2(last.Lat, last.Lon))
			if dist > 1000 {
				t.Fatalf("fix %d (%.0f s after leaving) suppressed %.0f m from the last accepted one", i, 30*float64(i), dist)
			}
		}
	})
}

// H8-2: a creeping bus reported by OwnTracks Android: 0.9 m/s truncated to
// vel 3 km/h (0.83 m/s, "at rest"), accuracy 35 m. The restSpeed promise:
// an asset creeping is reported every max(LagFactor radii, accuracy).
// OwnTracks Android truncates its speed to whole km/h: an asset creeping at
// 0.9 m/s reports 3 km/h, under the speed of rest. It gets no margin: it
// lags no more than its own accuracy or the lag bound.
func TestACreepAtATruncatedSpeedLagsNoMoreThanItsAccuracy(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d)
		last := offset(0, 0, 0)
		for i := 1; i <= 60; i++ {
			p := withSpeed(withAccuracy(offset(40+10*float64(i), 9*float64(i), 0), 35), 3/3.6)
			if d.settled(t, p).Decision == Accepted {
				last = p
				continue
			}
			dist := math.Sqrt(fixOf(&Claim{Observation: Observation{Ping: p}}).distance2(last.Lat, last.Lon))
			if dist > max(LagFactor*DefaultRadius, 35) {
				t.Fatalf("fix %d suppressed %.0f m from the last accepted one", i, dist)
			}
		}
	})
}

// H8-3: two state fields, one missing from a message, says nothing of it.
// (Traccar: ignition in every message, driverUniqueId only on an RFID
// swipe; OsmAnd port: whatever fields the sender put in the query.)

// With two state fields (Traccar's ignition and driver), a message that
// carries only one of them says nothing of the other: the state is
// compared field by field, and each change of either is admitted.
func TestAStateFieldAMessageLacksKeepsItsValue(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d)
		if v := d.settled(t, withState(offset(60, 1, 1), "ignition=true&driverUniqueId=D1")); v.Decision != Accepted {
			t.Fatalf("first state: %+v", v)
		}
		for i, p := range []struct {
			sec   float64
			state string
		}{{70, "ignition=true"}, {80, "driverUniqueId=D1"}, {90, ""}, {100, "ignition=true"}} {
			if v := d.settled(t, withState(offset(p.sec, 0, 1), p.state)); v.Decision != Suppressed {
				t.Fatalf("message %d (%q), nothing changed: %+v, want suppressed", i, p.state, v)
			}
		}
		if v := d.settled(t, withState(offset(110, 1, 0), "ignition=false")); v.Decision != Accepted {
			t.Fatalf("ignition off: %+v, want accepted", v)
		}
		if v := d.settled(t, withState(offset(120, 1, 0), "driverUniqueId=D2")); v.Decision != Accepted {
			t.Fatalf("driver change: %+v, want accepted", v)
		}
	})
}

// Each state field a policy lists has slots of the print of its own, so
// that each is compared on its own: the presets' (osmand's three, one of
// them carried by every request), and any the operator lists, up to four.
func TestTheStateFieldsAreComparedApart(t *testing.T) {
	for _, list := range [][]string{
		{"ignition", "driverUniqueId", "alarm"},
		{"position.attributes.ignition", "position.attributes.driverUniqueId"},
		{"location.is_moving", "location.alarm", "location.extras.alarm"},
		{"a", "b", "c", "d"},
		{"ignition", "driverUniqueId", "door", "fuel", "alarm", "sos"},
		{"ignition"},
	} {
		fields := strings.Join(list, "&")
		for i, one := range list {
			a := statePrint(one+"=true", fields)
			for _, other := range list[i+1:] {
				if b := statePrint(other+"=D1", fields); a&b != 0 || a == 0 || b == 0 {
					t.Errorf("%s and %s share slots of the state print (%016x, %016x): a message carrying one would change the other", one, other, a, b)
				}
			}
			if statePrint(one+"=true", fields) == statePrint(one+"=false", fields) {
				t.Errorf("%s=true and %s=false print alike", one, one)
			}
		}
	}
}

// A state change whose request failed is released; a later message of
// another request, accepted meanwhile, carried only the other state field.
// The release cannot undo the track (the released ping is no longer the
// last accepted one), and the merge kept the released ping's ignition half
// in the state: its retry must still be accepted, or the backend never
// hears that the ignition turned on.
func TestAReleasedStateChangeIsAcceptedAgainAfterAnotherFieldsChange(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d)
		on := withState(offset(60, 1, 1), "ignition=true")
		c, v := d.claim(t, on)
		if v.Decision != Accepted {
			t.Fatalf("ignition on: %+v, want accepted", v)
		}
		if v := d.settled(t, withState(offset(70, 0, 1), "driverUniqueId=D2")); v.Decision != Accepted {
			t.Fatalf("driver change: %+v, want accepted", v)
		}
		if n, err := d.Release(t.Context(), c); err != nil || n != 1 {
			t.Fatalf("release of the ignition on: %d %v", n, err)
		}
		if v := d.settled(t, on); v.Decision != Accepted {
			t.Fatalf("the retry of the released ignition on: %+v, want accepted (the backend never heard of it)", v)
		}
	})
}

// X reports the ignition on, Y (another request) only the driver; both
// fail and are released, oldest first, and Z is accepted. Releasing X
// cleared the ignition from the track but not from Y's undo record, which
// releasing Y put back: X's retry was suppressed as jitter.
func TestAReleasedStateChangeStaysForgottenWhenALaterPingIsUndone(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d)
		on := withState(offset(60, 1, 1), "ignition=true")
		x, v := d.claim(t, on)
		if v.Decision != Accepted {
			t.Fatalf("ignition on: %+v", v)
		}
		y, v := d.claim(t, withState(offset(70, 0, 1), "driverUniqueId=D2"))
		if v.Decision != Accepted {
			t.Fatalf("driver D2: %+v", v)
		}
		for _, c := range []*Claim{x, y} {
			if n, err := d.Release(t.Context(), c); err != nil || n != 1 {
				t.Fatalf("release: %d %v", n, err)
			}
		}
		if v := d.settled(t, withState(offset(80, -1, 0), "driverUniqueId=D3")); v.Decision != Accepted {
			t.Fatalf("driver D3: %+v", v)
		}
		if v := d.settled(t, on); v.Decision != Accepted {
			t.Fatalf("the retry of the released ignition on: %+v, want accepted (the backend never heard of it)", v)
		}
	})
}

// A release of a claim the store no longer holds (go-redis sending it again
// after losing the reply, once the retry was accepted) forgets nothing:
// the retry reported the same state, and the backend heard it.
func TestAReleaseThatHoldsNothingForgetsNoState(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d)
		on := withState(offset(60, 1, 1), "ignition=true")
		x, _ := d.claim(t, on)
		if n, _ := d.Release(t.Context(), x); n != 1 {
			t.Fatal("the release did not hold its claim")
		}
		if v := d.settled(t, on); v.Decision != Accepted {
			t.Fatalf("the retry: %+v", v)
		}
		if n, _ := d.Release(t.Context(), x); n != 0 {
			t.Fatal("the repeated release held a claim")
		}
		if v := d.settled(t, withState(offset(80, -1, 1), "ignition=true")); v.Decision != Suppressed {
			t.Fatalf("the ignition still on, at the stay: %+v, want suppressed (the backend heard it from the retry)", v)
		}
	})
}

// A phone parked indoors (accuracy 45 m, standing still): its last
// accepted fix was as noisy as the next, so two of its fixes may lie as
// far apart as both uncertainties together. A fix 110 m from the last
// accepted one, within the stay, is jitter; the same fix creeping at
// 0.8 m/s, or a network fix (accuracy 300 m) standing "still", keeps the
// bound of its own uncertainty.
func TestTwoNoisyFixesOfAParkedPhoneMayLieAsFarApartAsBothUncertainties(t *testing.T) {
	indoors := func(sec, dx float64, speed, acc float64) ping.Ping {
		return withSpeed(withAccuracy(offset(sec, dx, 0), acc), speed)
	}
	for _, tc := range []struct {
		name         string
		speed, acc   float64
		wantDecision Decision
	}{
		{"standing still", 0, 45, Suppressed},
		{"creeping", 0.8, 45, Accepted},
		{"a network fix", 0, 300, Suppressed}, // within its own 350 m
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachTrackShape(t, func(t *testing.T, d *testDeduper) {
				d.settled(t, indoors(0, 0, 0, 45))
				for i, dx := range []float64{20, -30, 10, -20, 40, -60} {
					if v := d.settled(t, indoors(float64(10*(i+1)), dx, 0, 45)); v.Decision != Suppressed {
						t.Fatalf("jitter %v m at the stay: %+v", dx, v)
					}
				}
				if v := d.settled(t, indoors(70, 110, tc.speed, tc.acc)); v.Decision != tc.wantDecision {
					t.Fatalf("a fix 110 m from the last accepted one: %+v, want %s", v, tc.wantDecision)
				}
			})
		})
	}
	t.Run("a network fix beyond its own uncertainty", func(t *testing.T) {
		eachTrackShape(t, func(t *testing.T, d *testDeduper) {
			d.settled(t, indoors(0, 0, 0, 300))
			for i := range 4 {
				d.settled(t, indoors(float64(10*(i+1)), 10, 0, 300))
			}
			if v := d.settled(t, indoors(60, 380, 0, 300)); v.Decision != Accepted {
				t.Fatalf("a network fix 380 m away, accuracy 300 m: %+v, want accepted", v)
			}
		})
	})
}

// The last accepted fix was a poor one (a phone indoors, or a network fix
// of 100 m, speed 0), then the phone walks away with good fixes (10 m)
// that carry no speed reading (OwnTracks Android and Traccar Client send
// 0). A still fix is judged against two fixes as good as itself, not
// against the poor one: it may lie √2 times its own uncertainty away, not
// its own and 50 m (70 m where the bound is 37.5 m).
func TestAGoodFixAfterAPoorOneLagsNoMoreThanTwoFixesLikeIt(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		poor := withSpeed(withAccuracy(offset(0, 0, 0), 100), 0)
		d.settled(t, poor)
		for i := 1; i <= 4; i++ {
			d.settled(t, withSpeed(withAccuracy(offset(float64(10*i), 0, 0), 100), 0))
		}
		last, worst, worstBound := poor, 0.0, 0.0
		defer func() {
			if worst > worstBound+0.01 {
				t.Errorf("walking fixes (accuracy 10 m, speed 0) suppressed up to %.1f m from the last accepted one; want at most %.1f", worst, worstBound)
			}
		}()
		for i := 1; i <= 30; i++ { // 1.4 m/s, a fix every 10 s
			p := withSpeed(withAccuracy(offset(40+10*float64(i), 14*float64(i), 0), 10), 0)
			if d.settled(t, p).Decision == Accepted {
				last = p
				continue
			}
			f := fixOf(&Claim{Observation: Observation{Ping: p}})
			bound := max(LagFactor*DefaultRadius, math.Sqrt2*f.accuracy)
			worst, worstBound = max(worst, math.Sqrt(f.distance2(last.Lat, last.Lon))), bound
		}
	})
}

// A released acceptance puts back the last accepted fix's uncertainty with
// the rest of the track: after the poor fix (100 m) is released, a good
// still fix 60 m from the good last accepted one is admitted.
func TestAReleasePutsBackTheLastAccuracy(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		good := func(sec, dx float64) ping.Ping { return withSpeed(withAccuracy(offset(sec, dx, 0), 10), 0) }
		d.settled(t, good(0, 0))
		for i := 1; i <= 4; i++ {
			d.settled(t, good(float64(10*i), 0))
		}
		// A poor fix 200 m away: accepted (a candidate), then released.
		c, v := d.claim(t, withSpeed(withAccuracy(offset(50, 200, 0), 100), 0))
		if v.Decision != Accepted {
			t.Fatalf("poor fix: %+v", v)
		}
		if n, err := d.Release(t.Context(), c); err != nil || n != 1 {
			t.Fatalf("release: %d %v", n, err)
		}
		if v := d.settled(t, good(60, 60)); v.Decision != Accepted {
			t.Fatalf("a good still fix 60 m from the last accepted good one after the release: %+v, want accepted", v)
		}
	})
}

// Traccar Client reports every 30 s; its phone, parked, loses the network
// at 25 min and queues what it records. At 41 min 40 s, 6 km on, the
// network is back and a requested position (send now, SOS, a push
// request) skips the queue; then the queue flushes, oldest first. Its
// parked part lies at the stay the backend has known since 0, at times
// the stay covers: it is jitter there. The first queued ping was judged
// against the live ping's place, 6 km off, not against the stay's last
// accepted ping: taken for a ping from away, it ended the stay at its
// time, and each next queued ping, just past that end, ended it again:
// all ten were admitted, one by one. The queued drive must still be
// admitted, from the departure on: it fills the backend's gap.
func TestABacklogOvertakenByALivePingIsJitterAtItsStay(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		var live, parked, drive []ping.Ping
		for s := 0; s < 1800; s += 30 {
			p := withSpeed(offset(float64(s), float64(s/30%5)-2, float64(s/30%3)-1), 0)
			if s < 1500 {
				live = append(live, p)
			} else {
				parked = append(parked, p)
			}
		}
		for s := 1800; s < 2500; s += 30 {
			drive = append(drive, withSpeed(offset(float64(s), 8+10*float64(s-1800), 0), 10))
		}
		for _, p := range live {
			d.settled(t, p)
		}
		if v := d.settled(t, withSpeed(offset(2500, 7008, 0), 10)); v.Decision != Accepted {
			t.Fatalf("the requested position: %+v", v)
		}
		for _, p := range append(parked, drive...) {
			v := d.settled(t, p)
			want := Accepted
			if !p.HasSpeed || p.Speed == 0 {
				want = Suppressed
			}
			if v.Decision != want {
				t.Errorf("queued ping at %v: %+v, want %s", p.Time.Sub(articleBase), v, want)
			}
		}
	})
}

// The same queue from a phone parked indoors: Traccar Client reports an
// accuracy of 30 m and a speed of 0, and a queued fix lies 70 m from the
// stay's last accepted one, inside the stay. Two fixes that uncertain may
// lie as far apart as both uncertainties together (85 m here): sent
// before the requested position, it is jitter. Sent after it, it was
// judged with the requested position's accuracy (5 m, a satellite fix
// under way) in place of the stay's fix's, a bound of 60 m: admitted, it
// ended the stay at its time, and the next queued fix was admitted as the
// asset's return. The late fix is judged against the stay's last
// accepted fix, its place and its accuracy.
func TestALateStillFixIsJudgedWithTheAccuracyOfTheStaysLastFix(t *testing.T) {
	indoors := func(sec, dx float64) ping.Ping { return withSpeed(withAccuracy(offset(sec, dx, 0), 30), 0) }
	queue := []ping.Ping{indoors(210, 5), indoors(240, 50), indoors(270, 6)}
	requested := withAccuracy(withSpeed(offset(290, 150, 0), 10), 5)
	for _, order := range []struct {
		name  string
		pings []ping.Ping
	}{
		{"the queue first", append(slices.Clone(queue), requested)},
		{"the requested position first", append([]ping.Ping{requested}, queue...)},
	} {
		t.Run(order.name, func(t *testing.T) {
			eachTrackShape(t, func(t *testing.T, d *testDeduper) {
				d.settled(t, indoors(0, -20))
				for s := 30; s <= 180; s += 30 {
					if v := d.settled(t, indoors(float64(s), float64(s/30%5)+3)); v.Decision != Suppressed {
						t.Fatalf("jitter at %d s: %+v", s, v)
					}
				}
				for _, p := range order.pings {
					v := d.settled(t, p)
					if p.Speed == 0 && v.Decision != Suppressed {
						t.Errorf("queued fix at %v: %+v, want suppressed (jitter at the stay)", p.Time.Sub(articleBase), v)
					}
				}
			})
		})
	}
}

// The indoor phone of TestALateStillFixIsJudgedWithTheAccuracyOfTheStaysLastFix,
// its requested position first, and then its next live position, farther
// on, which the backend answers 503: the release puts back the track from
// before it, and with it the accuracy of the stay's last fix, which Redis
// keeps beside the undo record while it differs from the requested
// position's. Put back as the requested position's (5 m), the queued fix
// 70 m from the stay's fix would be admitted, and the next as the return.
func TestAReleaseKeepsTheAccuracyOfTheStaysLastFix(t *testing.T) {
	indoors := func(sec, dx float64) ping.Ping { return withSpeed(withAccuracy(offset(sec, dx, 0), 30), 0) }
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		d.settled(t, indoors(0, -20))
		for s := 30; s <= 180; s += 30 {
			if v := d.settled(t, indoors(float64(s), float64(s/30%5)+3)); v.Decision != Suppressed {
				t.Fatalf("jitter at %d s: %+v", s, v)
			}
		}
		if v := d.settled(t, withAccuracy(withSpeed(offset(290, 150, 0), 10), 5)); v.Decision != Accepted {
			t.Fatalf("the requested position: %+v", v)
		}
		c, v := d.claim(t, withAccuracy(withSpeed(offset(300, 250, 0), 10), 5))
		if v.Decision != Accepted {
			t.Fatalf("the next live position: %+v", v)
		}
		if n, err := d.Release(t.Context(), c); err != nil || n != 1 {
			t.Fatalf("release: %d %v", n, err)
		}
		for _, p := range []ping.Ping{indoors(210, 5), indoors(240, 50), indoors(270, 6)} {
			if v := d.settled(t, p); v.Decision != Suppressed {
				t.Errorf("queued fix at %v: %+v, want suppressed (jitter at the stay)", p.Time.Sub(articleBase), v)
			}
		}
	})
}

// The queue of TestABacklogOvertakenByALivePingIsJitterAtItsStay, after
// a stay the asset left earlier: parked at A, a drive to B, parked at B,
// then offline, the drive on queued and a requested position far off
// sent first. The queue's drive, late and reporting travel, ends the stay
// at B once, at its first ping: the stay the asset keeps meanwhile starts
// at the requested position, after the whole queue. Had each ping of the
// drive ended it again, its copies would have pushed A out of the three
// stays remembered, and a position from A that Traccar's forwarder
// retries after newer ones (forward.retry.enable) would be admitted,
// not jitter there.
func TestAQueuedDriveEndsTheStayOnce(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d) // A, 0 to 40 s
		for s := 60.0; s <= 300; s += 30 {
			d.settled(t, offset(s, float64(int(s)%3)-1, 1))
		}
		for s := 310.0; s <= 400; s += 10 { // to B, 900 m east
			d.settled(t, withSpeed(offset(s, 10*(s-310), 0), 10))
		}
		for s := 410.0; s < 1500; s += 30 {
			d.settled(t, withSpeed(offset(s, 900+float64(int(s)%5)-2, float64(int(s)%3)-1), 0))
		}
		if v := d.settled(t, withSpeed(offset(2500, 7900, 0), 10)); v.Decision != Accepted {
			t.Fatalf("the requested position: %+v", v)
		}
		for s := 1500.0; s < 1800; s += 30 {
			d.settled(t, withSpeed(offset(s, 900+float64(int(s)%5)-2, 0), 0))
		}
		for s := 1800.0; s < 2500; s += 30 {
			if v := d.settled(t, withSpeed(offset(s, 908+10*(s-1800), 0), 10)); v.Decision != Accepted {
				t.Fatalf("queued drive at %v s: %+v, want accepted", s, v)
			}
		}
		if v := d.settled(t, offset(200, 2, -1)); v.Decision != Suppressed {
			t.Fatalf("a position from A, retried late: %+v, want suppressed (jitter at a stay the asset left)", v)
		}
	})
}

// The edge rule goes by device time alone: a late ping at the very time a
// stay the asset left ended is taken for the departure's released retry.
// From one sender that is all it can be. With two sources on one asset,
// a fix the second stamped in the departure's second, at the stay,
// delivered after the track moved on, is admitted: one extra admission per
// departure, no more than a fix of it one second later costs (past the
// stay's end), while its fixes inside the stay's time are suppressed.
func TestASecondSourcesFixInTheDeparturesSecondCostsOneAdmission(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d)
		if v := d.settled(t, withSpeed(offset(60, 5, 0), 4)); v.Decision != Accepted {
			t.Fatalf("the departure, by speed: %+v", v)
		}
		for s := 90.0; s <= 180; s += 30 {
			d.settled(t, withSpeed(offset(s, 5+4*(s-60), 0), 4))
		}
		for _, tc := range []struct {
			p    ping.Ping
			want Decision
		}{
			{offset(30, 2, 1), Suppressed},  // inside the stay's time
			{offset(59, -1, 2), Suppressed}, // its last second
			{offset(60, 1, -2), Accepted},   // the departure's second: the edge
			{offset(61, 2, 2), Accepted},    // past the stay's end
		} {
			if v := d.settled(t, tc.p); v.Decision != tc.want {
				t.Errorf("the second source's fix at %v, delivered late: %+v, want %s", tc.p.Time.Sub(articleBase), v, tc.want)
			}
		}
	})
}

// TestALateExcursionDoesNotHideTheReturn with the newest ping far off, a
// departure not yet settled: a late ping judged against the stay's last
// accepted fix (not the departure, kilometres off) is at the stay by
// place. After a late ping from away had ended the stay at its time, the
// stay started again at its latest fix, earlier than that away ping, so
// the late ping back, later than both, was taken for jitter: the backend
// heard the asset leave and never come back before the departure. The
// earliest late ping back after the excursion is the return.
func TestALateExcursionBeforeADepartureDoesNotHideTheReturn(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d)
		for _, s := range []struct {
			p    ping.Ping
			want Decision
		}{
			{withSpeed(offset(1800, 6000, 0), 10), Accepted}, // the newest first, 6 km on
			{offset(600, 1, 0), Suppressed},                  // late, at the stay before the excursion
			{offset(1200, 500, 0), Accepted},                 // late, away
			{offset(1500, 0, 0), Accepted},                   // late, back: the return
			{offset(1600, 1, 0), Suppressed},                 // late, back after the return
		} {
			if v := d.settled(t, s.p); v.Decision != s.want {
				t.Fatalf("%v, %v: %+v, want %s", s.p.Time.Sub(articleBase), s.p.Lon, v, s.want)
			}
		}
	})
}

// A parked receiver throws one outlier 30 m out, inside the lag bound, and
// its fixes come back: in session, however long it stays parked and
// reporting, that costs one admission (DESIGN.md: a single outlier costs
// at most one admission; pings in the same place are suppressed however
// long the burst). The stay learnt the outlier, so the backend, told of it,
// is not told again where the asset is (sliding's next window does).
func TestASingleOutlierCostsSessionOneAdmissionHoweverLongItStays(t *testing.T) {
	eachStore(t, func(t *testing.T, s Store) {
		d := newTestDeduper(s, Session)
		park(t, d)
		var admitted []float64
		if v := d.settled(t, offset(60, 30, 0)); v.Decision == Accepted {
			admitted = append(admitted, 60)
		}
		for sec := 70.0; sec <= 2*3600; sec += 10 {
			if v := d.settled(t, offset(sec, 2*math.Sin(sec/37), 2*math.Cos(sec/53))); v.Decision == Accepted {
				admitted = append(admitted, sec)
			}
		}
		if len(admitted) != 1 {
			t.Errorf("one outlier in one session cost %d admissions (at %v s), want one", len(admitted), admitted)
		}
	})
}

// A car stops 30 m past its last accepted fix, inside the lag bound, and
// its parked fixes are jitter of the stay that fix began. session never
// told the backend where it parked while the sender kept reporting: the
// car stayed 30 m short of the customer's yard until it left. It is told
// within a window of the stop, once.
func TestTheBackendIsToldWhereAnAssetParkedPastItsLastAcceptedFix(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		sec, x := 0.0, -300.0
		var lastAccepted float64
		for ; ; sec, x = sec+1, x+10 { // 10 m/s, a fix a second
			if v := d.settled(t, offset(sec, x, 0)); v.Decision == Accepted {
				lastAccepted = x
				if x >= 0 {
					break
				}
			}
		}
		spot := lastAccepted + 30
		for x < spot { // braking to the spot
			sec, x = sec+1, min(x+10, spot)
			if v := d.settled(t, offset(sec, x, 0)); v.Decision == Accepted {
				lastAccepted = x
			}
		}
		stopped, told := sec, 0.0
		for sec = stopped + 10; sec <= stopped+3600; sec += 10 { // parked an hour, 2 m of jitter
			if v := d.settled(t, offset(sec, spot+2*math.Sin(sec/37), 2*math.Cos(sec/53))); v.Decision == Accepted {
				if told != 0 && d.Policy.Shape == Session {
					t.Errorf("parked fixes admitted at %.0f s and %.0f s after the stop; session needs one", told-stopped, sec-stopped)
				}
				if told == 0 {
					told = sec
				}
			}
		}
		switch {
		case told == 0:
			t.Errorf("parked an hour %.0f m past the last accepted fix; the backend never heard where", spot-lastAccepted)
		case told-stopped > DefaultWindow.Seconds():
			t.Errorf("the parked position reached the backend %.0f s after the car stopped, want within a window", told-stopped)
		}
	})
}

// A static receiver's multipath is correlated: a reflection off a wall or
// a lorry parked alongside holds a fix 30 m or so off for tens of seconds
// to minutes, as satellite geometry changes slowly. At a 1 s cadence no
// parked car jumps 30 m between two fixes that both say it is at rest: the
// first fix of the burst is an outlier at rest, learnt, and the rest of the
// burst is held by what the stay learnt. The stay must not move there
// and tell the backend the asset stands where the reflection put it, then
// admit the fix back at the spot it never left. Over 20 runs of each (σ 2
// m), sliding never admits the burst past its first 2 s, and session does
// in 2 to 8 runs (a burst fix beyond the widened radius); a rule that
// moved the stay after 30 s beyond its own radius (tried in stop 55, to
// tell the backend of a car moved 28 m across a yard, and withdrawn) did
// in 19 or 20.
func TestAMultipathBurstAtOneSecondIsNotWhereTheAssetStands(t *testing.T) {
	const runs = 20
	for _, tc := range []struct {
		name        string
		burst, away float64 // seconds, metres east
		speed       bool    // the fixes report a speed (at rest)
	}{
		{"45 s at 32 m, at rest reported", 45, 32, true},
		{"60 s at 30 m, at rest reported", 60, 30, true},
		{"90 s at 32 m, no speed", 90, 32, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachTrackShape(t, func(t *testing.T, d *testDeduper) {
				told := 0 // runs in which the backend was told the burst's place
				for run := range uint64(runs) {
					r := rand.New(rand.NewPCG(run+1, 2))
					admitted := false
					for sec := 0.0; sec < 720; sec++ {
						x, y := r.NormFloat64()*2, r.NormFloat64()*2
						inBurst := sec >= 600 && sec < 600+tc.burst
						if inBurst {
							x += tc.away
						}
						p := offset(sec, x, y)
						p.Asset = fmt.Sprintf("veh-%d", run)
						if tc.speed {
							p = withSpeed(p, math.Abs(r.NormFloat64()*0.2))
						}
						d.clock = p.Time
						if v := d.settled(t, p); v.Decision == Accepted && inBurst && sec > 602 {
							admitted = true
						}
					}
					if admitted {
						told++
					}
				}
				t.Logf("%d of %d runs told the backend of the burst", told, runs)
				if told > runs/2 {
					t.Errorf("in %d of %d runs a fix of the multipath burst past its first 2 s was admitted: the backend is told the parked car stands where the reflection put it", told, runs)
				}
			})
		})
	}
}

// A tracker at a 1 min cadence reports a multipath outlier now and then,
// and now and then two in a row, on either side of the spot. Each lies
// beyond the stay's own radius (25 m) and within what it learnt from an
// outlier before (31 m, widened to 37.5 m): all four fixes are
// suppressed in both shapes. The rule tried in stop 55 (above) counted the
// two as the asset standing off: the second, 120 s after the last fix at
// the stay, moved the stay to it and was admitted, though the two lie 60 m
// apart and the asset stands at neither, and the fix back was admitted
// too.
func TestTwoOutliersOnEitherSideAreNoPlaceTheAssetStands(t *testing.T) {
	for _, tc := range []struct {
		name  string
		speed bool
	}{
		// Without a speed the first outlier, reachable in a minute, is
		// admitted as a possible departure, before and since.
		{"speed reported (at rest)", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachTrackShape(t, func(t *testing.T, d *testDeduper) {
				r := rand.New(rand.NewPCG(3, 60))
				fix := func(sec, x, y, sigma float64) ping.Ping {
					p := offset(sec, x+r.NormFloat64()*sigma, y+r.NormFloat64()*sigma)
					if tc.speed {
						p = withSpeed(p, 0)
					}
					d.clock = p.Time
					return p
				}
				sec := 0.0
				for ; sec < 1800; sec += 60 {
					d.settled(t, fix(sec, 0, 0, 3))
				}
				d.settled(t, fix(sec, 0, 31, 0)) // an outlier the stay learns
				for end := sec + 1260; sec < end; {
					sec += 60
					d.settled(t, fix(sec, 0, 0, 3))
				}
				for i, o := range [][2]float64{{30, 0}, {-30, 0}, {0, 0}, {0, 0}} {
					sec += 60
					sigma := 3.0
					if o[0] != 0 {
						sigma = 1
					}
					if v := d.settled(t, fix(sec, o[0], o[1], sigma)); v.Decision == Accepted {
						t.Errorf("fix %d of the pair and after (%v m off the spot) admitted; the asset never left", i, o)
					}
				}
			})
		})
	}
}

// withStates is p carrying state, read by a parser whose state fields are
// fields (paths joined by &), as ping/fields.go sets them.
func withStates(p ping.Ping, state, fields string) ping.Ping {
	p.State, p.StateFields = state, fields
	return p
}

// With five state fields a change of the first is seen beside the fifth,
// carried unchanged. When the fifth shared the first's slot, its hash was
// written over the first's, so an operator's `state ignition
// driverUniqueId door fuel alarm` (the alarm carried by every message)
// had a parked van's ignition going off suppressed, and the backend
// showed it running. (Helper 5's review, stop 63.)
func TestAFifthStateFieldDoesNotHideTheFirstsChange(t *testing.T) {
	const fields = "ignition&driverUniqueId&door&fuel&alarm"
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d)
		if v := d.settled(t, withStates(offset(60, 1, 1), "ignition=true&alarm=", fields)); v.Decision != Accepted {
			t.Fatalf("first state: %+v", v)
		}
		if v := d.settled(t, withStates(offset(70, 0, 1), "ignition=true&alarm=", fields)); v.Decision != Suppressed {
			t.Fatalf("nothing changed: %+v, want suppressed", v)
		}
		if v := d.settled(t, withStates(offset(80, 1, 0), "ignition=false&alarm=", fields)); v.Decision != Accepted {
			t.Errorf("ignition off (the first of five state fields, the fifth carried unchanged): %+v, want accepted", v)
		}
	})
}

// A field of two bytes takes every value whose bytes are not 0 (a field
// not carried), 65,025: the README's one change missed in about 65,000.
// The low bit of every 16-bit slot was set, which halved them. (Helper 5's
// review, stop 63.)
func TestASixteenBitSlotTakesSixteenBitsOfValues(t *testing.T) {
	const fields = "ignition&driverUniqueId&alarm"
	seen := map[uint64]bool{}
	for i := range 1 << 18 {
		seen[statePrint(fmt.Sprintf("driverUniqueId=D%d", i), fields)] = true
	}
	// 2^18 draws of 65,025 values hit about 63,900 of them; a slot of
	// 15 bits' worth holds 32,768 at most.
	if len(seen) < 60000 {
		t.Errorf("2^18 drivers print as %d values of the driver's two bytes; want about 63,900 (of 65,025)", len(seen))
	}
}

// With five state fields each has a slot of its own: a message that
// carries the fifth alone (the alarm, in every message) says nothing of
// the first (the ignition, in some). Hashed together in one slot, the two
// read as a change whenever the ignition came or went, and a parked
// tracker's status messages were each admitted. (Helper 7's review, stop
// 63.)
func TestAFifthStateFieldCarriedAloneIsNoChangeOfTheFirst(t *testing.T) {
	const fields = "ignition&driverUniqueId&door&fuel&alarm"
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d)
		if v := d.settled(t, withStates(offset(60, 1, 1), "ignition=false&alarm=", fields)); v.Decision != Accepted {
			t.Fatalf("first state: %+v", v)
		}
		for i, state := range []string{"alarm=", "ignition=false&alarm=", "alarm=", "ignition=false&alarm="} {
			if v := d.settled(t, withStates(offset(float64(70+10*i), float64(i%2), 1), state, fields)); v.Decision != Suppressed {
				t.Errorf("message %d (%s), nothing changed: %+v, want suppressed", i, state, v)
			}
		}
	})
}

// An outlier 34 m east of a settled stay, 20 s after the last fix there
// (reachable, so admitted as a possible departure), then the receiver back
// at the stay with ordinary 5 m jitter on the far side (5 m west), 39 m
// from the outlier, past the lag bound: the fix back is admitted, and the
// stay kept. It was abandoned for a new one at the outlier, the settled
// anchor, its spread and the outlier it had learnt gone, so that the next
// outlier as far out was admitted too. For a σ 3 m receiver at a 5–30 s
// cadence about one outlier in six between 30 and 37.5 m lands this way,
// and costs two admissions, where DESIGN.md says at most one: suppressing
// such a fix back lost departures of noisy receivers on the fleet
// simulator (TestParkedFleetCostsAboutOneAdmissionPerWindow). (Helper 2's
// review, stop 64.)
func TestASingleOutlierCostsTwoAdmissionsWhenTheFixBackFallsPastTheLagBound(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d) // first fix (0,0) accepted, 4 jitter fixes to 40 s
		var admitted []int
		for i, p := range []ping.Ping{offset(60, 34, 0), offset(70, -5, 0), offset(80, 1, 1), offset(90, -2, 2), offset(100, 2, -1)} {
			if d.settled(t, p).Decision == Accepted {
				admitted = append(admitted, i)
			}
		}
		if !slices.Equal(admitted, []int{0, 1}) {
			t.Fatalf("a single outlier 34 m from the last accepted ping, then the asset back at its stay 39 m from it: admitted fixes %v, "+
				"want the outlier and the fix back only", admitted)
		}
		if v := d.settled(t, offset(110, -30, 0)); v.Decision != Suppressed {
			t.Errorf("an outlier 30 m west after the stay learnt one 34 m east: %+v, want suppressed jitter (the stay kept)", v)
		}
	})
}

// A multipath outlier past the lag bound (60 to 500 m out) costs two
// admissions at every cadence, itself and the fix back, and no more: the
// stay is kept, so the fixes after it are jitter again until sliding's
// window turns. Suppressing the fix back whenever no vehicle could have
// driven out to the outlier and back in the time (an excursion of e metres
// takes 2·√(2e/maxAccel) at least) held a 1 s receiver's outliers to one
// admission, but left the outlier the backend's last position: the fixes
// of a departure still inside the stay then lay farther than the lag bound
// from it, and the fleet simulator lost 2 to 130 moves in eight of its
// receivers (stop 65). The fix back is the backend's correction.
func TestAnOutlierPastTheLagBoundCostsItselfAndTheFixBackOnly(t *testing.T) {
	for _, tt := range []struct {
		out, cadence float64 // metres east; seconds between fixes
	}{{60, 1}, {150, 1}, {500, 1}, {60, 5}, {150, 5}, {150, 10}, {500, 30}} {
		t.Run(fmt.Sprintf("%.0f m at %.0f s", tt.out, tt.cadence), func(t *testing.T) {
			eachTrackShape(t, func(t *testing.T, d *testDeduper) {
				park(t, d) // to 40 s
				outlierAt := 40 + 5*tt.cadence
				var admitted []float64
				for sec := 40 + tt.cadence; sec <= 40+DefaultWindow.Seconds()*0.8; sec += tt.cadence {
					p := offset(sec, 3*math.Sin(sec/7), 3*math.Cos(sec/11))
					if sec == outlierAt {
						p = offset(sec, tt.out, 0)
					}
					if d.settled(t, p).Decision == Accepted {
						admitted = append(admitted, sec)
					}
				}
				if want := []float64{outlierAt, outlierAt + tt.cadence}; !slices.Equal(admitted, want) {
					t.Errorf("parked with an outlier %.0f m out at %.0f s: admitted at %v s, want %v (the outlier and the fix back)",
						tt.out, outlierAt, admitted, want)
				}
			})
		})
	}
}
