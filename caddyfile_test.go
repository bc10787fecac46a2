package telemetrydedup

import (
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	"github.com/redis/go-redis/v9"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

func parse(t *testing.T, input string) (*Handler, error) {
	t.Helper()
	h := new(Handler)
	return h, h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input))
}

// resolvedBlock is the settings of a telemetry_dedup block holding block,
// read from the Caddyfile and resolved as Provision resolves them.
func resolvedBlock(t *testing.T, block string) settings {
	t.Helper()
	h, err := parse(t, "telemetry_dedup {\n"+block+"\n}")
	if err != nil {
		t.Fatalf("%q: %v", block, err)
	}
	s, err := h.resolve()
	if err != nil {
		t.Fatalf("%q: %v", block, err)
	}
	return s
}

func TestCaddyfileDefaults(t *testing.T) {
	h, err := parse(t, `telemetry_dedup`)
	if err != nil {
		t.Fatal(err)
	}
	s, err := h.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if want := ping.NewParser().Prepared(); !reflect.DeepEqual(s.parser, want) {
		t.Errorf("parser %+v, want the defaults %+v", s.parser, ping.NewParser())
	}
	if s.keyer != (dedup.Keyer{Window: 5 * time.Minute, Resolution: 12, Prefix: "dedup:"}) {
		t.Errorf("keyer %+v", s.keyer)
	}
	if s.policy != (dedup.Policy{Shape: dedup.Tumbling, Window: 5 * time.Minute, SessionIdle: 10 * time.Minute, Radius: dedup.DefaultRadius, TTL: 6*time.Hour + 30*time.Minute, InFlightTimeout: 30 * time.Second}) ||
		s.maxBody != 1<<20 || s.onStoreError != decisionUnchecked || !s.release || s.shadow || s.deadLetterInvalid || s.assetTemplate != "" {
		t.Errorf("settings %+v", s)
	}
	if h.StoreRaw != nil {
		t.Errorf("no store given, yet the JSON names one: %s", h.StoreRaw)
	}
}

