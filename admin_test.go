package telemetrydedup

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Before any ping was decided (a Caddy just started, or a config without
// the handler), GET /telemetry_dedup/stuck answers the shape the README
// shows: both lists are arrays, empty, never null, which a script reading
// .decisions[] would fail on.
func TestStuckEndpointAnswersEmptyListsBeforeAnyPing(t *testing.T) {
	metricsOnce.Do(initMetrics)
	counted := metrics.decisions
	metrics.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "decisions_total"}, []string{"decision", "reason", "mode"})
	defer func() { metrics.decisions = counted }()

	w := httptest.NewRecorder()
	if err := serveStuck(w, httptest.NewRequest(http.MethodGet, "/telemetry_dedup/stuck", nil)); err != nil {
		t.Fatal(err)
	}
	body := w.Body.String()
	if w.Header().Get("Content-Type") != "application/json" || !strings.Contains(body, `"decisions":[]`) {
		t.Fatalf("answered %q (Content-Type %q); want JSON with \"decisions\":[]", body, w.Header().Get("Content-Type"))
	}
}
