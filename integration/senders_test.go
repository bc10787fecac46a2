package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// Each preset at its defaults, through a real Caddy and a real Redis,
// answers what its sender's own client takes as meant: a suppression as
// delivered, an in-flight redelivery as "retry later" (clients.go has the
// rules, from the clients' source).

// send makes one request to the test site: method, the query of the URL,
// a Content-Type (none when empty) and a body.
func send(t *testing.T, client *http.Client, method, query, contentType string, body []byte, header ...string) response {
	t.Helper()
	target := siteURL
	if query != "" {
		target += "?" + query
	}
	req, _ := http.NewRequest(method, target, bytes.NewReader(body))
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return response{res.StatusCode, res.Header, string(b)}
}

// holdUpstream makes the upstream wait, for its next request, until the
// returned release is called; arrived is closed when that request is
// there.
func holdUpstream(up *upstream, status int, body string) (arrived chan struct{}, release func()) {
	arrived, proceed := make(chan struct{}), make(chan struct{})
	up.setResponse(func(w http.ResponseWriter, _ *http.Request) {
		close(arrived)
		<-proceed
		w.WriteHeader(status)
		io.WriteString(w, body)
	})
	return arrived, func() { close(proceed) }
}

// answering sets what the upstream answers from now on.
func answering(up *upstream, status int, contentType, body string) {
	up.setResponse(func(w http.ResponseWriter, _ *http.Request) {
		if contentType != "" {
			w.Header().Set("Content-Type", contentType)
		}
		w.WriteHeader(status)
		io.WriteString(w, body)
	})
}

func (r response) expectReason(t *testing.T, status int, decision, reason string) {
	t.Helper()
	r.expect(t, status, decision)
	if got := r.header.Get("X-Dedup-Reason"); got != reason {
		t.Fatalf("X-Dedup-Reason %q, want %q", got, reason)
	}
}

// inFlightRedelivery sends body while its first delivery is held at the
// upstream, and returns the answer to the copy; the first then completes.
func inFlightRedelivery(t *testing.T, up *upstream, deliver func() response) response {
	t.Helper()
	arrived, release := holdUpstream(up, http.StatusOK, "")
	first := make(chan response, 1)
	go func() { first <- deliver() }()
	select {
	case <-arrived:
	case r := <-first:
		release()
		t.Fatalf("the first delivery never reached the upstream: %d X-Dedup %q", r.status, r.header.Get("X-Dedup"))
	}
	copy := deliver()
	release()
	<-first
	return copy
}

func TestOwnTracksAppsTakeTheAnswersAsMeant(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	answering(up, http.StatusOK, "application/json", "[]") // what an OwnTracks backend answers
	tester := startCaddy(t, up, redisOptions(srv, "preset owntracks\n\t\tasset {http.request.header.X-Limit-U}/{http.request.header.X-Limit-D}"))
	phone := []string{"X-Limit-U", "jane", "X-Limit-D", "phone"}
	tst := base().Unix()
	location := func(offset int64, lat, lon float64, trigger string) []byte {
		field := ""
		if trigger != "" {
			field = fmt.Sprintf(`"t":%q,`, trigger)
		}
		return fmt.Appendf(nil, `{"_type":"location",%s"tid":"jp","tst":%d,"lat":%v,"lon":%v,"acc":12,"batt":81,"topic":"owntracks/jane/phone"}`,
			field, tst+offset, lat, lon)
	}
	postOT := func(body []byte) response {
		return send(t, tester.Client, http.MethodPost, "", "application/json", body, phone...)
	}
	takenAsDelivered := func(name string, r response) {
		t.Helper()
		if a, i := ownTracksAndroid(r), ownTracksIOS(r); a != delivered || i != delivered {
			t.Fatalf("%s: %d %q %q: Android %s, iOS %s; both must take it as delivered", name, r.status, r.header.Get("Content-Type"), r.body, a, i)
		}
		if ct := r.header.Get("Content-Type"); r.body != "[]" || ct != "application/json" {
			t.Fatalf("%s: answered %q as %q, want [] as application/json", name, r.body, ct)
		}
	}

	parked := location(0, 48.856826, 2.292713, "")
	postOT(parked).expect(t, http.StatusOK, "accepted")

	redelivery := postOT(parked)
	redelivery.expectReason(t, http.StatusOK, "suppressed", "redelivery")
	takenAsDelivered("redelivery", redelivery)
	jitter := postOT(location(30, 48.856822, 2.292709, "t"))
	jitter.expectReason(t, http.StatusOK, "suppressed", "jitter")
	takenAsDelivered("jitter", jitter)

	// Both apps come back for an in-flight redelivery; neither drops it
	// (iOS deletes on a 4xx) and OkHttp does not resend it at once.
	inFlight := inFlightRedelivery(t, up, func() response { return postOT(location(60, 48.858, 2.2945, "")) })
	inFlight.expect(t, http.StatusServiceUnavailable, "in_flight")
	if a, i := ownTracksAndroid(inFlight), ownTracksIOS(inFlight); a != retried || i != retried || !retryAfterAtLeastOne(inFlight) {
		t.Fatalf("in flight: %d Retry-After %q: Android %s, iOS %s; both must retry, not at once", inFlight.status, inFlight.header.Get("Retry-After"), a, i)
	}
	answering(up, http.StatusOK, "application/json", "[]")

	// A manual publish at the parked phone is an event: it reaches the
	// backend, its redelivery does not.
	sent, counted := up.count(), decisionCounts(t)
	manual := location(90, 48.856831, 2.292719, "u")
	postOT(manual).expectReason(t, http.StatusOK, "accepted", "event")
	takenAsDelivered("manual redelivery", postOT(manual))
	if d := delta(counted, decisionCounts(t)); d["accepted/event"] != 1 || d["suppressed/redelivery"] != 1 || len(d) != 2 {
		t.Errorf("decisions counted %v, want one accepted/event and one suppressed/redelivery", d)
	}
	if up.count() != sent+1 || !bytes.Equal(up.requests()[sent].body, manual) {
		t.Fatalf("the manual publish did not reach the backend once, byte for byte")
	}
	if got := up.requests()[sent].header.Get("X-Dedup-Why"); got != "event" {
		t.Errorf("{http.telemetry_dedup.reason} of the manual publish %q, want event", got)
	}

	// A transition, and an empty POST (a deleted friend), go through
	// untouched.
	transition := []byte(fmt.Sprintf(`{"_type":"transition","lat":48.85683,"lon":2.29272,"tst":%d,"acc":10,"tid":"jp","event":"leave","t":"c","desc":"Office","wtst":1610104395}`, tst+95))
	postOT(transition).expect(t, http.StatusOK, "skipped")
	postOT(nil).expect(t, http.StatusOK, "skipped")
	got := up.requests()
	if len(got) != sent+3 || !bytes.Equal(got[sent+1].body, transition) || len(got[sent+2].body) != 0 {
		t.Fatalf("upstream saw %d requests; want the transition and the empty POST as sent", len(got)-sent)
	}

	// The iOS app publishes a point of interest or a tag as a manual
	// location at the fix it last had, and both apps publish a region's
	// enter and leave at the fix of the transition: the same fix and
	// trigger, another message, each delivered; its exact retry is not.
	sent = up.count()
	withField := func(body []byte, field string) []byte {
		return append(append(bytes.TrimSuffix(body, []byte("}")), ","+field...), '}')
	}
	for _, b := range [][]byte{
		withField(manual, `"poi":"Café de Flore"`),
		withField(manual, `"tag":"work"`),
		withField(location(120, 48.856826, 2.292713, "c"), `"inregions":["Home","Street"]`),
		withField(location(120, 48.856826, 2.292713, "c"), `"inregions":["Street"]`),
	} {
		postOT(b).expectReason(t, http.StatusOK, "accepted", "event")
		takenAsDelivered("retry of "+string(b), postOT(b))
	}
	if up.count() != sent+4 {
		t.Fatalf("the backend got %d of the 4 messages at one fix, want each once", up.count()-sent)
	}
}

