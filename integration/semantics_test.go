package integration

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/uber/h3-go/v4"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/geo"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// Figure 2 of the design article through a real Caddy and a real Redis:
// six pings, two of them 4 s apart across a bucket boundary, then an idle
// gap. Each shape answers as the article says.
func TestShapesThroughCaddy(t *testing.T) {
	srv := redistest.Start(t)
	boundary := base().Add(5 * time.Minute)
	pings := []struct {
		at  time.Time
		lat float64
	}{
		{boundary.Add(-64 * time.Second), 52.5200087},
		{boundary.Add(-4 * time.Second), 52.5200207},
		{boundary, 52.5200087},
		{boundary.Add(3 * time.Minute), 52.5200087},
		{boundary.Add(6*time.Minute + 10*time.Second), 52.5200167},
		{boundary.Add(25 * time.Minute), 52.5200087},
	}
	want := map[string][]string{
		"tumbling": {"accepted", "jitter", "accepted", "reobservation", "accepted", "accepted"},
		"sliding":  {"accepted", "jitter", "sliding", "sliding", "accepted", "accepted"},
		"session":  {"accepted", "jitter", "session", "session", "session", "accepted"},
	}
	for _, shape := range []string{"tumbling", "sliding", "session"} {
		t.Run(shape, func(t *testing.T) {
			up := newUpstream(t)
			tester := startCaddy(t, up, redisOptions(srv, "shape "+shape))
			for i, p := range pings {
				res := post(t, tester.Client, ping("veh-fig2", p.at, p.lat, 13.4049547))
				got := res.header.Get("X-Dedup")
				if got == "suppressed" {
					got = res.header.Get("X-Dedup-Reason")
				}
				if got != want[shape][i] {
					t.Errorf("ping %d: %s, want %s", i+1, got, want[shape][i])
				}
			}
		})
	}
}

// Shadow mode makes the same decisions as enforce, records them in the
// placeholders, and forwards everything, marking what enforce would have
// suppressed or rejected.
func TestShadowModeForwardsEverything(t *testing.T) {
	at := base()
	bodies := [][]byte{
		ping("veh-shadow", at, 52.5200087, 13.4049547),
		ping("veh-shadow", at, 52.5200087, 13.4049547),
		ping("veh-shadow", at.Add(30*time.Second), 52.5200410, 13.4049920),
		ping("veh-shadow", at.Add(60*time.Second), 52.5241000, 13.4102000),
		[]byte(`{"asset_id":"veh-shadow","occurred_at":"2026-08-08T12:00:00","lat":52.5,"lon":13.4}`),
	}
	var enforced []response
	t.Run("enforce", func(t *testing.T) { // subtests: separate key prefixes
		enforce := startCaddy(t, newUpstream(t), "")
		for _, b := range bodies {
			enforced = append(enforced, post(t, enforce.Client, b))
		}
	})
	t.Run("shadow", func(t *testing.T) { shadowMatchesEnforce(t, bodies, enforced) })
}

func shadowMatchesEnforce(t *testing.T, bodies [][]byte, enforced []response) {
	shadowUp := newUpstream(t)
	shadow := startCaddy(t, shadowUp, "mode shadow")
	for i, b := range bodies {
		res := post(t, shadow.Client, b)
		if res.status != http.StatusCreated {
			t.Errorf("ping %d: shadow answered %d, want the upstream's 201", i+1, res.status)
		}
		wantHeader := map[string]string{"accepted": "accepted", "suppressed": "would_suppress", "rejected": "would_reject"}[enforced[i].header.Get("X-Dedup")]
		if res.header.Get("X-Dedup") != wantHeader {
			t.Errorf("ping %d: shadow X-Dedup %q, enforce said %q", i+1, res.header.Get("X-Dedup"), enforced[i].header.Get("X-Dedup"))
		}
	}
	got := shadowUp.requests()
	if len(got) != len(bodies) {
		t.Fatalf("shadow forwarded %d of %d requests", len(got), len(bodies))
	}
	for i, r := range got {
		if string(r.body) != string(bodies[i]) {
			t.Errorf("request %d reached the upstream as %q", i+1, r.body)
		}
		if d := r.header.Get("X-Dedup-Decision"); d != enforced[i].header.Get("X-Dedup") {
			t.Errorf("ping %d: shadow recorded %q, enforce decided %q", i+1, d, enforced[i].header.Get("X-Dedup"))
		}
	}
}

