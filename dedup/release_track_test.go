package dedup

import (
	"slices"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// In session, the first ping of a new session (after an idle gap of
// session_idle) is released when its request fails. The release puts back
// the latest device time seen with the track: the ping had raised it to
// its own, and its retry, finding no idle gap, was suppressed as a ping
// inside the session; the backend never heard the asset came back.
func TestARetriedFirstPingOfANewSessionIsAccepted(t *testing.T) {
	eachStore(t, func(t *testing.T, s Store) {
		d := newTestDeduper(s, Session)
		park(t, d)
		first := offset(25*60, 1, 1) // 25 min on: an idle gap opens a new session
		c, v := d.claim(t, first)
		if v.Decision != Accepted {
			t.Fatalf("the first ping of a new session: %+v, want accepted", v)
		}
		if n, err := d.Release(t.Context(), c); err != nil || n != 1 {
			t.Fatalf("release: %d %v", n, err)
		}
		if v := d.settled(t, first); v.Decision != Accepted {
			t.Fatalf("its retry: %+v, want accepted (judged as the first attempt was)", v)
		}
	})
}

// Two requests of one asset, A then B, both fail and are released newest
// first. B's release spends the undo record; A's must keep the track, not
// take A for the asset's first ping and delete the track, settled stay and
// all: A's retry would start a new stay of one fix, and a departure
// reported by speed (admitted at once from a settled stay) would be
// suppressed as jitter of it.
func TestTwoReleasesNewestFirstKeepTheStay(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d)
		a, b := withState(offset(60, 1, 1), "ignition=true"), withState(offset(70, 0, 1), "driverUniqueId=D1")
		ca, va := d.claim(t, a)
		cb, vb := d.claim(t, b)
		if va.Decision != Accepted || vb.Decision != Accepted {
			t.Fatalf("the two state changes: %+v, %+v", va, vb)
		}
		for _, c := range []*Claim{cb, ca} {
			if n, err := d.Release(t.Context(), c); err != nil || n != 1 {
				t.Fatalf("release: %d %v", n, err)
			}
		}
		for _, p := range []ping.Ping{a, b} {
			if v := d.settled(t, p); v.Decision != Accepted {
				t.Fatalf("the retry of %q: %+v, want accepted", p.State, v)
			}
		}
		if v := d.settled(t, withSpeed(offset(80, 8, 0), 4)); v.Decision != Accepted {
			t.Fatalf("a departure at 4 m/s from the settled stay: %+v, want accepted at once", v)
		}
	})
}

// Overland uploads what it queued in a tunnel as one batch and the backend
// answers 503: every claim of the batch is released, newest first, and the
// track goes back to what it was before the batch, so that the retried
// batch is judged as the first attempt was. With one undo record per
// acceptance, the second release found none and deleted the track as if
// its ping were the asset's first: the retry was judged against no stay at
// all, its departure at 4 m/s, admitted the first time, suppressed as
// jitter of a stay of one fix, and the backend never heard the asset left.
func TestAFailedBatchAfterATunnelIsJudgedAgainAsItWas(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d)
		retryIsJudgedAsItWas(t, d, []ping.Ping{
			offset(1500, 1, 0),               // at the stay, 25 min on: a window on, a new session
			withSpeed(offset(1505, 8, 0), 4), // setting off
			withSpeed(offset(1510, 60, 0), 10),
			withSpeed(offset(1515, 130, 0), 14),
		})
	})
}

// retryIsJudgedAsItWas claims batch as one request, releases what it
// accepted as a failed request is, and claims it again: every verdict must
// be the first attempt's.
func retryIsJudgedAsItWas(t *testing.T, d *testDeduper, batch []ping.Ping) {
	t.Helper()
	obs := observeAll(d, batch)
	var first []Verdict
	for attempt := 1; attempt <= 2; attempt++ {
		claims, verdicts, err := d.ClaimAll(t.Context(), obs)
		if err != nil {
			t.Fatal(err)
		}
		if attempt == 2 {
			for i := range verdicts {
				if verdicts[i] != first[i] {
					t.Errorf("ping %d of the retried batch: %+v, want %+v as the first attempt", i, verdicts[i], first[i])
				}
			}
			return
		}
		first = verdicts
		if _, err := d.Release(t.Context(), acceptedOf(claims, verdicts)...); err != nil {
			t.Fatal(err)
		}
	}
}

