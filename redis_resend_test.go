package telemetrydedup

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// go-redis sends a pipeline again, on a new connection, when its replies
// come later than read_timeout (set below the store's timeout): the first
// attempt ran in Redis, and every command of the batch runs twice. Each
// step below holds the reply to one kind of command past read_timeout, on
// a real Redis (no near cache: every answer is Redis's), and checks what
// the sender is answered then and on its retry or redelivery: claims,
// settlements and releases go by token, and their second run changes no
// decision, loses no ping and undoes nothing, not even an acceptance
// another instance made between the two runs. What it does change is as
// the README says: a sliding or session suppression's second run finds
// the ping's own entry and says redelivery, and a dead letter is written
// twice.
func TestABatchRunTwiceAfterALateReplyChangesNoAnswer(t *testing.T) {
	rdb := redistest.Start(t)
	const readTimeout, late = 300 * time.Millisecond, time.Second
	at := time.Now().UTC().Add(-time.Hour).Truncate(time.Minute)
	for _, shape := range []string{"tumbling", "sliding", "session"} {
		t.Run(shape, func(t *testing.T) {
			relay, hold, held := startReplyHolder(t, rdb.Addr(), late)
			prefix := "resend-" + shape + ":"
			tt := tableHandler(t, fmt.Sprintf(`{"key_prefix":%q,"shape":%q,"near_cache":0,"on_invalid":"dead_letter","store":{"type":"redis","url":"redis://%s","timeout":%d,"read_timeout":%d}}`,
				prefix, shape, relay, (5*time.Second).Nanoseconds(), readTimeout.Nanoseconds()))
			failing := ""
			tt.upstreamStatus = func(body []byte) int {
				if failing != "" && strings.Contains(string(body), failing) {
					return http.StatusInternalServerError
				}
				return http.StatusCreated
			}
			body := func(asset string, sec int, lat float64) string {
				return fmt.Sprintf(`{"asset_id":%q,"occurred_at":%q,"lat":%v,"lon":13.4}`, asset, at.Add(time.Duration(sec)*time.Second).Format(time.RFC3339), lat)
			}
			answer := func(step, ping, wantDecision, wantReason string, wantStatus int) {
				t.Helper()
				res := tt.post(ping, "application/json", nil)
				if res.status != wantStatus || res.header.Get("X-Dedup") != wantDecision || res.header.Get("X-Dedup-Reason") != wantReason {
					t.Errorf("%s: %d %s %q, want %d %s %q", step, res.status, res.header.Get("X-Dedup"), res.header.Get("X-Dedup-Reason"), wantStatus, wantDecision, wantReason)
				}
			}
			lateReply := func(step, command string, send func(before int32)) {
				t.Helper()
				before := held.Load()
				hold(command)
				send(before)
				if held.Load() != before+1 {
					t.Fatalf("%s: the relay held no reply to %q: nothing was tested", step, command)
				}
			}
			claim, settle, release := commandsOf(t, shape)

			answer("warm-up", body("warm", 0, 52.5), "accepted", "", http.StatusCreated) // connected, scripts loaded

			newPing := body("veh-claim", 0, 52.5)
			lateReply("claim", claim, func(int32) {
				answer("a new ping whose claim's reply came late", newPing, "accepted", "", http.StatusCreated)
			})
			answer("its redelivery", newPing, "suppressed", "redelivery", http.StatusOK)

			settled := body("veh-settle", 0, 52.5)
			lateReply("settlement", settle, func(int32) {
				answer("a new ping", settled, "accepted", "", http.StatusCreated)
				time.Sleep(late + readTimeout) // the settlement goes after the answer
			})
			answer("its redelivery, the settlement's reply late", settled, "suppressed", "redelivery", http.StatusOK)

			failed := body("veh-release", 0, 52.5)
			failing = "veh-release"
			lateReply("release", release, func(int32) {
				answer("a new ping whose upstream fails, the release's reply late", failed, "accepted", "", http.StatusInternalServerError)
			})
			failing = ""
			answer("its retry", failed, "accepted", "", http.StatusCreated)
			answer("the retry's redelivery", failed, "suppressed", "redelivery", http.StatusOK)

			// Another instance takes the retry between the release's two
			// runs: the second must leave that acceptance be.
			other := tableHandler(t, fmt.Sprintf(`{"key_prefix":%q,"shape":%q,"near_cache":0,"store":{"type":"redis","url":%q}}`, prefix, shape, rdb.URL()))
			overtaken := body("veh-overtaken", 0, 52.5)
			failing = "veh-overtaken"
			lateReply("release overtaken", release, func(before int32) {
				done := make(chan struct{})
				go func() {
					defer close(done)
					answer("a new ping whose upstream fails, the release's reply late", overtaken, "accepted", "", http.StatusInternalServerError)
				}()
				for until := time.Now().Add(5 * time.Second); held.Load() == before && time.Now().Before(until); { // the first run is in, its reply held
					time.Sleep(time.Millisecond)
				}
				if res := other.post(overtaken, "application/json", nil); res.status != http.StatusCreated {
					t.Errorf("its retry on another instance, before the release ran again: %d %s, want 201 accepted", res.status, res.header.Get("X-Dedup"))
				}
				<-done
			})
			failing = ""
			if res := other.post(overtaken, "application/json", nil); res.status != http.StatusOK || res.header.Get("X-Dedup") != "suppressed" {
				t.Errorf("the other instance's redelivery of the retry it took: %d %s, want 200 suppressed", res.status, res.header.Get("X-Dedup"))
			}

			answer("a parked asset's ping", body("veh-jitter", 0, 52.5), "accepted", "", http.StatusCreated)
			jitter := body("veh-jitter", 1, 52.50001) // a metre away, a second later
			reason := "jitter"
			if shape != "tumbling" { // the run again finds the entry the first wrote
				reason = "redelivery"
			}
			lateReply("suppression", claim, func(int32) { answer("its jitter, the reply late", jitter, "suppressed", reason, http.StatusOK) })

			for asset, want := range map[string]int{"veh-claim": 1, "veh-settle": 1, "veh-release": 2, "veh-overtaken": 2, "veh-jitter": 1} {
				n := 0
				for _, b := range append(tt.upstream, other.upstream...) {
					if strings.Contains(string(b), `"`+asset+`"`) {
						n++
					}
				}
				if n != want {
					t.Errorf("%s reached the upstream %d times, want %d", asset, n, want)
				}
			}

			stream := prefix + "dead_letter"
			lateReply("dead letter", "XADD", func(int32) {
				answer("an invalid ping, the dead letter's reply late", body("veh-invalid", 0, 91), "dead_lettered", "range", http.StatusAccepted)
			})
			if n := rdb.Client().XLen(context.Background(), stream).Val(); n < 2 {
				t.Errorf("the stream holds %d letters of one invalid ping; want it twice, the XADD sent again", n)
			}
		})
	}
}

