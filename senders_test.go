package telemetrydedup

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
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
		{`{"preset":"osmand"}`, "200  ", "503 1", "200  report"}, // Traccar Client 9 keeps a 202
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
		`{"answers":{"in_flight":{"status":503,"retry_after":99999999999}}}`, // 3,000 years: a sender that honours it never comes back
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

// An answer given beside a preset that the preset's client does not read
// as meant is named at load (a warning: a route may serve another client,
// as the README's Overland in OwnTracks mode does), with the client and
// what it does; one it reads as meant is not. Checked against the
// clients' source: OwnTracks Android 2.5.7-2.5.9 parses a 2xx body as
// messages and re-queues on failure, OwnTracks iOS deletes on a 4xx
// (Connection.m), Overland needs application/json {"result":"ok"}
// (GLManager.m, AFJSONResponseSerializer), Traccar Client 9's SDK a 200,
// 201 or 204.
func TestAnswersAPresetsClientMisreadsAreNamed(t *testing.T) {
	for _, tt := range []struct {
		block string
		want  []string // each: the answer's kind, then the client
	}{
		{"preset owntracks\n answers {\n suppressed 204\n }", []string{"suppressed: OwnTracks Android"}},
		{"preset owntracks\n answers {\n suppressed 200 text/plain `{\"ok\":true}`\n }", []string{"suppressed: OwnTracks Android"}},
		{"preset owntracks\n answers {\n dead_lettered 202\n }", []string{"dead_lettered: OwnTracks Android"}}, // the JSON report
		{"preset owntracks\n answers {\n in_flight 429 5\n }", []string{"in_flight: OwnTracks iOS"}},
		{"preset owntracks\n answers {\n suppressed 200 application/json `{\"result\":\"ok\"}`\n dead_lettered 202 application/json `{\"result\":\"ok\"}`\n }",
			[]string{"suppressed: OwnTracks Android", "dead_lettered: OwnTracks Android"}}, // the README's Overland in OwnTracks mode
		// Android decodes only the _type values it knows, each element of an
		// array too (Parser.kt at v2.5.9). (Helper 1's review, stop 62.)
		{"preset owntracks\n answers {\n suppressed 200 application/json `{\"_type\":\"duplicate\"}`\n }", []string{"suppressed: OwnTracks Android"}},
		{"preset owntracks\n answers {\n dead_lettered 202 application/json `{\"_type\":\"encrypted\",\"data\":\"\"}`\n }", []string{"dead_lettered: OwnTracks Android"}},
		{"preset owntracks\n answers {\n suppressed 200 application/json `[{\"result\":\"ok\"}]`\n }", []string{"suppressed: OwnTracks Android"}},
		{"preset owntracks\n answers {\n suppressed 200 application/json `[\"duplicate\"]`\n }", []string{"suppressed: OwnTracks Android"}},
		{"preset owntracks\n answers {\n suppressed 200 application/json `[[]]`\n }", []string{"suppressed: OwnTracks Android"}},
		{"preset owntracks\n answers {\n suppressed 200 text/plain []\n in_flight 503 2\n }", nil}, // Android parses the body whatever its type
		{"preset owntracks\n answers {\n suppressed 200 text/plain \"\ufeff[]\"\n }", nil},         // OkHttp drops a byte order mark (helper 4)
		{"preset owntracks\n answers {\n suppressed 200 application/json `{\"_type\":\"status\"}`\n }", nil},
		// Android acts on a cmd, transition or clear message at each answer
		// (MessageProcessor.kt): a reportLocation cmd in a parked phone's
		// suppressed answer has it report, be suppressed and report again.
		// (Helper 4's review, stop 62.)
		{"preset owntracks\n answers {\n suppressed 200 application/json `[{\"_type\":\"status\"},{\"_type\":\"cmd\",\"action\":\"reportLocation\"}]`\n }", []string{"suppressed: OwnTracks Android acts on a \"cmd\""}},
		{"preset owntracks\n answers {\n dead_lettered 200 application/json `{\"_type\":\"transition\",\"event\":\"enter\"}`\n }", []string{"dead_lettered: OwnTracks Android acts on a \"transition\""}},
		{"preset owntracks\n answers {\n suppressed 200 application/json `[{\"_type\":\"location\",\"lat\":52.5,\"lon\":13.4,\"tst\":1}]`\n }", nil}, // a contact's place, kept
		{"preset overland\n answers {\n suppressed 200 application/json []\n }", []string{"suppressed: Overland"}},
		{"preset overland\n answers {\n suppressed 200 text/plain `{\"result\":\"ok\"}`\n }", []string{"suppressed: Overland"}},
		{"preset overland\n answers {\n suppressed 200 application/json `{\"result\":\"okay\"}`\n }", []string{"suppressed: Overland"}},
		{"preset overland\n answers {\n dead_lettered 202\n }", []string{"dead_lettered: Overland"}}, // the JSON report
		// GLManager.m:237 sends isEqualToString: to result, 243-245
		// objectForKey: to geocode: another type crashes the app before
		// the batch is deleted. (Helper 1's review, stop 62.)
		{"preset overland\n answers {\n suppressed 200 application/json `{\"result\":\"ok\",\"geocode\":\"duplicate\"}`\n }", []string{"suppressed: Overland"}},
		{"preset overland\n answers {\n suppressed 200 application/json `{\"result\":1}`\n }", []string{"suppressed: Overland"}},
		{"preset overland\n answers {\n suppressed 200 application/json `{\"result\":\"ok\",\"geocode\":{\"full_name\":\"\"}}`\n }", nil},
		{"preset overland\n answers {\n suppressed 200 application/json `{\"result\":\"ok\",\"geocode\":null}`\n }", nil},
		// Traccar Client 9's SDK (Transistorsoft 4.x, http_event.dart)
		// deletes a record only on 200, 201 or 204. (Helper 1's review.)
		{"preset osmand\n answers {\n dead_lettered 202\n }", []string{"dead_lettered: Traccar Client 9"}},
		{"preset osmand\n answers {\n suppressed 203\n dead_lettered 201\n }", []string{"suppressed: Traccar Client 9"}},
		{"preset overland\n answers {\n suppressed 200 application/json `{\"result\":\"ok\",\"dedup\":true}`\n in_flight 429 5\n }", nil},
		{"preset osmand\n answers {\n suppressed 204\n in_flight 409 2\n }", nil},
		{"answers {\n suppressed 204\n in_flight 409 2\n }", nil},
	} {
		s := resolvedBlock(t, tt.block)
		if len(s.misreadAnswers) != len(tt.want) {
			t.Errorf("%q: named %q, want answers starting %q", tt.block, s.misreadAnswers, tt.want)
			continue
		}
		for i, got := range s.misreadAnswers {
			if !strings.HasPrefix(got, tt.want[i]) {
				t.Errorf("%q: named %q, want it to start %q", tt.block, got, tt.want[i])
			}
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

// A dead letter answered 204 or 205 without a body of its own carries no
// body: either with a non-zero Content-Length is a protocol error to
// OkHttp (the OwnTracks Android app's client), which fails the call, and
// the app then resends the message forever. The handler wrote its JSON
// report under them (helper 2's finding).
func TestADeadLetterAnsweredWithoutContentCarriesNoBody(t *testing.T) {
	for _, status := range []int{http.StatusNoContent, http.StatusResetContent} {
		h := new(Handler)
		if err := json.Unmarshal(fmt.Appendf(nil, `{"answers":{"dead_lettered":{"status":%d}}}`, status), h); err != nil {
			t.Fatal(err)
		}
		s, err := h.resolve()
		if err != nil {
			t.Fatal(err)
		}
		rej, _ := rejectionFor(&ping.InvalidPingError{Field: "lat", Rule: ping.RuleRange})
		w := httptest.NewRecorder()
		s.answers.writeDeadLettered(w, rej)
		length := map[int]string{http.StatusNoContent: "", http.StatusResetContent: "0"}[status] // a 204 has none (RFC 9110)
		if w.Code != status || w.Body.Len() != 0 || w.Header().Get("Content-Length") != length || w.Header().Get("Content-Type") != "" {
			t.Errorf("answered %d with %v and %q; want %d with no body or Content-Type, and Content-Length %q", w.Code, w.Header(), w.Body, status, length)
		}
		if w.Header().Get(headerReason) != string(ping.RuleRange) {
			t.Errorf("%d: X-Dedup-Reason %q, want the rule %q", status, w.Header().Get(headerReason), ping.RuleRange)
		}
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

// The OwnTracks Recorder stores a location whatever its tst (recorder.c,
// handle_message, at owntracks/recorder ae2fd29), and the apps handle a
// refusal badly: Android re-queues a non-2xx at the head of its queue and
// sends it again until it goes through, so every later location waits
// behind it (MessageProcessor.sendAvailableMessages); iOS deletes it and
// alerts the user (Connection.m). A phone whose clock runs ten minutes
// fast writes every location ahead of the server's clock: such a location
// goes on to the backend unkeyed, as it would without Caddy, the rule in
// X-Dedup-Reason.
//
// The bodies are testdata/senders' owntracks-android/location_http_composed.json
// (composed from owntracks/android's HttpMessageProcessorEndpoint.kt and
// MessageLocation.kt, EPL-1.0) and owntracks-ios/location_http_composed.json
// (composed from owntracks/ios's OwnTracking.m and Connection.m, MIT),
// their tst written by a clock ten minutes fast.
func TestOwnTracksLocationsFromAClockAheadReachTheBackend(t *testing.T) {
	tester := tableHandler(t, `{"preset":"owntracks"}`)
	ahead := time.Now().Add(10 * time.Minute).Unix()
	for _, file := range []string{"owntracks-android/location_http_composed.json", "owntracks-ios/location_http_composed.json"} {
		sample, err := os.ReadFile(filepath.Join("testdata", "senders", file))
		if err != nil {
			t.Fatal(err)
		}
		body := regexp.MustCompile(`"tst":\d+`).ReplaceAll(sample, fmt.Appendf(nil, `"tst":%d`, ahead))
		for attempt := range 2 {
			sent := len(tester.upstream)
			res := tester.post(string(body), "application/json", nil)
			if res.status != http.StatusCreated || res.header.Get("X-Dedup") != "skipped" || res.header.Get("X-Dedup-Reason") != "max_future" {
				t.Fatalf("%s, attempt %d: %d %q %q %s; want the backend's 201, skipped for max_future",
					file, attempt+1, res.status, res.header.Get("X-Dedup"), res.header.Get("X-Dedup-Reason"), res.body)
			}
			if len(tester.upstream) != sent+1 || !bytes.Equal(tester.upstream[sent], body) {
				t.Fatalf("%s, attempt %d: the backend did not get the location as sent", file, attempt+1)
			}
		}
	}
}

// Fixes a clock running ahead stamped beyond max_future were refused: in a
// batch with other records they were left out of what the backend got,
// and lost when the app deleted the batch on the backend's
// {"result":"ok"}; a batch of such fixes alone was 422 at every send
// interval, the app's queue standing behind it for good. Its backends
// store whatever time a fix has, so such fixes go on unkeyed.
func TestOverlandFixesFromAClockAheadReachTheBackend(t *testing.T) {
	tester := tableHandler(t, `{"preset":"overland"}`)
	sample, err := os.ReadFile(filepath.Join("testdata", "senders", "overland", "batch_composed.json"))
	if err != nil {
		t.Fatal(err)
	}
	ahead := time.Now().UTC().Add(10 * time.Minute).Format(time.RFC3339)
	body := regexp.MustCompile(`"timestamp": "[^"]+"`).ReplaceAll(sample, fmt.Appendf(nil, `"timestamp": %q`, ahead))
	for attempt := range 2 {
		sent := len(tester.upstream)
		res := tester.post(string(body), "application/json", nil)
		if res.status != http.StatusCreated || res.header.Get("X-Dedup") != "skipped" {
			t.Fatalf("attempt %d: %d %q %q %s; want the backend's 201, skipped", attempt+1,
				res.status, res.header.Get("X-Dedup"), res.header.Get("X-Dedup-Reason"), res.body)
		}
		if len(tester.upstream) != sent+1 || !bytes.Equal(tester.upstream[sent], body) {
			t.Fatalf("attempt %d: the backend did not get the batch as sent", attempt+1)
		}
	}
}

// OwnTracks posts each message whole, one a request, and its largest are
// not locations: an iOS card, whose face is a 192×192 PNG in base64 (up to
// about 197 KB; CreateCardTVC.swift:71-80, SettingsTVC.swift:836-857 at
// owntracks/ios 285f915), a location with a photo (AttachPhotoTVC.swift:51-59),
// Android's waypoints export, about 100 bytes a region
// (LocationProcessor.kt:248-266 at owntracks/android 25c27be). They pass
// through untouched, but are read first, within max_body, and Android
// re-queues a refused message at the head of its queue for good
// (MessageProcessor.kt:262-315): one 413 stopped every later location of
// the phone, and iOS deleted the card with an alert. A max_body they do not
// fit is refused at load, saying so; at the floor the largest card goes
// through.
func TestOwnTracksNeedsAMaxBodyItsLargestMessagesFit(t *testing.T) {
	for _, tt := range []struct{ config, want string }{
		{`{"preset":"owntracks","max_body":65536}`, "max_body: 65536 bytes is below the 262144 (256 KiB) that OwnTracks' largest messages need"},
		{`{"preset":"owntracks","max_body":262143}`, "max_body: 262143 bytes is below the 262144"},
		{`{"preset":"owntracks","max_body":262144}`, ""},
		{`{"preset":"owntracks"}`, ""},
		{`{"preset":"overland","max_body":65536}`, ""}, // its batch size is the app's setting, which the 413 names
		{`{"max_body":65536}`, ""},
	} {
		h := new(Handler)
		if err := json.Unmarshal([]byte(tt.config), h); err != nil {
			t.Fatal(err)
		}
		_, err := h.resolve()
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("%s: got %v, want %q", tt.config, err, tt.want)
		}
	}
	// The fix the error names, as the Caddyfile writes it, loads.
	if _, err := parse(t, "telemetry_dedup {\n\tpreset owntracks\n\tmax_body 256KiB\n}"); err != nil {
		t.Errorf("max_body 256KiB under preset owntracks: %v", err)
	}

	tester := tableHandler(t, `{"key_prefix":"owntracks-card:","preset":"owntracks","max_body":262144}`)
	// The largest PNG of 192×192 RGBA: every pixel stored, a filter byte a
	// row, and the chunks around them.
	face := make([]byte, 192*192*4+192+1024)
	card := fmt.Sprintf(`{"_type":"card","face":%q,"name":"Jane Doe"}`, base64.StdEncoding.EncodeToString(face))
	res := tester.post(card, "application/json", nil)
	if res.status != http.StatusCreated || len(tester.upstream) != 1 || string(tester.upstream[0]) != card {
		t.Fatalf("a %d-byte card at max_body 256KiB: %d %s, %d forwarded; want it forwarded as sent", len(card), res.status, res.body, len(tester.upstream))
	}
}

// OwnTracks Android's ping (t p, SendLocationPingWorker, every 15 minutes
// at least) publishes the fix it last published again, with the same tst
// and coordinates and a new created_at: a parked phone in the default
// significant mode sends nothing else. Keyed as that fix, each ping was a
// redelivery for the whole TTL (6 h 30 min) and answered with the
// handler's own [], and in HTTP mode, where friends' locations and queued
// commands come only in the answer to a post, the phone heard nothing for
// hours. Each ping now goes upstream once, and its retry is still a
// redelivery.
func TestOwnTracksPingsOfAParkedPhoneReachTheBackend(t *testing.T) {
	sample, err := os.ReadFile(filepath.Join("testdata", "senders", "owntracks-android", "location_http_composed.json"))
	if err != nil {
		t.Fatal(err)
	}
	tst := time.Now().Add(-time.Hour).Unix()
	message := func(trigger string, createdAt int64) string {
		body := regexp.MustCompile(`"tst":\d+`).ReplaceAll(sample, fmt.Appendf(nil, `"tst":%d`, tst))
		body = regexp.MustCompile(`"created_at":\d+`).ReplaceAll(body, fmt.Appendf(nil, `"created_at":%d`, createdAt))
		return strings.Replace(string(body), `"t":"p"`, trigger, 1)
	}
	for _, shape := range []string{"tumbling", "sliding", "session"} {
		t.Run(shape, func(t *testing.T) {
			tester := tableHandler(t, `{"preset":"owntracks","shape":"`+shape+`"}`)
			if res := tester.post(message(`"t":"t"`, tst), "application/json", nil); res.status != http.StatusCreated {
				t.Fatalf("the fix: %d %q, want the backend's 201", res.status, res.header.Get("X-Dedup"))
			}
			for minutes := int64(15); minutes <= 45; minutes += 15 {
				ping := message(`"t":"p"`, tst+minutes*60)
				sent := len(tester.upstream)
				res := tester.post(ping, "application/json", nil)
				if res.status != http.StatusCreated || len(tester.upstream) != sent+1 || string(tester.upstream[sent]) != ping {
					t.Errorf("the ping %d min after the fix: %d %q %q, want the backend's 201 and the ping as sent",
						minutes, res.status, res.header.Get("X-Dedup"), res.header.Get("X-Dedup-Reason"))
				}
				res = tester.post(ping, "application/json", nil)
				if res.status != http.StatusOK || res.header.Get("X-Dedup-Reason") != "redelivery" || len(tester.upstream) != sent+1 {
					t.Errorf("the ping's retry: %d %q %q, want 200 suppressed as a redelivery", res.status,
						res.header.Get("X-Dedup"), res.header.Get("X-Dedup-Reason"))
				}
			}
		})
	}
}

// OwnTracks iOS publishes its last fix again, with t "v" and a later
// created_at, when iOS reports a visit (OwnTracksAppDelegate.m,
// visitLocation): nothing in it is new to the backend, so where the fix went
// through already it is suppressed as the fix's redelivery, answered [] as
// the app counts delivered, in every shape (README, Events and states).
func TestAnOwnTracksIOSVisitRepublishingAFixIsSuppressedAsItsRedelivery(t *testing.T) {
	sample, err := os.ReadFile(filepath.Join("testdata", "senders", "owntracks-ios", "location_http_composed.json"))
	if err != nil {
		t.Fatal(err)
	}
	tst := time.Now().Add(-time.Hour).Unix()
	message := func(trigger string, createdAt int64) string {
		body := regexp.MustCompile(`"tst":\d+`).ReplaceAll(bytes.TrimSpace(sample), fmt.Appendf(nil, `"tst":%d`, tst))
		body = regexp.MustCompile(`"created_at":\d+`).ReplaceAll(body, fmt.Appendf(nil, `"created_at":%d`, createdAt))
		return strings.Replace(string(body), `"t":"u",`, trigger, 1)
	}
	fix, visit := message("", tst), message(`"t":"v",`, tst+20*60) // a location update carries no t
	for _, shape := range []string{"tumbling", "sliding", "session"} {
		t.Run(shape, func(t *testing.T) {
			tester := tableHandler(t, `{"preset":"owntracks","shape":"`+shape+`"}`)
			if res := tester.post(fix, "application/json", nil); res.status != http.StatusCreated {
				t.Fatalf("the fix: %d %q, want the backend's 201", res.status, res.header.Get("X-Dedup"))
			}
			res := tester.post(visit, "application/json", nil)
			if res.status != http.StatusOK || res.header.Get("X-Dedup-Reason") != "redelivery" || res.body != "[]" || len(tester.upstream) != 1 {
				t.Errorf("the visit republishing the fix: %d %q %q %q, upstream reached %d times; want 200 [] suppressed as a redelivery, once",
					res.status, res.header.Get("X-Dedup"), res.header.Get("X-Dedup-Reason"), res.body, len(tester.upstream))
			}
		})
	}
}

// The README: "A value written `""`, or a quoted `{$VARIABLE}` that is not
// set, is refused with its line rather than read as left out". An answer's
// content type written "" (answers { suppressed 200 "{$ANSWER_TYPE}"
// `{"result":"ok"}` } with the variable unset) is read as left out: the
// answer goes without a Content-Type, and Overland, which counts as
// delivered only a JSON-typed {"result":"ok"} (README, Senders), resends
// the batch forever.
func TestAnEmptyAnswerContentTypeIsRefused(t *testing.T) {
	for _, kind := range []string{"suppressed", "dead_lettered"} {
		input := "telemetry_dedup {\n\tpreset overland\n\tanswers {\n\t\t" + kind + " 200 \"\" `{\"result\":\"ok\"}`\n\t}\n}"
		if kind == "dead_lettered" {
			input = strings.Replace(input, " 200 ", " 202 ", 1)
		}
		_, err := parse(t, input)
		if err == nil {
			t.Errorf("answers { %s <status> \"\" <body> } loaded: the answer goes without a Content-Type, as if the type were left out", kind)
			continue
		}
		if !strings.Contains(err.Error(), "Testfile:4") {
			t.Errorf("%s with an empty content type: error %q does not name line 4", kind, err)
		}
	}
}

// An answer the handler gives itself typed application/json goes out with
// whatever body the line has: none (suppressed 200 application/json, the
// [] forgotten) or JSON cut short by a typo. The README's Senders table
// says what that does: OwnTracks Android 2.5.7-2.5.9 retries "a 2xx with
// an empty or other body: forever, at the head of its queue", and Overland
// counts as delivered only a JSON object with "result":"ok", resending the
// batch otherwise. The answers are checked so that a sender does not
// resend forever (a suppressed answer that is not a 2xx is refused for
// that); a JSON answer that is not JSON does the same and loads.
func TestAJSONAnswerWithoutAJSONBodyIsRefused(t *testing.T) {
	for _, tt := range []struct{ preset, line string }{
		{"owntracks", "suppressed 200 application/json"},
		{"overland", "suppressed 200 application/json `{\"result\":\"ok\"`"},
		{"owntracks", "dead_lettered 202 application/json `[`"},
	} {
		input := "telemetry_dedup {\n\tpreset " + tt.preset + "\n\tanswers {\n\t\t" + tt.line + "\n\t}\n}"
		_, err := parse(t, input)
		if err == nil {
			t.Errorf("preset %s, answers { %s } loaded: the answer is typed JSON and its body is not JSON", tt.preset, tt.line)
			continue
		}
		if !strings.Contains(err.Error(), "Testfile:4") {
			t.Errorf("%s: error %q does not name line 4", tt.line, err)
		}
	}
}

// A suppressed answer of 204 (or 205) typed application/json, as many
// backends answer, loaded before 10ca1da and is harmless: the status
// carries no body (RFC 9110 15.3.5, 15.3.6), so no client reads one, and
// writeJSON and bodyAnswer.write send none. 10ca1da refuses it as "JSON
// without a JSON body", advising "give a JSON body" — which the very next
// rule refuses ("status 204 carries no body"). A dead_lettered 204 or 205
// typed JSON is refused as "the answer is then the JSON report ... give a
// body too", which since 3af40f5 it is not, and the body is refused too.
// Either the line loads, or the advice it gives leads to a config that
// loads.
func TestANoContentAnswerTypedJSONLoadsOrItsAdviceDoes(t *testing.T) {
	for _, status := range []string{"204", "205"} {
		for _, line := range []string{
			"suppressed " + status + " application/json",
			"suppressed " + status + " application/json ``",
			// "the answer is then the JSON report ... give a body too":
			// since 3af40f5 a 204 or 205 dead_lettered answer has no report.
			"dead_lettered " + status + " application/json",
		} {
			load := func(line string) error {
				h, err := parse(t, "telemetry_dedup {\n\tanswers {\n\t\t"+line+"\n\t}\n}")
				if err == nil {
					_, err = h.resolve()
				}
				return err
			}
			err := load(line)
			if err == nil {
				continue
			}
			if !strings.Contains(err.Error(), "give a JSON body") && !strings.Contains(err.Error(), "give a body too") {
				continue
			}
			kind, _, _ := strings.Cut(line, " ")
			advised := kind + " " + status + " application/json `[]`"
			if err2 := load(advised); err2 != nil {
				t.Errorf("answers { %s } is refused: %v\nand its advice, answers { %s }, is refused too: %v", line, err, advised, err2)
			}
		}
	}
}

// The OsmAnd protocol's speed is knots, and preset osmand reads it so from
// every request, a tracker sending a true HDOP and no accuracy included (the
// Arduino TraccarClient library: &hdop=..., speed in knots). The OsmAnd
// app sends m/s with the same fields (helper 6), so the README gives its
// phones a route of their own with speed_unit m/s, which reads its speed
// right (helper 8: telling the app apart by hdop without accuracy misread
// those trackers' knots).
func TestOsmAndSpeedIsKnotsButOnARouteThatSaysMetresPerSecond(t *testing.T) {
	now := time.Now().UTC()
	query := fmt.Sprintf("id=4711&lat=48.85683&lon=2.292713&timestamp=%d&hdop=1.20&speed=4.0", now.Add(-time.Minute).Unix())
	for _, tt := range []struct {
		config string
		want   float64 // m/s
	}{
		{`{"preset":"osmand"}`, 4 * 1852.0 / 3600},
		{`{"preset":"osmand","speed_unit":"m/s"}`, 4},
	} {
		h := new(Handler)
		if err := json.Unmarshal([]byte(tt.config), h); err != nil {
			t.Fatal(err)
		}
		s, err := h.resolve()
		if err != nil {
			t.Fatal(err)
		}
		batch, err := s.formParser.SplitForm(query, nil)
		if err != nil {
			t.Fatal(err)
		}
		p, err := s.formParser.Parse(batch.Elements[0], now)
		if err != nil || !p.HasSpeed || math.Abs(p.Speed-tt.want) > 1e-9 {
			t.Errorf("%s: speed=4.0 read as %v m/s (%v), want %v", tt.config, p.Speed, err, tt.want)
		}
	}
}

// An OwnTracks location whose tid is empty (Android) or blank (iOS) is
// keyed by its topic, which both apps send in HTTP mode, and passed on:
// its redelivery is then suppressed as any other's. Refused (422, rule
// required), Android put it back at the head of its queue and retried it
// for weeks, every later location waiting behind it, and iOS deleted it
// and alerted the user, location after location.
//
// Android (owntracks/android 25c27be): the tid preference keeps only
// letters and digits, `value.filter { Character.isLetterOrDigit(it)
// }.take(2)` (preferences/types/StringMaxTwoAlphaNumericChars.kt:23-25,
// applied on every read, PreferencesStore.kt:122-123), while the settings
// screen accepts any `input.isNotBlank() && input.length <= 2`
// (ui/preferences/ConnectionFragment.kt:70): a tid typed as "--", "!!" or
// an emoji is "", which LocationProcessor.kt:141 writes as "tid":"",
// beside the topic the HTTP endpoint makes visible; the app counts it
// valid (MessageLocation.kt:109-112, "timestamp > 0 &&
// (!trackerId.isNullOrEmpty() || visibleTopic.isNotEmpty())"), and a
// non-2xx answer re-queues it at the head (MessageProcessor.kt:284-302)
// up to 100,000 times (MessageLocation.kt:61). iOS (owntracks/ios
// 285f915, OwnTracking.m:617-619) sends the setting as typed, a space
// included; a 4xx makes Connection.m:542-566 delete the message and
// alert. (Helper 4's review, stop 61.)
func TestAnOwnTracksLocationWithAnEmptyOrBlankTidIsKeyedByItsTopic(t *testing.T) {
	for _, c := range []struct{ file, from, to string }{
		{"owntracks-android/location_http_composed.json", `"tid":"jp"`, `"tid":""`},
		{"owntracks-ios/location_http_composed.json", `"tid":"JJ"`, `"tid":" "`},
	} {
		sample, err := os.ReadFile(filepath.Join("testdata", "senders", c.file))
		if err != nil {
			t.Fatal(err)
		}
		body := strings.Replace(string(sample), c.from, c.to, 1)
		if body == string(sample) {
			t.Fatalf("%s: no %s to replace", c.file, c.from)
		}
		tester := tableHandler(t, `{"preset":"owntracks","max_past":315360000000000000}`) // samples of 2024 and 2025
		first := tester.post(body, "application/json; charset=utf-8", nil)
		again := tester.post(body, "application/json; charset=utf-8", nil)
		if first.status != http.StatusCreated || first.header.Get("X-Dedup") != "accepted" || len(tester.upstream) != 1 ||
			again.header.Get("X-Dedup") != "suppressed" {
			t.Errorf("%s with %s: answered %d %q (%s), then %q; upstream got %d bodies; want the backend's 201, accepted, "+
				"then its redelivery suppressed", c.file, c.to, first.status, first.header.Get("X-Dedup"),
				strings.TrimSpace(first.body), again.header.Get("X-Dedup"), len(tester.upstream))
		}
	}
}

// An Overland batch sent back whole (a fix of it still in flight: 503, nothing
// forwarded) is counted with each of its elements sent back, its visit
// record too: decisions_total counted the visit skipped/not_a_ping, passed
// on untouched, at every resend, though nothing of the batch reached the
// backend (README, Decisions: a skipped message goes upstream; sent_back
// is what the other pings of such a batch are counted).
//
// Setup: preset overland, memory store; the app's own batch
// (testdata/senders/overland/batch_composed.json: two fixes and a visit)
// dated two minutes ago; its first fix claimed and left in flight, then
// the batch posted twice. (Helper 3's review, stop 62.)
func TestARecordThatIsNoFixInABatchSentBackIsNotCountedPassedOn(t *testing.T) {
	tt := tableHandler(t, `{"preset":"overland","key_prefix":"sentbackvisit:"}`)
	sample, err := os.ReadFile(filepath.Join("testdata", "senders", "overland", "batch_composed.json"))
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now().UTC().Add(-2 * time.Minute)
	n := 0
	body := regexp.MustCompile(`"timestamp": "[^"]+"`).ReplaceAllFunc(sample, func([]byte) []byte {
		n++
		return fmt.Appendf(nil, `"timestamp": %q`, at.Add(time.Duration(n)*time.Second).Format(time.RFC3339))
	})
	var batch struct{ Locations []json.RawMessage }
	if err := json.Unmarshal(body, &batch); err != nil || len(batch.Locations) != 3 {
		t.Fatalf("the sample no longer holds two fixes and a visit: %v", err)
	}
	tt.claimInFlight(t, string(batch.Locations[0]))
	for attempt := 1; attempt <= 2; attempt++ {
		before := decisionCountsNow()
		res := tt.post(string(body), "application/json", nil)
		if res.status != http.StatusServiceUnavailable || res.header.Get("X-Dedup") != "in_flight" || len(tt.upstream) != 0 {
			t.Fatalf("attempt %d: %d X-Dedup %q, %d forwarded; want the batch sent back whole (503 in_flight, nothing forwarded)",
				attempt, res.status, res.header.Get("X-Dedup"), len(tt.upstream))
		}
		if got := decisionCountsNow().since(before); got["skipped/not_a_ping"] != 0 {
			t.Errorf("attempt %d: nothing went upstream, yet decisions_total counts %v (the visit counted skipped: passed on untouched)", attempt, got)
		}
		// The visit counts in flight with the rest (helper 4's review):
		// the counts add up to the batch.
		counted := 0
		for _, h := range []string{"X-Dedup-Accepted", "X-Dedup-Suppressed", "X-Dedup-Rejected", "X-Dedup-In-Flight"} {
			n, _ := strconv.Atoi(res.header.Get(h))
			counted += n
		}
		if counted != 3 {
			t.Errorf("attempt %d: the count headers add up to %d for a batch of 3: %v", attempt, counted, res.header)
		}
	}
}

// A batch of dead letters and duplicates under preset osmand is answered
// 200, the status the dead_lettered answer has there: Traccar Client 9
// (the Transistorsoft SDK 4.x) deletes a record only on 200, 201 or 204,
// and uploaded one answered 202 again at every sync. (Helper 4's review,
// stop 62.)
//
// Setup: preset osmand, real Redis, on_invalid dead_letter; a
// Transistorsoft ping sent alone, then a JSON array of its redelivery and
// an invalid ping (latitude 91).
func TestAnOsmAndBatchOfDeadLettersAndDuplicatesIsAnsweredAsTraccarClient9DeletesIt(t *testing.T) {
	rdb := redistest.Start(t)
	tt := tableHandler(t, fmt.Sprintf(`{"preset":"osmand","key_prefix":"osmand-dlq-batch:","on_invalid":"dead_letter",`+
		`"store":{"type":"redis","url":%q,"timeout":1000000000}}`, rdb.URL()))
	at := time.Now().UTC().Add(-2 * time.Minute).Format("2006-01-02T15:04:05.000Z")
	fix := func(lat string) string {
		return `{"location":{"timestamp":"` + at + `","coords":{"latitude":` + lat + `,"longitude":2.292713}},"device_id":"48241179"}`
	}
	if res := tt.post(fix("48.856826"), "application/json", nil); res.status != http.StatusCreated {
		t.Fatalf("the first ping: %d %q, want the upstream's 201", res.status, res.header.Get("X-Dedup"))
	}
	res := tt.post("["+fix("48.856826")+","+fix("91.5")+"]", "application/json", nil)
	if res.header.Get("X-Dedup-Suppressed") != "1" || res.header.Get("X-Dedup-Rejected") != "1" || len(tt.upstream) != 1 {
		t.Fatalf("setup: %d X-Dedup %q, suppressed %q, rejected %q, %d upstream; want one duplicate and one dead letter, nothing forwarded",
			res.status, res.header.Get("X-Dedup"), res.header.Get("X-Dedup-Suppressed"), res.header.Get("X-Dedup-Rejected"), len(tt.upstream))
	}
	if res.status != http.StatusOK {
		t.Errorf("a batch of a dead letter and a duplicate answered %d under preset osmand; Traccar Client 9 deletes only on 200, 201 or 204", res.status)
	}
}

// The status a refused suppressed or dead_lettered answer's error
// suggests loads without a warning under every preset: under osmand it
// suggested 202, which the warning then said Traccar Client 9 uploads
// again. (Helper 4's review, stop 62.)
func TestTheStatusARefusedAnswerSuggestsDrawsNoWarning(t *testing.T) {
	for _, preset := range []string{"", "owntracks", "overland", "osmand", "traccar"} {
		for _, kind := range []string{"suppressed", "dead_lettered"} {
			config := func(status string) []byte {
				return fmt.Appendf(nil, `{"preset":%q,"answers":{%q:{"status":%s}}}`, preset, kind, status)
			}
			h := new(Handler)
			if err := json.Unmarshal(config("302"), h); err != nil {
				t.Fatal(err)
			}
			_, refusal := h.resolve()
			m := regexp.MustCompile(`such as (\d+)`).FindStringSubmatch(fmt.Sprint(refusal))
			if m == nil {
				t.Fatalf("%q %s 302: refused with %v, suggesting no status", preset, kind, refusal)
			}
			h = new(Handler)
			if err := json.Unmarshal(config(m[1]), h); err != nil {
				t.Fatal(err)
			}
			s, err := h.resolve()
			if err != nil {
				t.Fatalf("%q %s: the suggested status %s is refused: %v", preset, kind, m[1], err)
			}
			if preset != "owntracks" && preset != "overland" && len(s.misreadAnswers) != 0 { // those two need a body too
				t.Errorf("%q %s: refused with %q; the suggested %s then warns: %q", preset, kind, refusal, m[1], s.misreadAnswers)
			}
		}
	}
}

// An OsmAnd request that carries its fix as location=lat,lon is a position
// to Traccar like lat and lon (OsmAndProtocolDecoder.java:130-134 at
// traccar 9e5c458; Traccar's own test takes "location=60.0,30.0" as one,
// OsmAndProtocolDecoderTest.java:62-63): it is keyed, and its retry is
// suppressed. It was passed on unkeyed, as a request with no position,
// so such a sender's every retry and parked report reached Traccar.
// (Helper 2's review, stop 63.)
func TestAnOsmAndFixSentAsLocationIsKeyedAndItsRetrySuppressed(t *testing.T) {
	tt := tableHandler(t, `{"preset":"osmand","key_prefix":"osmand-location:"}`)
	form := fmt.Sprintf("id=123456&timestamp=%d&location=60.0,%%2030.0", time.Now().Add(-time.Minute).Unix()) // a space, as Double.parseDouble takes it
	first := tt.post(form, "application/x-www-form-urlencoded", nil)
	retry := tt.post(form, "application/x-www-form-urlencoded", nil)
	if first.header.Get("X-Dedup") != "accepted" || retry.status != http.StatusOK || retry.header.Get("X-Dedup") != "suppressed" {
		t.Errorf("a fix sent as location=lat,lon was %s (%s), its retry %d %s; want accepted, then 200 suppressed",
			first.header.Get("X-Dedup"), first.header.Get("X-Dedup-Reason"), retry.status, retry.header.Get("X-Dedup"))
	}
	if len(tt.upstream) != 1 || string(tt.upstream[0]) != form {
		t.Errorf("Traccar got %q; want the one request, as it was sent", tt.upstream)
	}
}

// A tracker on Traccar's OsmAnd port that reports its ignition in only
// some requests (OsmAndProtocolDecoder.java:160-169 keeps ignition=false
// as the attribute), parked with the ignition off at one place every
// 30 s, is suppressed after its first request in sliding: a request
// without the ignition says nothing of it (README, Events and states).
// Every request was admitted: the preset's states are ignition,
// driverUniqueId and alarm, the alarm carried by every request (its
// absence a state too), and the print put the alarm in the ignition's
// half, so a request without the ignition changed that half. (Helper 2's
// review, stop 63.)
func TestAnOsmAndTrackerThatReportsItsIgnitionSometimesIsSuppressedWhileParked(t *testing.T) {
	for _, shape := range []string{"sliding", "session"} {
		tt := tableHandler(t, `{"preset":"osmand","shape":"`+shape+`","key_prefix":"osmand-ignition-`+shape+`:"}`)
		base := time.Now().UTC().Add(-10 * time.Minute).Truncate(time.Second)
		var admitted []int
		for i := range 8 {
			form := fmt.Sprintf("id=123456789012345&timestamp=%d&lat=40.7232948571&lon=-74.0061408571&speed=0.0", base.Add(time.Duration(i)*30*time.Second).Unix())
			if i%2 == 0 {
				form += "&ignition=false&rpm=0"
			}
			res := tt.post(form, "application/x-www-form-urlencoded", nil)
			if res.status != http.StatusOK && res.status != http.StatusCreated {
				t.Fatalf("%s: request %d answered %d %s", shape, i, res.status, res.body)
			}
			if i > 0 && res.header.Get("X-Dedup") == "accepted" {
				admitted = append(admitted, i)
			}
		}
		if len(admitted) > 0 {
			t.Errorf("%s: parked, the ignition off throughout, requests %v of 1-7 were admitted; a request without the ignition says nothing of it",
				shape, admitted)
		}
	}
}

// The position of an OsmAnd request is the one Traccar stores: it reads
// the fields in the order they first come (Netty's QueryStringDecoder
// keeps them in a LinkedHashMap), each value in turn, lat and lon setting
// their coordinate and location=lat,lon both (value.split(","), parts
// beyond two ignored, trailing empty ones dropped), the last deciding.
// location was read only alone, once and of two parts: a third part was
// answered 422, a location after lat and lon was ignored (a 130 km move
// suppressed as jitter of lat/lon), and one given twice passed on
// unkeyed. (Helper 5's review, stop 63.)
func TestAnOsmAndRequestIsKeyedAtThePositionTraccarStores(t *testing.T) {
	now := time.Now().Add(-time.Minute).Unix()
	for i, tt := range []struct {
		fields string // besides id and timestamp
		lat    float64
	}{
		{"location=60.0,30.0,120", 60},
		{"location=60.0,30.0,", 60},
		{"location=60.0,30.0&location=60.0,30.0", 60},
		{"location=59.0,30.0&location=60.0,30.0", 60},
		{"lat=52.52&lon=13.4&location=60.0,30.0", 60},
		{"lat=52.52&location=60.0,30.0", 60},
		{"location=60.0,30.0&lat=61.0", 61},
		{"lat=52.52&lon=13.4", 52.52},
		// Double.parseDouble trims what is up to a space and takes a
		// leading +: a form's + is a space. (Helper 7's review, stop 63.)
		{"lat=+52.52&lon=13.4", 52.52},
		{"lat=%2B52.52&lon=%2013.4", 52.52},
		{"location=+60.0,+30.0", 60},
	} {
		tt2 := tableHandler(t, fmt.Sprintf(`{"preset":"osmand","key_prefix":"osmand-position-%d:"}`, i))
		form := fmt.Sprintf("id=123456&timestamp=%d&%s", now, tt.fields)
		first := tt2.post(form, "application/x-www-form-urlencoded", nil)
		retry := tt2.post(form, "application/x-www-form-urlencoded", nil)
		if first.header.Get("X-Dedup") != "accepted" || retry.header.Get("X-Dedup") != "suppressed" || len(tt2.upstream) != 1 || string(tt2.upstream[0]) != form {
			t.Errorf("%s: %d %s (%s), its retry %s, upstream %q; want accepted, the retry suppressed, the one request passed on as sent",
				tt.fields, first.status, first.header.Get("X-Dedup"), first.body, retry.header.Get("X-Dedup"), tt2.upstream)
			continue
		}
		p, err := tt2.h.settings.formParser.Extract(mustFormLine(t, tt2.h, form))
		if err != nil || p.Lat != tt.lat {
			t.Errorf("%s: read at latitude %v (%v); Traccar stores %v", tt.fields, p.Lat, err, tt.lat)
		}
	}
}

// mustFormLine is form's fields as the handler's form parser reads them.
func mustFormLine(t *testing.T, h *Handler, form string) []byte {
	t.Helper()
	element, err := h.settings.formParser.FormLine(form)
	if err != nil {
		t.Fatal(err)
	}
	return element
}

// Overland's Locations per Batch goes up to 1000 (GLManager.m), and a batch
// answered 413 is resent whole at every send interval: a max_batch below
// it under preset overland is warned of at load, so that a phone set to a
// larger batch does not stop sending unnoticed.
func TestAnOverlandMaxBatchBelowTheAppsLargestBatchIsWarnedOf(t *testing.T) {
	for _, tt := range []struct {
		block string
		warn  bool
	}{
		{"preset overland", false},
		{"preset overland\n max_batch 1000", false},
		{"preset overland\n max_batch 5000", false},
		{"preset overland\n max_batch 999", true},
		{"preset overland\n max_batch 200", true},
		{"preset owntracks\n max_batch 10", false},
		{"max_batch 10", false},
	} {
		if s := resolvedBlock(t, tt.block); s.overlandBatchShort != tt.warn {
			t.Errorf("%q: warned %v, want %v", tt.block, s.overlandBatchShort, tt.warn)
		}
	}
}

// overlandFix is what Overland iOS writes for one CLLocation.
type overlandFix struct {
	lat, lon                float64
	at                      time.Time
	accuracy, speed, course int // (int)round(...): -1 when iOS says invalid
	deviceID, uniqueID      string
}

// overlandFeature builds a Feature field for field as Overland iOS
// (aaronpk/Overland-iOS 5f2a5be) writes it: currentDictionaryFromLocation,
// GPSLogger/GLManager.m:1746-1769 (coordinates truncated to 7 decimals,
// speed, course and accuracies rounded to ints), addMetadataToUpdate,
// :1732-1744 (device_id only when one is set, :1734; unique_id only with
// "Include Unique ID in Logs", :1740-1743), the time as
// iso8601DateStringFromDate writes it, :2095-2105 ("%Y-%m-%dT%H:%M:%SZ").
func overlandFeature(f overlandFix) string {
	props := fmt.Sprintf(`"timestamp":%q,"altitude":15,"speed":%d,"course":%d,"horizontal_accuracy":%d,"vertical_accuracy":3,`+
		`"speed_accuracy":0.5,"course_accuracy":12.25,"motion":["stationary"]`,
		f.at.UTC().Format("2006-01-02T15:04:05Z"), f.speed, f.course, f.accuracy)
	if f.deviceID != "" {
		props += fmt.Sprintf(`,"device_id":%q`, f.deviceID)
	}
	props += `,"battery_state":"unplugged","battery_level":0.8`
	if f.uniqueID != "" {
		props += fmt.Sprintf(`,"unique_id":%q`, f.uniqueID)
	}
	return fmt.Sprintf(`{"type":"Feature","geometry":{"type":"Point","coordinates":[%v,%v]},"properties":{%s}}`, f.lon, f.lat, props)
}

// overlandBatch is the body sendQueueNow posts: {"locations":[...]}
// (GLManager.m:169-181; "current" and "trip" only sometimes).
func overlandBatch(features ...string) string {
	return `{"locations":[` + strings.Join(features, ",") + `]}`
}

// Overland's "Include Unique ID in Logs" setting (also set by its setup
// link, overland://setup?...&unique_id=yes) adds properties.unique_id, the
// phone's identifierForVendor, to every record (GLManager.m:1740-1743),
// which Overland's README (lines 104 and 239) offers as "a reliable way to
// identify unique devices"; device_id is written only when the user typed
// one (GLManager.m:1734). Under preset overland such a phone's batches are
// all refused 422 (field properties.device_id, rule required), and the app
// keeps and resends the same oldest batch at every send interval, forever
// (the failure callback, GLManager.m:283-287, deletes nothing; the queue
// is read oldest first, :146-157): nothing it records
// after them gets through. The preset should fall back to
// properties.unique_id, as owntracks falls back from tid to topic.
// (Helper 1's review, stop 64.)
func TestAnOverlandPhoneIdentifiedOnlyByItsUniqueIDIsKeyed(t *testing.T) {
	tt := tableHandler(t, `{"preset":"overland","key_prefix":"overland-uniqueid:"}`)
	at := time.Now().UTC().Add(-10 * time.Minute).Truncate(time.Second)
	body := overlandBatch(
		overlandFeature(overlandFix{lat: 45.5230622, lon: -122.6764971, at: at, accuracy: 5, speed: 0, course: -1, uniqueID: "E621E1F8-C36C-495A-93FC-0C247A3E6E5F"}),
		overlandFeature(overlandFix{lat: 45.5330622, lon: -122.6764971, at: at.Add(time.Minute), accuracy: 5, speed: 12, course: 0, uniqueID: "E621E1F8-C36C-495A-93FC-0C247A3E6E5F"}),
	)
	res := tt.post(body, "application/json", nil)
	if res.status != http.StatusCreated || res.header.Get("X-Dedup") != "accepted" {
		t.Fatalf("a batch of a phone with Unique ID on and no Device ID: %d X-Dedup %q %s; want both fixes keyed by properties.unique_id and "+
			"the batch forwarded (the backend's 201): Overland resends a refused batch forever", res.status, res.header.Get("X-Dedup"), res.body)
	}
	again := tt.post(body, "application/json", nil)
	if again.status != http.StatusOK || again.header.Get("X-Dedup") != "suppressed" || again.body != `{"result":"ok"}` {
		t.Fatalf("its redelivery: %d X-Dedup %q %q; want the suppressed answer Overland deletes the batch on", again.status, again.header.Get("X-Dedup"), again.body)
	}
}

// CLLocation's horizontalAccuracy is negative when "the latitude and
// longitude are invalid" (Apple's CLLocation docs), and speed negative
// when unknown. Overland filters neither: every location iOS delivers is
// queued (GLManager.m:1652-1699, no accuracy check), written with
// "horizontal_accuracy": (int)round(-1) = -1 and "speed": -1
// (GLManager.m:1760-1762). The preset reads -1 as "no accuracy reported"
// and keys the fix as a position (ping/fields.go measure). A parked
// phone's invalid fix at stale coordinates 2.2 km off is then accepted as
// where the phone went, and its valid fixes at home right after it are
// suppressed as jitter: the backend's latest point is the invalid one
// until the next window. The traccar preset skips a position the device
// marks invalid (position.valid false); Overland's mark is the negative
// accuracy, and such a Feature should be passed on unkeyed (skipped,
// not_a_ping), out of the track, as the app's backends get it anyway.
// (Helper 1's review, stop 64.)
func TestAnOverlandFixIOSMarksInvalidIsNotKeyedAsAPosition(t *testing.T) {
	tt := tableHandler(t, `{"preset":"overland","key_prefix":"overland-invalid:"}`)
	at := time.Now().UTC().Add(-60 * time.Minute).Truncate(5 * time.Minute)
	home := func(i int) string {
		return overlandFeature(overlandFix{lat: 45.5230622 + float64(i%3)*0.00002, lon: -122.6764971,
			at: at.Add(time.Duration(i) * 30 * time.Second), accuracy: 10, speed: 0, course: -1, deviceID: "phone1"})
	}
	var stay []string
	for i := range 6 { // a settled stay, one upload, in the first window
		stay = append(stay, home(i))
	}
	if res := tt.post(overlandBatch(stay...), "application/json", nil); res.status != http.StatusCreated {
		t.Fatalf("the stay: %d %s", res.status, res.body)
	}
	invalid := overlandFeature(overlandFix{lat: 45.5430622, lon: -122.6764971, at: at.Add(6 * 30 * time.Second),
		accuracy: -1, speed: -1, course: -1, deviceID: "phone1"})
	before := decisionCountsNow()
	sent := len(tt.upstream)
	res := tt.post(overlandBatch(invalid, home(7), home(8), home(9)), "application/json", nil)
	got := decisionCountsNow().since(before)
	var forwarded []string
	for _, b := range tt.upstream[sent:] {
		batch, err := ping.Splitter{Wrapper: "locations", Max: 1000}.Split(nil, b, false)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range batch.Elements {
			forwarded = append(forwarded, string(e))
		}
	}
	if got["skipped/not_a_ping"] != 1 {
		t.Fatalf("a Feature with horizontal_accuracy -1 and speed -1 (invalid to iOS) between fixes at home: %d, decisions %v, "+
			"upstream got %d element(s): %s; want it skipped (not_a_ping), passed on unkeyed, and the fixes at home after it "+
			"judged against the stay, not against it", res.status, got, len(forwarded), strings.Join(forwarded, " "))
	}
}

// Overland in its OwnTracks logging mode posts one OwnTracks message,
// {"_type":"location",...}, not {"locations":[...]} (GLManager.m,
// sendQueueNow: postData = locationUpdates[0] under
// kGLLoggingModeOwntracks). The 400 now says "leave batch out of a route
// that takes single pings", but with preset overland the wrapper is the
// preset's: a route without a batch option still has batch locations, so
// the advice changes nothing. It should name batch off or the app's
// logging mode / preset owntracks.
// (Helper 6's review, stop 64.)
func TestOverlandInOwnTracksModeIsToldAFixThatWorks(t *testing.T) {
	tt := tableHandler(t, `{"preset":"overland"}`)
	body := fmt.Sprintf(`{"_type":"location","lat":52.5,"lon":13.4,"tst":%d,"acc":5,"batt":80}`, time.Now().Unix()-60)
	res := tt.post(body, "application/json", nil)
	if res.status != http.StatusBadRequest {
		t.Fatalf("status %d %s", res.status, res.body)
	}
	if strings.Contains(res.body, "leave batch out") || !strings.Contains(strings.ToLower(res.body), "owntracks") && !strings.Contains(res.body, "batch off") {
		t.Errorf("preset overland answers an OwnTracks-mode post with %s: leaving batch out of the route changes nothing under preset overland; "+
			"name the app's logging mode (or preset owntracks), or batch off", res.body)
	}
}

// A latitude out of range is told it may be swapped with the longitude,
// and, read from a coordinate array, that GeoJSON writes [lon, lat]. The
// hint said "a projected grid's metres need crs", and named GeoJSON,
// to every sender.
// Under preset osmand (Traccar Client, OsmAnd: lat= and lon= fields, no
// GeoJSON) a projected crs is a load error ("preset osmand's senders
// always write WGS 84 degrees; remove crs", options.go): the hint sends
// the operator to an option the handler refuses. It fits only a route
// that may set crs (no preset, or geojson).
// (Helper 6's review, stop 64.)
func TestALatitudeOutOfRangeUnderAPresetDoesNotAdviseCrs(t *testing.T) {
	tt := tableHandler(t, `{"preset":"osmand"}`)
	r := httptest.NewRequest(http.MethodPost, fmt.Sprintf("/?id=abc&lat=123.4&lon=52.5&timestamp=%d", time.Now().Unix()-60), nil)
	r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, caddyhttp.NewTestReplacer(r)))
	w := httptest.NewRecorder()
	if err := tt.h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })); err != nil {
		t.Fatal(err)
	}
	if w.Code != http.StatusUnprocessableEntity {
		t.Fatalf("status %d %s", w.Code, w.Body)
	}
	if b := w.Body.String(); strings.Contains(b, "crs") || strings.Contains(b, "GeoJSON") {
		t.Errorf("an OsmAnd ping with lat=123.4 is answered %s: preset osmand refuses a projected crs at load, and its fields are no GeoJSON", b)
	}
	// Overland is GeoJSON, but refuses a projected crs all the same.
	ov := tableHandler(t, `{"preset":"overland"}`)
	at := time.Now().UTC().Add(-time.Hour).Format(time.RFC3339)
	res := ov.post(fmt.Sprintf(`{"locations":[{"type":"Feature","geometry":{"type":"Point","coordinates":[52.5,123.4]},"properties":{"timestamp":%q,"device_id":"p"}}]}`, at), "application/json", nil)
	if strings.Contains(res.body, "crs") {
		t.Errorf("an Overland Feature with latitude 123.4 is answered %s: preset overland refuses a projected crs at load", res.body)
	}
}