// A ping kept as a dead letter is answered so that the app stops sending
// it: OwnTracks Android would otherwise re-queue it, blocking its queue.
func TestDeadLettersAreDeliveredForTheApps(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	tester := startCaddy(t, up, redisOptions(srv, "preset owntracks\n\t\ton_invalid dead_letter"))
	// Without a tid or a topic the location has no identity.
	res := send(t, tester.Client, http.MethodPost, "", "application/json",
		fmt.Appendf(nil, `{"_type":"location","tst":%d,"lat":48.85,"lon":2.29}`, time.Now().Unix()))
	res.expectReason(t, http.StatusAccepted, "dead_lettered", "required")
	if ownTracksAndroid(res) != delivered || ownTracksIOS(res) != delivered || res.body != "[]" {
		t.Fatalf("dead letter answered %d %q: Android %s", res.status, res.body, ownTracksAndroid(res))
	}
}

// A ping whose dead letter cannot be written (Redis hung) is asked to come
// back, as the store's outage asks a valid ping to with on_store_error
// closed: every app keeps a 503 and sends it again, and once Redis answers
// the ping is kept. It was rejected with its 4xx, which OwnTracks iOS
// answers by deleting the location and alerting the user: the loss
// dead-lettering is there to prevent, at every Redis blip.
func TestADeadLetterThatCannotBeWrittenComesBack(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	tester := startCaddy(t, up, redisOptions(srv, "preset owntracks\n\t\ton_invalid dead_letter\n\t\tdead_letter_stream test:dlq-blip"))
	// Without a tid or a topic the location has no identity.
	invalid := fmt.Appendf(nil, `{"_type":"location","tst":%d,"lat":48.85,"lon":2.29}`, time.Now().Unix())
	postOT := func() response { return send(t, tester.Client, http.MethodPost, "", "application/json", invalid) }

	srv.Pause()
	res := postOT()
	srv.Resume()
	res.expect(t, http.StatusServiceUnavailable, "unavailable")
	if !strings.Contains(res.body, `"field":"tid","rule":"required"`) {
		t.Errorf("503 body %s does not say what is wrong with the ping", res.body)
	}
	if a, i := ownTracksAndroid(res), ownTracksIOS(res); a != retried || i != retried || !retryAfterAtLeastOne(res) {
		t.Fatalf("Redis hung: answered %d, Retry-After %q: Android %s, iOS %s; both must send it again, not at once",
			res.status, res.header.Get("Retry-After"), a, i)
	}

	// The app's retry, once Redis answers (and the breaker lets it try).
	deadline := time.Now().Add(5 * time.Second)
	for res = postOT(); res.status != http.StatusAccepted && time.Now().Before(deadline); res = postOT() {
		time.Sleep(100 * time.Millisecond)
	}
	res.expectReason(t, http.StatusAccepted, "dead_lettered", "required")
	if n := srv.Client().XLen(context.Background(), "test:dlq-blip").Val(); n != 1 || up.count() != 0 {
		t.Fatalf("the stream holds %d letters and the upstream saw %d requests; want the ping kept once, nothing forwarded", n, up.count())
	}
}