func TestCaddyfileEveryOption(t *testing.T) {
	h, err := parse(t, `telemetry_dedup {
		preset traccar
		asset device.uniqueId position.deviceId
		time position.fixTime position.deviceTime
		time_format rfc3339
		lat position.latitude
		lon position.longitude
		crs EPSG:4326
		shape session
		window 10m
		session_idle 20m
		key_scope {http.request.host}
		resolution 10
		radius 30
		hysteresis 12.5
		key_prefix ""
		retry_ladder 30s 2m 1h
		outage_margin 0s
		ttl 3h
		store redis redis://user:secret@127.0.0.1:6390/2 {
			timeout 75ms
		}
		near_cache off
		on_store_error closed
		release_on_failure off
		in_flight_timeout 45s
		mode shadow
		on_invalid dead_letter
		dead_letter_stream fleet:invalid
		dead_letter_maxlen 5000
		max_body 64KiB
		max_batch 50
		max_future 90s
		null_island allow
		time_zone Europe/Berlin
		accuracy position.accuracy
		speed position.speed knots
		event position.attributes.alarm position.attributes.event=geofence|sos
		state position.attributes.ignition
		encoding auto
		batch positions
		answers {
			suppressed 200 application/json `+"`"+`{"result":"ok"}`+"`"+`
			in_flight 503 2
			dead_lettered 202 text/plain kept
		}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(h)
	want := `{"asset":["device.uniqueId","position.deviceId"],"time":["position.fixTime","position.deviceTime"],"time_format":"rfc3339",` +
		`"lat":"position.latitude","lon":"position.longitude","accuracy":"position.accuracy","speed":"position.speed","speed_unit":"knots",` +
		`"event":["position.attributes.alarm","position.attributes.event=geofence|sos"],"state":["position.attributes.ignition"],` +
		`"time_zone":"Europe/Berlin","encoding":"auto","batch":"positions","preset":"traccar",` +
		`"answers":{"suppressed":{"status":200,"content_type":"application/json","body":"{\"result\":\"ok\"}"},"in_flight":{"status":503,"retry_after":2},` +
		`"dead_lettered":{"status":202,"content_type":"text/plain","body":"kept"}},"crs":"EPSG:4326","shape":"session","window":600000000000,` +
		`"session_idle":1200000000000,"resolution":10,"radius":30,"hysteresis":12.5,"key_prefix":"","key_scope":"{http.request.host}","retry_ladder":[30000000000,120000000000,3600000000000],` +
		`"outage_margin":0,"ttl":10800000000000,"store":{"timeout":75000000,"type":"redis","url":"redis://user:secret@127.0.0.1:6390/2"},` +
		`"near_cache":0,"on_store_error":"closed","release_on_failure":false,"in_flight_timeout":45000000000,"mode":"shadow","on_invalid":"dead_letter",` +
		`"dead_letter_stream":"fleet:invalid","dead_letter_maxlen":5000,"max_body":65536,"max_batch":50,"max_future":90000000000,"null_island":"allow"}`
	if string(got) != want {
		t.Fatalf("JSON\n got %s\nwant %s", got, want)
	}
}

func TestCaddyfileMemoryStore(t *testing.T) {
	h, err := parse(t, "telemetry_dedup {\n store memory {\n max_keys 5000\n }\n}")
	if err != nil {
		t.Fatal(err)
	}
	if string(h.StoreRaw) != `{"max_keys":5000,"type":"memory"}` {
		t.Fatalf("store JSON %s", h.StoreRaw)
	}
}

// A wrong value reports the line it is on and what is allowed.
func TestCaddyfileErrorsSayTheLineAndTheFix(t *testing.T) {
	tests := []struct {
		name  string
		input string
		want  []string
	}{
		{"unknown option", "telemetry_dedup {\n\twindow 5m\n\tresoluton 12\n}", []string{":3", `"resoluton"`}},
		{"repeated option", "telemetry_dedup {\n\twindow 5m\n\twindow 10m\n}", []string{":3", "already specified on line 2"}},
		{"bad duration", "telemetry_dedup {\n\twindow five\n}", []string{":2", "window", "5m"}},
		{"fractional window", "telemetry_dedup {\n\tasset id\n\twindow 1500ms\n}", []string{":3", "whole number of seconds"}},
		{"resolution out of range", "telemetry_dedup {\n\n\tresolution 16\n}", []string{":3", "0 (cell edges"}},
		{"resolution not a number", "telemetry_dedup {\n\tresolution fine\n}", []string{":2", "0 to 15"}},
		{"time format", "telemetry_dedup {\n\ttime_format iso\n}", []string{":2", "rfc3339"}},
		{"ttl below window", "telemetry_dedup {\n\twindow 10m\n\tttl 5m\n}", []string{":3", "shorter than the window"}},
		{"ttl below ladder", "telemetry_dedup {\n\tretry_ladder 1m 1h\n\tttl 1h\n}", []string{":3", "1h30m0s"}},
		// An asset's track expires with the TTL: its next ping after a
		// silence longer than that but shorter than session_idle started a
		// new track, admitted as a new session.
		{"ttl below session_idle", "telemetry_dedup {\n\tshape session\n\tsession_idle 2h\n\tttl 1h\n}", []string{":4", "ttl", "shorter than session_idle 2h0m0s", "at least 2h0m0s"}},
		{"ladder of gaps", "telemetry_dedup {\n\tretry_ladder 1m 5m 1m\n}", []string{":2", "strictly increasing"}},
		{"on_store_error", "telemetry_dedup {\n\ton_store_error maybe\n}", []string{":2", "open", "closed"}},
		{"release_on_failure", "telemetry_dedup {\n\trelease_on_failure yes\n}", []string{":2", "on", "off"}},
		{"null_island", "telemetry_dedup {\n\tnull_island ignore\n}", []string{":2", "reject", "allow"}},
		{"max_body", "telemetry_dedup {\n\tmax_body lots\n}", []string{":2", "1MiB"}},
		{"in_flight_timeout beyond ttl", "telemetry_dedup {\n\tin_flight_timeout 7h\n}", []string{":2", "shorter than the key TTL"}},
		{"ttl below the default in_flight_timeout", "telemetry_dedup {\n\twindow 5s\n\tttl 10s\n}", []string{":3", "ttl: gives keys a TTL of 10s", "default in_flight_timeout 30s"}},
		{"retry_ladder below the default in_flight_timeout", "telemetry_dedup {\n\twindow 1s\n\tretry_ladder 5s\n\toutage_margin 0s\n}", []string{":3", "retry_ladder: gives keys", "give keys longer"}},
		// The claim (up to the store's timeout), the upstream and the release
		// (the timeout again, and 100ms) must all fit into in_flight_timeout.
		{"in_flight_timeout too short for the store", "telemetry_dedup {\n\tstore redis redis://a:6379 {\n\t\ttimeout 500ms\n\t}\n\tin_flight_timeout 1s\n}",
			[]string{":5", "leaves the upstream 0s", "at least 1.2s", "lower the store's timeout"}},
		{"store timeout too long for the default in_flight_timeout", "telemetry_dedup {\n\twindow 5m\n\tstore redis redis://a:6379 {\n\t\ttimeout 20s\n\t}\n}",
			[]string{":3", "store: the default in_flight_timeout 30s leaves the upstream 0s", "lower the store's timeout"}},
		{"in_flight_timeout too short for the memory store", "telemetry_dedup {\n\tin_flight_timeout 150ms\n}",
			[]string{":2", "leaves the upstream 50ms", "at least 200ms"}},
		{"missing argument", "telemetry_dedup {\n\tasset\n}", []string{":2"}},
		{"extra argument", "telemetry_dedup {\n\tlat a b\n}", []string{":2", "lat takes one value: lat <json path>"}},
		{"gjson modifier as latitude", "telemetry_dedup {\n\tlat @this\n}", []string{":2", "lat: \"@this\" is not a plain dotted path"}},
		{"empty time path", "telemetry_dedup {\n\ttime occurred_at \"\"\n}", []string{":2", "time: the path is empty"}},
		{"event without its path", "telemetry_dedup {\n\tevent =u|r\n}", []string{":2", "event: the path is empty", "such as position.attributes.alarm"}},
		{"gjson query as asset", "telemetry_dedup {\n\tasset devices.#.id\n}", []string{":2", "asset: \"devices.#.id\" is not a plain dotted path"}},
		{"preset without argument", "telemetry_dedup {\n\tpreset\n}", []string{":2", "preset owntracks|overland|osmand|traccar|geojson"}},
		{"max_body twice", "telemetry_dedup {\n\tmax_body 1MiB 2MiB\n}", []string{":2", "max_body <size>"}},
		{"window without argument", "telemetry_dedup {\n\twindow\n}", []string{":2", "window <duration>"}},
		{"store option without argument", "telemetry_dedup {\n\tstore redis redis://x {\n\t\ttimeout\n\t}\n}", []string{":3", "timeout takes one value: timeout <duration>", "6h30m or 1d"}},
		{"store option with a value in two words", "telemetry_dedup {\n\tstore redis redis://x {\n\t\tmaster my master\n\t}\n}", []string{":3", "master takes one value: master <name>"}},
		{"memory store option without argument", "telemetry_dedup {\n\tstore memory {\n\t\tmax_keys\n\t}\n}", []string{":3", "max_keys takes one value", "max_keys 1000000"}},
		{"in_flight_timeout too short for the memory store", "telemetry_dedup {\n\tin_flight_timeout 150ms\n}", []string{":2", "at least 200ms"}},
		{"duration in two words", "telemetry_dedup {\n\twindow 5 minutes\n}", []string{":2", "window takes one value: window <duration> (one word, such as"}},
		{"unknown store", "telemetry_dedup {\n\tstore etcd\n}", []string{":2", "memory", "redis"}},
		{"redis without URL", "telemetry_dedup {\n\tstore redis\n}", []string{":2", "needs a URL"}},
		{"redis bad URL", "telemetry_dedup {\n\tstore redis http://x\n}", []string{":2", "redis://"}},
		{"redis bad timeout", "telemetry_dedup {\n\tstore redis redis://x {\n\t\ttimeout soon\n\t}\n}", []string{":3", "timeout"}},
		{"redis negative timeout", "telemetry_dedup {\n\tstore redis redis://x {\n\t\ttimeout -1s\n\t}\n}", []string{":3", "more than 0"}},
		{"redis timeout 0", "telemetry_dedup {\n\tstore redis redis://x {\n\t\ttimeout 0\n\t}\n}", []string{":3", "more than 0"}},
		{"redis negative breaker_cooldown", "telemetry_dedup {\n\tstore redis redis://x {\n\t\tbreaker_cooldown -1s\n\t}\n}", []string{":3", "more than 0"}},
		// Below the breaker's first wait, an open breaker let nearly every
		// request try a Redis that is down (helper 3's finding, stop 59).
		{"redis breaker_cooldown of nanoseconds", "telemetry_dedup {\n\tstore redis redis://x {\n\t\tbreaker_cooldown 30ns\n\t}\n}", []string{":3", "breaker_cooldown 30ns is shorter than 100ms", "such as 1s"}},
		// A conflict between the block's settings is reported at the store's
		// line, not at the brace that closes its block.
		{"redis db on a Cluster", "telemetry_dedup {\n\tstore redis {\n\t\taddresses a:7000 b:7000\n\t\tdb 1\n\t}\n}", []string{"at Testfile:2", "drop db"}},
		{"redis URL and addresses", "telemetry_dedup {\n\tstore redis redis://x {\n\t\taddresses a:7000\n\t}\n}", []string{"at Testfile:2", "not both"}},
		{"redis option twice", "telemetry_dedup {\n\tstore redis redis://x {\n\t\ttimeout 50ms\n\t\ttimeout 75ms\n\t}\n}", []string{":4", "timeout already specified on line 3; give each option once"}},
		{"memory option twice", "telemetry_dedup {\n\tstore memory {\n\t\tmax_keys 10\n\t\tmax_keys 20\n\t}\n}", []string{":4", "max_keys already specified on line 3; give each option once"}},
		{"memory bad max_keys", "telemetry_dedup {\n\tstore memory {\n\t\tmax_keys -1\n\t}\n}", []string{":3", "positive"}},
		// A typo's extra zeros in near_cache used to take the whole process
		// down on a reload (its table is allocated as the config loads).
		{"near_cache too large", "telemetry_dedup {\n\tstore redis redis://x\n\tnear_cache 99999999999\n}", []string{":3", "near_cache", "6400.0 GB", "at most 50000000"}},
		{"redis timeout shorter than a round trip", "telemetry_dedup {\n\tstore redis redis://x {\n\t\ttimeout 1ns\n\t}\n}", []string{":3", "timeout 1ns", "shorter than 1ms", "50ms"}},
		{"redis negative dial_timeout", "telemetry_dedup {\n\tstore redis redis://x {\n\t\tdial_timeout -5s\n\t}\n}", []string{":3", "more than 0"}},
		// Read as metres, every fix landed by (0, 0), and a car driving on
		// was answered "jitter", which OwnTracks takes as delivered.
		// Said in the Caddyfile's own syntax, with the floor (helper 5's
		// finding: it gave the JSON form of a ladder).
		{"retry ladder under a second", "telemetry_dedup {\n\tretry_ladder 500ms 5m\n}", []string{":2", "retry_ladder", "at least 1s, e.g. 1m 5m 30m 2h 6h"}},
		{"projected crs beside a preset of degrees", "telemetry_dedup {\n\tpreset owntracks\n\tcrs EPSG:3857\n}", []string{":3", "WGS 84 degrees", "remove crs"}},
		{"redis read_timeout shorter than a round trip", "telemetry_dedup {\n\tstore redis redis://x {\n\t\tread_timeout 5ns\n\t}\n}", []string{":3", "read_timeout 5ns", "shorter than 1ms"}},
		// go-redis reserves room for the whole pool as the config loads:
		// this one was a fatal out-of-memory error, every site down with it.
		{"redis pool_size no server takes", "telemetry_dedup {\n\tstore redis redis://x {\n\t\tpool_size 100000000\n\t}\n}", []string{":3", "pool_size 100000000", "at most 10000"}},
		// go-redis drops the URL's database for a Cluster without a word.
		{"redis cluster with a database in the URL", "telemetry_dedup {\n\tstore redis redis://127.0.0.1:1/3 {\n\t\tcluster\n\t}\n}", []string{"database 0", "drop the URL's /3"}},
		{"placeholder in key_prefix", "telemetry_dedup {\n\tkey_prefix {http.request.host}:\n}", []string{":2", "key_prefix", "not expanded", "key_scope {http.request.host}"}},
		{"placeholder in dead_letter_stream", "telemetry_dedup {\n\tdead_letter_stream {env.STREAM}\n}", []string{":2", "dead_letter_stream", "not expanded", "{$NAME}"}},
		{"off beside other events", "telemetry_dedup {\n\tevent alarm off\n}", []string{":2", "off clears the preset's and goes alone"}},
		{"window past a year", "telemetry_dedup {\n\twindow 400d\n}", []string{":2", "window", "longer than"}},
		{"directive argument", "telemetry_dedup fast", []string{":1", "matcher"}},
		{"unknown shape", "telemetry_dedup {\n\tshape hopping\n}", []string{":2", "tumbling", "sliding", "session"}},
		{"radius on tumbling", "telemetry_dedup {\n\tradius 20\n}", []string{":2", "sliding or session"}},
		{"radius too wide", "telemetry_dedup {\n\tshape sliding\n\tradius 5km\n}", []string{":3", "metres"}},
		{"radius negative", "telemetry_dedup {\n\tshape session\n\tradius -4\n}", []string{":3", "radius", "25"}},
		{"hysteresis not a number", "telemetry_dedup {\n\thysteresis close\n}", []string{":2", "metres"}},
		{"session idle", "telemetry_dedup {\n\tshape session\n\tsession_idle -1m\n}", []string{":3", "session_idle -1m", "more than 0"}},
		{"session idle without sessions", "telemetry_dedup {\n\tshape sliding\n\tsession_idle 20m\n}", []string{":3", "needs shape session"}},
		// 0 means the default in JSON; written out, it is a mistake to be
		// told about, not a default to be given silently.
		{"window 0", "telemetry_dedup {\n\twindow 0\n}", []string{":2", "window 0", "more than 0", "leave window out"}},
		{"ttl 0", "telemetry_dedup {\n\tttl 0s\n}", []string{":2", "more than 0"}},
		{"max_future 0", "telemetry_dedup {\n\tmax_future 0\n}", []string{":2", "more than 0"}},
		{"radius 0", "telemetry_dedup {\n\tshape sliding\n\tradius 0\n}", []string{":3", "radius 0", "more than 0", "radius 25"}},
		{"stuck_ratio 0", "telemetry_dedup {\n\tstuck_ratio 0\n}", []string{":2", "more than 0", "0.95"}},
		{"stuck_after within the window", "telemetry_dedup {\n\twindow 5m\n\tstuck_after 1m\n}", []string{":3", "not longer than the window", "15m"}},
		{"stuck_after within the window, sliding", "telemetry_dedup {\n\tshape sliding\n\twindow 4s\n\tstuck_after 3s\n}", []string{":4", "not longer than the window", "12s"}},
		{"unknown preset", "telemetry_dedup {\n\tpreset teltonika\n}", []string{":2", "owntracks"}},
		// The floor is new: an operator upgrading with a lower max_body is
		// told the line, and the fix as the Caddyfile writes it.
		{"max_body below OwnTracks' largest messages", "telemetry_dedup {\n\tpreset owntracks\n\tmax_body 64KiB\n}",
			[]string{":3", "65536 bytes is below", "set max_body 256KiB or more (262144 in JSON)"}},
		{"unknown crs", "telemetry_dedup {\n\tcrs EPSG:27700\n}", []string{":2", "EPSG:3857"}},
		{"mode", "telemetry_dedup {\n\tmode dry-run\n}", []string{":2", "enforce", "shadow"}},
		{"on_invalid", "telemetry_dedup {\n\ton_invalid drop\n}", []string{":2", "reject", "dead_letter"}},
		{"dead letter on memory", "telemetry_dedup {\n\ton_invalid dead_letter\n}", []string{":2", "store redis"}},
		{"template beside paths", "telemetry_dedup {\n\tasset id {http.request.host}\n}", []string{":2", "alone"}},
		// Caddy keeps a placeholder it cannot read as text: every request
		// would share it, and devices or tenants suppress each other.
		{"asset template unclosed", "telemetry_dedup {\n\tasset {http.request.header.X-Id\n}", []string{":2", "asset", "not closed", "{http.request.header.X-Device}"}},
		{"asset template stray brace", "telemetry_dedup {\n\tasset http.request.header.X-Id}\n}", []string{":2", "closes no placeholder"}},
		{"asset template nested", "telemetry_dedup {\n\tasset {a{b}}\n}", []string{":2", "not closed before the next {"}},
		{"key_scope unclosed", "telemetry_dedup {\n\tkey_scope {http.request.host\n}", []string{":2", "key_scope", "not closed"}},
		{"key_scope without a placeholder", "telemetry_dedup {\n\tkey_scope http.request.host\n}", []string{":2", "no placeholder", "{http.request.host}"}},
		{"key_scope empty placeholder", "telemetry_dedup {\n\tkey_scope tenant-{}\n}", []string{":2", "names no placeholder"}},
		{"dead_letter_maxlen", "telemetry_dedup {\n\tdead_letter_maxlen many\n}", []string{":2", "positive"}},
		{"hysteresis NaN", "telemetry_dedup {\n\tshape sliding\n\thysteresis NaN\n}", []string{":3", "metres"}},
		{"stuck_ratio NaN", "telemetry_dedup {\n\tstuck_ratio NaN\n}", []string{":2", "above 0 and at most 1"}},
		{"stuck_ratio above 1", "telemetry_dedup {\n\tstuck_ratio 1.5\n}", []string{":2", "(0, 1]"}},
		{"max_body overflowing", "telemetry_dedup {\n\tmax_body 10EiB\n}", []string{":2", "1MiB"}},
		{"ladder + margin overflowing", "telemetry_dedup {\n\tretry_ladder 2562047h\n\toutage_margin 2562047h\n}", []string{":2", "retry_ladder", "no sender retries that long"}},
		// A size without its unit is bytes: one holds no ping.
		{"max_body too small", "telemetry_dedup {\n\tmax_body 1\n}", []string{":2", "max_body", "holds no ping", "1MiB"}},
		// A form ping is one request: there is no JSON body to split.
		{"batch with encoding form", "telemetry_dedup {\n\tencoding form\n\tbatch locations\n}", []string{":3", "batch", "encoding form"}},
		// A zone is read only for timestamps written without an offset.
		{"time_zone with unix", "telemetry_dedup {\n\ttime_format unix\n\ttime_zone Europe/Berlin\n}", []string{":3", "time_zone", "epoch numbers"}},
		// The option to change is the one that makes it too long: the
		// ladder, also with the default margin, which was blamed, at the
		// block's closing line.
		{"ladder too long", "telemetry_dedup {\n\tretry_ladder 1m 4000d\n}", []string{":2", "retry_ladder", "no sender retries that long"}},
		{"margin too long", "telemetry_dedup {\n\tretry_ladder 1m 80000h\n\toutage_margin 10000h\n}", []string{":3", "outage_margin", "no sender retries that long"}},
		{"key_scope without argument", "telemetry_dedup {\n\tkey_scope\n}", []string{":2"}},
		{"near_cache", "telemetry_dedup {\n\tnear_cache lots\n}", []string{":2", "off"}},
		{"max_batch", "telemetry_dedup {\n\tmax_batch 0\n}", []string{":2", "positive"}},
		{"max_batch beyond a request's tokens", "telemetry_dedup {\n\tmax_batch 65537\n}", []string{":2", "65536", "such as 1000"}},
		{"time_zone", "telemetry_dedup {\n\ttime_zone Mars/Olympus\n}", []string{":2", "Europe/Berlin"}},
		{"time_zone Local", "telemetry_dedup {\n\ttime_zone Local\n}", []string{":2", "explicit"}},
		{"speed unit", "telemetry_dedup {\n\tspeed vel kph\n}", []string{":2", "km/h"}},
		{"speed without path", "telemetry_dedup {\n\tspeed\n}", []string{":2", "speed vel km/h"}},
		{"accuracy query", "telemetry_dedup {\n\taccuracy a.#.b\n}", []string{":2", "plain dotted path"}},
		{"event empty value", "telemetry_dedup {\n\tevent t=u||r\n}", []string{":2", "empty value"}},
		{"state wildcard", "telemetry_dedup {\n\tstate attributes.*\n}", []string{":2", "plain dotted path"}},
		{"encoding", "telemetry_dedup {\n\tencoding xml\n}", []string{":2", "json, form or auto"}},
		{"batch query", "telemetry_dedup {\n\tbatch locations|@reverse\n}", []string{":2", "plain dotted path"}},
		{"answers without block", "telemetry_dedup {\n\tanswers\n}", []string{":2", "needs a block"}},
		{"answers argument", "telemetry_dedup {\n\tanswers owntracks\n}", []string{":2", "only a block"}},
		{"unknown answer", "telemetry_dedup {\n\tanswers {\n\t\trejected 200\n\t}\n}", []string{":3", "suppressed, in_flight and dead_lettered"}},
		{"answer twice", "telemetry_dedup {\n\tanswers {\n\t\tin_flight 503\n\t\tin_flight 429\n\t}\n}", []string{":4", "already given"}},
		{"answer status", "telemetry_dedup {\n\tanswers {\n\t\tsuppressed ok\n\t}\n}", []string{":3", "not a number"}},
		{"suppressed not 2xx", "telemetry_dedup {\n\tanswers {\n\t\tsuppressed 409\n\t}\n}", []string{":3", "not a 2xx", "use a 2xx such as 200"}},
		{"dead letter not 2xx", "telemetry_dedup {\n\tanswers {\n\t\tdead_lettered 422\n\t}\n}", []string{":3", "not a 2xx", "use a 2xx such as 200"}},
		{"in flight 2xx", "telemetry_dedup {\n\tanswers {\n\t\tin_flight 200\n\t}\n}", []string{":3", "does not make a sender retry"}},
		{"in flight 3xx", "telemetry_dedup {\n\tanswers {\n\t\tin_flight 302\n\t}\n}", []string{":3", "503"}},
		{"retry after 0", "telemetry_dedup {\n\tanswers {\n\t\tin_flight 503 0\n\t}\n}", []string{":3", "at least 1"}},
		{"in flight body", "telemetry_dedup {\n\tanswers {\n\t\tin_flight 503 1 x\n\t}\n}", []string{":3", "in_flight <status>"}},
		{"204 with a body", "telemetry_dedup {\n\tanswers {\n\t\tsuppressed 204 application/json []\n\t}\n}", []string{":3", "carries no body"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse(t, tt.input)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// An option brought in by import is reported in its own file: the error
// used to give its line in the file of the block's end.
func TestAnImportedOptionsErrorNamesItsFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dedup.caddy"), []byte("ttl 1m\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	caddyfilePath := filepath.Join(dir, "Caddyfile")
	src := ":8080 {\n\ttelemetry_dedup {\n\t\twindow 5m\n\t\timport dedup.caddy\n\t}\n}\n"
	_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), map[string]any{"filename": caddyfilePath})
	if err == nil || !strings.Contains(err.Error(), "shorter than the window") {
		t.Fatalf("got %v, want the ttl error", err)
	}
	if want := "at " + filepath.Join(dir, "dedup.caddy") + ":1"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q, where ttl is written", err, want)
	}
}

func TestEveryListedOptionIsParsed(t *testing.T) {
	for _, name := range caddyfileOptionNames() {
		_, err := parse(t, "telemetry_dedup {\n\t"+name+"\n}")
		if err == nil || strings.Contains(err.Error(), "unrecognized") {
			t.Errorf("option %s: got %v, want an argument error", name, err)
		}
	}
}

func TestCaddyfileRedisTopologies(t *testing.T) {
	for _, tt := range []struct {
		name, block, want string
	}{
		{"sentinel", `store redis {
			addresses 127.0.0.1:26379 127.0.0.1:26380 127.0.0.1:26381
			master fleet
			username dedup
			password {env.REDIS_PASSWORD}
			sentinel_password s3cret
			db 2
			timeout 80ms
			dial_timeout 1s
			read_timeout 500ms
			write_timeout 500ms
			pool_size 32
			breaker_failures 3
			breaker_cooldown 2s
		}`, `{"addresses":["127.0.0.1:26379","127.0.0.1:26380","127.0.0.1:26381"],"breaker_cooldown":2000000000,"breaker_failures":3,` +
			`"db":2,"dial_timeout":1000000000,"master":"fleet","password":"{env.REDIS_PASSWORD}","pool_size":32,"read_timeout":500000000,` +
			`"sentinel_password":"s3cret","timeout":80000000,"type":"redis","username":"dedup","write_timeout":500000000}`},
		{"cluster", `store redis {
			addresses 10.0.0.1:6379 10.0.0.2:6379 10.0.0.3:6379
		}`, `{"addresses":["10.0.0.1:6379","10.0.0.2:6379","10.0.0.3:6379"],"type":"redis"}`},
		{"cluster from one seed URL, TLS", `store redis rediss://redis.internal:6380 {
			cluster
			tls {
				ca /etc/redis/ca.pem
				cert /etc/redis/client.pem
				key /etc/redis/client.key
				server_name redis.internal
			}
		}`, `{"cluster":true,"tls":{"ca":"/etc/redis/ca.pem","cert":"/etc/redis/client.pem","key":"/etc/redis/client.key",` +
			`"server_name":"redis.internal"},"type":"redis","url":"rediss://redis.internal:6380"}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h, err := parse(t, "telemetry_dedup {\n"+tt.block+"\n}")
			if err != nil {
				t.Fatal(err)
			}
			if string(h.StoreRaw) != tt.want {
				t.Fatalf("store JSON\n got %s\nwant %s", h.StoreRaw, tt.want)
			}
		})
	}
	for _, tt := range []struct{ block, want string }{
		{"store redis redis://a:6379 {\n addresses b:6379\n}", "either a URL or addresses"},
		{"store redis {\n addresses a:1 b:2\n master m\n cluster\n}", "exclude each other"},
		{"store redis {\n addresses a:1 b:2\n sentinel_password s\n}", "add master"},
		{"store redis redis://a {\n sentinel_username u\n}", "add master"},
		{"store redis {\n addresses a:1 b:2\n db 3\n}", "only database 0"},
		{"store redis {\n pool_size 20\n}", "needs a URL"},
		{"store redis redis://a {\n pool_size none\n}", "pool_size"},
		{"store redis redis://a {\n tls {\n verify\n }\n}", "server_name"},
		{"store redis redis://a {\n tls {\n cert /etc/redis/client.pem\n }\n}", "Testfile:5"}, // no key: said at its line, not only when the config loads
		{"store redis redis://a {\n sharding on\n}", "breaker_cooldown"},
	} {
		if _, err := parse(t, "telemetry_dedup {\n"+tt.block+"\n}"); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: got %v, want an error mentioning %q", tt.block, err, tt.want)
		}
	}
}