// A backlog batch holds a ping older than the asset's last accepted one,
// at the stay but farther than the lag bound from that last ping, and a
// newer one. The late ping is admitted (it may fill a gap of the
// backend's track) and ends the stay at its time. The batch fails: its
// retry must admit the late ping again, not find it in the stay it
// ended and suppress it, losing it.
func TestAFailedBatchWithALatePingIsJudgedAgainAsItWas(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d)
		// the last accepted ping: an event 20 m east of the anchor
		if v := d.settled(t, withEvent(offset(60, 20, 0), "manual")); v.Decision != Accepted {
			t.Fatalf("the event: %+v", v)
		}
		retryIsJudgedAsItWas(t, d, []ping.Ping{
			offset(55, -20, 0),              // late, 40 m west of the last
			withSpeed(offset(65, 40, 0), 4), // setting off
		})
	})
}

// In session, a fix outside a settled stay that reports rest is suppressed
// as an outlier, and its device time counts toward the silence that ends
// the session. A state change after it is accepted, and its request fails:
// the release must put back the latest device time seen as it was before
// that request, the outlier's included. It put back only the stay's last
// fix, earlier: the next ping at the stay, minutes after the outlier,
// found an idle gap and was admitted as a new session's first.
func TestAReleaseKeepsTheTimeOfAnOutlierSeenBeforeIt(t *testing.T) {
	eachStore(t, func(t *testing.T, s Store) {
		d := newTestDeduper(s, Session)
		park(t, d) // the last fix at the stay 40 s in
		if v := d.settled(t, withSpeed(offset(9*60, 30, 0), 0)); v.Decision != Suppressed {
			t.Fatalf("a fix 30 m out reporting rest, 9 min in: %+v, want suppressed as an outlier", v)
		}
		c, v := d.claim(t, withState(offset(12*60, 1, 0), "ignition=true"))
		if v.Decision != Accepted {
			t.Fatalf("the state change: %+v", v)
		}
		if n, err := d.Release(t.Context(), c); err != nil || n != 1 {
			t.Fatalf("release: %d %v", n, err)
		}
		if v := d.settled(t, offset(13*60, -1, 1)); v.Decision != Suppressed {
			t.Fatalf("a fix at the stay 4 min after the outlier: %+v, want suppressed (the same session)", v)
		}
	})
}

// Overland uploads a parked phone's queue as one batch, the first ping of
// a new session (25 min after the last) and fifteen more at the stay,
// one a minute; the backend answers 503 and the batch is retried. The
// release put back the latest device time seen as it was before the
// batch, so that the retried first ping finds the idle gap again; but the
// batch's suppressed pings, later than it, were forgotten with it, and the
// retry finds them as redeliveries that judge nothing. The next upload, a
// minute after the batch's last ping, found a 16 minute silence and was
// admitted as a new session's first: a parked asset admitted again inside
// its session, once for every failed batch.
func TestAFailedBatchKeepsTheTimeOfItsSuppressedPings(t *testing.T) {
	eachStore(t, func(t *testing.T, s Store) {
		d := newTestDeduper(s, Session)
		park(t, d)
		batch := []ping.Ping{offset(25*60, 1, 1)}
		for m := 26; m <= 40; m++ {
			batch = append(batch, offset(float64(m*60), float64(m%5)-2, float64(m%3)-1))
		}
		failAndRetry(t, d, batch)
		if v := d.settled(t, offset(41*60, 2, -1)); v.Decision != Suppressed {
			t.Fatalf("the next ping at the stay, a minute after the batch's last: %+v, want suppressed (the same session)", v)
		}
	})
}

