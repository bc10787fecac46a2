package integration

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// Two telemetry_dedup handlers on one request (one at the site's top and
// one inside handle, as the README's "It also works inside route and
// handle" invites; or two lines in one route) load without a word, and
// then no ping is ever delivered: the first handler claims the key and
// calls the second, which finds the same key claimed and in flight and
// answers 409 in_flight; the first reads that as an upstream failure and
// releases the claim, so the sender's retry meets the same 409, forever.
// Either the config is refused, naming the directive and its line, or a
// first sighting goes upstream.
func TestTwoDedupHandlersOnOneRequestStillDeliverAFirstSighting(t *testing.T) {
	for _, tt := range []struct{ name, site string }{
		{"site and handle", `
	telemetry_dedup /telemetry {
		key_prefix %[1]q
	}
	handle /telemetry {
		telemetry_dedup {
			key_prefix %[1]q
		}
		reverse_proxy %[2]s
	}`},
		{"one route", `
	route /telemetry {
		telemetry_dedup {
			key_prefix %[1]q
		}
		telemetry_dedup {
			key_prefix %[1]q
		}
		reverse_proxy %[2]s
	}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			up := newUpstream(t)
			caddyfile := caddytestGlobals + "\nhttp://localhost:{$TD_TEST_HTTP_PORT} {" +
				fmt.Sprintf(tt.site, keyPrefix(t), strings.TrimPrefix(up.URL, "http://")) + "\n}\n"
			if _, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil); err != nil {
				if !strings.Contains(err.Error(), "telemetry_dedup") || !strings.Contains(err.Error(), ":") {
					t.Fatalf("refused, but without naming telemetry_dedup and its line: %v", err)
				}
				return // refused at load, saying why: fixed
			}
			caddyTester(t, caddyfile)
			body := ping("veh-twice", base(), 52.5200087, 13.4049547)
			for attempt := range 3 { // the sender retries, as every client does
				res := post(t, caddytestClient(), body)
				if res.status == http.StatusCreated {
					return
				}
				if attempt == 2 {
					t.Fatalf("a first sighting answered %d X-Dedup=%q (reason %q) %s on every attempt, upstream got %d requests: "+
						"the config loaded, and no ping is ever delivered",
						res.status, res.header.Get("X-Dedup"), res.header.Get("X-Dedup-Reason"), res.body, up.count())
				}
			}
		})
	}
}

// The README's Shadow mode: "Put it in front of live traffic, log
// {http.telemetry_dedup.decision} ... and you know what enforcing would
// remove". An operator who already enforces in a handle puts a shadow
// handler with another key_prefix (a fresh key space, to try another
// window or resolution) at the site's top, in front of it. The two never
// share a key, so the enforcing one never meets its own claim in flight.
// Through a real Caddy, since 499dcb6 the enforcing handler passes every
// request on unjudged and the redelivery reaches the upstream: enforcement
// is off, with one warning telling the operator to remove a handler.
func TestEnforcingHandleBehindAShadowSiteHandlerInAnotherKeySpaceStillSuppresses(t *testing.T) {
	up := newUpstream(t)
	caddyTester(t, fmt.Sprintf(caddytestGlobals+`
http://localhost:{$TD_TEST_HTTP_PORT} {
	telemetry_dedup /telemetry {
		key_prefix "%[1]strial:"
		mode shadow
		window 1m
	}
	handle /telemetry {
		telemetry_dedup {
			key_prefix "%[1]slive:"
		}
		reverse_proxy %[2]s
	}
}`, keyPrefix(t), strings.TrimPrefix(up.URL, "http://")))
	body := ping("veh-nested-shadow-front", base(), 52.5200087, 13.4049547)
	post(t, caddytestClient(), body).expect(t, http.StatusCreated, "accepted")
	res := post(t, caddytestClient(), body) // the redelivery
	if res.status != http.StatusOK || up.count() != 1 {
		t.Fatalf("the redelivery was answered %d X-Dedup=%q, and the upstream got %d requests; want 200 from the enforcing "+
			"handler and 1 request upstream: the shadow handler in front shares no key with it", res.status, res.header.Get("X-Dedup"), up.count())
	}
}

// Guard: a handler that runs after another on one request, not inside it,
// still judges. The upstream is down, so the site's handler releases the
// ping's claim and returns reverse_proxy's error; Caddy then runs
// handle_errors on the same request and replacer, whose telemetry_dedup
// (same key space) forwards the ping to a fallback. Had the first
// handler's judging mark outlived its return, the second would pass every
// ping on unjudged and the fallback would get each redelivery too.
func TestHandleErrorsAfterAFailedUpstreamStillJudges(t *testing.T) {
	fallback := newUpstream(t)
	caddyTester(t, fmt.Sprintf(caddytestGlobals+`
http://localhost:{$TD_TEST_HTTP_PORT} {
	route /telemetry {
		telemetry_dedup {
			key_prefix %[1]q
		}
		reverse_proxy 127.0.0.1:1
	}
	handle_errors {
		telemetry_dedup {
			key_prefix %[1]q
		}
		reverse_proxy %[2]s
	}
}`, keyPrefix(t), strings.TrimPrefix(fallback.URL, "http://")))
	body := ping("veh-nested-errors", base(), 52.5200087, 13.4049547)
	first := post(t, caddytestClient(), body)
	if first.status != http.StatusCreated || fallback.count() != 1 {
		t.Fatalf("the ping was answered %d X-Dedup=%q %s, fallback got %d; want 201 from the fallback",
			first.status, first.header.Get("X-Dedup"), first.body, fallback.count())
	}
	again := post(t, caddytestClient(), body)
	if fallback.count() != 1 {
		t.Fatalf("the redelivery was answered %d X-Dedup=%q and reached the fallback (%d requests): the handler in handle_errors passed it unjudged",
			again.status, again.header.Get("X-Dedup"), fallback.count())
	}
	t.Logf("redelivery: %d X-Dedup=%q", again.status, again.header.Get("X-Dedup"))
}

// The README ("Using it") invites a mode shadow trial of another setting
// inside the live handler ("in front of the live handler, say, or behind
// it") and promises "The answer's headers are the enforcing handler's
// either way". Caddyfile.example sends {http.telemetry_dedup.key} upstream
// with header_up so that "The backend can see the key it got, e.g. to store
// it beside the row", and logs {http.telemetry_dedup.decision}. With a
// trial behind the live handler, every placeholder a later handler read was
// the trial's: the backend was told a key of the trial's key space (which
// the live store never holds) and a decision of "suppressed" for a ping the
// live handler accepted and delivered, while the sender's X-Dedup said
// accepted, and the access log reported suppressions that never happened.
// The placeholders are now the enforcing handler's, as its headers are.
// (Helper 3's review, stop 65.)
func TestPlaceholdersBehindAShadowTrialAreTheEnforcingHandlers(t *testing.T) {
	up := newUpstream(t)
	prefix := keyPrefix(t)
	caddyTester(t, fmt.Sprintf(caddytestGlobals+`
http://localhost:{$TD_TEST_HTTP_PORT} {
	route /telemetry {
		telemetry_dedup {
			key_prefix "%[1]slive:"
		}
		telemetry_dedup {
			key_prefix "%[1]strial:"
			mode shadow
			resolution 5
		}
		reverse_proxy %[2]s {
			header_up X-Dedup-Key {http.telemetry_dedup.key}
			header_up X-Dedup-Decision {http.telemetry_dedup.decision}
		}
	}
}`, prefix, strings.TrimPrefix(up.URL, "http://")))
	at := base()
	// Two fixes ~1.3 km apart (as in the README's resolution table, one res-5 cell) at one time: two cells at the live
	// resolution 12, one cell at the trial's resolution 5.
	post(t, caddytestClient(), ping("veh-trial-trial", at, 52.5, 13.4)).expect(t, http.StatusCreated, "accepted")
	post(t, caddytestClient(), ping("veh-trial-trial", at, 52.51, 13.41)).expect(t, http.StatusCreated, "accepted")
	got := up.requests()
	if len(got) != 2 {
		t.Fatalf("upstream got %d requests, want 2", len(got))
	}
	for i, r := range got {
		key, decision := r.header.Get("X-Dedup-Key"), r.header.Get("X-Dedup-Decision")
		if !strings.HasPrefix(key, prefix+"live:") || decision != "accepted" {
			t.Errorf("ping %d, accepted and delivered by the live handler (X-Dedup: accepted): the upstream was told "+
				"X-Dedup-Key %q and X-Dedup-Decision %q; want the live handler's key (prefix %q) and accepted, "+
				"as the answer's headers say", i+1, key, decision, prefix+"live:")
		}
	}
}

// The README ("Using it") said a telemetry_dedup inside another passes the
// request on unjudged only when its keys are the other's ("both tumbling
// with one window and resolution"), and that "One whose keys differ judges
// as it would alone: a mode shadow trial of another setting in front of the
// live handler, say, or behind it". A trial of another window on the same
// store and key_prefix is such a trial by that rule. But a tumbling key is
// blake2b(asset|bucket|cell) with bucket = the device time floored to the
// window, so for every ping in the first half of a 10m window the 10m
// trial's key IS the 5m live key (the README's Key contract says so: "a
// bucket and cell that come out the same under both keep their key").
// The trial in front claims the key, the live handler inside meets that
// claim in flight and answers 409, the trial reads the 409 as a failed
// upstream and releases, and the sender's retry meets the same: that ping
// is never delivered (the very loop passNested was written to end). The
// two now count as one key space: the live handler inside passes the
// request on, and warns. (Helper 3's review, stop 65.)
func TestAShadowTrialOfAnotherWindowInFrontNeverBlocksTheLiveHandler(t *testing.T) {
	up := newUpstream(t)
	caddyTester(t, fmt.Sprintf(caddytestGlobals+`