// db overrides the URL's database, db 0 too, in the Caddyfile and in JSON:
// db 0 beside a URL ending in /2 used to be read as no db, and the claims
// went to database 2.
func TestRedisDBOverridesTheURLs(t *testing.T) {
	for _, tt := range []struct {
		block string
		want  int
	}{
		{"store redis redis://127.0.0.1:6390/2 {\n\t\tdb 0\n\t}", 0},
		{"store redis redis://127.0.0.1:6390/2 {\n\t\tdb 5\n\t}", 5},
		{"store redis redis://127.0.0.1:6390/2", 2},
	} {
		h, err := parse(t, "telemetry_dedup {\n\t"+tt.block+"\n}")
		if err != nil {
			t.Fatal(err)
		}
		var r RedisStore // as Caddy loads it from the JSON
		if err := json.Unmarshal(h.StoreRaw, &r); err != nil {
			t.Fatal(err)
		}
		opts, err := r.options()
		if err != nil {
			t.Fatal(err)
		}
		if opts.DB != tt.want {
			t.Errorf("%q (JSON %s): database %d, want %d", tt.block, h.StoreRaw, opts.DB, tt.want)
		}
	}
}

func TestStoreRedisAcceptsPlaceholders(t *testing.T) {
	h, err := parse(t, "telemetry_dedup {\n\tstore redis {env.REDIS_URL}\n}")
	if err != nil {
		t.Fatal(err)
	}
	if string(h.StoreRaw) != `{"type":"redis","url":"{env.REDIS_URL}"}` {
		t.Fatalf("store JSON %s", h.StoreRaw)
	}
}