// overlandFeature is a Feature as GLManager.m writes it.
func overlandFeature(at time.Time, lon, lat float64, device string) string {
	return fmt.Sprintf(`{"type":"Feature","geometry":{"type":"Point","coordinates":[%v,%v]},"properties":{"timestamp":%q,`+
		`"altitude":15,"speed":4,"horizontal_accuracy":5,"motion":["driving"],"device_id":%q,"battery_level":0.8}}`,
		lon, lat, at.UTC().Format("2006-01-02T15:04:05Z"), device)
}

func TestOverlandTakesTheAnswersAsMeant(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	answering(up, http.StatusOK, "application/json", `{"result":"ok"}`)
	tester := startCaddy(t, up, redisOptions(srv, "preset overland"))
	postLocations := func(body []byte) response {
		return send(t, tester.Client, http.MethodPost, "", "application/json", body)
	}
	at := base()
	current := `"current":{"type":"Feature","geometry":{"type":"Point","coordinates":[-122.6770011,45.5229003]},"properties":{"timestamp":"` +
		at.Add(5*time.Minute).Format(time.RFC3339) + `","device_id":"phone1"}}`
	trip := `"trip":{"mode":"car","start":"` + at.Add(-10*time.Minute).Format(time.RFC3339) + `","distance":10432.5}`
	batch := func(features ...string) []byte {
		return []byte("{\n  \"locations\": [\n    " + strings.Join(features, ",\n    ") + "\n  ],\n  " + current + ",\n  " + trip + "\n}")
	}
	fix1 := overlandFeature(at, -122.6764971, 45.5230622, "phone1")
	fix2 := overlandFeature(at.Add(10*time.Second), -122.6771000, 45.5236000, "phone1")

	// A new batch goes upstream as sent.
	first := batch(fix1, fix2)
	postLocations(first).expect(t, http.StatusOK, "accepted")
	if got := up.requests()[0].body; !bytes.Equal(got, first) {
		t.Fatalf("a new batch reached the upstream as\n%s", got)
	}
	// Its redelivery is answered {"result":"ok"} and reaches nobody.
	again := postLocations(first)
	again.expect(t, http.StatusOK, "suppressed")
	if f := overland(again, false); f != delivered || again.body != `{"result":"ok"}` || up.count() != 1 {
		t.Fatalf("redelivery answered %d %q (%s), upstream count %d", again.status, again.body, f, up.count())
	}
	if f := overland(again, true); f != delivered {
		t.Fatalf("with Consider HTTP 2XX Successful on, the redelivery is %s", f)
	}

	// A mixed batch: only the new Features, byte for byte and in order;
	// a visit record rides along untouched; current and trip as sent.
	fix3 := overlandFeature(at.Add(40*time.Second), -122.6790000, 45.5250000, "phone1")
	visit := `{"type":"Feature","geometry":{"type":"Point","coordinates":[-122.6765522,45.5230101]},"properties":{"timestamp":"` +
		at.Add(41*time.Second).Format("2006-01-02T15:04:05Z") + `","action":"visit","arrival_date":"` + at.Format(time.RFC3339) + `","departure_date":null,"device_id":"phone1"}}`
	mixed := postLocations(batch(fix2, fix3, fix1, visit))
	mixed.expect(t, http.StatusOK, "partial")
	want := "{\n  \"locations\": [" + fix3 + "," + visit + "],\n  " + current + ",\n  " + trip + "\n}"
	if got := string(up.requests()[1].body); got != want {
		t.Fatalf("the mixed batch reached the upstream as\n%s\nwant\n%s", got, want)
	}

	// In flight: the whole batch is kept by the app and sent again.
	fix4 := overlandFeature(at.Add(2*time.Minute), -122.6800000, 45.5260000, "phone1")
	inFlight := inFlightRedelivery(t, up, func() response { return postLocations(batch(fix4)) })
	inFlight.expect(t, http.StatusServiceUnavailable, "in_flight")
	if overland(inFlight, false) != retried || overland(inFlight, true) != retried || !retryAfterAtLeastOne(inFlight) {
		t.Fatalf("in flight answered %d: Overland does not send the batch again", inFlight.status)
	}
}

// Overland resends a batch whose answer it never got (the phone lost its
// signal while waiting). One that went through partial, its new fixes
// upstream and an invalid one left out, comes back as duplicates beside
// that invalid fix: it is answered as delivered, as it was the first
// time, not with a 422 that the app resends at every send interval,
// forever, the oldest points of its queue, holding back all behind them.
func TestOverlandsResendOfAPartialBatchIsDelivered(t *testing.T) {
	up := newUpstream(t)
	answering(up, http.StatusOK, "application/json", `{"result":"ok"}`)
	tester := startCaddy(t, up, "preset overland")
	at := base()
	fix := overlandFeature(at, -122.6764971, 45.5230622, "phone1")
	// Queued before the user cleared the device id: the app then leaves it out.
	anonymous := strings.Replace(overlandFeature(at.Add(10*time.Second), -122.6771, 45.5236, ""), `,"device_id":""`, "", 1)
	batch := []byte(`{"locations":[` + fix + `,` + anonymous + `]}`)

	first := send(t, tester.Client, http.MethodPost, "", "application/json", batch)
	first.expect(t, http.StatusOK, "partial")
	if overland(first, false) != delivered || up.count() != 1 {
		t.Fatalf("the first delivery answered %d %q, upstream count %d", first.status, first.body, up.count())
	}
	again := send(t, tester.Client, http.MethodPost, "", "application/json", batch)
	again.expect(t, http.StatusOK, "partial")
	if off, on := overland(again, false), overland(again, true); off != delivered || on != delivered || up.count() != 1 {
		t.Fatalf("its resend answered %d %q: Overland %s it (2xx successful off), %s it (on); upstream count %d; want it delivered, once",
			again.status, again.body, off, on, up.count())
	}
	if r := again.header.Get("X-Dedup-Rejections"); !strings.Contains(r, `"index":1`) || !strings.Contains(r, `"rule":"required"`) {
		t.Fatalf("X-Dedup-Rejections %q does not name the fix left out", r)
	}
}