// commandsOf returns what marks, in what the store sends, a shape's claim,
// settlement and release: the scripts' hashes, or the tumbling commands'
// flags.
func commandsOf(t *testing.T, shape string) (claim, settle, release string) {
	if shape == "tumbling" {
		return "\r\nNX\r\n", "\r\nXX\r\n", scriptHash(t, "claim_release")
	}
	return scriptHash(t, "track_decide"), scriptHash(t, "track_settle"), scriptHash(t, "track_release")
}

func scriptHash(t *testing.T, name string) string {
	src, err := os.ReadFile("dedup/lua/" + name + ".lua")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha1.Sum(src)
	return strings.ToUpper(hex.EncodeToString(sum[:]))
}

// startReplyHolder relays to a Redis. Once hold names a command (text
// the client sends, matched without regard to case), the reply that
// follows it on its connection is held for late, as a Redis answering
// after read_timeout would; held counts the replies held.
func startReplyHolder(t *testing.T, to string, late time.Duration) (addr string, hold func(command string), held *atomic.Int32) {
	var armed atomic.Pointer[string]
	held = new(atomic.Int32)
	addr = redistest.StartRelay(t, to, func(client, server net.Conn) (up, down func()) {
		var holdNext atomic.Bool
		up = func() {
			defer server.Close()
			copyChunks(client, server, func(chunk []byte) {
				if c := armed.Load(); c != nil && strings.Contains(strings.ToUpper(string(chunk)), *c) && armed.CompareAndSwap(c, nil) {
					holdNext.Store(true)
				}
			})
		}
		down = func() {
			defer client.Close()
			copyChunks(server, client, func([]byte) {
				if holdNext.CompareAndSwap(true, false) {
					held.Add(1)
					time.Sleep(late)
				}
			})
		}
		return up, down
	})
	return addr, func(command string) { c := strings.ToUpper(command); armed.Store(&c) }, held
}