// Every Caddyfile example in the README adapts as Caddy reads it, without a
// warning (caddy fmt's layout included): a site block as it stands, a
// telemetry_dedup block inside a site, and each store block of an example
// (the Sentinel and the Cluster one, laid out as caddy fmt would) inside a
// telemetry_dedup block. The options and store syntax blocks (with
// placeholders such as [<matcher>] and <host:port>) and a log fragment are
// not Caddyfiles; any other kind of block is one the test does not know how
// to check.
func TestREADMECaddyfileExamplesAdapt(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	adapter := caddyconfig.GetAdapter("caddyfile")
	for i, block := range regexp.MustCompile("(?s)```caddyfile\n(.*?)```").FindAllSubmatch(readme, -1) {
		body := string(block[1])
		first := strings.Fields(body)[0]
		switch {
		case strings.HasPrefix(body, "telemetry_dedup [<matcher>]"), first == "store" && strings.Contains(body, "<"), first == "log":
			continue
		case first == "store":
			for _, store := range regexp.MustCompile(`(?m)^store`).Split(body, -1)[1:] {
				site := ":8080 {\n\ttelemetry_dedup {\n\t\tstore" + strings.ReplaceAll(strings.TrimSuffix(store, "\n"), "\n", "\n\t\t") + "\n\t}\n}\n"
				// Aligned for reading beside the syntax block, not as caddy fmt lays it out.
				if _, warnings, err := adapter.Adapt(caddyfile.Format([]byte(site)), nil); err != nil || len(warnings) > 0 {
					t.Errorf("README Caddyfile block %d: %v %v\n%s", i, err, warnings, site)
				}
			}
			continue
		case first == "telemetry_dedup":
			body = ":8080 {\n\t" + strings.ReplaceAll(strings.TrimSuffix(body, "\n"), "\n", "\n\t") + "\n}\n"
		case first != "{" && !strings.ContainsAny(first, ".:"):
			t.Errorf("README Caddyfile block %d starts with %q, which this test does not know how to check", i, first)
			continue
		}
		if _, warnings, err := adapter.Adapt([]byte(body), nil); err != nil || len(warnings) > 0 {
			t.Errorf("README Caddyfile block %d: %v %v\n%s", i, err, warnings, body)
		}
	}
}

// caddy adapt of the example gives JSON that configures the handler exactly
// as the Caddyfile says, and the example is formatted as caddy fmt would.
func TestExampleAdaptsToEquivalentJSON(t *testing.T) {
	src, err := os.ReadFile("Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	if formatted := caddyfile.Format(src); string(formatted) != string(src) {
		t.Error("Caddyfile.example is not formatted; run caddy fmt --overwrite Caddyfile.example")
	}
	out, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt(src, map[string]any{"filename": "Caddyfile.example"})
	if err != nil || len(warnings) > 0 {
		t.Fatalf("adapt: %v %v", err, warnings)
	}
	handler := findHandler(t, out)
	want := `{"asset":["asset_id"],"crs":"EPSG:4326","handler":"telemetry_dedup","in_flight_timeout":30000000000,"key_prefix":"dedup:",` +
		`"lat":"lat","lon":"lon","max_batch":1000,"max_body":1048576,"max_future":300000000000,"max_past":31536000000000000,"mode":"enforce","null_island":"reject","on_invalid":"reject",` +
		`"on_store_error":"open","outage_margin":1800000000000,"release_on_failure":true,"resolution":12,` +
		`"retry_ladder":[60000000000,300000000000,1800000000000,7200000000000,21600000000000],` +
		`"shape":"tumbling","store":{"max_keys":1000000,"type":"memory"},"time":["occurred_at"],"time_format":"auto","window":300000000000}`
	if string(handler) != want {
		t.Fatalf("adapted handler\n got %s\nwant %s", handler, want)
	}

	// The example spells out the defaults: its JSON resolves to exactly what
	// an empty block does.
	var fromJSON Handler
	if err := json.Unmarshal(handler, &fromJSON); err != nil {
		t.Fatal(err)
	}
	empty, _ := parse(t, "telemetry_dedup")
	a, errA := fromJSON.resolve()
	b, errB := empty.resolve()
	if errA != nil || errB != nil || !reflect.DeepEqual(a, b) {
		t.Fatalf("example settings %+v (%v) differ from the defaults %+v (%v)", a, errA, b, errB)
	}
}

// findHandler returns the telemetry_dedup handler object in adapted JSON.
func findHandler(t *testing.T, config []byte) json.RawMessage {
	t.Helper()
	var found json.RawMessage
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if v["handler"] == "telemetry_dedup" {
				found, _ = json.Marshal(v)
				return
			}
			for _, c := range v {
				walk(c)
			}
		case []any:
			for _, c := range v {
				walk(c)
			}
		}
	}
	var doc any
	if err := json.Unmarshal(config, &doc); err != nil {
		t.Fatal(err)
	}
	walk(doc)
	if found == nil {
		t.Fatalf("no telemetry_dedup handler in %s", config)
	}
	return found
}

