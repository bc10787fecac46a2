package analyze

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// recorderFile is a month file of the OwnTracks Recorder
// (rec/jane/phone/2025-01.rec), written as its recorder.c writes each
// message: putrec() prints RECFORMAT, "%s\t%-18s\t%s\n", with isotime() of
// the location's tst (util.c; the time of receipt for an lwt), the topic
// below owntracks/<user>/<device> ("*" for the device's own, "event" for
// a transition published there, "lwt"), and the message as json_stringify
// re-encodes it, with the tzname it looked up (WITH_TZ, on by default)
// and, for a message posted over HTTP, "_http":true appended (snapshot
// ae2fd296caf8ee2b451231221da3265f1fe2f1d0 of owntracks/recorder,
// GPL-2.0-or-later; only the line format is followed, the values are
// invented). Line 4 is line 3 delivered twice: the Recorder stores every
// copy.
const recorderFile = "" +
	"2025-01-01T10:00:00Z\t*                 \t" + `{"_type":"location","_id":"3f9a1c2e","acc":12,"alt":35,"batt":81,"bs":1,"conn":"w","created_at":1735725601,"lat":48.856826,"lon":2.292713,"m":1,"t":"p","tid":"jp","tst":1735725600,"vac":3,"vel":0,"tzname":"Europe/Paris"}` + "\n" +
	"2025-01-01T10:00:30Z\t*                 \t" + `{"_type":"location","_id":"3f9a1c2f","acc":11,"alt":35,"batt":81,"bs":1,"conn":"w","created_at":1735725631,"lat":48.856841,"lon":2.292698,"m":1,"t":"p","tid":"jp","tst":1735725630,"vac":3,"vel":0,"tzname":"Europe/Paris"}` + "\n" +
	"2025-01-01T10:01:00Z\t*                 \t" + `{"_type":"location","_id":"3f9a1c30","acc":12,"alt":36,"batt":80,"bs":1,"conn":"w","created_at":1735725661,"lat":48.856819,"lon":2.292731,"m":1,"t":"p","tid":"jp","tst":1735725660,"vac":3,"vel":0,"tzname":"Europe/Paris"}` + "\n" +
	"2025-01-01T10:01:00Z\t*                 \t" + `{"_type":"location","_id":"3f9a1c30","acc":12,"alt":36,"batt":80,"bs":1,"conn":"w","created_at":1735725661,"lat":48.856819,"lon":2.292731,"m":1,"t":"p","tid":"jp","tst":1735725660,"vac":3,"vel":0,"tzname":"Europe/Paris"}` + "\n" +
	"2025-01-01T10:01:05Z\tevent             \t" + `{"_type":"transition","acc":3,"desc":"home","event":"enter","lat":48.856826,"lon":2.292713,"t":"c","tid":"jp","tst":1735725665,"wtst":1558351273,"tzname":"Europe/Paris"}` + "\n" +
	"2025-01-01T10:01:10Z\tlwt               \t" + `{"_type":"lwt","tst":1735725000}` + "\n" +
	"2025-01-01T10:01:30Z\t*                 \t" + `{"_type":"location","topic":"owntracks/jane/phone","created_at":1735725691,"_id":"3f9a1c31","t":"p","batt":80,"bs":1,"acc":9,"vac":3,"lat":48.856832,"lon":2.292709,"alt":35,"vel":0,"cog":0,"tst":1735725690,"m":1,"conn":"w","inregions":["home"],"tid":"jp","source":"fused","tzname":"Europe/Paris","_http":true}` + "\n" +
	"2025-01-01T10:02:00Z\t*                 \t" + `{"_type":"location","topic":"owntracks/jane/phone","created_at":1735725721,"_id":"3f9a1c32","t":"p","batt":80,"bs":1,"acc":10,"vac":3,"lat":48.856824,"lon":2.292719,"alt":35,"vel":0,"cog":0,"tst":1735725720,"m":1,"conn":"w","inregions":["home"],"tid":"jp","source":"fused","tzname":"Europe/Paris","_http":true}` + "\n"

// A Recorder's .rec file is read with the owntracks preset as its
// messages one a line would be: each line's message is the text after its
// second tab, the locations are pings (the redelivered one too), and the
// transition and the lwt are other message types.
func TestAnalyzeReadsOwnTracksRecorderFiles(t *testing.T) {
	preset, err := ping.ParsePreset("owntracks")
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{Parser: preset.Parser}
	rep := analyze(t, []byte(recorderFile), opts)
	if rep.Lines != 8 || rep.Pings != 6 || rep.Assets != 1 || !reflect.DeepEqual(rep.Skipped, map[string]int{SkipNotAPing: 2}) {
		t.Errorf("%d lines, %d pings of %d assets, skipped %v; want 8 lines, 6 pings of 1 asset, 2 not a ping",
			rep.Lines, rep.Pings, rep.Assets, rep.Skipped)
	}
	var messages bytes.Buffer
	for line := range strings.Lines(recorderFile) {
		fields := strings.SplitN(line, "\t", 3)
		messages.WriteString(fields[2])
	}
	if want := analyze(t, messages.Bytes(), opts); !reflect.DeepEqual(rep, want) {
		t.Errorf("the .rec file reads as\n%+v\nits messages one a line as\n%+v", rep, want)
	}
}
