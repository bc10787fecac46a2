package telemetrydedup

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// loadHandler provisions a handler from its JSON as Caddy loads a config,
// and returns the load's error; the handler is cleaned up when the test
// ends.
func loadHandler(t *testing.T, config string) (*Handler, error) {
	t.Helper()
	h := new(Handler)
	if err := json.Unmarshal([]byte(config), h); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(func() { _ = h.Cleanup(); cancel() })
	return h, h.Provision(ctx)
}

// deadLetterConfig is a handler's JSON with on_invalid dead_letter into
// stream on url.
func deadLetterConfig(url, stream string) string {
	return fmt.Sprintf(`{"key_prefix":"check:","on_invalid":"dead_letter","dead_letter_stream":%q,"store":{"type":"redis","url":%q,"timeout":1000000000}}`,
		stream, url)
}

// checkStream runs the load's check of stream on the Redis store of url,
// as the handler does beside the load, and returns what it found.
func checkStream(t *testing.T, url, stream string) error {
	t.Helper()
	if _, err := loadHandler(t, deadLetterConfig(url, stream)); err != nil {
		t.Fatalf("dead_letter_stream %s: the load failed: %v; a Redis that answers must not fail it", stream, err)
	}
	return provisionRedisStore(t, url).checkDeadLetterStream(context.Background(), stream)
}

// A dead_letter_stream whose key holds another type than a stream can
// never be written (XADD answers WRONGTYPE): every invalid ping would be
// answered 503 forever and a sender's queue stall behind it, with only the
// store-error log of the first one saying why. The load says so at once,
// naming the key, what it holds, and the fix, without failing (Provision
// does no network I/O that can fail the config); a stream, or no key yet,
// is fine.
func TestADeadLetterStreamOfAnotherTypeIsReportedAtLoad(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	c := srv.Client()
	c.Set(ctx, "dlq:string", "x", 0)
	c.HSet(ctx, "dlq:hash", "f", "v")
	c.RPush(ctx, "dlq:list", "x")
	c.XAdd(ctx, &redis.XAddArgs{Stream: "dlq:stream", Values: []any{"f", "v"}})
	for _, tt := range []struct{ stream, holds string }{
		{"dlq:string", "string"}, {"dlq:hash", "hash"}, {"dlq:list", "list"},
	} {
		err := checkStream(t, srv.URL(), tt.stream)
		if err == nil {
			t.Errorf("dead_letter_stream %s holding a %s: nothing reported", tt.stream, tt.holds)
			continue
		}
		for _, want := range []string{"dead_letter_stream", tt.stream, "holds a " + tt.holds, "DEL " + tt.stream} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("dead_letter_stream %s holding a %s: %q; want it to say %q", tt.stream, tt.holds, err, want)
			}
		}
	}
	for _, stream := range []string{"dlq:stream", "dlq:none"} {
		if err := checkStream(t, srv.URL(), stream); err != nil {
			t.Errorf("dead_letter_stream %s: %v; want nothing reported", stream, err)
		}
	}
}