// The first ping of a new session fails upstream and is released, and its
// sender drops it (an OwnTracks iOS message answered 4xx, a Traccar
// forwarder without forward.retry.enable); a ping sent meanwhile was
// suppressed inside the session it opened. The time of that ping is held
// only for the released ping's retry: without it, the backend never
// heard the asset came back, and the next ping after the silence must
// open the session again, as it did before.
func TestADroppedFirstPingOfASessionIsReopenedByTheNextPing(t *testing.T) {
	eachStore(t, func(t *testing.T, s Store) {
		d := newTestDeduper(s, Session)
		park(t, d)
		c, v := d.claim(t, offset(25*60, 1, 1))
		if v.Decision != Accepted {
			t.Fatalf("the first ping of a new session: %+v", v)
		}
		if v := d.settled(t, offset(25*60+30, -1, 2)); v.Decision != Suppressed {
			t.Fatalf("a ping 30 s later, while the first is in flight: %+v, want suppressed", v)
		}
		if n, err := d.Release(t.Context(), c); err != nil || n != 1 {
			t.Fatalf("release: %d %v", n, err)
		}
		if v := d.settled(t, offset(26*60, 2, 0)); v.Decision != Accepted {
			t.Fatalf("the next ping, the first never retried: %+v, want accepted (the backend never heard of the session)", v)
		}
	})
}

// failAndRetry claims batch as one request, releases what it accepted as
// a failed request is, claims it again and settles the retry: the retry
// must accept what the first attempt accepted, and find the rest as
// redeliveries.
func failAndRetry(t *testing.T, d *testDeduper, batch []ping.Ping) {
	t.Helper()
	obs := observeAll(d, batch)
	claims, first, err := d.ClaimAll(t.Context(), obs)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Release(t.Context(), acceptedOf(claims, first)...); err != nil {
		t.Fatal(err)
	}
	claims, retry, err := d.ClaimAll(t.Context(), obs)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range retry {
		if v.Decision != first[i].Decision {
			t.Errorf("ping %d of the retried batch: %+v, want %s as the first attempt", i, v, first[i].Decision)
		}
	}
	if err := d.Settle(t.Context(), acceptedOf(claims, retry)...); err != nil {
		t.Fatal(err)
	}
}

// Overland in a car crossing a car park at 5 m/s, a fix a second, uploads
// fifteen of them as one batch and the backend answers 503. The first
// attempt admitted every third fix: a stay of three fixes forms at each
// accepted one, and the next fix, reporting travel, leaves it. The retry
// found the batch's suppressed fixes as redeliveries, which judged
// nothing, so its stays held one fix where they had held three: a fix
// reporting travel 15 m on was jitter of such a stay, and the retry
// suppressed fixes the first attempt had accepted (and the backend never
// got). The backend last heard of the asset 40 m behind it, beyond the
// lag bound. A redelivery of a fix its request suppressed after
// accepting one is judged again when the release took it out of the
// track, and the retry is judged as the batch was.
// With store redis a near cache answers, in process, the redeliveries of
// suppressed pings: not those of such a batch, which must reach Redis.
func TestARetriedBatchOfADriveIsJudgedAsItWas(t *testing.T) {
	retriedDrive := func(t *testing.T, d *testDeduper) {
		park(t, d)
		var drive []ping.Ping
		for i := 1; i <= 15; i++ {
			drive = append(drive, withSpeed(offset(60+float64(i), 5*float64(i), 0), 5))
		}
		failAndRetry(t, d, drive)
	}
	eachTrackShape(t, retriedDrive)
	for _, shape := range []Shape{Sliding, Session} {
		t.Run(string(shape)+"/redis with a near cache", func(t *testing.T) {
			retriedDrive(t, newTestDeduper(NewNearCache(newRedisStore(t, redistest.Start(t)), 1000, nil), shape))
		})
	}
}

// A parked phone's Overland batch holds its arrival at a new place and
// four minutes parked there; the backend answers 503 and the batch is
// retried. The next upload begins with the phone setting off at 3 m/s:
// reported by its speed 12 m from where it stood, a departure from a stay
// of three fixes or more is admitted at once, however close. The retry's
// stay held only the fixes the retry accepted, the arrival's one, and the
// departure was suppressed as jitter of it twice, the backend hearing of
// it 42 m on.
func TestADepartureByItsSpeedAfterARetriedBatchIsAdmittedAtOnce(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d)
		var batch []ping.Ping
		for i := 1; i <= 12; i++ { // the drive, 50 m a fix
			batch = append(batch, withSpeed(offset(60+5*float64(i), 50*float64(i), 0), 10))
		}
		for i := 1; i <= 48; i++ { // parked 600 m on, 5 s a fix, jitter of a few metres
			batch = append(batch, withSpeed(offset(120+5*float64(i), 600+float64(i%7)-3, float64(i%5)-2), 0))
		}
		failAndRetry(t, d, batch)
		if v := d.settled(t, withSpeed(offset(365, 612, 0), 3)); v.Decision != Accepted {
			t.Fatalf("setting off at 3 m/s, 12 m from the stay of 48 fixes: %+v, want accepted at once", v)
		}
	})
}

