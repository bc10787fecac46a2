package telemetrydedup

import (
	"strings"
	"testing"
)

// key --scope takes the scope's value as it entered the key; given the
// key_scope template itself it printed a key no request ever has, as
// --asset with a template is refused for.
func TestKeyCommandRefusesAScopeTemplate(t *testing.T) {
	_, err := runKeyCmd(t, articlePing, "--scope", "{http.request.host}")
	if err == nil || !strings.Contains(err.Error(), "--scope") {
		t.Errorf("--scope {http.request.host}: got %v, want an error naming --scope", err)
	}
	if _, err := runKeyCmd(t, articlePing, "--scope", "tenant-a.example"); err != nil {
		t.Errorf("--scope with a value: %v", err)
	}
}
