package telemetrydedup

import (
	"encoding/json"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// Run with:
//
//	go test -run XXX -fuzz FuzzCaddyfile -fuzztime 60s .
//
// Plain go test runs the seeds below and in testdata/fuzz/FuzzCaddyfile.

// caddyfileSeeds are the most important block bodies; the corpus holds every
// option with a valid and an invalid value.
var caddyfileSeeds = []string{
	"",
	"preset traccar\nasset device.uniqueId position.deviceId\ntime position.fixTime\ntime_format rfc3339\n" +
		"lat position.latitude\nlon position.longitude\ncrs EPSG:32633\nshape session\nwindow 10m\nsession_idle 20m\n" +
		"resolution 10\nhysteresis 12.5\nkey_prefix \"\"\nretry_ladder 30s 2m 1h\noutage_margin 0s\nttl 3h\n" +
		"store redis redis://user:secret@127.0.0.1:6390/2 {\n\ttimeout 75ms\n}\non_store_error closed\n" +
		"release_on_failure off\nin_flight_timeout 45s\nmode shadow\non_invalid dead_letter\n" +
		"dead_letter_stream fleet:invalid\ndead_letter_maxlen 5000\nmax_body 64KiB\nmax_future 90s\nnull_island allow\n" +
		"stuck_ratio 0.9\nstuck_after 20m\nstuck_track 500",
	"preset owntracks\nasset {http.request.header.X-Limit-U}/{http.request.header.X-Limit-D}",
	"store memory {\n\tmax_keys 5000\n}",
	"shape sliding\nhysteresis 5m",
	"window 1500ms",
	"hysteresis NaN",
	"stuck_ratio NaN",
	"key_prefix \"a\xffb\"", // the lexer reads it as U+FFFD already
	"asset id {http.request.host}",
	"}\n}\n{",
	"retry_ladder 1m 5m 1m",
	"max_body 10EiB",
}

// FuzzCaddyfile parses arbitrary text as the block of a telemetry_dedup
// directive. It must never panic. Whatever it accepts must also resolve, and
// survive what Caddy does with it: the Caddyfile is adapted to JSON, and the
// handler is loaded from that JSON, so the JSON must configure exactly the
// settings the Caddyfile did.
func FuzzCaddyfile(f *testing.F) {
	for _, seed := range caddyfileSeeds {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, text string) {
		input := "telemetry_dedup {\n" + text + "\n}"
		// Not ours: caddyfile.NewTestDispenser calls log.Fatalf (exiting the
		// fuzzer) on input its lexer refuses, such as an unterminated quote or
		// heredoc, and expands {$ENV} variables from the environment. Caddy
		// reports the former as a Caddyfile syntax error before our parser
		// runs; the latter is not reproducible.
		if strings.Contains(input, "{$") {
			t.Skip("environment variable placeholder")
		}
		if _, err := caddyfile.Tokenize([]byte(input), "Testfile"); err != nil && err != io.EOF {
			t.Skipf("the Caddyfile lexer refuses it: %v", err)
		}
		h := new(Handler)
		if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input)); err != nil {
			if err.Error() == "" {
				t.Fatal("an error without a message")
			}
			return
		}
		want, err := h.resolve()
		if err != nil {
			t.Fatalf("UnmarshalCaddyfile accepted what resolve refuses: %v", err)
		}
		raw, err := json.Marshal(h)
		if err != nil {
			t.Fatalf("accepted, but cannot be adapted to JSON: %v", err)
		}
		var fromJSON Handler
		if err := json.Unmarshal(raw, &fromJSON); err != nil {
			t.Fatalf("its JSON %s does not load: %v", raw, err)
		}
		got, err := fromJSON.resolve()
		if err != nil {
			t.Fatalf("its JSON %s does not resolve: %v", raw, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("its JSON %s configures\n%+v\nthe Caddyfile configured\n%+v", raw, got, want)
		}
	})
}
