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