// An asset reported by two sources: its app's batch, a fix 30 m from where
// it was parked (no speed reported) and one 4 m beyond it standing still,
// suppressed as jitter of that new place, fails and is released; the
// second fix comes alone from the other source before the batch's retry.
// It must wait for the retry (see refold). Judged against the track from
// before the batch, it was an outlier at rest of the parked stay, which
// learnt it and widened to 37.5 m: the retried first fix was jitter of the
// stay, and the backend, which got neither attempt, never heard the asset
// had moved. Whether the batch ends with the suppressed fix or with one
// accepted after it, driving off: a batch whose last fix was accepted
// left no time held by its release (held), and the fix alone was judged.
func TestABatchsPingAloneBeforeItsRetryWaitsForTheRetry(t *testing.T) {
	moved, still := offset(60, 30, 0), withSpeed(offset(65, 34, 0), 0)
	for _, tc := range []struct {
		name  string
		batch []ping.Ping
	}{
		{"ending with the suppressed fix", []ping.Ping{moved, still}},
		{"ending with a fix accepted after it", []ping.Ping{moved, still, withSpeed(offset(70, 80, 0), 5)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachTrackShape(t, func(t *testing.T, d *testDeduper) {
				park(t, d)
				obs := observeAll(d, tc.batch)
				claims, first, err := d.ClaimAll(t.Context(), obs)
				if err != nil {
					t.Fatal(err)
				}
				if first[0].Decision != Accepted || first[1].Decision != Suppressed {
					t.Fatalf("the batch: %+v, want the fix 30 m on accepted, the one beyond it suppressed", first)
				}
				if _, err := d.Release(t.Context(), acceptedOf(claims, first)...); err != nil {
					t.Fatal(err)
				}
				if v := d.settled(t, still); v != suppressed(Redelivery) {
					t.Fatalf("the fix beyond it, alone: %+v, want suppressed as a redelivery", v)
				}
				_, retry, err := d.ClaimAll(t.Context(), obs)
				if err != nil {
					t.Fatal(err)
				}
				for i, v := range retry {
					if v.Decision != first[i].Decision {
						t.Errorf("fix %d of the retried batch: %+v, want %s as the first attempt", i, v, first[i].Decision)
					}
				}
			})
		})
	}
}

// observeAll observes a batch's pings, as one request's.
func observeAll(d *testDeduper, batch []ping.Ping) []Observation {
	obs := make([]Observation, len(batch))
	for i, p := range batch {
		obs[i] = d.Observe(p)
	}
	return obs
}

// acceptedOf is the claims the store accepted: those a failed request
// releases, or a delivered one settles.
func acceptedOf(claims []*Claim, verdicts []Verdict) []*Claim {
	var accepted []*Claim
	for i, v := range verdicts {
		if v.Decision == Accepted {
			accepted = append(accepted, claims[i])
		}
	}
	return accepted
}

// Overland writes a fix's time to the second, and a car's receiver, a fix
// a second, now and then puts two fixes in one second. Its batch, fifteen
// fixes at 9 m/s, fails once. The retry judged the second fix of that
// second as a redelivery the track already held (nothing later had been
// seen), and folded it in no more: the stay begun at the first accepted
// fix held two fixes where it had held three, the next fix, reporting
// travel 36 m on, was jitter of it, and the two after it, judged again as
// departures, were redeliveries: the backend, which got neither attempt,
// last heard of the car 45 m behind it.
func TestARetriedBatchWithTwoFixesInOneSecondIsJudgedAsItWas(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d)
		seconds := []float64{61, 62, 62, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75}
		var drive []ping.Ping
		for i, s := range seconds {
			drive = append(drive, withSpeed(offset(s, 9*float64(i+1), 0), 9))
		}
		failAndRetry(t, d, drive)
	})
}