// getWithoutBody sends a GET with no body to the handler, as Traccar's URL
// forwarder (forward.type url, its default) and OsmAnd do.
func (tt *tableTester) getWithoutBody(target string) response {
	r := httptest.NewRequest(http.MethodGet, target, nil)
	repl := caddyhttp.NewTestReplacer(r)
	r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
	w := httptest.NewRecorder()
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		w.WriteHeader(http.StatusCreated)
		return nil
	})
	if err := tt.h.ServeHTTP(w, r, next); err != nil {
		return response{status: http.StatusInternalServerError, body: err.Error()}
	}
	return response{w.Code, w.Header(), w.Body.String()}
}

// README, Tracker formats, "Traccar forwarding (preset traccar)":
// "forward.type defaults to url, which GETs a URL template without a body:
// with this preset each such request is 400, its error naming
// forward.type". The URL forwarder's template holds the position as
// query fields (the README's own template, under "Traccar's URL
// forwarder": ?id={uniqueId}&timestamp=...&lat={latitude}&lon={longitude}...).
// Stop 65's first queryHoldsAPosition answered such a GET, before the
// preset's own empty-body error, with "the OsmAnd protocol, as OsmAnd and
// Traccar Client send it: read it with preset osmand, or encoding form":
// it named neither forward.type nor Traccar's forwarder. (Helper 4's
// review, stop 65.)
func TestTraccarURLForwarderGETStillNamesForwardType(t *testing.T) {
	tt := tableHandler(t, `{"key_prefix":"getforward:","preset":"traccar"}`)
	res := tt.getWithoutBody("/?id=123456789012345&timestamp=2026-12-07%2012:00:00&lat=52.52&lon=13.40&speed=0&accuracy=5&valid=true&statusCode=0xF020")
	if res.status != http.StatusBadRequest || !strings.Contains(res.body, "forward.type") {
		t.Errorf("preset traccar, the URL forwarder's GET: %d %s; want 400 naming forward.type (README, Traccar forwarding)", res.status, res.body)
	}
}

