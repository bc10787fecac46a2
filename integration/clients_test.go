package integration

import (
	"encoding/json"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// What each tracker app does with an answer, written from its own source
// (the snapshots and lines are in testdata/senders/SOURCES.md and the
// README's "What each client counts as delivered"). The tests hold the
// module's real answers to these rules.

// fate is what a client does with a message after an answer.
type fate string

const (
	delivered fate = "delivered" // removed from its queue
	retried   fate = "retried"   // kept, and sent again later
	dropped   fate = "dropped"   // removed without having been delivered
	crashed   fate = "crashed"   // the app throws; the message stays queued, to crash it again
)

// ownTracksAndroid is OwnTracks Android 2.5.7–2.5.9, the strictest of its
// versions (HttpMessageProcessorEndpoint.kt at v2.5.9, lines 124-164;
// Parser.kt:144-158): any non-2xx is re-queued; a 2xx is delivered only if
// its body parses as OwnTracks messages, an array of objects with a
// "_type" or one such object, and re-queued otherwise (an empty body too).
// Content-Type is never read. Through OkHttp
// (RetryAndFollowUpInterceptor.followUpRequest), a 503 with Retry-After: 0
// is sent again at once, which no answer of ours may cause.
func ownTracksAndroid(r response) fate {
	if r.status == http.StatusServiceUnavailable && r.header.Get("Retry-After") == "0" {
		return "resent at once by OkHttp"
	}
	if r.status < 200 || r.status > 299 {
		return retried
	}
	var messages []map[string]json.RawMessage
	if err := json.Unmarshal([]byte(r.body), &messages); err != nil {
		var one map[string]json.RawMessage
		if json.Unmarshal([]byte(r.body), &one) != nil {
			return retried
		}
		messages = append(messages, one)
	}
	for _, m := range messages {
		var typ string
		if json.Unmarshal(m["_type"], &typ) != nil || !ownTracksAndroidTypes[typ] {
			return retried
		}
	}
	return delivered
}

// ownTracksAndroidTypes are the message types Parser.kt (v2.5.9, lines
// 39-50) decodes without the phone's key; any other _type fails the
// whole body.
var ownTracksAndroidTypes = map[string]bool{"card": true, "clear": true, "cmd": true, "configuration": true, "location": true,
	"lwt": true, "status": true, "transition": true, "waypoint": true, "waypoints": true}

// ownTracksIOS is OwnTracks iOS (Connection.m:490-568): a 2xx with any
// body is delivered; a 4xx deletes the message and alerts the user with
// "Status Code N"; anything else keeps it for the reconnect timer.
func ownTracksIOS(r response) fate {
	switch {
	case r.status >= 200 && r.status <= 299:
		return delivered
	case r.status >= 400 && r.status <= 499:
		return dropped
	}
	return retried
}

// overland is Overland iOS (GLManager.m:220-287) behind AFNetworking's
// AFJSONResponseSerializer: only a 2xx whose body is empty or JSON with a
// JSON Content-Type reaches the success callback; there, unless the user
// turned on "Consider HTTP 2XX Successful", the batch is deleted only when
// the body is a JSON object with "result":"ok". Anything else keeps the
// whole batch, to be sent again at the next interval. With that setting on,
// a delivered answer is still read as an object (objectForKey: "geocode",
// line 243, before the batch is deleted): JSON that is not one, such as
// OwnTracks' [], throws an uncaught exception.
func overland(r response, consider2xxSuccessful bool) fate {
	if r.status < 200 || r.status > 299 {
		return retried
	}
	var object map[string]any
	if strings.TrimSpace(r.body) != "" {
		mt, _, _ := mime.ParseMediaType(r.header.Get("Content-Type"))
		if mt != "application/json" && mt != "text/json" && mt != "text/javascript" {
			return retried // "unacceptable content-type"
		}
		var v any
		if json.Unmarshal([]byte(r.body), &v) != nil {
			return retried
		}
		var isObject bool
		if object, isObject = v.(map[string]any); !isObject && consider2xxSuccessful {
			return crashed
		}
	}
	if !consider2xxSuccessful {
		switch result := object["result"].(type) {
		case nil:
			return retried
		case string:
			if result != "ok" {
				return retried
			}
		default:
			return crashed // isEqualToString: sent to a number, a list or an object (line 237)
		}
	}
	if _, isObject := object["geocode"].(map[string]any); object["geocode"] != nil && !isObject {
		return crashed // objectForKey: sent to it (lines 243-245), before the batch is deleted
	}
	return delivered
}

// traccarClientAndroid is the old Traccar Client for Android
// (RequestManager.kt:30-51, TrackingController.kt): HttpURLConnection's
// getInputStream succeeds for any status below 400, which deletes the
// buffered position; anything else leaves it for a retry 30 s later. An
// alarm (ShortcutActivity.kt:78-98) is sent unbuffered and never retried.
func traccarClientAndroid(r response, alarm bool) fate {
	switch {
	case r.status < 400:
		return delivered
	case alarm:
		return dropped
	}
	return retried
}

// traccarClientSDK is the Traccar Client SDK of the new app
// (HttpUploader.kt, TrackerEngine.kt): a 2xx is delivered, anything else
// is retried from the buffer with a backoff; requestPosition (SOS, manual,
// push) uploads once and never retries.
func traccarClientSDK(r response, alarm bool) fate {
	switch {
	case r.status >= 200 && r.status <= 299:
		return delivered
	case alarm:
		return dropped
	}
	return retried
}

// traccarClient9 is Traccar Client 9.0 to 9.6.5, built on the
// Transistorsoft background-geolocation SDK 4.x (flutter_background_geolocation
// 4.16.9-4.18.2), whose HTTP service deletes a record only on "a
// successful HTTP response from your server (200, 201, 204)"
// (lib/models/http_event.dart, lines 42-43 and 301) and uploads anything
// else again at the next sync.
func traccarClient9(r response) fate {
	switch r.status {
	case http.StatusOK, http.StatusCreated, http.StatusNoContent:
		return delivered
	}
	return retried
}

// traccarForwarder is Traccar's JSON position forwarder
// (PositionForwarderJson.java:78-83, PositionForwardingHandler.java:89-103):
// a 2xx is delivered; anything else is retried only with
// forward.retry.enable, and dropped without it.
func traccarForwarder(r response, retryEnabled bool) fate {
	switch {
	case r.status >= 200 && r.status <= 299:
		return delivered
	case retryEnabled:
		return retried
	}
	return dropped
}

// traccarAlarms is what Traccar raises from the OsmAnd positions it
// stores, in order, at its default event.ignoreDuplicateAlerts true
// (traccar/traccar 9e5c458: Keys.java:511-514; AlarmEventHandler.java:40-59,
// with lastPosition the device's latest stored position,
// BasePositionEventHandler.java:30-35): each alarm of a position's alarm
// field (a comma-separated list) is an event, unless the device's last
// stored position carried that alarm too. Each query is one position, its
// fields as OsmAndProtocolDecoder reads them.
func traccarAlarms(queries []string) []string {
	var raised []string
	var last []string
	for _, q := range queries {
		fields, _ := url.ParseQuery(q)
		var alarms []string
		if a := fields.Get("alarm"); a != "" {
			alarms = strings.Split(a, ",")
		}
		for _, a := range alarms {
			if !slices.Contains(last, a) {
				raised = append(raised, a)
			}
		}
		last = alarms
	}
	return raised
}

// retryAfterAtLeastOne reports an answer whose Retry-After is a whole
// number of seconds of at least 1.
func retryAfterAtLeastOne(r response) bool {
	n, err := strconv.Atoi(r.header.Get("Retry-After"))
	return err == nil && n >= 1
}

// The rules read the clients' own samples as the clients do: an OwnTracks
// server's array of messages and Overland's README answer are delivered;
// the answers the issue started from are not.
func TestClientRulesReadTheClientsOwnSamples(t *testing.T) {
	ok := func(status int, contentType, body string) response {
		h := http.Header{}
		if contentType != "" {
			h.Set("Content-Type", contentType)
		}
		return response{status, h, body}
	}
	for _, tt := range []struct {
		name string
		got  fate
		want fate
	}{
		{"Android: a server's array of locations", ownTracksAndroid(ok(200, "application/json", string(fixture(t, "owntracks-android/location_multiple_messages.json")))), delivered},
		{"Android: an empty 200", ownTracksAndroid(ok(200, "", "")), retried},
		{`Android: {"result":"ok"}`, ownTracksAndroid(ok(200, "application/json", `{"result":"ok"}`)), retried},
		{"Android: 409", ownTracksAndroid(ok(409, "application/json", `{}`)), retried},
		{"Android: a _type it does not know", ownTracksAndroid(ok(200, "application/json", `{"_type":"duplicate"}`)), retried},
		{"iOS: an empty 200", ownTracksIOS(ok(200, "", "")), delivered},
		{"iOS: 409", ownTracksIOS(ok(409, "application/json", `{}`)), dropped},
		{"Overland: the README's answer", overland(ok(200, "application/json", string(fixture(t, "overland/readme_response_ok.json"))), false), delivered},
		{"Overland: []", overland(ok(200, "application/json", "[]"), false), retried},
		{"Overland: an empty 200", overland(ok(200, "", ""), false), retried},
		{"Overland: an empty 200, 2xx successful", overland(ok(200, "", ""), true), delivered},
		{"Overland: text/plain, 2xx successful", overland(ok(200, "text/plain", "ok"), true), retried},
		{"Overland: [], 2xx successful", overland(ok(200, "application/json", "[]"), true), crashed},
		{"Overland: a geocode that is no object", overland(ok(200, "application/json", `{"result":"ok","geocode":"x"}`), false), crashed},
		{"Overland: a result that is no string", overland(ok(200, "application/json", `{"result":true}`), false), crashed},
		{"Traccar Client 9: 202", traccarClient9(ok(202, "application/json", `{}`)), retried},
		{"Traccar Client 9: 204", traccarClient9(ok(204, "", "")), delivered},
		{"Traccar Client: 302", traccarClientAndroid(ok(302, "", ""), false), delivered},
		{"Traccar Client: SOS answered 503", traccarClientAndroid(ok(503, "", ""), true), dropped},
		{"Traccar forwarder: 503 without retry", traccarForwarder(ok(503, "", ""), false), dropped},
	} {
		if tt.got != tt.want {
			t.Errorf("%s: %s, want %s", tt.name, tt.got, tt.want)
		}
	}
}
