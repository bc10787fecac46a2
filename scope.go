package telemetrydedup

import (
	"strings"

	"github.com/caddyserver/caddy/v2"
)

// hostPlaceholder is the placeholder whose value enters a key scope in its
// canonical form.
const hostPlaceholder = "{http.request.host}"

// keyScope is the key_scope template, split where it names the request's
// host. A host names its tenant in any letter case and with or without the
// trailing dot of a fully qualified name, so it enters the scope canonical:
// lower case, no trailing dot (Caddy's placeholder already leaves the port
// off). Every other value enters as it is: user ids alice and Alice may well
// be two tenants.
type keyScope struct {
	parts []string // the template's pieces around each host placeholder
}

func parseKeyScope(template string) keyScope {
	if template == "" {
		return keyScope{}
	}
	return keyScope{parts: strings.Split(template, hostPlaceholder)}
}

// enabled reports whether key_scope is set.
func (k keyScope) enabled() bool { return k.parts != nil }

// expand fills the template from the request. An unknown or empty
// placeholder is an error (see expandTemplate): never a shared, empty scope.
func (k keyScope) expand(repl *caddy.Replacer) (string, error) {
	var b strings.Builder
	for i, part := range k.parts {
		if i > 0 {
			host, err := expandTemplate(repl, "key_scope", hostPlaceholder)
			if err != nil {
				return "", err
			}
			b.WriteString(canonicalHost(host))
		}
		if part == "" {
			continue
		}
		v, err := expandTemplate(repl, "key_scope", part)
		if err != nil {
			return "", err
		}
		b.WriteString(v)
	}
	return b.String(), nil
}

// canonicalHost is a host name as DNS compares it: without letter case, and
// without the root label's trailing dot.
func canonicalHost(host string) string {
	return strings.ToLower(strings.TrimSuffix(host, "."))
}