// Overland may leave device_id out: the identity then comes from the
// request, here a query parameter of the receiver URL the app was given.
// Overland's OwnTracks mode reads every answer as Overland does: the
// README's configuration answers a redelivery {"result":"ok"}, which the
// app takes as delivered with "Consider HTTP 2XX Successful" off or on;
// the owntracks preset's own [] would be resent forever with it off and
// would crash the app with it on.
func TestOverlandInOwnTracksModeTakesTheREADMEsAnswers(t *testing.T) {
	body := fixture(t, "overland/owntracks_mode_composed.json")
	for _, tt := range []struct {
		name, answers string
		off, on       fate
	}{
		{"the README's answers", "answers {\n\t\t\tsuppressed 200 application/json `{\"result\":\"ok\"}`\n\t\t\tdead_lettered 202 application/json `{\"result\":\"ok\"}`\n\t\t}", delivered, delivered},
		{"the owntracks preset's", "", retried, crashed},
	} {
		t.Run(tt.name, func(t *testing.T) {
			up := newUpstream(t)
			answering(up, http.StatusOK, "application/json", `{"result":"ok"}`)
			tester := startCaddy(t, up, "preset owntracks\n\t\tasset topic\n\t\tmax_past 20000d\n\t\t"+tt.answers) // a 2024 sample, dated 1993
			send(t, tester.Client, http.MethodPost, "", "application/json", body).expect(t, http.StatusOK, "accepted")
			again := send(t, tester.Client, http.MethodPost, "", "application/json", body)
			again.expect(t, http.StatusOK, "suppressed")
			if off, on := overland(again, false), overland(again, true); off != tt.off || on != tt.on {
				t.Fatalf("redelivery answered %d %q: Overland %s it (2xx successful off), %s it (on); want %s, %s",
					again.status, again.body, off, on, tt.off, tt.on)
			}
		})
	}
}

func TestOverlandIdentityFromTheRequest(t *testing.T) {
	up := newUpstream(t)
	tester := startCaddy(t, up, "preset overland\n\t\tasset {http.request.uri.query.device}\n\t\tmax_past 20000d") // a 2015 sample
	body, err := os.ReadFile(filepath.Join("..", "testdata", "senders", "overland", "readme_locations_derived.json"))
	if err != nil {
		t.Fatal(err)
	}
	send(t, tester.Client, http.MethodPost, "device=jane-phone", "application/json", body).expect(t, http.StatusCreated, "accepted")
	send(t, tester.Client, http.MethodPost, "device=jane-phone", "application/json", body).expect(t, http.StatusOK, "suppressed")
	send(t, tester.Client, http.MethodPost, "device=john-phone", "application/json", body).expect(t, http.StatusCreated, "accepted")
	send(t, tester.Client, http.MethodPost, "", "application/json", body).expect(t, http.StatusUnprocessableEntity, "rejected")
}