// With preset osmand the route already reads the OsmAnd protocol; with
// `encoding json` beside it (a route meant for Traccar Client 9's JSON),
// an older Traccar Client's or OsmAnd's GET was refused 400 with "read it
// with preset osmand, or encoding form": the first is what the route
// already has, the second would refuse every JSON body of the same route
// with the preset's own error. What reads both is encoding auto (the
// preset's default). (Helper 4's review, stop 65.)
func TestAnOsmAndRouteIsNotToldToUsePresetOsmAnd(t *testing.T) {
	tt := tableHandler(t, `{"key_prefix":"getosmand:","preset":"osmand","encoding":"json"}`)
	res := tt.getWithoutBody("/?id=358240051111110&timestamp=1733570000&lat=52.52&lon=13.40&speed=0&accuracy=5")
	if res.status != http.StatusBadRequest || strings.Contains(res.body, "preset osmand") || !strings.Contains(res.body, "encoding auto") {
		t.Errorf("preset osmand with encoding json, an OsmAnd GET: %d %s; want 400 saying to use encoding auto, not the preset the route has", res.status, res.body)
	}
}

// An OsmAnd timestamp whose offset is written with a bare + (a
// hand-written URL template) reaches the parser with a space there, as it
// reaches Traccar's decoder: a + in a query string is a space. The sender
// wrote RFC 3339, and was told it had not; the answer now names the
// escape, and the time written as it says is read (helper 1's review, stop
// 66), also where the template's + for the T became a space too; a JSON
// body, which is not percent-decoded, is told to write the + itself
// (helper 5's review).
func TestAnOffsetWrittenWithABarePlusIsToldToEscapeIt(t *testing.T) {
	at := time.Now().Add(-time.Hour).In(time.FixedZone("", 2*3600))
	date, clock := at.Format("2006-01-02"), at.Format("15:04:05")
	// The rows' fixes are alike: each row keys its own (prefix).
	get := func(prefix, timestamp string) response {
		return tableHandler(t, `{"key_prefix":"`+prefix+`:","preset":"osmand"}`).
			getWithoutBody("/?id=358240051111110&timestamp=" + timestamp + "&lat=52.52&lon=13.40&speed=0&accuracy=5")
	}
	post := func(prefix, occurredAt string) response {
		return tableHandler(t, `{"key_prefix":"`+prefix+`:"}`).
			post(`{"asset_id":"veh-88","occurred_at":"`+occurredAt+`","lat":52.52,"lon":13.40}`, "application/json", nil)
	}
	for i, tc := range []struct {
		name          string
		send          func(prefix, timestamp string) response
		sent, advised string
	}{
		{"a query's offset", get, date + "T" + clock + "+02:00", date + "T" + clock + "%2B02:00"},
		{"a query's offset and T", get, date + "+" + clock + "+02:00", date + "T" + clock + "%2B02:00"},
		{"a JSON body's offset", post, date + "T" + clock + " 02:00", date + "T" + clock + "+02:00"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := "bareplus" + strconv.Itoa(i)
			res := tc.send(prefix, tc.sent)
			if res.status != http.StatusUnprocessableEntity || !strings.Contains(res.body, "%2B") {
				t.Fatalf("timestamp %s: %d %s; want 422 naming the escape", tc.sent, res.status, res.body)
			}
			if got := tc.send(prefix, tc.advised); got.status != http.StatusCreated {
				t.Errorf("the time written as advised, %s: %d %s; want 201", tc.advised, got.status, got.body)
			}
		})
	}
}

