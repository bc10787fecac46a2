package telemetrydedup

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// The README's ACL rule for the store's Redis user (Stores) is all the
// store needs: a user with exactly that rule, and nothing more, runs each
// shape's claim, settlement and release, and a dead letter, through the
// handler, on one Redis, with Sentinel and on a Cluster; and Redis logs
// no command or key it refused the user (ACL LOG), not even one the
// module copes without. The rule is read from the README, so the README
// cannot give operators one that does not work.
func TestTheREADMEsACLRuleIsAllTheStoreNeeds(t *testing.T) {
	rules := readmeACLRules(t)
	const password = "acl-test-password"
	// grant gives the README's user, on every server, the rules for a
	// topology ("" for one server, or "Sentinel" or "Cluster"), with
	// this test's key prefix, and returns the user's name.
	grant := func(t *testing.T, topology string, servers []*redistest.Server) string {
		t.Helper()
		var user string
		for _, s := range servers {
			client := s.Client()
			for _, rule := range rules {
				if rule.only != "" && (topology == "" || !strings.Contains(rule.only, topology)) {
					continue
				}
				args := []any{"ACL", "SETUSER"}
				for _, word := range rule.words {
					word = strings.ReplaceAll(word, "{password}", password)
					args = append(args, strings.Replace(word, "~dedup:*", "~acl:*", 1))
				}
				if err := client.Do(context.Background(), args...).Err(); err != nil {
					t.Fatalf("README's %q on %s: %v", strings.Join(rule.words, " "), s.Addr(), err)
				}
				user = rule.words[0]
			}
			if err := client.ACLLogReset(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
		}
		return user
	}

	t.Run("one server", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t)
		user := grant(t, "", []*redistest.Server{srv})
		store := fmt.Sprintf(`{"type":"redis","url":%q,"username":%q,"password":%q,"timeout":1000000000}`, srv.URL(), user, password)
		runEveryShapeAs(t, store, srv.Client())
		noRefusals(t, user, srv)
	})
	t.Run("Sentinel", func(t *testing.T) {
		t.Parallel()
		st := redistest.StartSentinel(t)
		data := []*redistest.Server{st.Master(), st.Replica()} // ACLs are not replicated
		user := grant(t, "Sentinel", data)
		store := fmt.Sprintf(`{"type":"redis","addresses":[%q,%q,%q],"master":%q,"username":%q,"password":%q,"timeout":1000000000}`,
			st.Addrs()[0], st.Addrs()[1], st.Addrs()[2], st.MasterName, user, password)
		runEveryShapeAs(t, store, st.Master().Client())
		noRefusals(t, user, data...)
	})
	t.Run("Cluster", func(t *testing.T) {
		t.Parallel()
		c := redistest.StartCluster(t, 3)
		user := grant(t, "Cluster", c.Nodes())
		a := c.Addrs()
		store := fmt.Sprintf(`{"type":"redis","addresses":[%q,%q,%q],"username":%q,"password":%q,"timeout":1000000000}`,
			a[0], a[1], a[2], user, password)
		runEveryShapeAs(t, store, c.Client())
		noRefusals(t, user, c.Nodes()...)
	})
}

// aclRule is one ACL SETUSER line of the README's rule: its arguments,
// the user's name first, and the topologies it is for, from the comment
// above it ("" for every one).
type aclRule struct {
	words []string
	only  string
}

// readmeACLRules are the ACL SETUSER lines of the README's fenced block
// that gives them.
func readmeACLRules(t *testing.T) []aclRule {
	t.Helper()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "```text\nACL SETUSER ")
	if !ok {
		t.Fatal("README.md has no ```text block starting with ACL SETUSER")
	}
	block, _, _ = strings.Cut("ACL SETUSER "+block, "```")
	var rules []aclRule
	only := ""
	for _, line := range strings.Split(strings.TrimSpace(block), "\n") {
		if comment, ok := strings.CutPrefix(line, "#"); ok {
			only = comment
			continue
		}
		words := strings.Fields(line)
		if len(words) < 3 || words[0] != "ACL" || words[1] != "SETUSER" {
			t.Fatalf("README's ACL block has %q, not an ACL SETUSER line", line)
		}
		rules = append(rules, aclRule{words: words[2:], only: only})
	}
	if !strings.Contains(strings.Join(rules[0].words, " "), " resetkeys ~dedup:* -@all ") {
		t.Fatalf("README's first ACL line %q does not confine the user to the default key_prefix's keys and no other command", rules[0].words)
	}
	return rules
}

