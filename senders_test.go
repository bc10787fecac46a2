package telemetrydedup

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
)

// Each preset's answers, and the answers option replacing them one by one.
func TestAnswersFromPresetsAndTheOption(t *testing.T) {
	for _, tt := range []struct {
		config                           string
		suppressed, inFlight, deadLetter string // status content-type body / status retry-after
	}{
		{`{}`, "200  ", "409 1", "202  report"},
		{`{"preset":"geojson"}`, "200  ", "409 1", "202  report"},
		{`{"preset":"owntracks"}`, "200 application/json []", "503 1", "202 application/json []"},
		{`{"preset":"overland"}`, `200 application/json {"result":"ok"}`, "503 1", `202 application/json {"result":"ok"}`},
		{`{"preset":"osmand"}`, "200  ", "503 1", "202  report"},
		{`{"preset":"traccar"}`, "200  ", "503 1", "202  report"},
		{`{"preset":"owntracks","answers":{"in_flight":{"status":429}}}`, "200 application/json []", "429 1", "202 application/json []"},
		{`{"answers":{"suppressed":{"status":204},"in_flight":{"status":503,"retry_after":7},"dead_lettered":{"status":200,"content_type":"text/plain","body":""}}}`,
			"204  ", "503 7", "200 text/plain "},
	} {
		h := new(Handler)
		if err := json.Unmarshal([]byte(tt.config), h); err != nil {
			t.Fatal(err)
		}
		s, err := h.resolve()
		if err != nil {
			t.Fatalf("%s: %v", tt.config, err)
		}
		a := s.answers
		if got := describeBody(a.suppressed, ""); got != tt.suppressed {
			t.Errorf("%s: suppressed %q, want %q", tt.config, got, tt.suppressed)
		}
		if got := fmt.Sprint(a.inFlight.status, " ", a.inFlight.retryAfter); got != tt.inFlight {
			t.Errorf("%s: in flight %q, want %q", tt.config, got, tt.inFlight)
		}
		if got := describeBody(a.deadLettered, "report"); got != tt.deadLetter {
			t.Errorf("%s: dead lettered %q, want %q", tt.config, got, tt.deadLetter)
		}
	}
	for _, bad := range []string{
		`{"answers":{"suppressed":{"status":409}}}`,
		`{"answers":{"suppressed":{"status":200,"retry_after":1}}}`,
		`{"answers":{"dead_lettered":{"status":422}}}`,
		`{"answers":{"in_flight":{"status":200}}}`,
		`{"answers":{"in_flight":{"status":503,"body":"later"}}}`,
		`{"answers":{"in_flight":{"status":503,"retry_after":-1}}}`,
		`{"answers":{"suppressed":{"status":204,"body":"[]"}}}`,
	} {
		h := new(Handler)
		if err := json.Unmarshal([]byte(bad), h); err != nil {
			t.Fatal(err)
		}
		var ce *dedup.ConfigError
		if _, err := h.resolve(); !errors.As(err, &ce) || ce.Option != "answers" {
			t.Errorf("%s: got %v, want an answers error", bad, err)
		}
	}
}

// A configured body is written as given, with its Content-Type and a
// Content-Length that matches.
func TestBodyAnswerIsWrittenAsGiven(t *testing.T) {
	w := httptest.NewRecorder()
	bodyAnswer{status: 200, contentType: "application/json", body: []byte(`{"result":"ok"}`), hasBody: true}.write(w)
	if w.Code != 200 || w.Header().Get("Content-Type") != "application/json" || w.Header().Get("Content-Length") != "15" || w.Body.String() != `{"result":"ok"}` {
		t.Fatalf("wrote %d %v %q", w.Code, w.Header(), w.Body.String())
	}
}

// The headers of an answer share one allocation but no value: a later
// handler that edits one in place or appends to it (Caddy's header
// directive does both) leaves the others as they were.
func TestAnswerHeadersAreIndependent(t *testing.T) {
	w := httptest.NewRecorder()
	bodyAnswer{status: 200, contentType: "text/plain", body: []byte("ok"), hasBody: true}.write(w, headerDecision, "suppressed", headerReason, "jitter")
	h := w.Header()
	h[headerDecision][0] = "edited"
	h.Add(headerReason, "added")
	h["Content-Type"] = append(h["Content-Type"], "appended")
	want := map[string][]string{
		headerDecision:   {"edited"},
		headerReason:     {"jitter", "added"},
		"Content-Type":   {"text/plain", "appended"},
		"Content-Length": {"2"},
	}
	for name, values := range want {
		if !slices.Equal(h[name], values) {
			t.Errorf("%s: %q, want %q", name, h[name], values)
		}
	}
}

// describeBody writes an answer as "status content-type body", with
// instead the handler's own body when it has none of its own.
func describeBody(b bodyAnswer, own string) string {
	body := own
	if b.hasBody {
		body = string(b.body)
	}
	return fmt.Sprint(b.status, " ", b.contentType, " ", body)
}

// Traccar's position forwarder sends no body with its default forward.type
// (url: a GET of a URL template). The 400 says what to set in traccar.xml,
// not to put a method matcher in front, which would let the GETs through
// to a backend expecting JSON.
func TestTraccarPresetSaysHowToSendItsForwarderABody(t *testing.T) {
	for _, tt := range []struct{ options, want string }{
		{`"preset":"traccar"`, "forward.type"},
		{`"preset":"geojson"`, "@pings method POST"},
	} {
		res := tableHandler(t, `{"key_prefix":"empty:",`+tt.options+`}`).post("", "", nil)
		if res.status != http.StatusBadRequest || !strings.Contains(res.body, tt.want) {
			t.Errorf("%s, empty body: %d %s; want 400 naming %q", tt.options, res.status, res.body, tt.want)
		}
	}
}