// The same fields POSTed as a form body (the Traccar Client SDK's upload,
// HttpUploader.kt) to a route that reads JSON bodies get the GET's advice,
// and a route with encoding auto that read them as JSON (their
// Content-Type said so) is told of the Content-Type: the parser's own fix
// ("use preset osmand, else encoding form") told the first what would not
// load or would pass its own senders on unkeyed, and the second to add the
// preset it has (helper 1's review, stop 66), or, without a preset, that
// it reads JSON bodies (helper 5's). Each advice, followed, reads the
// body. A body that is not form encoded (XML, whose attributes hold =, or
// padded base64, or a lone &) is not told to use a form reader.
func TestAFormBodyOnAJSONRouteIsToldWhatReadsIt(t *testing.T) {
	const form, json, osmandRoute = "application/x-www-form-urlencoded", "application/json", `{"key_prefix":"formfollowed:","preset":"osmand"}`
	now := time.Now()
	osmandFields := "id=358240051111110&timestamp=" + strconv.FormatInt(now.Unix(), 10) + "&lat=52.5200087&lon=13.4049547&speed=0&accuracy=4"
	ownFields := "asset_id=veh-88&occurred_at=" + now.UTC().Format(time.RFC3339) + "&lat=52.52&lon=13.40"
	for _, tc := range []struct {
		config, body, contentType, want string
		followConfig, followType        string // the request that follows the advice
	}{
		{`{"key_prefix":"formjson:"}`, osmandFields, form, "a route of their own with preset osmand", osmandRoute, form},
		{`{"key_prefix":"formjson:","preset":"overland"}`, osmandFields, form, "a route of their own with preset osmand", osmandRoute, form},
		{`{"key_prefix":"formjson:","preset":"owntracks"}`, osmandFields, form, "a route of their own with preset osmand", osmandRoute, form},
		{`{"key_prefix":"formjson:","preset":"traccar"}`, osmandFields, form, "a route of their own with preset osmand", osmandRoute, form},
		{`{"key_prefix":"formjson:","preset":"osmand"}`, osmandFields, json, "without Content-Type: application/json", osmandRoute, form},
		{`{"key_prefix":"formjson:","preset":"osmand","encoding":"json"}`, osmandFields, form, "encoding auto", osmandRoute, form},
		{`{"key_prefix":"formjson:","encoding":"auto"}`, ownFields, json, "without Content-Type: application/json", `{"key_prefix":"formfollowed:","encoding":"auto"}`, form},
		// a trailing & (a URL template's), which the form reader passes over (helper 9's review)
		{`{"key_prefix":"formjson:"}`, osmandFields + "&", form, "a route of their own with preset osmand", osmandRoute, form},
	} {
		t.Run(tc.config+" "+tc.contentType, func(t *testing.T) {
			res := tableHandler(t, tc.config).post(tc.body, tc.contentType, nil)
			if res.status != http.StatusBadRequest || !strings.Contains(res.body, tc.want) || strings.Contains(res.body, "use preset osmand") {
				t.Fatalf("a form body: %d %s; want 400 saying %q, and not to use preset osmand", res.status, res.body, tc.want)
			}
			if got := tableHandler(t, tc.followConfig).post(tc.body, tc.followType, nil); got.status != http.StatusCreated {
				t.Errorf("following the advice, the same body: %d %s; want 201", got.status, got.body)
			}
		})
	}
	gpx := `<?xml version="1.0" encoding="UTF-8"?><gpx version="1.1"><wpt lat="52.52" lon="13.40"><name>veh-88</name></wpt></gpx>`
	for _, body := range []string{gpx, "eyJhc3NldF9pZCI6InZlaC04OCJ9fQ==", "&"} {
		if res := tableHandler(t, `{"key_prefix":"notform:"}`).post(body, json, nil); strings.Contains(res.body, "osmand") {
			t.Errorf("POST %.40s...: %d %s; it is not form encoded, and a route with preset osmand reads it no better", body, res.status, res.body)
		}
	}
}

