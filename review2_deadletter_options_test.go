package telemetrydedup

import (
	"strings"
	"testing"
)

// dead_letter_stream and dead_letter_maxlen do nothing unless on_invalid is
// dead_letter: a config that sets them and forgets on_invalid rejects every
// invalid ping while its author believes they are kept. Like radius on
// tumbling, it must be an error naming the line, in the Caddyfile and JSON.
func TestDeadLetterOptionsWithoutDeadLettering(t *testing.T) {
	for _, tt := range []struct{ block, option string }{
		{"\tstore redis redis://x\n\tdead_letter_stream fleet:invalid\n", "dead_letter_stream"},
		{"\tstore redis redis://x\n\tdead_letter_maxlen 5000\n", "dead_letter_maxlen"},
		{"\tstore redis redis://x\n\ton_invalid reject\n\tdead_letter_stream fleet:invalid\n", "dead_letter_stream"},
	} {
		_, err := parse(t, "telemetry_dedup {\n"+tt.block+"}")
		line := ":3"
		if strings.Contains(tt.block, "on_invalid") {
			line = ":4"
		}
		if err == nil || !strings.Contains(err.Error(), tt.option) || !strings.Contains(err.Error(), "on_invalid dead_letter") || !strings.Contains(err.Error(), line) {
			t.Errorf("%q: got %v, want an error at %s naming %s and on_invalid dead_letter", tt.block, err, line, tt.option)
		}
	}
	h := &Handler{DeadLetterStream: "fleet:invalid", StoreRaw: []byte(`{"type":"redis","url":"redis://x"}`)}
	if _, err := h.resolve(); err == nil || !strings.Contains(err.Error(), "dead_letter_stream") {
		t.Errorf("JSON dead_letter_stream without on_invalid dead_letter: got %v, want an error", err)
	}
	// With on_invalid dead_letter they load.
	if _, err := parse(t, "telemetry_dedup {\n\tstore redis redis://x\n\ton_invalid dead_letter\n\tdead_letter_stream s\n\tdead_letter_maxlen 10\n}"); err != nil {
		t.Errorf("with on_invalid dead_letter: %v", err)
	}
}
