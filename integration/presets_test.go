package integration

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// presetSender is one preset's real client: how it posts a ping, and what it
// does with an answer.
type presetSender struct {
	preset   string
	upstream func(up *upstream) // what the backend answers, as without Caddy
	// valid and invalid are the client's own requests: a fix, and one the
	// module cannot key.
	valid, invalid func(t *testing.T, c *http.Client) response
	// fates are what each of its clients does with an answer.
	fates map[string]func(response) fate
}

func presetSenders() []presetSender {
	at := base().Add(7 * time.Minute)
	ownTracks := func(identity string) []byte { // without tid and topic, it names no device
		return fmt.Appendf(nil, `{"_type":"location",%s"tst":%d,"lat":48.856826,"lon":2.292713,"acc":12}`, identity, at.Unix())
	}
	overlandBatch := func(device string) []byte {
		f := overlandFeature(at, 2.292713, 48.856826, device)
		if device == "" {
			f = strings.Replace(f, `,"device_id":""`, "", 1)
		}
		return []byte(`{"locations":[` + f + `]}`)
	}
	osmand := func(lat string) string {
		return fmt.Sprintf("id=4711&timestamp=%d&lat=%s&lon=2.292713&speed=0.0&accuracy=5.0", at.Unix(), lat)
	}
	traccar := func(lat string) []byte {
		return []byte(`{"position":{"deviceId":7,"deviceTime":"` + at.Format("2006-01-02T15:04:05.000+00:00") + `","fixTime":"` +
			at.Format("2006-01-02T15:04:05.000+00:00") + `","valid":true,"latitude":` + lat + `,"longitude":2.292713,"speed":0,"attributes":{}},` +
			`"device":{"uniqueId":"358240051111199","name":"van"}}`)
	}
	json := func(body []byte) func(t *testing.T, c *http.Client) response {
		return func(t *testing.T, c *http.Client) response {
			return send(t, c, http.MethodPost, "", "application/json", body)
		}
	}
	query := func(q string) func(t *testing.T, c *http.Client) response {
		return func(t *testing.T, c *http.Client) response { return send(t, c, http.MethodPost, q, "", nil) }
	}
	return []presetSender{
		{"owntracks", func(up *upstream) { answering(up, http.StatusOK, "application/json", "[]") },
			json(ownTracks(`"tid":"jp","topic":"owntracks/jane/phone",`)), json(ownTracks("")),
			map[string]func(response) fate{"OwnTracks Android": ownTracksAndroid, "OwnTracks iOS": ownTracksIOS}},
		{"overland", func(up *upstream) { answering(up, http.StatusOK, "application/json", `{"result":"ok"}`) },
			json(overlandBatch("phone1")), json(overlandBatch("")),
			map[string]func(response) fate{
				"Overland":                 func(r response) fate { return overland(r, false) },
				"Overland, 2XX Successful": func(r response) fate { return overland(r, true) },
			}},
		{"osmand", func(up *upstream) { answering(up, http.StatusOK, "", "") },
			query(osmand("48.856826")), query(osmand("91.5")),
			map[string]func(response) fate{
				"Traccar Client (old)": func(r response) fate { return traccarClientAndroid(r, false) },
				"Traccar Client SDK":   func(r response) fate { return traccarClientSDK(r, false) },
				"Traccar Client 9":     traccarClient9,
			}},
		{"traccar", func(up *upstream) { answering(up, http.StatusOK, "", "") },
			json(traccar("48.856826")), json(traccar("91.5")),
			map[string]func(response) fate{
				"Traccar forwarder, forward.retry.enable": func(r response) fate { return traccarForwarder(r, true) },
			}},
	}
}

// Guard: with on_store_error closed, a ping the store cannot judge is
// answered so that every client of every preset keeps it and sends it
// again, not at once (README, Senders: "Unavailable ... is 503 +
// Retry-After: 5 with every preset. The apps retry it from their queues");
// once Redis answers, the resend reaches the backend once and its next
// resend is taken as delivered. Untested per preset before: the
// integration tests drove on_store_error closed with plain JSON pings only.
func TestEveryPresetsSenderKeepsAPingTheStoreCouldNotJudge(t *testing.T) {
	for _, s := range presetSenders() {
		t.Run(s.preset, func(t *testing.T) {
			srv := redistest.Start(t)
			up := newUpstream(t)
			s.upstream(up)
			tester := startCaddy(t, up, redisOptions(srv, "preset "+s.preset+"\n\t\ton_store_error closed"))

			srv.Pause()
			res := s.valid(t, tester.Client)
			srv.Resume()
			res.expect(t, http.StatusServiceUnavailable, "unavailable")
			for client, fate := range s.fates {
				if f := fate(res); f != retried || !retryAfterAtLeastOne(res) {
					t.Errorf("Redis hung: %d, Retry-After %q: %s %s it; want it kept and sent again later", res.status, res.header.Get("Retry-After"), client, f)
				}
			}
			if up.count() != 0 {
				t.Fatalf("the upstream saw %d requests while the store could not judge", up.count())
			}
			waitFor(t, func() bool { return s.valid(t, tester.Client).header.Get("X-Dedup") == "accepted" })
			again := s.valid(t, tester.Client)
			again.expect(t, http.StatusOK, "suppressed")
			for client, fate := range s.fates {
				if f := fate(again); f != delivered {
					t.Errorf("the resend after the outage: %d %q: %s %s it; want it delivered", again.status, again.body, client, f)
				}
			}
			if up.count() != 1 {
				t.Errorf("the upstream saw %d requests; want the ping once", up.count())
			}
		})
	}
}

// Guard: with on_invalid dead_letter, a ping that cannot be keyed is
// answered so that every client of every preset stops sending it (README,
// Senders: "With those senders use on_invalid dead_letter: the ping is kept
// in a Redis stream and the answer is one the client takes as delivered"),
// and it is kept once. Only OwnTracks was driven so before.
func TestEveryPresetsSenderTakesADeadLetterAsDelivered(t *testing.T) {
	for _, s := range presetSenders() {
		t.Run(s.preset, func(t *testing.T) {
			srv := redistest.Start(t)
			up := newUpstream(t)
			s.upstream(up)
			stream := "test:presetdlq:" + s.preset
			tester := startCaddy(t, up, redisOptions(srv, "preset "+s.preset+"\n\t\ton_invalid dead_letter\n\t\tdead_letter_stream "+stream))
			res := s.invalid(t, tester.Client)
			if res.status/100 != 2 || (res.header.Get("X-Dedup") != "dead_lettered" && res.header.Get("X-Dedup") != "partial") {
				t.Fatalf("the invalid ping: %d X-Dedup %q %s; want a 2xx dead_lettered", res.status, res.header.Get("X-Dedup"), res.body)
			}
			for client, fate := range s.fates {
				if f := fate(res); f != delivered {
					t.Errorf("dead letter answered %d %q %q: %s %s it; want it delivered", res.status, res.header.Get("Content-Type"), res.body, client, f)
				}
			}
			if n := srv.Client().XLen(t.Context(), stream).Val(); n != 1 || up.count() != 0 {
				t.Errorf("the stream holds %d letters, the upstream saw %d requests; want the ping kept once, nothing forwarded", n, up.count())
			}
		})
	}
}