// The advice an OsmAnd-protocol GET gets on a route that reads JSON bodies
// can be followed without harm to the route's own senders: a route of its
// own with preset osmand, which reads the same GET. Told encoding form, a
// route without a preset looked for asset_id and occurred_at, which the
// protocol has not (every fix 422), and one whose preset posts JSON only
// (overland, geojson) did not load (helper 5's review, stop 65); told to
// add preset osmand, a route without a preset read its own senders' JSON
// as Transistorsoft bodies and passed every one on unkeyed, duplicates
// included (helper 6's review). An OwnTracks route passes an empty body on
// as no ping, as it always did.
func TestAnOsmAndGETIsToldWhatReadsItOnThatRoute(t *testing.T) {
	get := "/?id=358240051111110&timestamp=" + strconv.FormatInt(time.Now().Unix(), 10) +
		"&lat=52.5200087&lon=13.4049547&speed=0&accuracy=4"
	for _, tc := range []struct {
		preset, want string
		status       int
	}{
		{"", "a route of their own with preset osmand", http.StatusBadRequest},
		{"overland", "a route of their own with preset osmand", http.StatusBadRequest},
		{"geojson", "a route of their own with preset osmand", http.StatusBadRequest},
		{"owntracks", "", http.StatusCreated},
	} {
		t.Run(cmp.Or(tc.preset, "no preset"), func(t *testing.T) {
			config := `{"key_prefix":"osmandget` + tc.preset + `:"`
			if tc.preset != "" {
				config += `,"preset":"` + tc.preset + `"`
			}
			res := tableHandler(t, config+"}").getWithoutBody(get)
			if res.status != tc.status || !strings.Contains(res.body, tc.want) || strings.Contains(res.body, "encoding form") {
				t.Fatalf("an OsmAnd GET: %d %s; want %d saying %q, and not encoding form", res.status, res.body, tc.status, tc.want)
			}
			if tc.status == http.StatusBadRequest {
				if got := tableHandler(t, `{"key_prefix":"osmandgetfollowed:","preset":"osmand"}`).getWithoutBody(get); got.status != http.StatusCreated {
					t.Errorf("following the advice (a route with preset osmand), the same GET: %d %s; want 201", got.status, got.body)
				}
			}
		})
	}
}
