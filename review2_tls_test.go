package telemetrydedup

import (
	"strings"
	"testing"
)

// An option of the redis store's tls block given twice must be an error,
// as it is everywhere else in the directive: the second ca silently won.
func TestRedisTLSOptionGivenTwiceIsAnError(t *testing.T) {
	for _, option := range []string{"ca a.pem", "cert c.pem", "key k.pem", "server_name redis.internal", "insecure_skip_verify"} {
		input := "telemetry_dedup {\n\tstore redis redis://x {\n\t\ttls {\n\t\t\t" + option + "\n\t\t\t" + option + "\n\t\t}\n\t}\n}"
		_, err := parse(t, input)
		if err == nil || !strings.Contains(err.Error(), ":5") || !strings.Contains(err.Error(), "already") {
			t.Errorf("tls { %s twice }: got %v, want an error at line 5 saying it is already given", option, err)
		}
	}
}
