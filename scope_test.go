package telemetrydedup

import (
	"errors"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// A host is one tenant however it is written; every other value is taken as
// it is, since user ids alice and Alice may be two tenants.
func TestKeyScopeFromTheHostIsCanonical(t *testing.T) {
	for _, tt := range []struct {
		template, host, user, want string
	}{
		{"{http.request.host}", "fleet-a.example", "", "fleet-a.example"},
		{"{http.request.host}", "Fleet-A.Example", "", "fleet-a.example"},
		{"{http.request.host}", "fleet-a.example.", "", "fleet-a.example"},
		{"{http.request.host}", "FLEET-A.example.:8443", "", "fleet-a.example"},
		// Caddy strips an IPv6 literal's brackets only with its port.
		{"{http.request.host}", "[2001:db8::1]", "", "2001:db8::1"},
		{"{http.request.host}", "[2001:DB8::1]:8443", "", "2001:db8::1"},
		{"{http.request.header.X-User}", "fleet-a.example", "Alice", "Alice"},
		{"{http.request.host}/{http.request.header.X-User}", "Fleet-A.example.", "Alice", "fleet-a.example/Alice"},
		{"tenant-{http.request.host}-{http.request.host}", "A.", "", "tenant-a-a"},
	} {
		r := httptest.NewRequest("POST", "/telemetry", nil)
		r.Host = tt.host
		if tt.user != "" {
			r.Header.Set("X-User", tt.user)
		}
		got, err := parseKeyScope(tt.template).expand(caddyhttp.NewTestReplacer(r))
		if err != nil || got != tt.want {
			t.Errorf("%s with Host %q: %q, %v; want %q", tt.template, tt.host, got, err, tt.want)
		}
	}
	r := httptest.NewRequest("POST", "/telemetry", nil)
	if _, err := parseKeyScope("{http.request.header.X-User}").expand(caddyhttp.NewTestReplacer(r)); err == nil {
		t.Error("an empty scope was accepted; it must never put a request in a shared key space")
	}
}

// A host that is nothing once canonical (the root ".", empty brackets) is
// an empty scope too: with it the ping was keyed as an unscoped asset, in
// the key space that every such request, and every unscoped handler on the
// same store, shares. Beside other text it would put every such request
// in one tenant's space ("t-"), whichever host it came for.
func TestKeyScopeOfAHostThatIsNothingIsRefused(t *testing.T) {
	for _, template := range []string{"{http.request.host}", "t-{http.request.host}", "{http.request.host}/fleet"} {
		for _, host := range []string{".", ".:8443", "[]"} {
			r := httptest.NewRequest("POST", "/telemetry", nil)
			r.Host = host
			got, err := parseKeyScope(template).expand(caddyhttp.NewTestReplacer(r))
			var invalid *ping.InvalidPingError
			if !errors.As(err, &invalid) || invalid.Field != "key_scope" {
				t.Errorf("%s, Host %q: scope %q, %v; want a 422 naming key_scope", template, host, got, err)
			}
		}
	}
}
