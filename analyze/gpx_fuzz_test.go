package analyze

import (
	"bytes"
	"testing"
)

// FuzzReadGPX feeds arbitrary documents to the GPX reader: whatever the
// bytes, it returns pings or an error, never panics, and counts every
// track point it read once, as a ping or as skipped.
func FuzzReadGPX(f *testing.F) {
	f.Add([]byte(traccarGPX))
	f.Add([]byte(`<gpx><trk><trkseg><trkpt lat="1" lon="2"><time>2026-03-01T10:00:00Z</time></trkpt><trkpt lat="1"/></trkseg></trk></gpx>`))
	f.Fuzz(func(t *testing.T, doc []byte) {
		a, err := newAnalyzer(Options{}.withDefaults())
		if err != nil {
			t.Fatal(err)
		}
		assets, err := a.readGPX(bytes.NewReader(doc))
		if err != nil {
			return
		}
		skipped := 0
		for _, n := range a.report.Skipped {
			skipped += n
		}
		if a.report.Elements != a.report.Pings+skipped {
			t.Errorf("%d elements, %d pings, %d skipped", a.report.Elements, a.report.Pings, skipped)
		}
		fixes := 0
		for _, as := range assets {
			fixes += len(as.fixes)
		}
		if fixes != a.report.Pings {
			t.Errorf("%d fixes for %d pings", fixes, a.report.Pings)
		}
	})
}