func TestOsmAndRequestsAreJudgedAndForwardedAsTheyCame(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	answering(up, http.StatusOK, "", "") // what Traccar's OsmAnd port answers
	tester := startCaddy(t, up, redisOptions(srv, "preset osmand"))
	ts := base().Unix()
	q := func(id string, offset int64, lat, lon float64, extra string) string {
		return fmt.Sprintf("id=%s&timestamp=%d&lat=%v&lon=%v&speed=0.0&bearing=0.0&altitude=35.0&accuracy=0.0&batt=81.0%s", id, ts+offset, lat, lon, extra)
	}
	type request struct{ method, query, contentType, body string }
	var forwarded []request
	do := func(r request, status int, decision string) response {
		t.Helper()
		res := send(t, tester.Client, r.method, r.query, r.contentType, []byte(r.body))
		res.expect(t, status, decision)
		if decision == "accepted" || decision == "skipped" {
			forwarded = append(forwarded, r)
		}
		return res
	}
	deliveredForClients := func(name string, r response) {
		t.Helper()
		if traccarClientAndroid(r, false) != delivered || traccarClientSDK(r, false) != delivered || r.body != "" {
			t.Fatalf("%s: answered %d %q, which the Traccar clients do not take as delivered", name, r.status, r.body)
		}
	}

	// The old Traccar Client: a POST with the fields in the query and an
	// empty body.
	fix := request{http.MethodPost, q("123456789012345", 0, 48.856826, 2.292713, ""), "", ""}
	do(fix, http.StatusOK, "accepted")
	deliveredForClients("redelivery", do(fix, http.StatusOK, "suppressed"))
	// OsmAnd's GET of the parked phone's jitter.
	deliveredForClients("jitter", do(request{http.MethodGet, q("123456789012345", 20, 48.856822, 2.292709, ""), "", ""}, http.StatusOK, "suppressed"))
	// The SDK's form body, a move.
	do(request{http.MethodPost, "", "application/x-www-form-urlencoded", q("123456789012345", 40, 48.858, 2.2945, "")}, http.StatusOK, "accepted")
	// ISO 8601, as a GET.
	iso := request{http.MethodGet, "id=902064&lat=42.06288&lon=-88.23412&timestamp=" + url.QueryEscape(base().Format(time.RFC3339)) + "&speed=0.0", "", ""}
	do(iso, http.StatusOK, "accepted")
	do(iso, http.StatusOK, "suppressed")
	// The Transistorsoft body Traccar's port takes as JSON.
	ttst := `{"location":{"timestamp":"` + base().Format("2006-01-02T15:04:05.000Z") + `","coords":{"latitude":37.4219983,"longitude":-122.084,` +
		`"accuracy":5,"speed":0,"heading":-1,"altitude":5},"is_moving":false,"event":"motionchange","extras":{}},"device_id":"48241179"}`
	do(request{http.MethodPost, "", "application/json", ttst}, http.StatusOK, "accepted")
	do(request{http.MethodPost, "", "application/json", ttst}, http.StatusOK, "suppressed")

	// Refused: a latitude of 91.5; passed on untouched: no timestamp.
	bad := do(request{http.MethodGet, q("123456789012345", 60, 91.5, 2.29, ""), "", ""}, http.StatusUnprocessableEntity, "rejected")
	if !strings.Contains(bad.body, `"field":"lat"`) || !strings.Contains(bad.body, `"rule":"range"`) {
		t.Fatalf("lat 91.5 answered %s", bad.body)
	}
	do(request{http.MethodGet, "deviceid=123456&lat=60.0&lon=30.0&speed=0.0", "", ""}, http.StatusOK, "skipped")
	// A phone whose clock runs an hour ahead: Traccar stores the position
	// as it is, and the old client would retry a refusal forever at the
	// head of its queue, so it is passed on unkeyed.
	ahead := fmt.Sprintf("id=123456789012345&timestamp=%d&lat=48.86&lon=2.30", time.Now().Add(time.Hour).Unix())
	do(request{http.MethodGet, ahead, "", ""}, http.StatusOK, "skipped").expectReason(t, http.StatusOK, "skipped", "max_future")

	// In flight: both clients retry a buffered position.
	inFlight := inFlightRedelivery(t, up, func() response {
		return send(t, tester.Client, http.MethodPost, q("123456789012345", 120, 48.86, 2.30, ""), "", nil)
	})
	inFlight.expect(t, http.StatusServiceUnavailable, "in_flight")
	if traccarClientAndroid(inFlight, false) != retried || traccarClientSDK(inFlight, false) != retried {
		t.Fatalf("in flight answered %d, which the Traccar clients do not retry", inFlight.status)
	}
	answering(up, http.StatusOK, "", "")

	// The upstream got exactly the accepted requests (and the one passed
	// on), each as it came: method, query and body.
	got := up.requests()
	got = append(got[:len(forwarded)], got[len(forwarded)+1:]...) // the in-flight one, first delivery
	if len(got) != len(forwarded) {
		t.Fatalf("upstream saw %d requests, want %d", len(got), len(forwarded))
	}
	for i, r := range forwarded {
		if got[i].method != r.method || got[i].query != r.query || string(got[i].body) != r.body {
			t.Errorf("request %d reached the upstream as %s ?%s %q; sent as %s ?%s %q",
				i, got[i].method, got[i].query, got[i].body, r.method, r.query, r.body)
		}
	}
}

// The SOS alarm and the ignition switched off at a parked vehicle reach
// Traccar (through the OsmAnd port) and a Traccar forward receiver; their
// redeliveries and the jitter around them do not.
func TestTraccarEventsAndStatesAtAParkedVehicle(t *testing.T) {
	ts := base()
	osmand := func(offset time.Duration, lat, lon float64, extra string) (string, string) {
		return fmt.Sprintf("id=358240051111110&timestamp=%d&lat=%v&lon=%v&speed=0.0%s", ts.Add(offset).Unix(), lat, lon, extra), ""
	}
	forward := func(offset time.Duration, lat, lon float64, extra string) (string, string) {
		attributes := `"batteryLevel":81.0,"motion":false`
		for pair := range strings.SplitSeq(strings.TrimPrefix(extra, "&"), "&") {
			if k, v, ok := strings.Cut(pair, "="); ok {
				if v != "true" && v != "false" {
					v = `"` + v + `"`
				}
				attributes += fmt.Sprintf(",%q:%s", k, v)
			}
		}
		return "", fmt.Sprintf(`{"position":{"id":0,"attributes":{%s},"deviceId":7,"protocol":"osmand","fixTime":%q,"valid":true,`+
			`"latitude":%v,"longitude":%v,"speed":0.0,"accuracy":5.0},"device":{"id":7,"name":"Van 7","uniqueId":"358240051111110"}}`,
			attributes, ts.Add(offset).Format("2006-01-02T15:04:05.000+00:00"), lat, lon)
	}
	for _, tt := range []struct {
		preset, method string
		request        func(time.Duration, float64, float64, string) (query, body string)
		answer         func(response) fate
	}{
		{"osmand", http.MethodPost, osmand, func(r response) fate { return traccarClientSDK(r, true) }},
		{"traccar", http.MethodPost, forward, func(r response) fate { return traccarForwarder(r, false) }},
	} {
		t.Run(tt.preset, func(t *testing.T) {
			srv := redistest.Start(t)
			up := newUpstream(t)
			answering(up, http.StatusOK, "", "")
			tester := startCaddy(t, up, redisOptions(srv, "preset "+tt.preset))
			step := func(offset time.Duration, lat, lon float64, extra, decision, reason string) {
				t.Helper()
				query, body := tt.request(offset, lat, lon, extra)
				ct := ""
				if body != "" {
					ct = "application/json"
				}
				sent := up.count()
				res := send(t, tester.Client, tt.method, query, ct, []byte(body))
				res.expectReason(t, http.StatusOK, decision, reason)
				if reached := up.count() > sent; reached != (decision == "accepted") {
					t.Fatalf("%s at +%s: reached the backend %v", extra, offset, reached)
				}
				if decision == "suppressed" && tt.answer(res) != delivered {
					t.Fatalf("%s at +%s answered %d, which the sender does not take as delivered", extra, offset, res.status)
				}
			}
			step(0, 52.5200087, 13.4049547, "&ignition=true", "accepted", "")
			step(20*time.Second, 52.5200410, 13.4049920, "&ignition=true", "suppressed", "jitter")
			// SOS where it stands: an event.
			step(30*time.Second, 52.5200300, 13.4049800, "&ignition=true&alarm=sos", "accepted", "event")
			step(30*time.Second, 52.5200300, 13.4049800, "&ignition=true&alarm=sos", "suppressed", "redelivery")
			step(40*time.Second, 52.5200150, 13.4049650, "&ignition=true", "suppressed", "jitter")
			// The ignition switched off: a new state.
			step(60*time.Second, 52.5200200, 13.4049700, "&ignition=false", "accepted", "")
			step(60*time.Second, 52.5200200, 13.4049700, "&ignition=false", "suppressed", "redelivery")
			step(80*time.Second, 52.5200350, 13.4049850, "&ignition=false", "suppressed", "jitter")
		})
	}
}

