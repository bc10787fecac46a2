package telemetrydedup

import (
	"strings"
	"testing"
)

// analyze with a list flag written out empty silently used the default
// list, as if the flag had not been given.
func TestAnalyzeCommandRefusesEmptyListFlags(t *testing.T) {
	for _, flag := range []string{"--retry-ladder", "--windows"} {
		_, err := runAnalyzeCmd(t, articlePing+"\n", flag, "", "-")
		if err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("%s \"\": got %v, want an error naming %s", flag, err, flag)
		}
	}
}