// A batch that carries a fix twice (an exact copy: a client's queue
// holding a location its OS delivered twice) judges the copy as the fix's
// redelivery, on the first attempt and on the retry: the stay counts the
// fix once. Overland in a car at 5 m/s, a fix a second: as without the
// copy, the first fix is admitted and a stay of three fixes forms there,
// which the next fix, reporting travel, leaves. Counted twice, the copy
// made the stay one of three a fix early, and the fix after it, 15 m on,
// was admitted as a departure from it.
func TestACopyInABatchCountsOnceInTheStay(t *testing.T) {
	var drive []ping.Ping
	for i := 1; i <= 6; i++ {
		drive = append(drive, withSpeed(offset(60+float64(i), 5*float64(i), 0), 5))
	}
	batch := slices.Insert(drive, 2, drive[1])
	want := []Decision{Accepted, Suppressed, Suppressed, Suppressed, Accepted, Suppressed, Suppressed}
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d)
		obs := observeAll(d, batch)
		for _, attempt := range []string{"the first attempt", "the retry"} {
			claims, verdicts, err := d.ClaimAll(t.Context(), obs)
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range verdicts {
				if v.Decision != want[i] {
					t.Errorf("%s, fix %d: %+v, want %s", attempt, i, v, want[i])
				}
			}
			if _, err := d.Release(t.Context(), acceptedOf(claims, verdicts)...); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// A tracker reports its ignition and its driver's card (Traccar's
// ignition and driverUniqueId) each in some of its messages only, and a
// gateway posts its fixes in batches. The car drives off at 9 m/s, a fix
// a second, the ignition on and the driver known from before, and the
// batch fails once: its first attempt admitted every third fix (a stay of
// three fixes forms at each, which the next fix, reporting travel,
// leaves). The release put back the track from before the batch, then the
// batch's older acceptances forgot from it what they reported, the
// ignition and the driver the backend had heard before the batch. The
// first retried acceptance reported the ignition again, not the driver:
// the fix after it, carrying the driver, was judged a change of driver
// and not folded into the stay begun there, which held two fixes where it
// had held three, and the next fix, reporting travel 36 m on, was jitter
// of it, suppressed by the retry where the first attempt admitted it.
func TestARetriedBatchOfATrackerWithTwoStateFieldsIsJudgedAsItWas(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d)
		if v := d.settled(t, withState(offset(50, 1, 0), "ignition=true&driverUniqueId=D1")); v.Decision != Accepted {
			t.Fatalf("the ignition turned on: %+v, want accepted", v)
		}
		states := map[int]string{1: "ignition=true", 2: "driverUniqueId=D1", 4: "ignition=true", 7: "driverUniqueId=D1"}
		var drive []ping.Ping
		for i := 1; i <= 10; i++ {
			drive = append(drive, withState(withSpeed(offset(60+float64(i), 9*float64(i), 0), 9), states[i]))
		}
		failAndRetry(t, d, drive)
	})
}

// A car's tracker reports its arrival at a car park, and a fix there ten
// seconds later; the driver's phone, offline underground, then uploads its
// Overland queue: the last twenty seconds of the approach, creeping in at
// 2 m/s (older than the tracker's arrival, so late), and a minute parked.
// The backend answers 503 once. The first attempt admitted the approach
// (the stay, of two fixes, was not settled) and folded the parked fixes
// into the stay; the release could not take those back, taken before the
// batch's first normal acceptance (it had none), and the retry judged the
// approach against the settled stay: the first fix within its radius
// moved the stay's start back to its time, and the eleven after it were
// suppressed as jitter there. The backend, which got neither attempt,
// never heard of them.
func TestARetriedBatchWithLateFixesIsJudgedAsItWas(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		if v := d.settled(t, offset(0, 0, 0)); v.Decision != Accepted {
			t.Fatalf("the tracker's arrival: %+v, want accepted", v)
		}
		if v := d.settled(t, offset(10, 1, 1)); v.Decision != Suppressed {
			t.Fatalf("the tracker's next fix: %+v, want suppressed", v)
		}
		var queue []ping.Ping
		for s := -20; s < 0; s++ {
			queue = append(queue, withSpeed(offset(float64(s), -2*float64(s), 0), 2))
		}
		for s := 5; s <= 60; s += 5 {
			queue = append(queue, withSpeed(offset(float64(s), float64(s%3)-1, float64(s%4)-2), 0))
		}
		failAndRetry(t, d, queue)
	})
}