// Traccar raises an alarm only when the device's last stored position did
// not carry it already (event.ignoreDuplicateAlerts, on by default;
// traccarAlarms). A parked phone's second SOS is a new alarm to Traccar
// because the positions the phone sent between the two, without an alarm,
// were stored: its last position no longer says sos. Behind the osmand
// preset those positions are jitter of the parked phone and never reach
// Traccar, whose last position still carries the first SOS, so the second,
// accepted and forwarded, raises no event and no notification. The old
// Traccar Client sends a position every interval while parked (300 s by
// default, preferences.xml:32; PositionProvider.kt:49-62) and each SOS apart
// (ShortcutActivity.kt:78-98); so do OsmAnd-protocol trackers.
func TestASecondSOSAtAParkedPhoneRaisesItsAlarmInTraccar(t *testing.T) {
	for _, tt := range []struct {
		shape    string
		interval time.Duration // the client's
	}{
		{"session", 5 * time.Minute}, // the old Traccar Client's default
		{"sliding", time.Minute},     // both SOS in one 5-minute window
		// Not tumbling: there the state enters the key, and a position
		// without an alarm after the first SOS has the key of one before
		// it (README, Presets).
	} {
		t.Run(tt.shape, func(t *testing.T) {
			srv := redistest.Start(t)
			up := newUpstream(t)
			answering(up, http.StatusOK, "", "") // what Traccar's OsmAnd port answers
			tester := startCaddy(t, up, redisOptions(srv, "preset osmand\n\t\tshape "+tt.shape))
			ts := base()
			position := func(at time.Duration, jitter float64, extra string) string {
				return fmt.Sprintf("id=358240051111110&timestamp=%d&lat=%v&lon=%v&speed=0.0&bearing=0.0&altitude=35.0&accuracy=0.0&batt=81.0%s",
					ts.Add(at).Unix(), 52.5200087+jitter, 13.4049547+jitter, extra)
			}
			// What the phone sends, in order: a position every interval,
			// an SOS after the second and another after the fifth.
			var sent []string
			for k := range 7 {
				jitter := float64(k%3-1) * 3e-6 // a few decimetres
				sent = append(sent, position(time.Duration(k)*tt.interval, jitter, ""))
				if k == 1 || k == 4 {
					sent = append(sent, position(time.Duration(k)*tt.interval+tt.interval/2, jitter, "&alarm=sos"))
				}
			}
			for _, q := range sent {
				res := send(t, tester.Client, http.MethodPost, q, "", nil)
				if traccarClientAndroid(res, strings.Contains(q, "alarm=")) != delivered {
					t.Fatalf("?%s answered %d %q, which the Traccar Client does not take as delivered", q, res.status, res.header.Get("X-Dedup"))
				}
				if strings.Contains(q, "alarm=") && res.header.Get("X-Dedup") != "accepted" {
					t.Fatalf("an SOS was %q (%q); want it accepted", res.header.Get("X-Dedup"), res.header.Get("X-Dedup-Reason"))
				}
			}
			var stored []string
			for _, r := range up.requests() {
				stored = append(stored, r.query)
			}
			without, behind := traccarAlarms(sent), traccarAlarms(stored)
			if !slices.Equal(behind, without) {
				t.Fatalf("Traccar raised the alarms %q behind the module and %q without it: the positions without an alarm "+
					"after the first SOS never reached it (%d of the %d requests sent were answered here), so it drops the "+
					"second SOS as a duplicate of the first", behind, without, len(sent)-len(stored), len(sent))
			}
		})
	}
}

