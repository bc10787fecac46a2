package telemetrydedup

import (
	"context"
	"encoding/json"
	"fmt"
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
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
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

// A batch sent back whole (a ping of it still in flight, or the store down
// with on_store_error closed) comes back with its invalid pings: with
// on_invalid dead_letter they are dead-lettered once it gets through, and
// until then sent back with it, as its new pings are. Enforce counted them
// rejected at every return, so an outage looked like a flood of bad pings
// to an operator alerting on rejections, while shadow mode, which forwards
// the batch and writes their letters at once, counted them dead_lettered
// (or, the store down, unavailable/store_error). Both modes count them
// sent back now, and the answer still names the rule each broke.
func TestInvalidPingsOfABatchSentBackWholeAreSentBackWithIt(t *testing.T) {
	rdb := redistest.Start(t)
	at := time.Now().UTC().Add(-time.Hour).Format(time.RFC3339)
	held := fmt.Sprintf(`{"asset_id":"veh-held","occurred_at":%q,"lat":52.5,"lon":13.4}`, at)
	fresh := fmt.Sprintf(`{"asset_id":"veh-new","occurred_at":%q,"lat":48.1,"lon":11.6}`, at)
	naive := `{"asset_id":"veh-naive","occurred_at":"2026-08-08T12:00:00","lat":52.5,"lon":13.4}`
	for _, tt := range []struct {
		name    string
		options string
		inFlight,
		batch []string
		counts   string // in both modes
		decision dedup.Decision
		error    string           // the enforce answer's
		letters  map[string]int64 // written, by mode
	}{
		{"a ping in flight", fmt.Sprintf(`"store":{"type":"redis","url":%q}`, rdb.URL()), []string{held}, []string{fresh, held, naive},
			`{"in_flight/redelivery":1,"in_flight/sent_back":2}`, dedup.InFlight, "still being processed",
			map[string]int64{"enforce": 0, "shadow": 1}},
		{"the store down, failing closed", `"on_store_error":"closed","store":{"type":"redis","url":"redis://127.0.0.1:1/0","timeout":20000000,"breaker_failures":1000}`,
			nil, []string{fresh, naive},
			`{"unavailable/sent_back":1,"unavailable/store_error":1}`, decisionUnavailable, "on_store_error is closed", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			counts := map[string]string{}
			for _, mode := range []string{"enforce", "shadow"} {
				prefix := fmt.Sprintf("sentback-invalid:%s:%s:", strings.ReplaceAll(tt.name, " ", "-"), mode)
				h := tableHandler(t, fmt.Sprintf(`{"key_prefix":%q,"mode":%q,"on_invalid":"dead_letter",%s}`, prefix, mode, tt.options))
				for _, b := range tt.inFlight {
					h.claimInFlight(t, b)
				}
				before := decisionCountsNow()
				res := h.post(strings.Join(tt.batch, "\n")+"\n", "application/x-ndjson", nil)
				counts[mode] = decisionCountsNow().since(before).asEnforce().String()
				if n := rdb.Client().XLen(context.Background(), prefix+"dead_letter").Val(); n != tt.letters[mode] {
					t.Errorf("%s: %d letters written, want %d", mode, n, tt.letters[mode])
				}
				if mode == "shadow" {
					continue
				}
				var answer batchAnswer
				if err := json.Unmarshal([]byte(res.body), &answer); err != nil || len(answer.Elements) != len(tt.batch) {
					t.Fatalf("enforce answered %d %s: %v", res.status, res.body, err)
				}
				naive := answer.Elements[len(tt.batch)-1]
				if naive.Decision != tt.decision || naive.Rule != "timezone" || !strings.Contains(answer.Error, tt.error) ||
					res.header.Get("X-Dedup-Rejected") != "0" {
					t.Errorf("enforce answered %s (X-Dedup-Rejected %s); want the naive ping %s naming its rule, the error saying %q, none rejected",
						res.body, res.header.Get("X-Dedup-Rejected"), tt.decision, tt.error)
				}
			}
			if counts["enforce"] != tt.counts {
				t.Errorf("enforce counted %s; want %s", counts["enforce"], tt.counts)
			}
			if counts["shadow"] != counts["enforce"] {
				t.Errorf("shadow counted %s; enforce %s", counts["shadow"], counts["enforce"])
			}
		})
	}
}

