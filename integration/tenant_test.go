package integration

import (
	"fmt"
	"strings"
	"testing"
)

// Two tenants on two hosts send the same asset ids: with key_scope on the
// host, neither suppresses the other's pings.
func TestTenantsOnTwoHostsNeverSuppressEachOther(t *testing.T) {
	up := newUpstream(t)
	tester := caddyTester(t, fmt.Sprintf(caddytestGlobals+`
http://fleet-a.localhost:9080, http://fleet-b.localhost:9080 {
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
		res, err := tester.Client.Post("http://"+host+":9080/", "application/json", strings.NewReader(body))
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
