package analyze

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// traccarGPX is a route as Traccar's web UI exports it (reports, route,
// export GPX), written as GpxExportProvider.generate writes it
// (src/main/java/org/traccar/reports/GpxExportProvider.java of
// traccar/traccar at 9e5c458ad0bf44ceaddf72534bf6874787f41b6c,
// Apache-2.0): an XMLStreamWriter's document on one line, no namespace,
// one trk named after the device (escaped), one trkseg, and per position a
// trkpt with lat and lon as Java's Double.toString writes them (-5.0E-4
// below 1e-3), its altitude as ele and its fix time as DateUtil.formatDate
// writes it (ISO_OFFSET_DATE_TIME in the server's zone: the offset, and a
// fraction only when the milliseconds are not 0). Only the format is
// followed; the values are invented: a van parked at the Greenwich
// meridian for five minutes, reporting every 30 s, then driving east.
const traccarGPX = "<?xml version='1.0' encoding='UTF-8'?>" +
	`<gpx version="1.0"><trk><name>Van 7 &amp; trailer &lt;spare></name><trkseg>` +
	`<trkpt lat="51.47787" lon="-5.0E-4"><ele>46.0</ele><time>2026-03-01T10:00:00+01:00</time></trkpt>` +
	`<trkpt lat="51.477872" lon="-4.98E-4"><ele>46.2</ele><time>2026-03-01T10:00:30+01:00</time></trkpt>` +
	`<trkpt lat="51.477866" lon="-5.03E-4"><ele>45.9</ele><time>2026-03-01T10:01:00.25+01:00</time></trkpt>` +
	`<trkpt lat="51.477874" lon="-4.97E-4"><ele>46.1</ele><time>2026-03-01T10:01:30+01:00</time></trkpt>` +
	`<trkpt lat="51.477869" lon="-5.01E-4"><ele>46.0</ele><time>2026-03-01T10:02:00+01:00</time></trkpt>` +
	`<trkpt lat="51.477871" lon="-4.99E-4"><ele>46.3</ele><time>2026-03-01T10:02:30+01:00</time></trkpt>` +
	`<trkpt lat="51.477868" lon="-5.02E-4"><ele>45.8</ele><time>2026-03-01T10:03:00+01:00</time></trkpt>` +
	`<trkpt lat="51.477873" lon="-4.96E-4"><ele>46.0</ele><time>2026-03-01T10:03:30+01:00</time></trkpt>` +
	`<trkpt lat="51.47787" lon="-5.0E-4"><ele>46.1</ele><time>2026-03-01T10:04:00+01:00</time></trkpt>` +
	`<trkpt lat="51.477867" lon="-5.04E-4"><ele>46.0</ele><time>2026-03-01T10:04:30+01:00</time></trkpt>` +
	`<trkpt lat="51.477872" lon="-4.98E-4"><ele>45.9</ele><time>2026-03-01T10:05:00+01:00</time></trkpt>` +
	`<trkpt lat="51.47787" lon="0.0012"><ele>45.0</ele><time>2026-03-01T10:05:30+01:00</time></trkpt>` +
	`<trkpt lat="51.47787" lon="0.0035"><ele>44.0</ele><time>2026-03-01T10:06:00+01:00</time></trkpt>` +
	`<trkpt lat="51.47787" lon="0.0058"><ele>43.0</ele><time>2026-03-01T10:06:30+01:00</time></trkpt>` +
	`</trkseg></trk></gpx>`

// A GPX route exported from Traccar is one asset, each trkpt one of its
// pings in document order: the document counts as one line holding its
// track points.
func TestAnalyzeReadsATraccarGPXExport(t *testing.T) {
	rep := analyze(t, []byte(traccarGPX), Options{})
	if rep.Lines != 1 || rep.Elements != 14 || rep.Pings != 14 || rep.Assets != 1 || len(rep.Skipped) != 0 {
		t.Errorf("%d lines, %d elements, %d pings of %d assets, skipped %v; want 1 line of 14 elements, 14 pings of 1 asset",
			rep.Lines, rep.Elements, rep.Pings, rep.Assets, rep.Skipped)
	}
	if rep.MedianInterval != 30*time.Second || rep.Jitter.Runs != 1 || rep.Moves.Count != 3 {
		t.Errorf("median interval %s, %d stationary runs, %d moves; want 30s, 1, 3",
			rep.MedianInterval, rep.Jitter.Runs, rep.Moves.Count)
	}
}