// The store-error line says what the senders of the pings the store could
// not judge, or whose dead letters it could not write, got: 503 to send
// them again, or the upstream's answer, unchecked; in shadow mode always
// the upstream's answer, what enforce would have done only recorded. It
// said "applying on_store_error" and "answered 503" in shadow mode too,
// where no sender got a 503 (and so did the fix of a letter Redis refused);
// and in an outage the claims' line held back
// the dead letters' (one line per 10 s for both), so a batch answered 503
// for its invalid ping was logged as gone upstream unchecked.
func TestTheStoreErrorLineSaysWhatTheSendersGot(t *testing.T) {
	withoutXADD, takeXADD := urlWithoutXADD(t)
	down := `{"type":"redis","url":"redis://127.0.0.1:1/0","timeout":20000000,"breaker_failures":1000}`
	at := time.Now().UTC().Add(-time.Hour).Format(time.RFC3339)
	valid := fmt.Sprintf(`{"asset_id":"veh-line","occurred_at":%q,"lat":52.5,"lon":13.4}`, at)
	naive := `{"asset_id":"veh-line","occurred_at":"2026-08-08T12:00:00","lat":52.5,"lon":13.4}`
	cases := []struct {
		name, options, ping string
		status              int // what the sender got
		says                []string
	}{
		{"enforce, failing open", `"store":` + down, valid, http.StatusCreated,
			[]string{"go upstream unchecked", "on_store_error open"}},
		{"enforce, failing closed", `"on_store_error":"closed","store":` + down, valid, http.StatusServiceUnavailable,
			[]string{"answered 503", "on_store_error closed"}},
		{"shadow, failing open", `"mode":"shadow","store":` + down, valid, http.StatusCreated,
			[]string{"shadow mode forwarded", "unchecked"}},
		{"shadow, failing closed", `"mode":"shadow","on_store_error":"closed","store":` + down, valid, http.StatusCreated,
			[]string{"shadow mode forwarded", "recorded unavailable", "on_store_error closed"}},
		{"enforce, failing open, a batch with an invalid ping", `"on_invalid":"dead_letter","store":` + down, valid + "\n" + naive + "\n",
			http.StatusServiceUnavailable, []string{"go upstream unchecked", "answered 503", "sent back whole"}},
		{"enforce, a dead letter", fmt.Sprintf(`"on_invalid":"dead_letter","store":{"type":"redis","url":%q}`, withoutXADD), naive,
			http.StatusServiceUnavailable, []string{"answered 503"}},
		{"shadow, a dead letter", fmt.Sprintf(`"mode":"shadow","on_invalid":"dead_letter","store":{"type":"redis","url":%q}`, withoutXADD), naive,
			http.StatusCreated, []string{"shadow mode forwarded", "recorded unavailable"}},
	}
	handlers := make([]*tableTester, len(cases))
	for i, tt := range cases {
		handlers[i] = tableHandler(t, fmt.Sprintf(`{"key_prefix":"storeline:%d:",%s}`, i, tt.options))
	}
	takeXADD() // after the load, which would report it
	for i, tt := range cases {
		core, logs := observer.New(zap.WarnLevel)
		h := handlers[i].h
		observeStoreErrors(h, zap.New(core))
		contentType := "application/json"
		if strings.Contains(tt.ping, "\n") {
			contentType = "application/x-ndjson"
		}
		res := handlers[i].post(tt.ping, contentType, nil)
		var lines []string
		for _, e := range logs.All() {
			fix, _ := e.ContextMap()["fix"].(string)
			lines = append(lines, e.Message, fix)
		}
		said := strings.Join(lines, "\n")
		if res.status != tt.status {
			t.Errorf("%s: answered %d, want %d", tt.name, res.status, tt.status)
		}
		for _, want := range tt.says {
			if !strings.Contains(said, want) {
				t.Errorf("%s: the sender got %d, and the log says %q; want it to say %q", tt.name, res.status, said, want)
			}
		}
		if tt.status != http.StatusServiceUnavailable && strings.Contains(said, "answered 503") {
			t.Errorf("%s: the sender got %d, and the log says %q", tt.name, res.status, said)
		}
	}
}

