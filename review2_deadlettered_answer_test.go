package telemetrydedup

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// answers { dead_lettered <status> <content type> } without a body: the
// answer is then the JSON report, and the content type was accepted but
// never sent. Either the config is refused, or the answer carries it.
func TestDeadLetteredContentTypeWithoutABodyIsNotIgnored(t *testing.T) {
	h, err := parse(t, "telemetry_dedup {\n\tanswers {\n\t\tdead_lettered 202 text/plain\n\t}\n}")
	if err != nil {
		if !strings.Contains(err.Error(), ":3") {
			t.Errorf("refused, but not at the line: %v", err)
		}
		return
	}
	s, err := h.resolve()
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	s.answers.writeDeadLettered(w, rejection{status: http.StatusUnprocessableEntity, body: errorBody{Error: "x", Field: "lat", Rule: "range"}})
	if ct := w.Header().Get("Content-Type"); ct != "text/plain" {
		t.Errorf("dead_lettered 202 text/plain loaded, but the answer's Content-Type is %q", ct)
	}
}
