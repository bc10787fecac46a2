package integration

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

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