// runEveryShapeAs runs, through a handler with the store, in each shape:
// a new ping (accepted), its redelivery (suppressed: its settlement ran,
// else it would be in flight), a ping whose upstream fails and its retry
// (accepted: the release ran), and an invalid ping, dead-lettered into
// the stream, which check reads. In tumbling, a redelivery of a claim
// left in flight past in_flight_timeout too (suppressed: the store read
// the key's TTL to date the claim, else it would be in flight).
func runEveryShapeAs(t *testing.T, store string, check redis.Cmdable) {
	t.Helper()
	const inFlightTimeout = 2500 * time.Millisecond // the least a store timeout of 1s allows, and a margin
	at := time.Now().UTC().Add(-time.Hour).Truncate(time.Minute).Format(time.RFC3339)
	ping := func(asset string, lat float64) string {
		return fmt.Sprintf(`{"asset_id":%q,"occurred_at":%q,"lat":%v,"lon":13.4}`, asset, at, lat)
	}
	for _, shape := range []string{"tumbling", "sliding", "session"} {
		prefix := "acl:" + shape + ":"
		tt := tableHandler(t, fmt.Sprintf(`{"key_prefix":%q,"shape":%q,"near_cache":0,"in_flight_timeout":%d,"on_invalid":"dead_letter","store":%s}`,
			prefix, shape, inFlightTimeout.Nanoseconds(), store))
		if shape == "tumbling" {
			stale := ping("veh-stale", 50.1)
			tt.claimInFlight(t, stale)
			// Dated by its landing, which may come up to the store's timeout
			// (1s) after the claim on a loaded machine.
			time.Sleep(inFlightTimeout + time.Second)
			if res := tt.post(stale, "application/json", nil); res.status != http.StatusOK || res.header.Get("X-Dedup") != "suppressed" {
				t.Errorf("%s, a redelivery of a claim in flight for longer than in_flight_timeout: %d %s %q; want 200 suppressed",
					shape, res.status, res.header.Get("X-Dedup"), res.body)
			}
		}
		upstreamDown := true
		tt.upstreamStatus = func(body []byte) int {
			if upstreamDown && bytes.Contains(body, []byte("veh-fail")) {
				return http.StatusInternalServerError
			}
			return http.StatusCreated
		}
		for _, step := range []struct {
			name, ping string
			status     int
			decision   string
		}{
			{"a new ping", ping("veh-new", 52.5), http.StatusCreated, "accepted"},
			{"its redelivery", ping("veh-new", 52.5), http.StatusOK, "suppressed"},
			{"a ping whose upstream fails", ping("veh-fail", 48.1), http.StatusInternalServerError, "accepted"},
			{"its retry", ping("veh-fail", 48.1), http.StatusCreated, "accepted"},
			{"an invalid ping", ping("veh-new", 91), http.StatusAccepted, "dead_lettered"},
		} {
			if step.name == "its retry" {
				upstreamDown = false
			}
			res := tt.post(step.ping, "application/json", nil)
			if res.status != step.status || res.header.Get("X-Dedup") != step.decision {
				t.Errorf("%s, %s: %d %s %q; want %d %s", shape, step.name, res.status, res.header.Get("X-Dedup"), res.body, step.status, step.decision)
			}
		}
		if n, err := check.XLen(context.Background(), prefix+"dead_letter").Result(); n != 1 {
			t.Errorf("%s: the dead-letter stream holds %d letters (%v), want 1", shape, n, err)
		}
	}
}

// noRefusals fails t if a server logged a command or key it refused user.
func noRefusals(t *testing.T, user string, servers ...*redistest.Server) {
	t.Helper()
	for _, s := range servers {
		entries, err := s.Client().ACLLog(context.Background(), 100).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.Username == user {
				t.Errorf("%s refused %s a %s: %s (%d times, context %s)", s.Addr(), user, e.Reason, e.Object, e.Count, e.Context)
			}
		}
	}
}