// A Traccar position the device marks invalid carries no fix: it goes to
// the receiver as it came, never keyed.
func TestTraccarInvalidPositionsPassUntouched(t *testing.T) {
	up := newUpstream(t)
	tester := startCaddy(t, up, "preset traccar")
	body := []byte(`{"position":{"deviceId":7,"fixTime":"` + base().Format("2006-01-02T15:04:05.000+0000") +
		`","valid":false,"latitude":52.52,"longitude":13.40,"attributes":{"alarm":"sos"}},"device":{"uniqueId":"358240051111110"}}`)
	for range 2 {
		send(t, tester.Client, http.MethodPost, "", "application/json", body).expect(t, http.StatusCreated, "skipped")
	}
	if up.count() != 2 {
		t.Fatalf("upstream saw %d of the two invalid positions", up.count())
	}

	// Traccar stores a position whatever its time (filter.future and
	// filter.past are off by default), and a new device's first message
	// comes at (0, 0) from OutdatedHandler; the forwarder drops what it is
	// refused. Such positions go on unkeyed, the rule they break named.
	traccarTime := func(t time.Time) string { return t.Format("2006-01-02T15:04:05.000+00:00") }
	for _, tt := range []struct {
		name, deviceTime, position, rule string
	}{
		{"a clock three hours ahead", traccarTime(time.Now().Add(3 * time.Hour)), `"latitude":52.52,"longitude":13.40`, "max_future"},
		{"a GPS week rollover", traccarTime(time.Now().AddDate(0, 0, -7*1024)), `"latitude":52.52,"longitude":13.40`, "max_past"},
		{"a new device without a fix", traccarTime(time.Now()), `"latitude":0.0,"longitude":0.0`, "null_island"},
	} {
		body := []byte(`{"position":{"deviceId":7,"deviceTime":"` + tt.deviceTime + `","valid":true,` + tt.position +
			`,"attributes":{"alarm":"sos"}},"device":{"uniqueId":"358240051111111"}}`)
		sent := up.count()
		for range 2 {
			send(t, tester.Client, http.MethodPost, "", "application/json", body).expectReason(t, http.StatusCreated, "skipped", tt.rule)
		}
		if up.count() != sent+2 || !bytes.Equal(up.requests()[sent].body, body) {
			t.Fatalf("%s: the upstream saw %d of 2, want both as sent", tt.name, up.count()-sent)
		}
	}
}

// A tracker's status message without a fix of its own (a GT06 heartbeat
// with the ignition, an alarm sent from a garage) reaches Traccar's
// forwarder as a position that repeats the last fix's fixTime and
// coordinates, at its own deviceTime. Each is judged at that time: an
// ignition switched on and then off again, and a second SOS, reach the
// receiver in every shape; the statuses that say nothing new, and the
// forwarder's retry of one, do not.
func TestTraccarStatusWithoutAFixIsJudgedAtItsOwnTime(t *testing.T) {
	ts := base()
	fixTime := ts.Format("2006-01-02T15:04:05.000+00:00")
	status := func(at time.Duration, attributes string) []byte {
		return fmt.Appendf(nil, `{"position":{"id":0,"attributes":{%s},"deviceId":7,"protocol":"gt06","fixTime":%q,"deviceTime":%q,`+
			`"valid":true,"latitude":52.5200087,"longitude":13.4049547,"speed":0.0,"accuracy":0.0},"device":{"id":7,"uniqueId":"358240051111110"}}`,
			attributes, fixTime, ts.Add(at).Format("2006-01-02T15:04:05.000+00:00"))
	}
	for _, shape := range []string{"tumbling", "sliding", "session"} {
		t.Run(shape, func(t *testing.T) {
			up := newUpstream(t)
			answering(up, http.StatusOK, "", "")
			tester := startCaddy(t, up, "preset traccar\n\t\tshape "+shape)
			for _, step := range []struct {
				at               time.Duration
				attributes       string
				decision, reason string
			}{
				{0, `"ignition":false`, "accepted", ""}, // the fix itself: deviceTime is its fixTime
				{time.Minute, `"ignition":true`, "accepted", ""},
				{6 * time.Minute, `"ignition":false`, "accepted", ""},
				{8 * time.Minute, `"ignition":false`, "suppressed", ""},
				{9 * time.Minute, `"ignition":false,"alarm":"sos"`, "accepted", "event"},
				{9 * time.Minute, `"ignition":false,"alarm":"sos"`, "suppressed", "redelivery"},
				{9*time.Minute + 30*time.Second, `"ignition":false`, "suppressed", ""},
				{9*time.Minute + 45*time.Second, `"ignition":false,"alarm":"sos"`, "accepted", "event"},
			} {
				sent := up.count()
				res := send(t, tester.Client, http.MethodPost, "", "application/json", status(step.at, step.attributes))
				decision, reason := res.header.Get("X-Dedup"), res.header.Get("X-Dedup-Reason")
				if res.status != http.StatusOK || decision != step.decision || (step.reason != "" || decision == "accepted") && reason != step.reason {
					t.Fatalf("+%s %s: %d %s %q, want %s %q", step.at, step.attributes, res.status, decision, reason, step.decision, step.reason)
				}
				if reached := up.count() > sent; reached != (step.decision == "accepted") {
					t.Fatalf("+%s %s: reached the receiver %v", step.at, step.attributes, reached)
				}
			}
		})
	}
}