// A Redis user that may not XADD to the stream (the command taken away, or
// the key outside its key patterns) can never write a dead letter either:
// the load reports it naming the user, the key and the fix. The check
// writes nothing: a user that may XADD (even without TYPE) has nothing
// reported, and neither creates the stream nor adds to one that exists.
func TestAUserThatMayNotXADDToTheStreamIsReportedAtLoad(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	for user, rule := range map[string][]any{
		"noxadd":    {"-xadd"},
		"elsewhere": {"resetkeys", "~other:*"},
		"notype":    {"-type", "-acl"},
	} {
		srv.AddUser(t, user, "pw")
		if err := srv.Client().Do(ctx, append([]any{"ACL", "SETUSER", user}, rule...)...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, user := range []string{"noxadd", "elsewhere"} {
		err := checkStream(t, "redis://"+user+":pw@"+srv.Addr()+"/0", "dlq:acl")
		if err == nil {
			t.Errorf("user %s: nothing reported", user)
			continue
		}
		for _, want := range []string{"dead_letter_stream", `"dlq:acl"`, user, "XADD", "ACL SETUSER " + user + " +xadd ~dlq:acl"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("user %s: %q; want it to say %q", user, err, want)
			}
		}
	}
	srv.Client().XAdd(ctx, &redis.XAddArgs{Stream: "dlq:kept", Values: []any{"f", "v"}})
	for _, stream := range []string{"dlq:acl", "dlq:kept"} {
		if err := checkStream(t, "redis://notype:pw@"+srv.Addr()+"/0", stream); err != nil {
			t.Errorf("a user that may XADD to %s but not run TYPE: %v; want nothing reported", stream, err)
		}
	}
	// A user without SELECT on a db other than 0 is refused the handshake
	// (NOPERM for SELECT), which the store's startup warning names; it is
	// no reason to tell the operator to grant XADD.
	srv.AddUser(t, "noselect", "pw")
	if err := srv.Client().Do(ctx, "ACL", "SETUSER", "noselect", "-select").Err(); err != nil {
		t.Fatal(err)
	}
	if err := checkStream(t, "redis://noselect:pw@"+srv.Addr()+"/1", "dlq:acl"); err != nil {
		t.Errorf("a user without SELECT on db 1: %v; want nothing reported, the handshake's refusal left to the startup warning", err)
	}
	if n := srv.Client().Exists(ctx, "dlq:acl").Val(); n != 0 {
		t.Errorf("the check created the stream it checked")
	}
	if n := srv.Client().XLen(ctx, "dlq:kept").Val(); n != 1 {
		t.Errorf("the check left %d entries in a stream that held 1", n)
	}
}

// What the check finds is logged as an error, with the stream, for the
// operator to see at load rather than at the first invalid ping.
func TestAnUnwritableStreamIsLoggedAsAnError(t *testing.T) {
	srv := redistest.Start(t)
	srv.Client().Set(context.Background(), "dlq:taken", "x", 0)
	core, logs := observer.New(zap.ErrorLevel)
	h := &Handler{logger: zap.New(core)}
	h.reportUnwritableStream(context.Background(), provisionRedisStore(t, srv.URL()), "dlq:taken")
	entries := logs.All()
	if len(entries) != 1 || entries[0].ContextMap()["dead_letter_stream"] != "dlq:taken" ||
		!strings.Contains(fmt.Sprint(entries[0].ContextMap()["error"]), "holds a string") {
		t.Fatalf("logged %v; want one error naming the stream and what its key holds", logs.All())
	}
	h.reportUnwritableStream(context.Background(), provisionRedisStore(t, srv.URL()), "dlq:free")
	if n := logs.Len(); n != 1 {
		t.Errorf("a stream that can be written: %d errors logged, want none more", n-1)
	}
}

// A Redis that does not answer at load (down, or not up yet) does not stop
// the load: an outage at start is on_store_error's, not a config error. The
// stream is not checked, and a warning says so.
func TestADeadLetterStreamRedisDoesNotAnswerForLoadsWithAWarning(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // refused from now on
	if _, err := loadHandler(t, deadLetterConfig("redis://"+addr+"/0", "dlq:down")); err != nil {
		t.Fatalf("Redis down at load: %v; want the config to load", err)
	}

	store := provisionRedisStore(t, "redis://"+addr+"/0")
	core, logs := observer.New(zap.WarnLevel)
	store.logger = zap.New(core)
	if err := store.checkDeadLetterStream(context.Background(), "dlq:down"); err != nil {
		t.Fatalf("check with Redis down: %v; want none", err)
	}
	entries := logs.FilterMessageSnippet("dead_letter_stream").All()
	if len(entries) != 1 || entries[0].ContextMap()["dead_letter_stream"] != "dlq:down" {
		t.Fatalf("warnings %v; want one naming the stream it could not check", logs.All())
	}
}

// At run time, a letter refused because of the config (the stream's key
// made another type, XADD taken from the user after the load) is logged
// as a configuration problem that retries will not fix, with what to
// change: the line said only what Redis said, as for an outage that
// passes.
func TestARefusedDeadLetterIsLoggedAsAConfigProblem(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	srv.AddUser(t, "writer", "pw")
	naive := `{"asset_id":"veh-cfg","occurred_at":"2026-08-08T12:00:00","lat":52.5,"lon":13.4}`
	for _, tt := range []struct {
		name, stream string
		breakIt      []any
		want         []string
	}{
		{"WRONGTYPE", "dlq:typed", []any{"SET", "dlq:typed", "x"}, []string{"dlq:typed", "another type", "DEL dlq:typed", "dead_letter_stream"}},
		{"NOPERM", "dlq:perm", []any{"ACL", "SETUSER", "writer", "-xadd"}, []string{"dlq:perm", "writer", "ACL SETUSER writer", "dead_letter_stream"}},
	} {
		h, err := loadHandler(t, deadLetterConfig("redis://writer:pw@"+srv.Addr()+"/0", tt.stream))
		if err != nil {
			t.Fatal(err)
		}
		h.logger = zap.NewNop()
		core, logs := observer.New(zap.WarnLevel)
		h.letterErrors = newThrottledLog(zap.New(core))
		if err := srv.Client().Do(ctx, tt.breakIt...).Err(); err != nil {
			t.Fatal(err)
		}
		res := (&tableTester{h: h}).post(naive, "application/json", nil)
		if res.status != http.StatusServiceUnavailable {
			t.Fatalf("%s: %d %s; want 503", tt.name, res.status, res.header.Get("X-Dedup"))
		}
		entries := logs.All()
		if len(entries) != 1 {
			t.Fatalf("%s: %d warnings, want 1", tt.name, len(entries))
		}
		fix, _ := entries[0].ContextMap()["fix"].(string)
		for _, want := range append(tt.want, "configuration", "retries will not fix") {
			if !strings.Contains(fix, want) {
				t.Errorf("%s: fix %q; want it to say %q", tt.name, fix, want)
			}
		}
	}
}