// In shadow mode a batch that enforce would send back whole (a ping of it
// still in flight) is forwarded, and its invalid pings' letters are
// written at once, counted sent_back as enforce counts them. When those
// letters failed, the line said shadow mode had "recorded unavailable" and
// that enforce "would have answered them 503", neither of which happened:
// they were recorded sent_back, and enforce sends such a batch back without
// trying its letters. The line says what was recorded, and that the
// upstream has the pings the stream does not.
func TestShadowLogsAFailedLetterOfABatchSentBackAsItRecordedIt(t *testing.T) {
	redisURL, takeXADD := urlWithoutXADD(t)
	tt := tableHandler(t, fmt.Sprintf(`{"key_prefix":"shadow-sentback-line:","mode":"shadow","on_invalid":"dead_letter","store":{"type":"redis","url":%q}}`,
		redisURL))
	takeXADD() // after the load, which would report it
	held := fmt.Sprintf(`{"asset_id":"veh-held-line","occurred_at":%q,"lat":52.5,"lon":13.4}`, time.Now().UTC().Add(-time.Hour).Format(time.RFC3339))
	naive := `{"asset_id":"veh-naive-line","occurred_at":"2026-08-08T12:00:00","lat":52.5,"lon":13.4}`
	tt.claimInFlight(t, held)
	core, logs := observer.New(zap.WarnLevel)
	observeStoreErrors(tt.h, zap.New(core))

	before := decisionCountsNow()
	res := tt.post(held+"\n"+naive+"\n", "application/x-ndjson", nil)
	counts := decisionCountsNow().since(before).asEnforce().String()
	if want := `{"in_flight/redelivery":1,"in_flight/sent_back":1}`; counts != want || len(tt.upstream) != 1 {
		t.Fatalf("shadow answered %d, forwarded %d requests, counted %s; want it forwarded, counted %s", res.status, len(tt.upstream), counts, want)
	}
	lines := logs.FilterMessageSnippet("dead-lettering").All()
	if len(lines) != 1 {
		t.Fatalf("%d dead-letter lines (%v); want 1", len(lines), logs.All())
	}
	said := lines[0].Message
	for _, want := range []string{"shadow mode forwarded", "the upstream has them", "recorded them sent_back"} {
		if !strings.Contains(said, want) {
			t.Errorf("the line %q; want it to say %q", said, want)
		}
	}
	for _, wrong := range []string{"recorded unavailable", "503"} {
		if strings.Contains(said, wrong) {
			t.Errorf("the line %q says %q; the pings were recorded sent_back, and enforce tries no letter of a batch it sends back", said, wrong)
		}
	}
}

// observeStoreErrors sends h's store-error lines (and its other
// throttled warnings) to logger, each kind throttled on its own as
// provisioned.
func observeStoreErrors(h *Handler, logger *zap.Logger) {
	for _, kind := range h.throttledLines() {
		kind.logger = logger
	}
}

