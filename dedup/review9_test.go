package dedup

import (
	"testing"
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