http://localhost:{$TD_TEST_HTTP_PORT} {
	telemetry_dedup /telemetry {
		key_prefix %[1]q
		mode shadow
		window 10m
	}
	handle /telemetry {
		telemetry_dedup {
			key_prefix %[1]q
		}
		reverse_proxy %[2]s
	}
}`, keyPrefix(t), strings.TrimPrefix(up.URL, "http://")))
	at := time.Now().UTC().Truncate(10 * time.Minute).Add(-time.Hour).Add(time.Minute) // one bucket start under 5m and 10m
	body := ping("veh-trial-window-trial", at, 52.5200087, 13.4049547)
	var res response
	for range 3 { // the sender retries
		if res = post(t, caddytestClient(), body); res.status == http.StatusCreated {
			return
		}
	}
	t.Fatalf("a first sighting was answered %d X-Dedup=%q (reason %q) %s on every attempt, upstream got %d requests; "+
		"want 201 accepted: the shadow trial (window 10m) in front is another key space by the README's rule, and must not "+
		"change what the live handler (window 5m) does", res.status, res.header.Get("X-Dedup"), res.header.Get("X-Dedup-Reason"), res.body, up.count())
}

// Behind the live handler, the same trial writes claims into the live key
// space: a ping at minute 7 has the trial claim the 10m bucket's key, which
// is the live handler's key of minutes 0-5. A fix of minutes 0-5 in that
// cell that arrives late (a phone's offline buffer) is then suppressed by
// the enforcing handler as if it had been delivered, though the backend
// never had it: without the trial it is accepted. (Helper 3's review, stop
// 65.)
func TestAShadowTrialOfAnotherWindowBehindNeverSuppressesForTheLiveHandler(t *testing.T) {
	up := newUpstream(t)
	caddyTester(t, fmt.Sprintf(caddytestGlobals+`
