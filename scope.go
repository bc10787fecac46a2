package telemetrydedup

import (
	"fmt"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// hostPlaceholder is the placeholder whose value enters a key scope in its
// canonical form.
const hostPlaceholder = "{http.request.host}"

// checkTemplate refuses an asset or key_scope template that Caddy would
// fill only in part: a brace left open or closed alone, or an empty
// placeholder, which Caddy keeps as the text it is, or a template with no
// placeholder at all. Every request would then share that text, and
// devices or tenants would suppress each other's pings without a word.
func checkTemplate(option, template string) error {
	if strings.Contains(strings.ToLower(template), "{http.request.header.host}") {
		// Go's server takes Host out of the header map into the request's
		// Host: the placeholder is empty on every request.
		return templateError(option, template, "the Host header is never among a request's headers in Caddy; use "+hostPlaceholder+" (or {host})")
	}
	open, placeholders := -1, 0
	for i := 0; i < len(template); i++ {
		switch template[i] {
		case '\\':
			i++ // an escaped brace is text
		case '{':
			if open >= 0 {
				return templateError(option, template, fmt.Sprintf("the placeholder opened at byte %d is not closed before the next {", open+1))
			}
			open = i
		case '}':
			switch {
			case open < 0:
				return templateError(option, template, fmt.Sprintf("the } at byte %d closes no placeholder", i+1))
			case i == open+1:
				return templateError(option, template, "{} names no placeholder")
			}
			open, placeholders = -1, placeholders+1
		}
	}
	switch {
	case open >= 0:
		return templateError(option, template, fmt.Sprintf("the placeholder opened at byte %d is not closed", open+1))
	case placeholders == 0:
		return templateError(option, template, "it holds no placeholder, so every request would share it")
	}
	return nil
}

func templateError(option, template, problem string) error {
	return &dedup.ConfigError{Option: option, Problem: fmt.Sprintf(
		"template %q: %s; write each placeholder whole, such as {http.request.host} or {http.request.header.X-Device}", template, problem)}
}

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
			host, err := k.host(repl)
			if err != nil {
				return "", err
			}
			b.WriteString(host)
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

// host is the request's host, canonical. A host that is nothing once
// canonical (".", "[]") is an error, as an empty placeholder is: alone in
// the template it would key the ping as an unscoped asset, and beside
// other text put every such request in one tenant's space.
func (k keyScope) host(repl *caddy.Replacer) (string, error) {
	raw, err := expandTemplate(repl, "key_scope", hostPlaceholder)
	if err != nil {
		return "", err
	}
	host := canonicalHost(raw)
	if host == "" {
		return "", &ping.InvalidPingError{Field: "key_scope", Rule: ping.RuleRequired,
			Detail: fmt.Sprintf("the request's host %q names no host, and the key_scope template %s needs one; send the Host the ingest is served at",
				raw, strings.Join(k.parts, hostPlaceholder))}
	}
	return host, nil
}

// canonicalHost is a host name as DNS compares it: without letter case, and
// without the root label's trailing dot. An IPv6 literal sent without a
// port keeps its brackets in Caddy's placeholder (which strips them only
// with the port): they are dropped, so that [::1] and [::1]:8443 are one
// tenant.
func canonicalHost(host string) string {
	if len(host) >= 2 && host[0] == '[' && host[len(host)-1] == ']' {
		host = host[1 : len(host)-1]
	}
	return strings.ToLower(strings.TrimSuffix(host, "."))
}
