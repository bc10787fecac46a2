package telemetrydedup

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/uber/h3-go/v4"
)

// The placeholders say what became of the request, read after the handler
// ran as a log or header template would read them: a single ping's fields,
// the request's counts, empty for what the request did not have (never the
// placeholder's own name, which header_up would send upstream as it is),
// and the latest outcome when the handler runs twice on one request.
func TestPlaceholdersSayWhatBecameOfTheRequest(t *testing.T) {
	at := time.Now().UTC().Truncate(5 * time.Minute).Add(-time.Hour)
	ping := `{"asset_id":"veh-1","occurred_at":"` + at.Format(time.RFC3339) + `","lat":52.5200087,"lon":13.4049547}`
	bucket := strconv.FormatInt(at.Unix(), 10) // at starts a window
	cell := h3.LatLngToCell(h3.NewLatLng(52.5200087, 13.4049547), 12).String()
	for _, tt := range []struct {
		name   string
		shape  string
		bodies []string // sent in turn on one request; the last one's outcome counts
		want   map[string]string
	}{
		{"a new ping", "", []string{ping}, map[string]string{
			"decision": "accepted", "reason": "", "asset": "veh-1", "bucket": bucket, "cell": cell,
			"accepted": "1", "suppressed": "0"}},
		// decided by the asset's stay, without a cell: the placeholder computes it
		{"a new ping, sliding", "sliding", []string{ping}, map[string]string{
			"decision": "accepted", "asset": "veh-1", "bucket": bucket, "cell": cell}},
		{"its redelivery, session", "session", []string{ping, ping}, map[string]string{
			"decision": "suppressed", "reason": "redelivery", "cell": cell}},
		{"its redelivery", "", []string{ping, ping}, map[string]string{"decision": "suppressed", "reason": "redelivery", "asset": "veh-1"}},
		{"a rejected ping", "", []string{`{"asset_id":"veh-1"}`}, map[string]string{
			"decision": "rejected", "reason": "required", "key": "", "asset": "", "cell": "", "bucket": "", "event": ""}},
		{"a batch", "", []string{ping, "[" + ping + `,{"asset_id":"veh-2"}]`}, map[string]string{
			"decision": "partial", "reason": "", "accepted": "0", "suppressed": "1", "rejected": "1", "in_flight": "0",
			"asset": "", "key": ""}},
		{"a ping after a batch", "", []string{"[" + ping + "]", `{"asset_id":"veh-1"}`}, map[string]string{
			"decision": "rejected", "suppressed": "0", "rejected": "1"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			prefix := "placeholders-" + strings.ReplaceAll(tt.name, " ", "-") + ":"
			h := provisioned(t, &Handler{KeyPrefix: &prefix, Shape: tt.shape})
			r := httptest.NewRequest(http.MethodPost, "/telemetry", nil)
			repl := caddyhttp.NewTestReplacer(r)
			r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
			next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil })
			for _, body := range tt.bodies {
				r.Body, r.ContentLength = io.NopCloser(strings.NewReader(body)), int64(len(body))
				_ = h.ServeHTTP(httptest.NewRecorder(), r, next)
			}
			for name, want := range tt.want {
				placeholder := "{http.telemetry_dedup." + name + "}"
				if got := repl.ReplaceKnown(placeholder, ""); got != want {
					t.Errorf("%s = %q, want %q", placeholder, got, want)
				}
			}
		})
	}
}

// A second handler on the same request (another route's, with its own
// shape and resolution) answers the placeholders with its own outcome: a
// sliding ping's cell at that handler's resolution.
func TestPlaceholdersFollowTheLastHandler(t *testing.T) {
	at := time.Now().UTC().Truncate(5 * time.Minute).Add(-time.Hour)
	ping := `{"asset_id":"veh-1","occurred_at":"` + at.Format(time.RFC3339) + `","lat":52.5200087,"lon":13.4049547}`
	first, second := "placeholders-first:", "placeholders-second:"
	resolution := 9
	handlers := []*Handler{
		provisioned(t, &Handler{KeyPrefix: &first}),
		provisioned(t, &Handler{KeyPrefix: &second, Shape: "sliding", Resolution: &resolution}),
	}
	r := httptest.NewRequest(http.MethodPost, "/telemetry", nil)
	repl := caddyhttp.NewTestReplacer(r)
	r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil })
	for _, h := range handlers {
		r.Body, r.ContentLength = io.NopCloser(strings.NewReader(ping)), int64(len(ping))
		_ = h.ServeHTTP(httptest.NewRecorder(), r, next)
	}
	want := h3.LatLngToCell(h3.NewLatLng(52.5200087, 13.4049547), resolution).String()
	if got := repl.ReplaceKnown("{http.telemetry_dedup.cell}", ""); got != want {
		t.Errorf("cell = %q, want %q (the second handler's, at resolution %d)", got, want, resolution)
	}
}