// Each kind of store failure says something else about what became of
// its pings, so each has its own line, throttled on its own. Shadow
// mode's letters of a batch enforce sends back whole shared a throttle
// with the other letters, and settlements with claims: in an outage the
// first line of one kind held back the other's for ten seconds, and a
// settlement that failed hid that the next pings went upstream unchecked.
func TestAStoreErrorOfOneKindHoldsBackNoOtherKindsLine(t *testing.T) {
	at := time.Now().UTC().Add(-time.Hour).Format(time.RFC3339)
	fix := func(asset string) string {
		return fmt.Sprintf(`{"asset_id":%q,"occurred_at":%q,"lat":52.5,"lon":13.4}`, asset, at)
	}
	naive := `{"asset_id":"veh-kinds-naive","occurred_at":"2026-08-08T12:00:00","lat":52.5,"lon":13.4}`
	saidBoth := func(t *testing.T, logs *observer.ObservedLogs, first, then string) {
		t.Helper()
		for _, line := range []string{first, then} {
			if logs.FilterMessageSnippet(line).Len() != 1 {
				t.Errorf("no line saying %q; the lines: %v", line, logs.All())
			}
		}
	}

	t.Run("letters of a batch sent back, then a ping's", func(t *testing.T) {
		redisURL, takeXADD := urlWithoutXADD(t)
		tt := tableHandler(t, fmt.Sprintf(`{"key_prefix":"kinds-letters:","mode":"shadow","on_invalid":"dead_letter","store":{"type":"redis","url":%q}}`,
			redisURL))
		takeXADD() // after the load, which would report it
		core, logs := observer.New(zap.WarnLevel)
		observeStoreErrors(tt.h, zap.New(core))
		held := fix("veh-kinds-held")
		tt.claimInFlight(t, held)
		tt.post(held+"\n"+naive+"\n", "application/x-ndjson", nil)
		tt.post(naive, "application/json", nil)
		saidBoth(t, logs, "recorded them sent_back", "recorded unavailable")
	})

	t.Run("a settlement, then claims", func(t *testing.T) {
		rdb := redistest.Start(t)
		tt := tableHandler(t, fmt.Sprintf(`{"key_prefix":"kinds-settle:","store":{"type":"redis","url":%q,"timeout":1000000000,"breaker_failures":1000}}`,
			rdb.URL()))
		core, logs := observer.New(zap.WarnLevel)
		observeStoreErrors(tt.h, zap.New(core))
		tt.upstreamStatus = func([]byte) int {
			rdb.Kill() // after the claim: its settlement fails
			return http.StatusCreated
		}
		tt.post(fix("veh-kinds-settled"), "application/json", nil)
		for deadline := time.Now().Add(10 * time.Second); logs.FilterMessageSnippet("settling a claim failed").Len() == 0; {
			if time.Now().After(deadline) {
				t.Fatalf("no settlement failed; the lines: %v", logs.All())
			}
			time.Sleep(10 * time.Millisecond)
		}
		if res := tt.post(fix("veh-kinds-unchecked"), "application/json", nil); res.header.Get("X-Dedup") != "unchecked" {
			t.Fatalf("a new ping with Redis down: X-Dedup %q, want unchecked", res.header.Get("X-Dedup"))
		}
		saidBoth(t, logs, "settling a claim failed", "go upstream unchecked")
	})
}

// A config unloaded in an outage (a reload, Caddy's exit) writes the store
// error lines it held back: the failures of its last seconds were told by
// no line, and an operator reading the log after the exit saw one failed
// claim where there were three.
func TestCleanupWritesTheStoreErrorLinesHeldBack(t *testing.T) {
	down := `{"type":"redis","url":"redis://127.0.0.1:1/0","timeout":20000000,"breaker_failures":1000}`
	tt := tableHandler(t, `{"key_prefix":"held-back:","store":`+down+`}`)
	core, logs := observer.New(zap.WarnLevel)
	observeStoreErrors(tt.h, zap.New(core))
	at := time.Now().UTC().Add(-time.Hour).Format(time.RFC3339)
	for i := range 3 {
		tt.post(fmt.Sprintf(`{"asset_id":"veh-held-back-%d","occurred_at":%q,"lat":52.5,"lon":13.4}`, i, at), "application/json", nil)
	}
	claimLines := func() []observer.LoggedEntry { return logs.FilterMessageSnippet("go upstream unchecked").All() }
	if n := len(claimLines()); n != 1 {
		t.Fatalf("%d claim failure lines before the cleanup, want 1 (the others held back): %v", n, logs.All())
	}
	if err := tt.h.Cleanup(); err != nil {
		t.Fatal(err)
	}
	lines := claimLines()
	if len(lines) != 2 {
		t.Fatalf("%d claim failure lines after the cleanup, want 2 (the held-back ones told): %v", len(lines), logs.All())
	}
	if similar := lines[1].ContextMap()["similar_since_last_line"]; similar != int64(1) {
		t.Errorf("the cleanup's line counts %v similar failures besides itself, want 1", similar)
	}
	if err := tt.h.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if n := len(claimLines()); n != 2 {
		t.Errorf("a second cleanup wrote the held-back line again: %d lines", n)
	}
}