http://localhost:{$TD_TEST_HTTP_PORT} {
	route /telemetry {
		telemetry_dedup {
			key_prefix %[1]q
		}
		telemetry_dedup {
			key_prefix %[1]q
			mode shadow
			window 10m
		}
		reverse_proxy %[2]s
	}
}`, keyPrefix(t), strings.TrimPrefix(up.URL, "http://")))
	start := time.Now().UTC().Truncate(10 * time.Minute).Add(-time.Hour)
	post(t, caddytestClient(), ping("veh-trial-window-behind", start.Add(7*time.Minute), 52.5200087, 13.4049547)).expect(t, http.StatusCreated, "accepted")
	late := ping("veh-trial-window-behind", start.Add(2*time.Minute), 52.5200087, 13.4049547) // same cell, the live handler's earlier bucket
	res := post(t, caddytestClient(), late)
	if res.status != http.StatusCreated || up.received(late) != 1 {
		t.Fatalf("a late fix of a 5m bucket the live handler never saw was answered %d X-Dedup=%q (reason %q), and the upstream "+
			"got it %d times; want 201 accepted and delivered, as without the shadow trial: the trial's claim of its 10m "+
			"bucket is the live key of that 5m bucket", res.status, res.header.Get("X-Dedup"), res.header.Get("X-Dedup-Reason"), up.received(late))
	}
}
