package integration

import (
	"bufio"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fixture reads a sample from testdata/senders (SOURCES.md says where each
// comes from).
func fixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "testdata", "senders", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Every sample request of the trackers goes through a real Caddy with its
// preset and gets the decision its content calls for, in the order given
// (a later sample can repeat an earlier one). A .txt file holds one
// request a line: a URL, sent as a GET with its query, or a form body,
// POSTed.
func TestSenderFixturesThroughCaddy(t *testing.T) {
	for _, tt := range []struct {
		options string
		files   []string
		want    [][]string // X-Dedup per request of each file
	}{
		{"preset owntracks", []string{
			"owntracks-android/location_deserialize_extended.json",
			"owntracks-android/location_extended_serialized.json",
			"owntracks-android/location_http_composed.json",
			"owntracks-android/location_multiple_messages.json",
			"owntracks-android/location_serialized.json",
			"owntracks-android/location_with_created_at.json",
			"owntracks-android/transition_message.json",
			"owntracks-android/valid_card_message.json",
			"owntracks-ios/location_http_composed.json",
			"owntracks-ios/location_incoming_test.json",
			"owntracks-ios/transition_composed.json",
		}, [][]string{{"accepted"}, {"rejected"}, {"accepted"},
			{"accepted"}, // pings (t p), events: its first is the first fixture's fix, without its regions
			{"rejected"}, {"accepted"},
			{"skipped"}, {"skipped"}, {"accepted"}, {"rejected"}, {"skipped"}}},
		// Overland's OwnTracks mode has no tid; its topic names the device.
		{"preset owntracks\n\t\tasset topic", []string{"overland/owntracks_mode_composed.json"}, [][]string{{"accepted"}}},
		// The second fix is 7 m from the first in the same second's bucket:
		// jitter; the visit is passed on.
		{"preset overland", []string{"overland/batch_composed.json", "overland/readme_locations_derived.json"},
			[][]string{{"partial"}, {"rejected"}}},
		{"preset osmand", []string{
			"traccar-osmand/query_strings.txt",
			"traccar-client-android/request_urls_test.txt",
			"traccar-client-android/request_url_composed.txt",
			"traccar-client-sdk/form_body_composed.txt",
			"traccar-client-sdk/json_array_body_composed.json",
			"traccar-osmand/json/transistorsoft_android_moving.json",
			"traccar-osmand/json/transistorsoft_extras_types.json",
			"traccar-osmand/json/transistorsoft_ios_mock.json",
			"traccar-osmand/json/transistorsoft_traccar_client9_motionchange.json",
		}, [][]string{
			// The tenth, location=60.0,30.0, is the sixth's fix again: Traccar reads location as lat,lon.
			{"skipped", "rejected", "accepted", "accepted", "rejected", "accepted", "suppressed", "skipped", "skipped", "suppressed", "accepted"},
			{"skipped", "skipped", "skipped"}, // at (0, 0), which Traccar stores as it is
			{"accepted", "accepted", "accepted"},
			{"accepted", "accepted"},
			{"skipped"},
			{"accepted"}, {"accepted"}, {"accepted"},
			{"suppressed"}, // the same location as extras_types
		}},
		// The event forwarder's alarm at the position just forwarded goes on
		// to the backend: keyed, it would be that position's redelivery.
		{"preset traccar", []string{"traccar-forward/position_forward_composed.json", "traccar-forward/event_forward_composed.json"},
			[][]string{{"accepted"}, {"skipped"}}},
	} {
		t.Run(tt.options, func(t *testing.T) {
			up := newUpstream(t)
			// The samples were recorded years ago: max_past is not what this
			// test is about.
			tester := startCaddy(t, up, tt.options+"\n\t\tmax_past 20000d")
			for i, file := range tt.files {
				var got []string
				for _, r := range fixtureRequests(t, file) {
					res := send(t, tester.Client, r.method, r.query, r.contentType, r.body)
					got = append(got, res.header.Get("X-Dedup")+"/"+res.header.Get("X-Dedup-Reason"))
				}
				var decisions []string
				for _, g := range got {
					decisions = append(decisions, strings.SplitN(g, "/", 2)[0])
				}
				if strings.Join(decisions, " ") != strings.Join(tt.want[i], " ") {
					t.Errorf("%s: got %v, want %v", file, got, tt.want[i])
				}
			}
		})
	}
}

type fixtureRequest struct {
	method, query, contentType string
	body                       []byte
}

func fixtureRequests(t *testing.T, file string) []fixtureRequest {
	t.Helper()
	if !strings.HasSuffix(file, ".txt") {
		return []fixtureRequest{{http.MethodPost, "", "application/json", fixture(t, file)}}
	}
	var requests []fixtureRequest
	for s := bufio.NewScanner(strings.NewReader(string(fixture(t, file)))); s.Scan(); {
		line := strings.TrimSpace(s.Text())
		if line == "" {
			continue
		}
		if u, err := url.Parse(line); err == nil && u.RawQuery != "" {
			requests = append(requests, fixtureRequest{http.MethodGet, u.RawQuery, "", nil})
			continue
		}
		requests = append(requests, fixtureRequest{http.MethodPost, "", "application/x-www-form-urlencoded", []byte(line)})
	}
	return requests
}