// The directive runs after authentication and before anything that answers
// or proxies, without a global order option.
func TestDirectiveOrder(t *testing.T) {
	src := []byte(`:8080 {
	reverse_proxy 127.0.0.1:8081
	respond /health 200
	telemetry_dedup
	basic_auth {
		alice $2a$14$Zkx19XLiW6VYouLHR5NmfOFU0z2GTNmpkT/5qqR7hx4IjWJPDhjvG
	}
}`)
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(src, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	auth, dedupAt, respond, proxy := strings.Index(s, `"authentication"`), strings.Index(s, `"telemetry_dedup"`),
		strings.Index(s, `"static_response"`), strings.Index(s, `"reverse_proxy"`)
	if !(auth < dedupAt && dedupAt < respond && respond < proxy) || auth < 0 {
		t.Fatalf("order authentication=%d telemetry_dedup=%d respond=%d reverse_proxy=%d in %s", auth, dedupAt, respond, proxy, s)
	}
}

// The doc comment of UnmarshalCaddyfile and the README's option block and
// table list exactly the options caddyfileOptions parses, with the syntax
// it documents: one list, and the docs held to it.
func TestDocsListEveryCaddyfileOption(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "caddyfile.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var doc string
	for _, decl := range f.Decls {
		if fn, ok := decl.(*ast.FuncDecl); ok && fn.Name.Name == "UnmarshalCaddyfile" {
			doc = fn.Doc.Text()
		}
	}
	var want []string
	for _, o := range caddyfileOptions {
		want = append(want, o.name+" "+o.syntax)
	}
	var documented []string
	for _, line := range strings.Split(doc, "\n") {
		if fields := strings.Fields(line); strings.HasPrefix(line, "\t\t") && len(fields) >= 2 {
			documented = append(documented, fields[0]+" "+strings.Join(fields[1:], " "))
		}
	}
	if strings.Join(documented, "\n") != strings.Join(want, "\n") {
		t.Errorf("UnmarshalCaddyfile's doc comment lists\n%s\nbut the options are\n%s", strings.Join(documented, "\n"), strings.Join(want, "\n"))
	}

	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)### Options.*?```caddyfile\ntelemetry_dedup \\[<matcher>\\] \\{\n(.*?)\n\\}\n```").FindSubmatch(readme)
	if block == nil {
		t.Fatal("README has no options block under ### Options")
	}
	var inBlock, inTable []string
	for _, line := range strings.Split(string(block[1]), "\n") {
		if fields := strings.Fields(line); len(fields) > 0 && fields[0] != "}" && !strings.HasPrefix(line, "\t\t") {
			inBlock = append(inBlock, fields[0])
		}
	}
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_]+)`(?:, `([a-z_]+)`)? \\|").FindAllSubmatch(readme, -1) {
		for _, name := range m[1:] {
			if len(name) > 0 && slices.Contains(caddyfileOptionNames(), string(name)) && !slices.Contains(inTable, string(name)) {
				inTable = append(inTable, string(name))
			}
		}
	}
	for _, name := range caddyfileOptionNames() {
		if !slices.Contains(inBlock, name) {
			t.Errorf("README's options block lacks %s", name)
		}
		if !slices.Contains(inTable, name) {
			t.Errorf("README's options table lacks %s", name)
		}
	}
	for _, name := range inBlock {
		if !slices.Contains(caddyfileOptionNames(), name) {
			t.Errorf("README's options block lists %s, which is no option", name)
		}
	}
}

// The README states the bounds the checks hold options to: an operator
// who meets one in an error should have read it first.
func TestREADMEStatesTheOptionsBounds(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ line, bound string }{
		{"| `max_batch` |", strconv.Itoa(dedup.MaxClaims)},
		{"| `near_cache` |", strconv.Itoa(dedup.MaxNearCache)},
		{"| `max_body` |", "at least `" + strconv.Itoa(ownTracksMinBody>>10) + "KiB`"},
		{"\ttimeout       ", minRedisTimeout.String()},
	} {
		line := regexp.MustCompile("(?m)^" + regexp.QuoteMeta(tt.line) + ".*$").Find(readme)
		if line == nil {
			t.Errorf("README has no line starting %q", tt.line)
			continue
		}
		if !strings.Contains(string(line), tt.bound) {
			t.Errorf("README's line %q does not state the bound %s", line, tt.bound)
		}
	}
}

// The README lists the options a Caddyfile refuses 0 for, where JSON's 0
// is the default: exactly those whose parser refuses 0.
func TestREADMEListsTheOptionsThatRefuseZero(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	sentence := regexp.MustCompile("(?s)a `0` \\(or\\s+less\\) for an option whose default is not `0` \\((.*?)\\) is an error").FindSubmatch(readme)
	if sentence == nil {
		t.Fatal("README's Options no longer says which options refuse 0")
	}
	var listed []string
	for _, m := range regexp.MustCompile("`([a-z_]+)`").FindAllSubmatch(sentence[1], -1) {
		listed = append(listed, string(m[1]))
	}
	var refusing []string
	for _, o := range caddyfileOptions {
		if !strings.HasPrefix(o.syntax, "<") {
			continue // a choice of words, a block or a module: no number
		}
		d := caddyfile.NewTestDispenser(o.name + " 0")
		d.Next()
		if o.parse(new(Handler), d) != nil {
			refusing = append(refusing, o.name)
		}
	}
	if !slices.Equal(listed, refusing) {
		t.Errorf("README lists %v as refusing 0; the parser refuses it for %v", listed, refusing)
	}
}

// JSON config reaches the same checks as the Caddyfile: a negative store
// timeout bounds nothing, and a negative count is no count (a negative pool
// size used to panic go-redis, taking caddy run and the admin API down);
// each is refused at provisioning, naming the setting.
func TestJSONRefusesNegativeStoreSettings(t *testing.T) {
	for _, tt := range []struct{ setting, want string }{
		{`"timeout":-1000000000`, "negative duration"},
		{`"breaker_cooldown":-1`, "negative duration"},
		{`"pool_size":-3`, "pool_size -3 is negative"},
		{`"db":-1`, "db -1 is negative"},
		{`"breaker_failures":-1`, "breaker_failures -1 is negative"},
		{`"timeout":1`, "shorter than 1ms"},
		{`"read_timeout":-1`, "read_timeout -1ns is negative"},
		{`"dial_timeout":-5000000000`, "dial_timeout -5s is negative"},
		// A bare number is nanoseconds in JSON: 5 was written for seconds,
		// and every store call failed, duplicates forwarded unchecked.
		{`"read_timeout":5`, "read_timeout 5ns is shorter than 1ms"},
		// Below timeout, go-redis sends a call Redis was slow to answer
		// again: the fix is not timeout's 50ms (helper 5's finding).
		{`"timeout":100000000,"read_timeout":5`, "keep it at or above timeout"},
		{`"write_timeout":5`, "write_timeout 5ns is shorter than 1ms"},
		{`"dial_timeout":5`, "dial_timeout 5ns is shorter than 1ms"},
		{`"pool_size":100000000`, "pool_size 100000000 is more connections than a Redis server takes"},
		{`"cluster":true,"db":3`, "a Cluster has only database 0"},
		// 30 written for seconds: an open breaker's wait of 30ns had nearly
		// every request try a Redis that is down, and log the breaker
		// opening again (helper 3's finding, stop 59).
		{`"breaker_cooldown":30`, "breaker_cooldown 30ns is shorter than 100ms"},
		{`"breaker_cooldown":1`, "in JSON, a bare number is nanoseconds: 1000000000"},
	} {
		h := new(Handler)
		if err := json.Unmarshal([]byte(`{"store":{"type":"redis","url":"redis://127.0.0.1:1",`+tt.setting+`}}`), h); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		err := h.Provision(ctx)
		cancel()
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("store with %s: got %v, want %q", tt.setting, err, tt.want)
		}
	}
}

// In Caddy's JSON a bare number is nanoseconds. A sender's clock and
// retries are durations of seconds at least, and one written as a number
// of seconds loaded without a word (helper 1's finding): max_past 86400
// refused every ping 2 s old (OwnTracks iOS deletes a message on a 4xx),
// session_idle 600 admitted every ping of a parked asset, a ladder in
// seconds made the TTL 30 minutes. window, ttl, in_flight_timeout and
// stuck_after had floors already.
func TestJSONRefusesDurationsWrittenAsSeconds(t *testing.T) {
	for _, tt := range []struct{ config, option string }{
		{`{"max_past":86400}`, "max_past"},
		{`{"max_future":300}`, "max_future"},
		{`{"shape":"session","session_idle":600}`, "session_idle"},
		{`{"retry_ladder":[60,300,1800,7200,21600]}`, "retry_ladder"},
		{`{"outage_margin":1800}`, "outage_margin"},
		{`{"shape":"session","stuck_after":1}`, "stuck_after"},
	} {
		h := new(Handler)
		if err := json.Unmarshal([]byte(tt.config), h); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		err := h.Provision(ctx)
		cancel()
		if err == nil || !strings.Contains(err.Error(), tt.option) || !strings.Contains(err.Error(), "at least 1s") {
			_ = h.Cleanup()
			t.Errorf("%s: got %v, want it refused, naming %s and its floor", tt.config, err, tt.option)
		}
	}
}

// A speed_unit with no speed path converts nothing, and said nothing
// (JSON only: the Caddyfile writes the unit on the speed line).
func TestJSONRefusesASpeedUnitWithoutASpeed(t *testing.T) {
	h := new(Handler)
	if err := json.Unmarshal([]byte(`{"speed_unit":"km/h"}`), h); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	if err := h.Provision(ctx); err == nil || !strings.Contains(err.Error(), "give speed its path") {
		_ = h.Cleanup()
		t.Fatalf("speed_unit without speed: got %v, want it refused", err)
	}
}

// JSON's null store is the default store, as a store left out is; a URL
// from an unset environment variable says so.
func TestJSONStoreNullAndUnsetURL(t *testing.T) {
	provision := func(config string) error {
		h := new(Handler)
		if err := json.Unmarshal([]byte(config), h); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		defer cancel()
		return h.Provision(ctx)
	}
	if err := provision(`{"store":null}`); err != nil {
		t.Errorf(`"store": null: %v, want the memory store`, err)
	}
	err := provision(`{"store":{"type":"redis","url":"{env.TELEMETRY_DEDUP_TEST_UNSET_URL}"}}`)
	if err == nil || !strings.Contains(err.Error(), "is the environment variable set?") {
		t.Errorf("a URL from an unset variable: got %v, want it named with the hint", err)
	}
}

// An address, master or credential from an unset environment variable is
// refused as the URL is: go-redis dials localhost:6379 for an empty address, so the
// store silently used whatever Redis runs there (not the one the fleet
// shares), and a Sentinel config without its master became a Cluster of
// sentinels.
func TestUnsetAddressMasterOrCredentialIsRefused(t *testing.T) {
	for _, tt := range []struct{ store, want string }{
		{`{"type":"redis","addresses":["{env.TELEMETRY_DEDUP_TEST_UNSET_ADDR}"]}`, "has no host"},
		{`{"type":"redis","addresses":["127.0.0.1:1",""]}`, "has no host"},
		{`{"type":"redis","master":"{env.TELEMETRY_DEDUP_TEST_UNSET_MASTER}","addresses":["127.0.0.1:1","127.0.0.1:2"]}`, "master is empty once its placeholders are filled"},
		// Only the host from the environment: go-redis dials the port on
		// this machine for it, as it does for an empty address.
		{`{"type":"redis","addresses":["{env.TELEMETRY_DEDUP_TEST_UNSET_HOST}:6379"]}`, "has no host"},
		{`{"type":"redis","url":"redis://{env.TELEMETRY_DEDUP_TEST_UNSET_HOST}:6379/0"}`, "has no host"},
		// An unset password connected without AUTH: every ping unchecked,
		// and the warning that Redis wants one sent the operator to set
		// the password they had set.
		{`{"type":"redis","url":"redis://127.0.0.1:1/0","password":"{env.TELEMETRY_DEDUP_TEST_UNSET_PASSWORD}"}`, "password is empty once its placeholders are filled"},
		{`{"type":"redis","url":"redis://127.0.0.1:1/0","username":"{env.TELEMETRY_DEDUP_TEST_UNSET_USER}","password":"x"}`, "username is empty once its placeholders are filled"},
		{`{"type":"redis","master":"m","addresses":["127.0.0.1:1"],"sentinel_password":"{env.TELEMETRY_DEDUP_TEST_UNSET_PASSWORD}"}`, "sentinel_password is empty once its placeholders are filled"},
	} {
		h := new(Handler)
		if err := json.Unmarshal([]byte(`{"store":`+tt.store+`}`), h); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		err := h.Provision(ctx)
		cancel()
		if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "is the environment variable set?") {
			t.Errorf("store %s: got %v, want %q with the hint", tt.store, err, tt.want)
		}
	}
	if _, err := parse(t, "telemetry_dedup {\n\tstore redis {\n\t\taddresses \"\"\n\t}\n}"); err == nil || !strings.Contains(err.Error(), "has no host") {
		t.Errorf("addresses \"\": got %v, want it refused", err)
	}
}

// A JSON config's error names the JSON field it is in.
func TestJSONErrorsNameTheirField(t *testing.T) {
	for _, tt := range []struct{ config, want string }{
		{`{"speed":"vel","speed_unit":"furlongs"}`, "speed_unit: unknown speed unit"},
		{`{"max_body":-1}`, "max_body: -1 is negative; use a number of bytes such as 1048576"},
		{`{"time":[""]}`, "time: the path is empty"},
		{`{"store":"memory"}`, `write it as {"type":"memory"}`},
		// 3 windows, the default stuck_after, used to overflow and blame it.
		{`{"window":9223372036000000000}`, "window: 2562047h47m16s is longer than"},
		{`{"near_cache":99999999999}`, "near_cache: 99999999999 keys would take 6400.0 GB"},
	} {
		h := new(Handler)
		if err := json.Unmarshal([]byte(tt.config), h); err != nil {
			t.Fatal(err)
		}
		if _, err := h.resolve(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: got %v, want %q", tt.config, err, tt.want)
		}
	}
}

// batch off clears a preset's wrapper, as event off and state off clear
// its events and states; before, it was read as a path named "off".
func TestBatchOffClearsThePresetsWrapper(t *testing.T) {
	for _, tt := range []struct{ config, want string }{
		{`{"preset":"overland"}`, "locations"},
		{`{"preset":"overland","batch":"off"}`, ""},
	} {
		h := new(Handler)
		if err := json.Unmarshal([]byte(tt.config), h); err != nil {
			t.Fatal(err)
		}
		s, err := h.resolve()
		if err != nil || s.splitter.Wrapper != tt.want {
			t.Errorf("%s: wrapper %q (%v), want %q", tt.config, s.splitter.Wrapper, err, tt.want)
		}
	}
}

// dead_letter_stream and dead_letter_maxlen do nothing unless on_invalid is
// dead_letter: a config that sets them and forgets on_invalid rejects every
// invalid ping while its author believes they are kept. Like radius on
// tumbling, it must be an error naming the line, in the Caddyfile and JSON.
func TestDeadLetterOptionsWithoutDeadLettering(t *testing.T) {
	for _, tt := range []struct{ block, option string }{
		{"\tstore redis redis://x\n\tdead_letter_stream fleet:invalid\n", "dead_letter_stream"},
		{"\tstore redis redis://x\n\tdead_letter_maxlen 5000\n", "dead_letter_maxlen"},
		{"\tstore redis redis://x\n\ton_invalid reject\n\tdead_letter_stream fleet:invalid\n", "dead_letter_stream"},
	} {
		_, err := parse(t, "telemetry_dedup {\n"+tt.block+"}")
		line := ":3"
		if strings.Contains(tt.block, "on_invalid") {
			line = ":4"
		}
		if err == nil || !strings.Contains(err.Error(), tt.option) || !strings.Contains(err.Error(), "on_invalid dead_letter") || !strings.Contains(err.Error(), line) {
			t.Errorf("%q: got %v, want an error at %s naming %s and on_invalid dead_letter", tt.block, err, line, tt.option)
		}
	}
	h := &Handler{DeadLetterStream: "fleet:invalid", StoreRaw: []byte(`{"type":"redis","url":"redis://x"}`)}
	if _, err := h.resolve(); err == nil || !strings.Contains(err.Error(), "dead_letter_stream") {
		t.Errorf("JSON dead_letter_stream without on_invalid dead_letter: got %v, want an error", err)
	}
	// With on_invalid dead_letter they load.
	if _, err := parse(t, "telemetry_dedup {\n\tstore redis redis://x\n\ton_invalid dead_letter\n\tdead_letter_stream s\n\tdead_letter_maxlen 10\n}"); err != nil {
		t.Errorf("with on_invalid dead_letter: %v", err)
	}
}

// An option of the redis store's tls block given twice must be an error,
// as it is everywhere else in the directive: the second ca silently won.
func TestRedisTLSOptionGivenTwiceIsAnError(t *testing.T) {
	for _, option := range []string{"ca a.pem", "cert c.pem", "key k.pem", "server_name redis.internal", "insecure_skip_verify"} {
		input := "telemetry_dedup {\n\tstore redis redis://x {\n\t\ttls {\n\t\t\t" + option + "\n\t\t\t" + option + "\n\t\t}\n\t}\n}"
		_, err := parse(t, input)
		if err == nil || !strings.Contains(err.Error(), ":5") || !strings.Contains(err.Error(), "already") {
			t.Errorf("tls { %s twice }: got %v, want an error at line 5 saying it is already given", option, err)
		}
	}
}

// insecure_skip_verify is a flag: a value after it must be an error, not
// ignored, or "insecure_skip_verify false" would turn verification off.
func TestRedisTLSInsecureSkipVerifyTakesNoValue(t *testing.T) {
	for _, value := range []string{"false", "off", "true"} {
		input := "telemetry_dedup {\n\tstore redis redis://x {\n\t\ttls {\n\t\t\tinsecure_skip_verify " + value + "\n\t\t}\n\t}\n}"
		_, err := parse(t, input)
		if err == nil || !strings.Contains(err.Error(), ":4") || !strings.Contains(err.Error(), "remove") {
			t.Errorf("insecure_skip_verify %s: got %v, want an error at line 4 saying to remove the value", value, err)
		}
	}
}

// A tls option given without its value, or with two, says what it takes,
// as every other option does: it used to say only "ca takes exactly one
// value".
func TestRedisTLSOptionWithoutItsValueSaysWhatToWrite(t *testing.T) {
	for _, tt := range []struct{ line, want string }{
		{"ca", "ca takes one value: ca <pem file>"},
		{"cert a.pem b.pem", "cert takes one value: cert <pem file>"},
		{"key", "key takes one value: key <pem file>"},
		{"server_name", "server_name takes one value: server_name <name>"},
	} {
		input := "telemetry_dedup {\n\tstore redis redis://x {\n\t\ttls {\n\t\t\t" + tt.line + "\n\t\t}\n\t}\n}"
		_, err := parse(t, input)
		if err == nil || !strings.Contains(err.Error(), ":4") || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("tls { %s }: got %v, want an error at line 4 saying %q", tt.line, err, tt.want)
		}
	}
}

// A stray value in the redis store's syntax (a second URL, a value after
// cluster or tls) is an error that says what the line takes, not Caddy's
// bare "wrong argument count".
func TestStoreRedisStrayValuesSayWhatToWrite(t *testing.T) {
	for _, tt := range []struct{ block, want string }{
		{"store redis redis://a:6379 redis://b:6379", "one URL"},
		{"store redis {\n\t\taddresses a:7000\n\t\tcluster yes\n\t}", "cluster takes no value"},
		{"store redis redis://x {\n\t\ttls on\n\t}", "tls takes no value"},
	} {
		_, err := parse(t, "telemetry_dedup {\n\t"+tt.block+"\n}")
		if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "wrong argument count") {
			t.Errorf("%q: got %v, want an error saying %q", tt.block, err, tt.want)
		}
	}
}

// answers { dead_lettered <status> <content type> } without a body: the
// answer is then the JSON report, so the content type would never be sent.
func TestDeadLetteredContentTypeWithoutABodyIsRefused(t *testing.T) {
	_, err := parse(t, "telemetry_dedup {\n\tanswers {\n\t\tdead_lettered 202 text/plain\n\t}\n}")
	if err == nil || !strings.Contains(err.Error(), ":3") {
		t.Errorf("dead_lettered 202 text/plain without a body: got %v, want an error at line 3", err)
	}
}

// A session_idle longer than the TTL the ladder gives is the TTL, as a
// window that outlasts it is: an asset's track must outlive the silence
// that ends its session, or a ping after a shorter silence (its track
// expired) is admitted as a new session.
func TestASessionIdleLongerThanTheLadderIsTheTTL(t *testing.T) {
	h, err := parse(t, "telemetry_dedup {\n\tshape session\n\tsession_idle 8h\n}")
	if err != nil {
		t.Fatal(err)
	}
	s, err := h.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if s.policy.TTL != 8*time.Hour {
		t.Errorf("TTL %s, want session_idle 8h0m0s (the ladder's 6h30m0s would expire a track within a session)", s.policy.TTL)
	}
}

// The README's store block states go-redis's own defaults for the timeouts
// left out: they are what a client built from the store's settings has.
func TestREADMEStatesTheRedisTimeoutDefaults(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	stated := func(option string) string {
		line := regexp.MustCompile(`(?m)^\t` + option + ` +(\S+)`).FindSubmatch(readme)
		if line == nil {
			t.Fatalf("README's store block has no %s line", option)
		}
		return string(line[1])
	}
	clientOptions := func(r RedisStore) *redis.Options {
		opts, err := r.options()
		if err != nil {
			t.Fatal(err)
		}
		client := redis.NewUniversalClient(opts).(*redis.Client)
		defer client.Close()
		return client.Options()
	}
	got := clientOptions(RedisStore{URL: "redis://127.0.0.1:1/0"})
	for option, value := range map[string]time.Duration{"dial_timeout": got.DialTimeout, "read_timeout": got.ReadTimeout} {
		if want, err := time.ParseDuration(stated(option)); err != nil || want != value {
			t.Errorf("README states %s %s; a client left without it has %s", option, stated(option), value)
		}
	}
	if want := stated("write_timeout"); want != "<read_timeout>" {
		t.Errorf("README states write_timeout %s; a client left without it takes its read_timeout", want)
	}
	if got := clientOptions(RedisStore{URL: "redis://127.0.0.1:1/0", ReadTimeout: caddy.Duration(2 * time.Second)}); got.WriteTimeout != 2*time.Second {
		t.Errorf("read_timeout 2s alone gives write_timeout %s, not the read_timeout the README states", got.WriteTimeout)
	}
}

// Caddyfile.example spells out the fields of a format without a preset,
// and a preset added above them was overridden by them without a word:
// every location of the tracker was refused as missing asset_id. Such
// options are named at load (a warning, as an override can be meant); a
// path of the tracker's own is not.
func TestDefaultFieldsWrittenBesideAPresetAreNamed(t *testing.T) {
	for _, tt := range []struct {
		block string
		want  []string
	}{
		{"preset owntracks\n asset asset_id\n time occurred_at", []string{
			"asset asset_id (the preset reads tid or topic)", "time occurred_at (the preset reads tst)"}},
		{"preset overland\n lat lat\n lon lon", []string{
			"lat lat (the preset reads geometry.coordinates.1)", "lon lon (the preset reads geometry.coordinates.0)"}},
		{"preset osmand\n asset asset_id", []string{"asset asset_id (the preset reads device_id or id or deviceid)"}},
		// OsmAnd's form fields are lat and lon, the Transistorsoft body's
		// are not.
		{"preset osmand\n lat lat", []string{"lat lat (the preset reads location.coords.latitude)"}},
		{"preset owntracks\n asset topic", nil},
		{"asset asset_id\n lat lat", nil},
	} {
		s := resolvedBlock(t, tt.block)
		if !slices.Equal(s.defaultsOverPreset, tt.want) {
			t.Errorf("%q: named %q, want %q", tt.block, s.defaultsOverPreset, tt.want)
		}
	}
}

// accuracy written beside preset osmand replaces where the preset reads
// it, hdop included: a device whose hdop is a true HDOP is not read as
// metres once its operator named the field.
func TestAccuracyOptionReplacesOsmAndsHdop(t *testing.T) {
	h, err := parse(t, "telemetry_dedup {\n preset osmand\n accuracy acc\n}")
	if err != nil {
		t.Fatal(err)
	}
	s, err := h.resolve()
	if err != nil {
		t.Fatal(err)
	}
	batch, err := s.formParser.SplitForm("id=7&lat=48.85&lon=2.29&timestamp=1796568000&hdop=40", nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.formParser.Parse(batch.Elements[0], time.Unix(1796568000, 0))
	if err != nil || got.Accuracy != 0 {
		t.Errorf("accuracy %v (%v), want none: hdop is not the accuracy named", got.Accuracy, err)
	}
}

// time_zone beside preset owntracks is refused (tst is epoch seconds), and
// the error names the preset: it blamed "time_format unix", an option the
// operator never wrote, and advised time_format auto, with which the zone
// loaded and still did nothing for OwnTracks' numeric tst.
func TestATimeZoneBesideAPresetOfEpochTimesNamesThePreset(t *testing.T) {
	_, err := parse(t, "telemetry_dedup {\n\tpreset owntracks\n\ttime_zone Europe/Berlin\n}")
	if err == nil {
		t.Fatal("no error")
	}
	if !strings.Contains(err.Error(), "owntracks") {
		t.Errorf("error %q blames time_format, which is not written; want it to name preset owntracks", err)
	}
}

// A key_scope written with a quoted environment variable that is not set
// in this process (a tenant header name kept in the environment, say)
// reaches the handler as an empty value, and the handler runs unscoped:
// every tenant's truck-1 shares one key, and one tenant's pings suppress
// another's. The README says a key_scope template "without a placeholder
// ... is a configuration error"; an empty one has none, and loads.
func TestAnEmptyKeyScopeIsAnError(t *testing.T) {
	t.Setenv("TELEMETRY_DEDUP_TEST_TENANT_SCOPE", "")
	src := ":8080 {\n\ttelemetry_dedup {\n\t\tkey_scope \"{$TELEMETRY_DEDUP_TEST_TENANT_SCOPE}\"\n\t}\n\trespond ok\n}\n"
	_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), map[string]any{"filename": "Caddyfile"})
	if err == nil {
		t.Fatal("an empty key_scope loaded: the handler runs unscoped, and tenants with the same asset ids suppress each other")
	}
	for _, w := range []string{"key_scope", "Caddyfile:3"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not contain %q", err, w)
		}
	}
}

// An option written with an empty value is a mistake to be told about
// (asset "" and state "" are: "the path is empty"), not a quiet default:
// lat "" reads the default path lat, accuracy "" keeps the preset's path,
// speed "" km/h applies km/h to the preset's speed path, time_zone ""
// refuses naive timestamps after all. Each comes from a quoted {$VAR} that
// is unset as easily as from a typo.
func TestAnEmptyOptionValueIsAnError(t *testing.T) {
	for _, tt := range []struct{ name, input string }{
		{"lat", "telemetry_dedup {\n\tlat \"\"\n}"},
		{"lon", "telemetry_dedup {\n\tlon \"\"\n}"},
		{"accuracy", "telemetry_dedup {\n\tpreset osmand\n\taccuracy \"\"\n}"},
		{"speed", "telemetry_dedup {\n\tpreset owntracks\n\tspeed \"\" knots\n}"},
		{"time_zone", "telemetry_dedup {\n\ttime_zone \"\"\n}"},
		{"key_scope", "telemetry_dedup {\n\tkey_scope \"\"\n}"},
		{"preset", "telemetry_dedup {\n\tpreset \"\"\n}"},
		{"crs", "telemetry_dedup {\n\tcrs \"\"\n}"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse(t, tt.input)
			if err == nil {
				t.Fatalf("%s \"\" loaded as if it were left out", tt.name)
			}
			if !strings.Contains(err.Error(), tt.name) || !strings.Contains(err.Error(), "Testfile:") {
				t.Errorf("error %q does not name %s and its line", err, tt.name)
			}
		})
	}
}

// A preset whose senders post only JSON, beside encoding form, is refused
// at its line: every post of theirs would be answered 400. Overland's
// batches first (its wrapper is the conflict batch <path> beside encoding
// form is refused for), then helper 2's finding: the OwnTracks apps post a
// JSON object a request (Android's HttpMessageProcessorEndpoint.kt sends
// application/json), Traccar's forwarder a JSON position
// (PositionForwarderJson.java), and GeoJSON is JSON; with encoding form
// they loaded, and OwnTracks Android then resent every location forever
// at the head of its queue, iOS deleted each with an alert, and Traccar's
// forwarder dropped every position. osmand, whose senders post form
// fields, keeps encoding form.
func TestAPresetWhoseSendersPostOnlyJSONRefusesEncodingForm(t *testing.T) {
	for _, preset := range []string{"overland", "owntracks", "traccar", "geojson"} {
		t.Run(preset, func(t *testing.T) {
			_, err := parse(t, "telemetry_dedup {\n\tpreset "+preset+"\n\tencoding form\n}")
			if err == nil {
				t.Fatalf("preset %s with encoding form loaded: every post of its senders, a JSON body, is then refused 400", preset)
			}
			if !strings.Contains(err.Error(), "encoding") || !strings.Contains(err.Error(), "Testfile:3") {
				t.Errorf("error %q does not name encoding at its line", err)
			}
		})
	}
	if _, err := parse(t, "telemetry_dedup {\n\tpreset osmand\n\tencoding form\n}"); err != nil {
		t.Errorf("preset osmand with encoding form refused: %v", err)
	}
}

// The README promises that a master or credential "that is empty once
// [its placeholders] are filled (the variable is not set) refuses the
// config, asking whether it is: an unset password connected without AUTH,
// and every ping went unchecked". That holds for {env.REDIS_PASSWORD};
// written with Caddy's own {$REDIS_PASSWORD} in quotes (the form the
// module's own key_prefix and dead_letter_stream errors recommend), an unset variable reaches
// the store as "" and loads: the connection goes without AUTH (or, for
// master, as a Cluster client to the sentinels), and every ping is
// unchecked. The URL and addresses written "" are refused at parse; these
// are not.
func TestAnEmptyRedisMasterOrCredentialIsRefused(t *testing.T) {
	for _, tt := range []struct{ option, block string }{
		{"master", "addresses a:26379 b:26379\n\t\tmaster \"\""},
		{"password", "password \"\""},
		{"username", "username \"\"\n\t\tpassword x"},
		{"sentinel_password", "addresses a:26379 b:26379\n\t\tmaster m\n\t\tsentinel_password \"\""},
	} {
		t.Run(tt.option, func(t *testing.T) {
			url := "redis://127.0.0.1:1/0 "
			if strings.Contains(tt.block, "addresses") {
				url = ""
			}
			_, err := parse(t, "telemetry_dedup {\n\tstore redis "+url+"{\n\t\t"+tt.block+"\n\t}\n}")
			if err == nil {
				t.Fatalf("store redis with %s \"\" loaded", tt.option)
			}
			if !strings.Contains(err.Error(), tt.option) || !strings.Contains(err.Error(), "Testfile:") {
				t.Errorf("error %q does not name %s and its line", err, tt.option)
			}
		})
	}
}

// A block opened after an option that takes none (preset owntracks {,
// mode shadow {, as store memory { is written) is reported as an unknown
// option "{", with the list of all 43 options: the line is right, but the
// message points at the wrong thing. It should say that the option takes
// no block.
func TestABlockAfterAnOptionThatTakesNoneSaysSo(t *testing.T) {
	for _, option := range []string{"preset owntracks", "mode shadow", "window 5m", "store redis redis://a {\n\t\tpassword x", "store redis redis://a {\n\t\tcluster"} {
		lines := strings.Split(option, "\n")
		name := strings.Fields(lines[len(lines)-1])[0]
		_, err := parse(t, "telemetry_dedup {\n\t"+option+" {\n\t}\n}")
		if err == nil {
			t.Fatalf("%s with a block loaded", option)
		}
		if strings.Contains(err.Error(), `option "{"`) || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "block") {
			t.Errorf("%s {: error %q does not say that %s takes no block", option, err, name)
		}
	}
}

// key_prefix left oneArg to take "" as a value, and reads its one value
// with AllArgs itself; given two words (a prefix with a space in it, or a
// second one pasted beside it) its argCountError is built after AllArgs
// has moved the cursor to the first value, so the error names the value
// as the option ("fleet: takes exactly one value") and withSyntax, which
// matches the option's name, cannot add the syntax: before, it was
// "key_prefix takes one value: key_prefix <prefix>", as for every other
// one-value option (lat a b, master my master).
func TestKeyPrefixInTwoWordsNamesKeyPrefix(t *testing.T) {
	_, err := parse(t, "telemetry_dedup {\n\tkey_prefix fleet: staging:\n}")
	if err == nil {
		t.Fatal("key_prefix with two values loaded")
	}
	for _, w := range []string{"key_prefix takes one value: key_prefix <prefix>", "Testfile:2"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not contain %q", err, w)
		}
	}
	if strings.HasPrefix(err.Error(), "fleet:") {
		t.Errorf("error %q names the value fleet: as the option", err)
	}
}

// An option written one block off (a store's timeout, max_keys or
// password beside store instead of in its block, near_cache inside the
// store's block)
// is "unrecognized", followed by the list of the block's options, which
// does not hold it: the line is named, the fix is not. Each error should
// say the block the option belongs in.
func TestAnOptionWrittenOneBlockOffSaysWhereItGoes(t *testing.T) {
	for _, tt := range []struct{ input, want string }{
		{"telemetry_dedup {\n\tstore redis redis://a\n\ttimeout 50ms\n}", "store redis"},
		{"telemetry_dedup {\n\tmax_keys 1000000\n}", "store memory"},
		{"telemetry_dedup {\n\tstore redis redis://a\n\tpassword {env.REDIS_PASSWORD}\n}", "store redis"},
		{"telemetry_dedup {\n\tstore redis redis://a {\n\t\tnear_cache 1000\n\t}\n}", "telemetry_dedup"},
	} {
		_, err := parse(t, tt.input)
		if err == nil {
			t.Errorf("%q loaded", tt.input)
			continue
		}
		if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: error %q names the line but not where the option goes (%q)", tt.input, err, tt.want)
		}
	}
}

// JSON's speed_unit written as a Caddyfile option after speed (the README
// names both fields) is refused as a repeat: "speed_unit already specified
// on line 2; give each option once", for an option written once, on a line
// that holds none of that name. The parser files the speed line under
// speed_unit too, to report JSON's speed_unit errors there, and the
// duplicate check finds it. It should say that the unit goes on the speed
// line (speed vel km/h), as it does, if less helpfully, without speed.
func TestSpeedUnitAfterSpeedIsNotCalledARepeat(t *testing.T) {
	_, err := parse(t, "telemetry_dedup {\n\tspeed vel\n\tspeed_unit km/h\n}")
	if err == nil {
		t.Fatal("speed_unit loaded")
	}
	if strings.Contains(err.Error(), "already specified") {
		t.Errorf("error %q says speed_unit was given twice; it was written once, and the unit goes on the speed line", err)
	}
	if !strings.Contains(err.Error(), "Testfile:3") {
		t.Errorf("error %q does not name line 3", err)
	}
}

// Guard: the default column of the README's options table is what an
// option left out resolves to, for the defaults TestCaddyfileDefaults does
// not hold to the README (dead letters, batches, stuck detection, the
// clock bounds, the near cache, the answers, a preset's encoding and
// batch).
func TestTheOptionsTableDefaultsAreWhatAnOptionLeftOutGets(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	resolved := func(block string) settings {
		t.Helper()
		h, err := parse(t, "telemetry_dedup {\n"+block+"\n}")
		if err != nil {
			t.Fatal(err)
		}
		s, err := h.resolve()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s, osmand, overland := resolved(""), resolved("preset osmand"), resolved("preset overland")
	nearCache := func(store any) int { return new(Handler).nearCacheSize(store) }
	for _, tt := range []struct {
		option, stated string // the table's default column holds stated
		holds          bool
	}{
		{"dead_letter_stream", "`<key_prefix>dead_letter`", s.deadLetterStream == "dedup:dead_letter"},
		{"dead_letter_maxlen", "`100000`", s.deadLetterMaxLen == 100000},
		{"max_batch", "`1000`", s.maxBatch == 1000 && s.splitter.Max == 1000},
		{"max_future", "`5m`", s.parser.MaxFuture == 5*time.Minute && s.formParser.MaxFuture == 5*time.Minute},
		{"max_past", "`365d`", s.parser.MaxPast == 365*24*time.Hour},
		{"null_island", "`reject`", !s.parser.AllowNullIsland},
		{"stuck_ratio", "`0.95`", s.stuckRatio == 0.95},
		{"stuck_after", "3 × `window`", s.stuckAfter == 15*time.Minute && resolved("window 1m").stuckAfter == 3*time.Minute},
		{"stuck_track", "`10000`", s.stuckTrack == 10000},
		{"near_cache", "`100000` with `store redis`, off with `memory`", nearCache(&RedisStore{}) == 100000 && nearCache(&MemoryStore{}) == 0},
		{"encoding", "`json`; `auto` with `preset osmand`", s.encoding == encodingJSON && osmand.encoding == encodingAuto},
		{"batch", "`locations` with `preset overland`, else none", s.splitter.Wrapper == "" && overland.splitter.Wrapper == "locations"},
		{"answers", "else `suppressed 200`, `in_flight 409 1`, `dead_lettered 202`", s.answers.suppressed.status == 200 && !s.answers.suppressed.hasBody &&
			s.answers.inFlight == retryAnswer{status: 409, retryAfter: "1"} && s.answers.deadLettered.status == 202 && !s.answers.deadLettered.hasBody},
		{"ttl", "`6h30m`", s.policy.TTL == 6*time.Hour+30*time.Minute && resolved("window 7h").policy.TTL == 7*time.Hour},
	} {
		row := regexp.MustCompile("(?m)^\\| `" + tt.option + "` \\| ([^|]*) \\|").FindSubmatch(readme)
		if row == nil {
			t.Errorf("README's options table has no row for %s", tt.option)
			continue
		}
		if !strings.Contains(string(row[1]), tt.stated) {
			t.Errorf("README's %s row gives the default %q, not %q", tt.option, row[1], tt.stated)
		}
		if !tt.holds {
			t.Errorf("%s left out does not resolve to the README's default %s", tt.option, tt.stated)
		}
	}
}

// Guard: Caddyfile.example's handler, as caddy adapt writes it, provisions
// (its store loaded, its metrics registered) in process, without the
// xcaddy build that integration's test of the example needs (skipped with
// -short).
func TestTheExamplesHandlerProvisions(t *testing.T) {
	src, err := os.ReadFile("Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	out, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt(src, map[string]any{"filename": "Caddyfile.example"})
	if err != nil || len(warnings) > 0 {
		t.Fatalf("adapt: %v %v", err, warnings)
	}
	h := new(Handler)
	if err := json.Unmarshal(findHandler(t, out), h); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	if err := h.Provision(ctx); err != nil {
		t.Fatalf("Caddyfile.example's handler does not provision: %v", err)
	}
	defer h.Cleanup()
	if h.deduper == nil || h.deduper.Store == nil {
		t.Fatal("provisioned without a store")
	}
}

// A Redis store that cannot be dialled as written, or not as meant, is
// refused at its line with the fix, not loaded to answer every ping
// unchecked or to use what the operator did not write. (Helper 1's
// review, stop 63.)
func TestARedisStoreWrittenWrongIsRefusedAtItsLine(t *testing.T) {
	for _, tt := range []struct {
		block, want string
	}{
		// go-redis dials neither a URL nor a name without its port: every
		// call failed, every ping unchecked, one startup warning.
		{"store redis {\n\t\taddresses redis://10.0.0.1:26379 redis://10.0.0.2:26379\n\t\tmaster mymaster\n\t}", "host:port"},
		{"store redis {\n\t\taddresses sentinel-1 sentinel-2 sentinel-3\n\t\tmaster mymaster\n\t}", "host:port"},
		{"store redis {\n\t\taddresses redis-node-1 redis-node-2 redis-node-3\n\t\tcluster\n\t}", "host:port"},
		// A URL without a port splits at its scheme's colon. (Helper 7's
		// review, stop 63.)
		{"store redis {\n\t\taddresses redis://redis.internal\n\t}", "host:port"},
		{"store redis {\n\t\taddresses unix:///var/run/redis/redis.sock\n\t}", "host:port"},
		// The block, not the URL's query, sets the connection's options:
		// go-redis checked the query and the store dropped it.
		{`store redis "redis://10.0.0.5:6379/0?dial_timeout=3s&read_timeout=2s&pool_size=50"`, "give them in the store's block"},
		// A negative database went to go-redis as it was, which selects 0.
		{"store redis redis://127.0.0.1:6379/-1", "is negative"},
	} {
		_, err := parse(t, "telemetry_dedup {\n\t"+tt.block+"\n}")
		if err == nil || !strings.Contains(err.Error(), "Testfile:2") || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v; want an error at line 2 saying %q", tt.block, err, tt.want)
		}
	}
}

// A Redis URL from the environment that does not parse (a generated
// password's /, # or %) is refused without the password: the URL parser's
// error quotes the URL, and Caddy prints it at start, logs it and answers
// it to the admin API's /load caller. It says what to do. (Helper 1's
// review, stop 63.)
func TestABadRedisURLFromTheEnvironmentDoesNotPrintItsPassword(t *testing.T) {
	for _, url := range []string{"redis://:s3cr/et@10.0.0.5:6379/0", "redis://:s3cr#et@10.0.0.5:6379/0", "redis://app:s3cr%et@10.0.0.5:6379/0",
		// A / or ? right after the user's colon (one base64 password in
		// 64 starts with a /) parses, and its tail was quoted as a query
		// or a path. (Helper 6's review, stop 63.)
		"redis://app:/s3cret@10.0.0.5:6379/0", "redis://app:?s3cret@10.0.0.5:6379/0", "redis://app:/x/s3cret@10.0.0.5:6379/0",
		"redis://app:12?s3cret@10.0.0.5:6379/0"} {
		t.Setenv("TELEMETRY_DEDUP_TEST_REDIS_URL", url)
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		r := &RedisStore{URL: "{env.TELEMETRY_DEDUP_TEST_REDIS_URL}"}
		err := r.Provision(ctx)
		cancel()
		if err == nil {
			_ = r.Cleanup()
			t.Fatalf("%s loaded", url)
		}
		if strings.Contains(err.Error(), "s3cr") || !strings.Contains(err.Error(), "percent-encoded") && !strings.Contains(err.Error(), "query") {
			t.Errorf("%s: %v; want an error without the password that says to percent-encode it", url, err)
		}
	}
}

// A time_format that a preset's senders never write is refused at its
// line: OwnTracks' tst is always epoch seconds, so unix_ms read every
// location as 1970, each passed on unkeyed (max_past), and rfc3339 had
// each answered 422, which Android resends forever; Traccar's forwarder
// and Overland write ISO strings, which unix refused. auto reads both
// kinds. (Helper 1's review, stop 63.)
func TestATimeFormatThePresetsSendersNeverWriteIsRefused(t *testing.T) {
	for _, tt := range []struct {
		preset, format string
		loads          bool
	}{
		{"owntracks", "unix_ms", false},
		{"owntracks", "rfc3339", false},
		{"traccar", "unix", false},
		{"overland", "unix_ms", false},
		{"owntracks", "auto", true},
		{"owntracks", "unix", true},
		{"overland", "rfc3339", true},
		{"osmand", "unix", true}, // its senders write seconds, milliseconds or ISO times: one sender may well write only one
	} {
		_, err := parse(t, "telemetry_dedup {\n\tpreset "+tt.preset+"\n\ttime_format "+tt.format+"\n}")
		switch {
		case tt.loads && err != nil:
			t.Errorf("preset %s, time_format %s: %v", tt.preset, tt.format, err)
		case !tt.loads && (err == nil || !strings.Contains(err.Error(), "Testfile:3") || !strings.Contains(err.Error(), "preset "+tt.preset)):
			t.Errorf("preset %s, time_format %s: %v; want it refused at line 3, naming the preset", tt.preset, tt.format, err)
		}
	}
}

// key_scope {header.Host} (Caddy's shorthand of
// {http.request.header.Host}) is empty on every request, since Go's server
// moves the Host header into the request's Host: every ping of every
// tenant was answered 422. It is refused at its line, naming
// {http.request.host}. (Helper 1's review, stop 63.)
func TestAKeyScopeOfTheHostHeaderIsRefused(t *testing.T) {
	for _, template := range []string{"{http.request.header.Host}", "t-{http.request.header.HOST}"} { // the adapter writes {header.Host} so
		_, err := parse(t, "telemetry_dedup {\n\tkey_scope "+template+"\n}")
		if err == nil || !strings.Contains(err.Error(), "Testfile:2") || !strings.Contains(err.Error(), "use {http.request.host}") {
			t.Errorf("key_scope %s: %v; want it refused at line 2, naming {http.request.host}", template, err)
		}
	}
}

// An answer written without its answers block, or a TLS setting written
// straight in the store's block or at the top, is told the block it goes
// in, as the other misplaced options are. (Helper 1's review, stop 63.)
func TestAnAnswerOrATLSOptionOneBlockOffSaysWhereItGoes(t *testing.T) {
	for _, tt := range []struct{ input, want string }{
		{"telemetry_dedup {\n\tsuppressed 200 application/json []\n}", "answers { suppressed"},
		{"telemetry_dedup {\n\tin_flight 503 1\n}", "answers { in_flight"},
		{"telemetry_dedup {\n\tstore redis rediss://r.example:6380 {\n\t\tinsecure_skip_verify\n\t}\n}", "tls { insecure_skip_verify"},
		{"telemetry_dedup {\n\tstore redis rediss://r.example:6380 {\n\t\tca /etc/redis/ca.pem\n\t}\n}", "tls { ca"},
		{"telemetry_dedup {\n\tstore redis rediss://r.example:6380\n\tserver_name r.example\n}", "tls { server_name"},
	} {
		if _, err := parse(t, tt.input); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: %v; want it to name the block, %q", tt.input, err, tt.want)
		}
	}
}

// The URL's db and skip_verify, which go-redis reads and the store takes
// (its database and TLS settings), still load; a URL without its scheme
// is told to write one, not blamed on a password. (Helper 6's review,
// stop 63: the query's refusal took these two too, and a working config
// no longer started.)
func TestARedisURLsDatabaseAndSkipVerifyStillLoad(t *testing.T) {
	opts, err := RedisStore{URL: "redis://10.0.0.5:6379?db=2"}.options()
	if err != nil || opts.DB != 2 {
		t.Errorf("redis://10.0.0.5:6379?db=2: %v, db %v; want database 2", err, opts)
	}
	for _, tls := range []*RedisTLS{nil, {ServerName: "redis.internal"}} { // a tls block that leaves insecure_skip_verify out kept it (helper 7)
		opts, err = RedisStore{URL: "rediss://10.0.0.5:6380/0?skip_verify=true", TLS: tls}.options()
		if err != nil || opts.TLSConfig == nil || !opts.TLSConfig.InsecureSkipVerify {
			t.Errorf("rediss://10.0.0.5:6380/0?skip_verify=true, tls %+v: %v; want TLS without verification", tls, err)
		}
	}
	if _, err := parse(t, "telemetry_dedup {\n\tstore redis 10.0.0.5:6379\n}"); err == nil || strings.Contains(err.Error(), "password") || !strings.Contains(err.Error(), "redis://host:port") {
		t.Errorf("store redis 10.0.0.5:6379: %v; want it told to write redis://host:port, not about a password", err)
	}
}

// More than eight state fields is refused: the print holds eight, each in
// slots of its own, and fields that share slots read as changed whenever
// a message carries one without the other. (Helper 7's review, stop 63.)
func TestMoreThanEightStateFieldsAreRefused(t *testing.T) {
	if _, err := parse(t, "telemetry_dedup {\n\tstate a b c d e f g h\n}"); err != nil {
		t.Errorf("eight state fields: %v", err)
	}
	if _, err := parse(t, "telemetry_dedup {\n\tstate a b c d e f g h i\n}"); err == nil || !strings.Contains(err.Error(), "Testfile:2") || !strings.Contains(err.Error(), "more than the 8") {
		t.Errorf("nine state fields: %v; want them refused at line 2", err)
	}
}

// The README ("Options"): "An option that takes no block, written with
// one (preset owntracks {), says so", and TestABlockAfterAnOptionThatTakesNoneSaysSo
// holds the block's options and the redis store's to it. Inside answers,
// the one other block of the directive, a line written with a block
// (suppressed 200 {, as a user who reads "answers { ... }" nests the body)
// was answered `unknown answer "{"; the answers are suppressed, in_flight
// and dead_lettered`: it said the user's own answer, suppressed, is not
// one, and not that it takes no block; max_keys { in the memory store's
// block, `unrecognized store memory option "{"`. (Helper 3's review, stop
// 65.)
func TestAnAnswerOrMaxKeysWrittenWithABlockSaysItTakesNone(t *testing.T) {
	for _, c := range []struct{ block, name string }{
		{"answers {\n\t\tsuppressed 200 {\n\t\t}\n\t}", "suppressed"},
		{"answers {\n\t\tin_flight 503 {\n\t\t}\n\t}", "in_flight"},
		{"answers {\n\t\tdead_lettered 202 {\n\t\t}\n\t}", "dead_lettered"},
		{"store memory {\n\t\tmax_keys 1000 {\n\t\t}\n\t}", "max_keys"},
	} {
		_, err := parse(t, "telemetry_dedup {\n\t"+c.block+"\n}")
		if err == nil {
			t.Errorf("%q loaded", c.block)
			continue
		}
		if strings.Contains(err.Error(), `"{"`) || !strings.Contains(err.Error(), c.name) || !strings.Contains(err.Error(), "block") {
			t.Errorf("%s with a block: error %q does not say that %s takes no block", c.name, err, c.name)
		}
	}
}