func TestPresetsThroughCaddy(t *testing.T) {
	up := newUpstream(t)
	tester := startCaddy(t, up, "preset owntracks\n\t\tasset {http.request.header.X-Limit-U}/{http.request.header.X-Limit-D}")
	tst := base().Unix()
	location := fmt.Appendf(nil, `{"_type":"location","tid":"jj","tst":%d,"lat":52.5200087,"lon":13.4049547,"acc":12,"batt":83}`, tst)

	post(t, tester.Client, location, "X-Limit-U", "jane", "X-Limit-D", "phone").expect(t, http.StatusCreated, "accepted")
	post(t, tester.Client, location, "X-Limit-U", "jane", "X-Limit-D", "phone").expect(t, http.StatusOK, "suppressed")
	// Another user whose app also calls itself "jj" is another asset.
	post(t, tester.Client, location, "X-Limit-U", "john", "X-Limit-D", "phone").expect(t, http.StatusCreated, "accepted")
	if asset := up.requests()[1].header.Get("X-Dedup-Asset"); asset != "john/phone" {
		t.Errorf("asset %q, want john/phone", asset)
	}
	// Without the headers the identity is unknown: rejected, not shared.
	res := post(t, tester.Client, location)
	res.expect(t, http.StatusUnprocessableEntity, "rejected")
	// Messages that are not locations pass through untouched.
	card := []byte(`{"_type":"card","name":"Jane","face":"iVBORw0KGgo="}`)
	post(t, tester.Client, card, "X-Limit-U", "jane", "X-Limit-D", "phone").expect(t, http.StatusCreated, "skipped")
	if n := up.count(); n != 3 || string(up.requests()[2].body) != string(card) {
		t.Fatalf("upstream saw %d requests; want the two first sightings and the card", n)
	}
}

func TestTraccarAndGeoJSONThroughCaddy(t *testing.T) {
	fix := base().Format("2006-01-02T15:04:05.000-07:00")
	for _, tt := range []struct {
		preset, first, jitter string
	}{
		{"traccar",
			`{"position":{"deviceId":1,"fixTime":"` + fix + `","latitude":52.5200087,"longitude":13.4049547,"speed":0.0},"device":{"id":1,"uniqueId":"358240051111110"}}`,
			`{"position":{"deviceId":1,"fixTime":"` + fix + `","latitude":52.5200410,"longitude":13.4049920,"speed":0.0},"device":{"id":1,"uniqueId":"358240051111110"}}`},
		{"geojson",
			`{"type":"Feature","id":"veh-88","geometry":{"type":"Point","coordinates":[13.4049547,52.5200087]},"properties":{"time":"` + fix + `"}}`,
			`{"type":"Feature","id":"veh-88","geometry":{"type":"Point","coordinates":[13.4049920,52.5200410]},"properties":{"time":"` + fix + `"}}`},
	} {
		t.Run(tt.preset, func(t *testing.T) {
			up := newUpstream(t)
			tester := startCaddy(t, up, "preset "+tt.preset)
			post(t, tester.Client, []byte(tt.first)).expect(t, http.StatusCreated, "accepted")
			res := post(t, tester.Client, []byte(tt.jitter))
			res.expect(t, http.StatusOK, "suppressed")
			if res.header.Get("X-Dedup-Reason") != "jitter" {
				t.Errorf("reason %q, want jitter", res.header.Get("X-Dedup-Reason"))
			}
			if cell := up.requests()[0].header.Get("X-Dedup-Cell"); cell != "8c1f1d48945d9ff" {
				t.Errorf("cell %s, want the cell of 52.5200087, 13.4049547", cell)
			}
		})
	}
}

// A ping in UTM is reprojected before keying: it lands in the cell of its
// WGS 84 position.
func TestProjectedPingsAreReprojected(t *testing.T) {
	up := newUpstream(t)
	tester := startCaddy(t, up, "crs EPSG:32633")
	// Zone 33N's central meridian (15°E) at 45°N: easting 500000 exactly.
	body := fmt.Appendf(nil, `{"asset_id":"utm-1","occurred_at":%q,"lat":4982950.4,"lon":500000}`, base().Format(time.RFC3339))
	post(t, tester.Client, body).expect(t, http.StatusCreated, "accepted")
	crs, _ := geo.ParseCRS("EPSG:32633")
	lat, lon, err := crs.ToWGS84(500000, 4982950.4)
	if err != nil || lon != 15 || lat < 44.99 || lat > 45.01 {
		t.Fatalf("reference point: %v %v %v", lat, lon, err)
	}
	want := h3.LatLngToCell(h3.NewLatLng(lat, lon), 12).String()
	if cell := up.requests()[0].header.Get("X-Dedup-Cell"); cell != want {
		t.Fatalf("cell %s, want %s", cell, want)
	}
	res := post(t, tester.Client, fmt.Appendf(nil, `{"asset_id":"utm-1","occurred_at":%q,"lat":4982950.4,"lon":1500000}`, base().Format(time.RFC3339)))
	res.expect(t, http.StatusUnprocessableEntity, "rejected")
	if !strings.Contains(res.body, `"field":"lon"`) {
		t.Errorf("an easting out of the zone should name lon: %s", res.body)
	}
}

