package analyze

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/fixtures"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// overlandBatch is the Overland fixture's batch with its first fix
// repeated n times, a second apart: the wrapped batch of n features an
// Overland app sends after a while offline.
func overlandBatch(t *testing.T, n int) string {
	t.Helper()
	var body map[string]any
	if err := json.Unmarshal([]byte(fixtures.SenderLine(t, "overland/batch_composed.json")), &body); err != nil {
		t.Fatal(err)
	}
	first, err := json.Marshal(body["locations"].([]any)[0])
	if err != nil {
		t.Fatal(err)
	}
	start := time.Date(2024, 10, 24, 15, 0, 0, 0, time.UTC)
	features := make([]any, n)
	for i := range features {
		var f map[string]any
		if err := json.Unmarshal(first, &f); err != nil {
			t.Fatal(err)
		}
		f["properties"].(map[string]any)["timestamp"] = start.Add(time.Duration(i) * time.Second).Format(time.RFC3339)
		features[i] = f
	}
	body["locations"] = features
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func presetOptions(t *testing.T, name string) Options {
	t.Helper()
	preset, err := ping.ParsePreset(name)
	if err != nil {
		t.Fatal(err)
	}
	return Options{Parser: preset.Parser, Batch: ping.Splitter{Wrapper: preset.Wrapper}}
}

// A line holds what a request body holds: a batch is split as the handler
// splits it (a JSON array, or the preset's or Batch's wrapper), and every
// element is counted, not the line.
func TestAnalyzeSplitsBatches(t *testing.T) {
	const fix = `{"asset_id":"a","occurred_at":"2026-03-01T00:00:%02dZ","lat":52.5,"lon":13.4}`
	fixes := func(n int) string {
		var s []string
		for i := range n {
			s = append(s, fmt.Sprintf(fix, i))
		}
		return strings.Join(s, ",")
	}
	for _, tt := range []struct {
		name                   string
		opts                   Options
		capture                []string
		lines, elements, pings int
		skipped                map[string]int
	}{
		{"overland batches", presetOptions(t, "overland"),
			[]string{fixtures.SenderLine(t, "overland/batch_composed.json"), overlandBatch(t, 150)},
			2, 153, 152, map[string]int{SkipNotAPing: 1}}, // the fixture's visit record
		{"overland: no wrapper array", presetOptions(t, "overland"),
			[]string{fixtures.SenderLine(t, "overland/readme_locations_derived.json"), `{"current":{}}`},
			2, 2, 0, map[string]int{string(ping.RuleRequired): 1, SkipMalformed: 1}},
		{"owntracks: a JSON array", presetOptions(t, "owntracks"),
			[]string{fixtures.SenderLine(t, "owntracks-android/location_multiple_messages.json")},
			1, 2, 2, map[string]int{}},
		{"osmand: an array of no fixes", presetOptions(t, "osmand"),
			[]string{fixtures.SenderLine(t, "traccar-client-sdk/json_array_body_composed.json")},
			1, 2, 0, map[string]int{SkipNotAPing: 2}},
		{"a wrapper of our own", Options{Batch: ping.Splitter{Wrapper: "data.fixes"}},
			[]string{`{"data":{"fixes":[` + fixes(3) + `]}}`, fmt.Sprintf(fix, 9)},
			2, 4, 3, map[string]int{SkipMalformed: 1}}, // the bare ping has no wrapper
		{"an array beyond max_batch", Options{Batch: ping.Splitter{Max: 2}},
			[]string{"[" + fixes(3) + "]", "[" + fixes(2) + "]"},
			2, 5, 2, map[string]int{SkipTooLarge: 3}},
		{"an empty array", Options{}, []string{"[]", "[" + fixes(1) + "]"},
			2, 2, 1, map[string]int{SkipMalformed: 1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rep := analyze(t, []byte(strings.Join(tt.capture, "\n")), tt.opts)
			if rep.Lines != tt.lines || rep.Elements != tt.elements || rep.Pings != tt.pings || !reflect.DeepEqual(rep.Skipped, tt.skipped) {
				t.Errorf("%d lines, %d elements, %d pings, skipped %v; want %d, %d, %d, %v",
					rep.Lines, rep.Elements, rep.Pings, rep.Skipped, tt.lines, tt.elements, tt.pings, tt.skipped)
			}
			var table strings.Builder
			if err := rep.WriteTable(&table); err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf("%d lines holding %d elements, %d pings", tt.lines, tt.elements, tt.pings)
			if tt.elements == tt.lines {
				want = fmt.Sprintf("%d lines, %d pings", tt.lines, tt.pings)
			}
			if !strings.Contains(table.String(), want) {
				t.Errorf("the table's summary lacks %q:\n%s", want, table.String())
			}
		})
	}
}

// A gzip-compressed capture is read as the capture it holds, a gzip of
// several members (files compressed apart, then concatenated) included.
func TestAnalyzeReadsAGzipCapture(t *testing.T) {
	plain := testFleet.capture()
	compress := func(parts ...[]byte) []byte {
		var b bytes.Buffer
		for _, p := range parts {
			zw := gzip.NewWriter(&b)
			if _, err := zw.Write(p); err != nil {
				t.Fatal(err)
			}
			if err := zw.Close(); err != nil {
				t.Fatal(err)
			}
		}
		return b.Bytes()
	}
	want := analyze(t, plain, Options{})
	half := bytes.IndexByte(plain[len(plain)/2:], '\n') + len(plain)/2 + 1
	for name, gz := range map[string][]byte{"one member": compress(plain), "two members": compress(plain[:half], plain[half:])} {
		t.Run(name, func(t *testing.T) {
			if got := analyze(t, gz, Options{}); !reflect.DeepEqual(got, want) {
				t.Errorf("gzip: %d lines, %d pings, skipped %v; plain: %d lines, %d pings", got.Lines, got.Pings, got.Skipped, want.Lines, want.Pings)
			}
		})
	}
	if _, err := Analyze(bytes.NewReader(compress(plain)[:100]), Options{}); err == nil || !strings.Contains(err.Error(), "gzip") {
		t.Errorf("a truncated gzip capture: %v, want a gzip error", err)
	}
}
