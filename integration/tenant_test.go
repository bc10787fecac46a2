package integration

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// Two tenants on two hosts send the same asset ids: with key_scope on the
// host, neither suppresses the other's pings.
func TestTenantsOnTwoHostsNeverSuppressEachOther(t *testing.T) {
	up := newUpstream(t)
	tester := caddyTester(t, fmt.Sprintf(caddytestGlobals+`
http://fleet-a.localhost:{$TD_TEST_HTTP_PORT}, http://fleet-b.localhost:{$TD_TEST_HTTP_PORT} {
	telemetry_dedup {
		key_prefix "tenants:"
		key_scope {http.request.host}
	}
	reverse_proxy %s {
		header_up X-Dedup-Key {http.telemetry_dedup.key}
		header_up X-Dedup-Asset {http.telemetry_dedup.asset}
	}
}`, strings.TrimPrefix(up.URL, "http://")))
	body := string(ping("veh-88", base(), 52.5200087, 13.4049547))
	send := func(host string) string {
		res, err := tester.Client.Post("http://"+host+":"+httpPort+"/", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.Header.Get("X-Dedup")
	}
	for _, step := range []struct{ host, want string }{
		{"fleet-a.localhost", "accepted"},
		{"fleet-b.localhost", "accepted"},
		{"fleet-a.localhost", "suppressed"},
		{"fleet-b.localhost", "suppressed"},
	} {
		if got := send(step.host); got != step.want {
			t.Fatalf("%s: %s, want %s", step.host, got, step.want)
		}
	}
	got := up.requests()
	if len(got) != 2 || got[0].header.Get("X-Dedup-Key") == got[1].header.Get("X-Dedup-Key") {
		t.Fatalf("upstream saw %d requests; the two tenants must have distinct keys", len(got))
	}
	if got[0].header.Get("X-Dedup-Asset") != "veh-88" {
		t.Errorf("the asset placeholder shows %q, want the plain id", got[0].header.Get("X-Dedup-Asset"))
	}
}

// An unscoped handler and a scoped one share a store (the process's memory
// store, or one Redis) and a key_prefix. The unscoped one's
// sender names its asset "12:acme.example/truck-2", the scoped identity of
// acme's truck-2 in the old key layout: both pings are accepted, neither
// suppresses the other. acme's host in another letter case and with a
// trailing dot is still acme: its redelivery is suppressed.
func TestForgedScopeIsSuppressedNowhere(t *testing.T) {
	srv := redistest.Start(t)
	for _, store := range []struct{ name, config string }{
		{"memory", ""},
		{"redis", "store redis " + srv.URL()},
	} {
		t.Run(store.name, func(t *testing.T) {
			up := newUpstream(t)
			prefix := "forged:" + store.name + ":"
			tester := caddyTester(t, fmt.Sprintf(caddytestGlobals+`
http://:{$TD_TEST_HTTP_PORT} {
	route /scoped {
		telemetry_dedup {
			key_prefix %[1]q
			key_scope {http.request.host}
			%[2]s
		}
		reverse_proxy %[3]s
	}
	route /unscoped {
		telemetry_dedup {
			key_prefix %[1]q
			%[2]s
		}
		reverse_proxy %[3]s
	}
}`, prefix, store.config, strings.TrimPrefix(up.URL, "http://")))
			at := base()
			send := func(path, host, asset string) string {
				t.Helper()
				req, _ := http.NewRequest(http.MethodPost, "http://"+siteAddr+path, bytes.NewReader(ping(asset, at, 52.5200087, 13.4049547)))
				req.Host = host
				res, err := tester.Client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				res.Body.Close()
				return res.Header.Get("X-Dedup")
			}
			for _, step := range []struct{ path, host, asset, want string }{
				{"/unscoped", "mallory.example", "12:acme.example/truck-2", "accepted"},
				{"/scoped", "acme.example", "truck-2", "accepted"},
				{"/unscoped", "mallory.example", "12:acme.example/truck-2", "suppressed"},
				{"/scoped", "ACME.Example.", "truck-2", "suppressed"},
				{"/scoped", "acme.example:9080", "truck-2", "suppressed"},
			} {
				if got := send(step.path, step.host, step.asset); got != step.want {
					t.Fatalf("%s %s %s: %s, want %s", step.path, step.host, step.asset, got, step.want)
				}
			}
			if n := up.count(); n != 2 {
				t.Fatalf("upstream saw %d pings, want both tenants' one each", n)
			}
		})
	}
}