// A GT06-class tracker drives down into an underground car park at 5 m/s
// (9.7 knots), loses GPS on the ramp, and parks there for 20 minutes
// sending its status every 10 s. Traccar's OutdatedHandler copies the
// last fix's coordinates, speed and fixTime into each such position, at
// the message's own deviceTime (traccar/traccar,
// src/main/java/org/traccar/handler/OutdatedHandler.java), and the
// forwarder posts them as the traccar preset reads them. 120 repeats of
// one point tell the backend nothing new: sliding should pass one a
// window (4 here, with one for slack), session one a burst, as tumbling,
// whose key is that one place, passes one a bucket. Through a real Caddy
// the track shapes pass every third repeat (40 of 120) to Traccar: the
// departure-by-speed rule takes each third repeat, at the very point of
// the last accepted one, for a departure.
func TestTraccarStatusRepeatsOfAFixTakenUnderWayAreNoDeparture(t *testing.T) {
	start := base()
	at := func(d time.Duration) string { return start.Add(d).Format("2006-01-02T15:04:05.000+00:00") }
	position := func(fix, device time.Duration, lat float64, knots float64) []byte {
		return fmt.Appendf(nil, `{"position":{"id":0,"attributes":{"ignition":true},"deviceId":7,"protocol":"gt06","fixTime":%q,"deviceTime":%q,`+
			`"valid":true,"latitude":%.7f,"longitude":13.4049547,"speed":%.1f,"accuracy":0.0},"device":{"id":7,"uniqueId":"358240051111112"}}`,
			at(fix), at(device), lat, knots)
	}
	for _, tc := range []struct {
		shape string
		most  int
	}{{"tumbling", 5}, {"sliding", 5}, {"session", 5}} {
		t.Run(tc.shape, func(t *testing.T) {
			up := newUpstream(t)
			answering(up, http.StatusOK, "", "")
			tester := startCaddy(t, up, "preset traccar\n\t\tshape "+tc.shape)
			// The drive in: a fix every 10 s, 50 m apart, at 9.7 knots.
			lat := 52.5200087
			var last time.Duration
			for i := range 6 {
				last = time.Duration(i) * 10 * time.Second
				lat += 50.0 / 111_195
				send(t, tester.Client, http.MethodPost, "", "application/json", position(last, last, lat, 9.7)).expect(t, http.StatusOK, "accepted")
			}
			sent := up.count()
			for i := 1; i <= 120; i++ {
				res := send(t, tester.Client, http.MethodPost, "", "application/json", position(last, last+time.Duration(i)*10*time.Second, lat, 9.7))
				if res.status != http.StatusOK {
					t.Fatalf("status %d: %d", i, res.status)
				}
			}
			passed := up.count() - sent
			t.Logf("%s: %d of 120 status repeats reached Traccar", tc.shape, passed)
			if passed > tc.most {
				t.Errorf("%s: %d of 120 status repeats of the last fix reached Traccar, want at most %d", tc.shape, passed, tc.most)
			}
		})
	}
}

// The README's Overland recipe for a phone without a Device ID takes the
// identity from the user a forward_auth service names, in the header it
// copies. It offered {http.auth.user.id} "behind basic_auth /
// forward_auth": Caddy sets that only in its authentication handler
// (caddyauth.go), forward_auth sets no such placeholder, and every batch
// was refused 422, which the app resends forever (its failure callback,
// GLManager.m:283-287, deletes nothing); basic_auth cannot stand in front
// of the app either, which sends its token as "Authorization: Bearer"
// (GLManager.m:627). (Helper 1's review, stop 64.)
func TestOverlandIdentityFromForwardAuthAsTheREADMESays(t *testing.T) {
	up := newUpstream(t)
	auth := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer jane-token" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Header().Set("X-User", "jane")
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(auth.Close)
	tester := caddyTester(t, fmt.Sprintf(caddytestGlobals+`
http://localhost:{$TD_TEST_HTTP_PORT} {
	forward_auth %s {
		uri /auth
		copy_headers X-User
	}
	telemetry_dedup /telemetry {
		key_prefix %q
		preset overland
		asset {http.request.header.X-User}
		max_past 20000d
	}
	reverse_proxy %s
}`, strings.TrimPrefix(auth.URL, "http://"), keyPrefix(t), strings.TrimPrefix(up.URL, "http://")))
	// The README's own body, device_id "" as its example has it (a 2015 sample).
	body, err := os.ReadFile(filepath.Join("..", "testdata", "senders", "overland", "readme_locations_derived.json"))
	if err != nil {
		t.Fatal(err)
	}
	// Overland's own mode sends its token as a bearer token (GLManager.m:627).
	send(t, tester.Client, http.MethodPost, "", "application/json", body, "Authorization", "Bearer jane-token").
		expect(t, http.StatusCreated, "accepted")
	send(t, tester.Client, http.MethodPost, "", "application/json", body, "Authorization", "Bearer jane-token").
		expect(t, http.StatusOK, "suppressed")
	// A sender naming itself, without the token, never reaches the handler.
	if res := send(t, tester.Client, http.MethodPost, "", "application/json", body, "X-User", "jane"); res.status != http.StatusUnauthorized {
		t.Errorf("a batch with X-User and no token: %d, want forward_auth's 401", res.status)
	}
}

// An OsmAnd or Traccar Client phone sends its fixes as GETs with the fields
// in the query string. Pointed at a route with the default encoding json,
// each is answered 400, and the error told the operator to put a method
// matcher in front: `@pings method POST`. Followed, that advice passed every
// one of those GETs through unexamined, undeduplicated, which the README
// warns against ("a method matcher such as `@post method POST` would pass
// OsmAnd's GETs through unexamined", Tracker formats; Using it). The error
// points at what reads such a request (`encoding form` or `preset
// osmand`), not at the matcher that stops judging it. (Helper 1's review,
// stop 65.)
func TestAnOsmAndGETOnAJSONRouteIsNotToldToBeMatchedAway(t *testing.T) {
	up := newUpstream(t)
	startCaddy(t, up, "")
	at := base()
	url := siteURL + "?id=358240051111110&timestamp=" + strconv.FormatInt(at.Unix(), 10) +
		"&lat=52.5200087&lon=13.4049547&speed=0&bearing=0&altitude=34&accuracy=4&batt=88"
	res, err := caddytestClient().Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusBadRequest {
		t.Fatalf("got %d %q, want the 400 of an empty body", res.StatusCode, body)
	}
	msg := string(body)
	if strings.Contains(msg, "method POST") || !(strings.Contains(msg, "encoding form") || strings.Contains(msg, "osmand")) {
		t.Fatalf("a GET whose query string holds a ping (id, timestamp, lat, lon) is answered %q: "+
			"the advice to match `method POST` lets every such ping through unexamined; "+
			"it should name `encoding form` / `preset osmand`", msg)
	}
}