// A batch ending in two fixes of one second is delivered, but its reply is
// lost, and the sender sends it again with a message it queued meanwhile
// that is older than the batch (a tracker's buffered report of the
// ignition turning on, which its gateway forwards late). The late report
// is admitted, and the batch's fixes are redeliveries: the second fix of
// that second, suppressed the first time, is held by the track already
// and must not be folded in again. Folded in twice, it settled the stay
// there a fix early, and the drive after it was admitted a fix early each
// time, as if the car were a fix behind where it was: the fixes admitted
// must be those admitted when the late report comes alone.
func TestAResentBatchWithAnOlderMessageFoldsNoFixTwice(t *testing.T) {
	var batch []ping.Ping
	for i := 1; i <= 3; i++ {
		batch = append(batch, withSpeed(offset(60+float64(i), 9*float64(i), 0), 9))
	}
	batch = append(batch, withSpeed(offset(63, 29, 0), 9)) // another fix of second 63
	late := withState(offset(50, 1, 0), "ignition=true")
	want := []Decision{Suppressed, Suppressed, Accepted, Suppressed, Suppressed, Accepted, Suppressed}
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		park(t, d)
		claims, verdicts, err := d.ClaimAll(t.Context(), observeAll(d, batch))
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Settle(t.Context(), acceptedOf(claims, verdicts)...); err != nil {
			t.Fatal(err)
		}
		claims, verdicts, err = d.ClaimAll(t.Context(), observeAll(d, append([]ping.Ping{late}, batch...)))
		if err != nil {
			t.Fatal(err)
		}
		if verdicts[0].Decision != Accepted {
			t.Fatalf("the late report of the ignition: %+v, want accepted", verdicts[0])
		}
		if err := d.Settle(t.Context(), acceptedOf(claims, verdicts)...); err != nil {
			t.Fatal(err)
		}
		for i, w := range want {
			s := float64(64 + i)
			if v := d.settled(t, withSpeed(offset(s, 9*(s-60), 0), 9)); v.Decision != w {
				t.Errorf("the drive's fix at %v s: %+v, want %s", s, v, w)
			}
		}
	})
}

// The retry of a ping a release left in the track ('r') is accepted with a
// seen value of its own form ('p' ... 'r' + its request's
// in_flight_timeout). It too waits its own request's timeout, not a
// shorter judge's, and settles and releases as before: its release marks
// it 'r' again, so the next retry is accepted.
func TestARetriedClaimWaitsItsOwnInFlightTimeout(t *testing.T) {
	eachTrackShape(t, func(t *testing.T, d *testDeduper) {
		retried := retriedPending(t, d)
		d.Policy.InFlightTimeout = 400 * time.Millisecond // the judge, after a reload
		time.Sleep(600 * time.Millisecond)
		d.clock = d.clock.Add(600 * time.Millisecond)
		if v := d.verdict(t, retried.Ping); v != (Verdict{Decision: InFlight, Reason: Redelivery}) {
			t.Fatalf("a redelivery of a retried ping whose claim waits 5 s, 600 ms after it, judged under 400 ms: %+v, want in_flight", v)
		}
		if n, err := d.Release(t.Context(), retried); err != nil || n != 1 {
			t.Fatalf("releasing the retry: %d %v", n, err)
		}
		if v := d.settled(t, retried.Ping); v.Decision != Accepted {
			t.Fatalf("the next retry after the retry's release: %+v, want accepted (the backend never had it)", v)
		}
		if v := d.settled(t, retried.Ping); v != suppressed(Redelivery) {
			t.Fatalf("its redelivery, delivered: %+v, want suppressed", v)
		}
	})
}

// retriedPending makes, under a 5 s in_flight_timeout, a pending claim of
// the retry of a ping a release left in the track (flagReleased), as
// TestARetryReleasedBehindAnotherRequestIsAccepted does, and returns it.
func retriedPending(t *testing.T, d *testDeduper) *Claim {
	t.Helper()
	d.Policy.InFlightTimeout = 5 * time.Second
	moved := releasedBehindAnother(t, d)
	retry, v := d.claim(t, moved)
	if v.Decision != Accepted {
		t.Fatalf("the retry of the fix 30 m off: %+v, want accepted", v)
	}
	return retry
}