// A point the route cannot use is skipped by why, as a line's ping would
// be, and the first one the document could not read is named by its index
// among the track points; other GPX writers' waypoints and route points
// are not Traccar's, and are not read.
func TestAnalyzeCountsBadGPXPoints(t *testing.T) {
	gpx := "\n  <gpx version=\"1.1\" xmlns=\"http://www.topografix.com/GPX/1/1\"><wpt lat=\"1\" lon=\"1\"><time>2026-03-01T10:00:00Z</time></wpt><trk><trkseg>" +
		`<trkpt lat="52.5" lon="13.4"><time>2026-03-01T10:00:00Z</time></trkpt>` +
		`<trkpt lat="52.5" lon="13.4"></trkpt>` + // no time
		`<trkpt lat="91" lon="13.4"><time>2026-03-01T10:01:00Z</time></trkpt>` +
		`<trkpt lat="0" lon="0"><time>2026-03-01T10:01:30Z</time></trkpt>` +
		`<trkpt lat="52.5"><time>2026-03-01T10:02:00Z</time></trkpt>` + // no lon
		`<trkpt lat="52.5" lon="13.4"><time>2026-03-01T10:02:30Z</time></trkpt>` +
		`</trkseg></trk></gpx>`
	rep := analyze(t, []byte(gpx), Options{})
	want := map[string]int{SkipMalformed: 2, "range": 1, "null_island": 1}
	if rep.Lines != 1 || rep.Elements != 6 || rep.Pings != 2 || !reflect.DeepEqual(rep.Skipped, want) {
		t.Errorf("%d lines, %d elements, %d pings, skipped %v; want 1, 6, 2, %v", rep.Lines, rep.Elements, rep.Pings, rep.Skipped, want)
	}
	if !strings.Contains(strings.Join(rep.Notes, "\n"), "track point 2 has no <time>") {
		t.Errorf("no note names the first point without time: %q", rep.Notes)
	}
	_, err := Analyze(strings.NewReader(`<gpx><trk><trkseg><trkpt lat="1" lon="2"/></trkseg></trk></gpx>`), Options{})
	if err == nil || !strings.Contains(err.Error(), "track point 1 has no <time>") {
		t.Errorf("a document of which no point can be read: %v, want an error naming track point 1", err)
	}
}

// A GPX file saved with a UTF-8 byte order mark (as Windows tools and .NET's
// XmlWriter write it) is still a GPX document: read as lines, each would be
// a malformed ping and the route lost without a word.
func TestAnalyzeReadsAGPXWithAByteOrderMark(t *testing.T) {
	rep := analyze(t, []byte("\xEF\xBB\xBF"+traccarGPX), Options{})
	if rep.Lines != 1 || rep.Pings != 14 || len(rep.Skipped) != 0 {
		t.Errorf("%d lines, %d pings, skipped %v; want 1 line, 14 pings, none skipped", rep.Lines, rep.Pings, rep.Skipped)
	}
}

// A GPX document is known by its opening '<', whatever comes first: a
// comment, a doctype, or a root with a namespace prefix, as GPX writers
// other than Traccar put them. Read as lines, the route was one malformed
// ping.
func TestAnalyzeReadsAGPXThatOpensWithoutADeclaration(t *testing.T) {
	body := traccarGPX[strings.Index(traccarGPX, "<gpx"):]
	prefixed := strings.NewReplacer("<gpx ", `<g:gpx xmlns:g="http://www.topografix.com/GPX/1/1" `, "</gpx>", "</g:gpx>",
		"<trkpt ", "<g:trkpt ", "</trkpt>", "</g:trkpt>", "<time>", "<g:time>", "</time>", "</g:time>").Replace(body)
	for name, doc := range map[string]string{
		"a comment first":   "<!-- exported by hand -->\n" + body,
		"a doctype first":   "<!DOCTYPE gpx>\n" + body,
		"a prefixed root":   prefixed,
		"a comment and BOM": "\xEF\xBB\xBF<!-- x -->" + body,
	} {
		rep := analyze(t, []byte(doc), Options{})
		if rep.Lines != 1 || rep.Pings != 14 || len(rep.Skipped) != 0 {
			t.Errorf("%s: %d lines, %d pings, skipped %v; want 1 line, 14 pings, none skipped", name, rep.Lines, rep.Pings, rep.Skipped)
		}
	}
}

// A GPX document that declares an encoding other than UTF-8 is read when
// its bytes are UTF-8 anyway: as iconv leaves it after converting (iconv
// does not rewrite the declaration, so refusing the declared encoding
// refused the converted file again, with the same advice), or as a writer
// of US-ASCII, or of Latin-1 text that is all ASCII, writes it. One whose
// bytes are not is refused with the encoding it declares and how to
// convert it, not with the XML decoder's word for invalid UTF-8.
func TestAnalyzeSaysHowToConvertAGPXThatIsNotUTF8(t *testing.T) {
	for name, doc := range map[string]string{
		"converted by iconv, still declaring ISO-8859-1": strings.NewReplacer("encoding='UTF-8'", "encoding='ISO-8859-1'", "Van 7", "Van M\u00fcller").Replace(traccarGPX),
		"declaring US-ASCII":                             strings.Replace(traccarGPX, "encoding='UTF-8'", "encoding='us-ascii'", 1),
	} {
		rep := analyze(t, []byte(doc), Options{})
		if rep.Lines != 1 || rep.Pings != 14 || len(rep.Skipped) != 0 {
			t.Errorf("%s: %d lines, %d pings, skipped %v; want 1 line, 14 pings, none skipped", name, rep.Lines, rep.Pings, rep.Skipped)
		}
	}
	latin1 := strings.NewReplacer("encoding='UTF-8'", "encoding='ISO-8859-1'", "Van 7", "Van M\xfcller").Replace(traccarGPX)
	_, err := Analyze(strings.NewReader(latin1), Options{})
	if err == nil || !strings.Contains(err.Error(), "ISO-8859-1") || !strings.Contains(err.Error(), "iconv -f ISO-8859-1 -t UTF-8") ||
		strings.Contains(err.Error(), "as exported") {
		t.Errorf("a GPX document in ISO-8859-1: %v, want an error naming the encoding and iconv", err)
	}
}
