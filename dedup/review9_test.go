package dedup

import (
	"testing"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// Review 9. In session, the first ping of a new session (after an idle gap
// of session_idle) is released when its request fails. The release puts
// the track back but not the latest device time seen, which the ping had
// raised to its own: its retry finds no idle gap, and is suppressed as a
// ping inside the session. The backend never hears the asset came back.
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

// Review 9. Two requests of one asset, A then B, both fail and are
// released newest first (B, then A; or a failed batch, which is released
// newest first). B's release uses up the undo record; A's then finds no
// undo record and takes A for the asset's first ping: the whole track is
// deleted, settled stay and all. A's retry starts a new stay of one fix,
// and a departure reported by speed (admitted at once from a settled stay)
// is suppressed as jitter of it.
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
