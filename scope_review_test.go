package telemetrydedup

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// postToHost sends one ping to h as a request for host, with next
// answering 201, and returns the answer.
func postToHost(h *Handler, host, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/telemetry", strings.NewReader(body))
	r.Host = host
	r.Header.Set("Content-Type", "application/json")
	repl := caddyhttp.NewTestReplacer(r)
	r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
	w := httptest.NewRecorder()
	_ = h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		w.WriteHeader(http.StatusCreated)
		return nil
	}))
	return w
}

// Review 8: README: "A host from {http.request.host} is canonical ... no
// port". Caddy's placeholder leaves the port off with net.SplitHostPort,
// which also strips an IPv6 literal's brackets; without a port it fails and
// the placeholder is the Host as sent, brackets and all. So [2001:db8::1]
// and [2001:db8::1]:8443 are two tenants, and a redelivery sent once with
// the port and once without is admitted twice.
func TestIPv6HostIsOneTenantWithAndWithoutPort(t *testing.T) {
	for _, hosts := range [][2]string{
		{"[2001:db8::1]", "[2001:db8::1]:8443"},
		{"[2001:DB8::1]", "[2001:db8::1]:443"},
	} {
		scopes := [2]string{}
		for i, host := range hosts {
			r := httptest.NewRequest("POST", "/telemetry", nil)
			r.Host = host
			s, err := parseKeyScope("{http.request.host}").expand(caddyhttp.NewTestReplacer(r))
			if err != nil {
				t.Fatal(err)
			}
			scopes[i] = s
		}
		if scopes[0] != scopes[1] {
			t.Errorf("Host %q enters the scope as %q, Host %q as %q: one host, two tenants", hosts[0], scopes[0], hosts[1], scopes[1])
		}
	}
	body := `{"asset_id":"truck-6","occurred_at":"` + time.Now().Add(-time.Minute).UTC().Format(time.RFC3339) + `","lat":52.5200087,"lon":13.4049547}`
	ipv6Prefix := "review8:ipv6:"
	h := provisioned(t, &Handler{KeyPrefix: &ipv6Prefix, KeyScope: "{http.request.host}"})
	if got := postToHost(h, "[2001:db8::1]:8443", body).Header().Get("X-Dedup"); got != "accepted" {
		t.Fatalf("first: %s", got)
	}
	if got := postToHost(h, "[2001:db8::1]", body).Header().Get("X-Dedup"); got != "suppressed" {
		t.Errorf("the same ping to the same IPv6 host without its port: X-Dedup %s, want suppressed", got)
	}
}