func TestInvalidPingsAreDeadLettered(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	tester := startCaddy(t, up, redisOptions(srv, "on_invalid dead_letter\n\t\tdead_letter_stream test:dlq"))
	invalid := []byte(`{"asset_id":"veh-88","occurred_at":"2026-08-08T12:00:00","lat":52.5,"lon":13.4}`)
	malformed := []byte(`{"asset_id":`)

	res := post(t, tester.Client, invalid)
	res.expect(t, http.StatusAccepted, "dead_lettered")
	if !strings.Contains(res.body, `"rule":"timezone"`) {
		t.Errorf("202 body %s does not say why", res.body)
	}
	post(t, tester.Client, malformed).expect(t, http.StatusAccepted, "dead_lettered")
	if n := up.count(); n != 0 {
		t.Fatalf("upstream saw %d dead-lettered pings", n)
	}

	entries, err := srv.Client().XRange(context.Background(), "test:dlq", "-", "+").Result()
	if err != nil || len(entries) != 2 {
		t.Fatalf("stream holds %d entries (%v), want 2", len(entries), err)
	}
	e := entries[0].Values
	if e["reason"] != "timezone" || e["field"] != "occurred_at" || e["body"] != string(invalid) || e["body_bytes"] != fmt.Sprint(len(invalid)) ||
		!strings.HasPrefix(e["remote_addr"].(string), "127.0.0.1:") || e["received_at"] == "" {
		t.Errorf("entry %v", e)
	}
	if entries[1].Values["reason"] != "malformed" || entries[1].Values["body"] != string(malformed) {
		t.Errorf("entry %v", entries[1].Values)
	}

	// With Redis gone the ping is asked to come back, as a valid one is
	// when the store fails closed: never silently dropped, nor answered
	// with a 4xx that some senders drop it on.
	srv.Kill()
	post(t, tester.Client, invalid).expect(t, http.StatusServiceUnavailable, "unavailable")
}

// A batch sent back whole (it holds a ping still in flight) keeps nothing
// of itself, its dead letters included: the invalid ping in it is
// dead-lettered once, when the batch comes back, not on every try.
func TestABatchSentBackWholeIsDeadLetteredOnce(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	tester := startCaddy(t, up, redisOptions(srv, "on_invalid dead_letter\n\t\tdead_letter_stream test:dlq-batch"))
	first := ping("veh-dlq-batch", base(), 52.5200087, 13.4049547)
	batch := []byte("[" + string(first) + `,{"asset_id":"veh-88","occurred_at":"2026-08-08T12:00:00","lat":52.5,"lon":13.4}]`)
	letters := func() int64 {
		n, err := srv.Client().XLen(context.Background(), "test:dlq-batch").Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	arrived, release := holdUpstream(up, http.StatusCreated, "")
	held := make(chan response, 1)
	go func() { held <- post(t, tester.Client, first) }()
	<-arrived
	sentBack := post(t, tester.Client, batch)
	answering(up, http.StatusCreated, "", "")
	release()
	(<-held).expect(t, http.StatusCreated, "accepted")
	sentBack.expect(t, http.StatusConflict, "in_flight")
	if n := letters(); n != 0 {
		t.Fatalf("the batch sent back whole wrote %d dead letters", n)
	}
	if res := post(t, tester.Client, batch); res.status != http.StatusAccepted {
		t.Fatalf("the batch taken: %d %q, want 202", res.status, res.header.Get("X-Dedup"))
	}
	if n := letters(); n != 1 {
		t.Fatalf("the batch taken wrote %d dead letters, want 1", n)
	}
}

// In the sliding shape a failed upstream undoes the move it accepted, so
// the retry is judged as if the failure had never happened.
func TestReleaseRestoresTheLastAcceptedPlace(t *testing.T) {
	srv := redistest.Start(t)
	up := newUpstream(t)
	tester := startCaddy(t, up, redisOptions(srv, "shape sliding"))
	at := base()
	post(t, tester.Client, ping("veh-slide", at, 52.5200087, 13.4049547)).expect(t, http.StatusCreated, "accepted")

	moved := ping("veh-slide", at.Add(time.Minute), 52.5241000, 13.4102000)
	up.setResponse(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusBadGateway) })
	post(t, tester.Client, moved).expect(t, http.StatusBadGateway, "accepted")
	// The failed move is not the last accepted place: back home is still home.
	up.setResponse(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	post(t, tester.Client, ping("veh-slide", at.Add(70*time.Second), 52.5200110, 13.4049560)).expect(t, http.StatusOK, "suppressed")
	post(t, tester.Client, moved).expect(t, http.StatusCreated, "accepted")
}