// A release Redis refuses is a store error as a claim's is: logged at most
// once per storeErrorLogEvery, the similar ones counted, with the fix, and
// each of the two release lines throttled on its own. Both were written
// once per request, without the fix: a user whose ACL lacks EVALSHA, which
// only releases use in tumbling, wrote a warning for every upstream
// failure and every batch sent back, as did an outage for every request
// whose upstream failed while Redis was gone.
func TestAReleaseRefusedIsLoggedAsTheOtherStoreErrorsAre(t *testing.T) {
	srv := redistest.Start(t)
	srv.AddUser(t, "noevalsha", "pw")
	tt := tableHandler(t, fmt.Sprintf(`{"key_prefix":"release-lines:","store":{"type":"redis","url":%q,"breaker_failures":1000}}`,
		"redis://noevalsha:pw@"+srv.Addr()+"/0"))
	if err := srv.Client().Do(context.Background(), "ACL", "SETUSER", "noevalsha", "-evalsha").Err(); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.WarnLevel)
	tt.h.logger = zap.New(core)
	observeStoreErrors(tt.h, tt.h.logger)
	at := time.Now().UTC().Add(-time.Hour).Format(time.RFC3339)
	fix := func(asset string) string {
		return fmt.Sprintf(`{"asset_id":%q,"occurred_at":%q,"lat":52.5,"lon":13.4}`, asset, at)
	}
	tt.upstreamStatus = func([]byte) int { return http.StatusBadGateway }
	held := fix("veh-release-held")
	tt.claimInFlight(t, held)
	for _, asset := range []string{"veh-release-1", "veh-release-2"} {
		if res := tt.post(fix(asset), "application/json", nil); res.status != http.StatusBadGateway {
			t.Fatalf("a ping whose upstream failed: %d, want the upstream's 502", res.status)
		}
		if res := tt.post(held+"\n"+fix(asset+"-batch")+"\n", "application/x-ndjson", nil); res.header.Get("X-Dedup") != "in_flight" {
			t.Fatalf("a batch holding a ping in flight: X-Dedup %q, want in_flight (sent back whole)", res.header.Get("X-Dedup"))
		}
	}
	for _, line := range []string{"releasing the claims of a failed request failed", "releasing the claims of a batch sent back for retry failed"} {
		said := logs.FilterMessageSnippet(line).All()
		if len(said) != 1 {
			t.Errorf("%d lines saying %q after two such failures, want 1 (the other counted at the next); the lines: %v", len(said), line, logs.All())
			continue
		}
		if fix, _ := said[0].ContextMap()["fix"].(string); !strings.Contains(fix, "EVALSHA") {
			t.Errorf("the line saying %q has the fix %q; want the ACL rule, which names EVALSHA", line, fix)
		}
	}
}

// A batch over max_batch is counted alike by decisions_total and by the
// request's placeholders: each of its pings (helper 6's finding: the
// metric counted 5 for a batch of 5 over max_batch 3, the placeholder 1).
func TestABatchOverMaxBatchIsCountedAlikeByMetricAndPlaceholder(t *testing.T) {
	tt := tableHandler(t, `{"key_prefix":"over-batch:","max_batch":3}`)
	at := time.Now().UTC().Add(-time.Minute).Format(time.RFC3339)
	var pings []string
	for i := range 5 {
		pings = append(pings, fmt.Sprintf(`{"asset_id":"veh-over-%d","occurred_at":%q,"lat":52.52,"lon":13.40}`, i, at))
	}
	r := httptest.NewRequest(http.MethodPost, "/telemetry", strings.NewReader("["+strings.Join(pings, ",")+"]"))
	r.Header.Set("Content-Type", "application/json")
	repl := caddyhttp.NewTestReplacer(r)
	r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
	w := httptest.NewRecorder()
	before := decisionCountsNow()
	if err := tt.h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil })); err != nil {
		t.Fatal(err)
	}
	counted := decisionCountsNow().since(before)["rejected/too_large"]
	if placeholder := repl.ReplaceAll("{http.telemetry_dedup.rejected}", "?"); w.Code != http.StatusRequestEntityTooLarge ||
		counted != 5 || placeholder != "5" {
		t.Errorf("a batch of 5 over max_batch 3: answered %d, decisions_total counted rejected/too_large %d, "+
			"{http.telemetry_dedup.rejected} %s; want 413, 5 and 5", w.Code, counted, placeholder)
	}
}
