package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/freeport"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/xbuild"
)

// The README's build, exactly: xcaddy with the pinned recipe in xcaddy.json,
// then Caddyfile.example served by the binary it built, answering the
// README's pings as the README says.
func TestXcaddyBuildServesTheExample(t *testing.T) {
	caddy := buildCaddy(t)

	out, err := exec.Command(caddy, "list-modules").CombinedOutput()
	if err != nil {
		t.Fatalf("caddy list-modules: %v\n%s", err, out)
	}
	for _, id := range []string{"http.handlers.telemetry_dedup", "http.handlers.telemetry_dedup.stores.memory", "http.handlers.telemetry_dedup.stores.redis"} {
		if !strings.Contains(string(out), id+"\n") {
			t.Errorf("the built binary lacks %s", id)
		}
	}

	// The CLI subcommand ships in the same binary.
	out, err = exec.Command(caddy, "telemetry-dedup", "key",
		`{"asset_id":"veh-88","occurred_at":"2026-08-08T12:00:00Z","lat":52.5200087,"lon":13.4049547}`).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "dedup:93978d4cc1c8ffa35f6c00a4a1fc01dd") {
		t.Errorf("caddy telemetry-dedup key: %v\n%s", err, out)
	}

	site := serveExample(t, caddy)
	at := time.Now().UTC().Add(-2 * time.Minute).Format(time.RFC3339)
	body := `{"asset_id":"veh-88","occurred_at":"` + at + `","lat":52.5200087,"lon":13.4049547}`
	for _, want := range []struct {
		status   int
		decision string
		body     string
	}{
		{http.StatusCreated, "accepted", `{"stored":true}`},
		{http.StatusOK, "suppressed", ""},
	} {
		res, err := http.Post(site, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != want.status || res.Header.Get("X-Dedup") != want.decision || string(b) != want.body {
			t.Fatalf("got %d X-Dedup=%q %q, want %d %q %q", res.StatusCode, res.Header.Get("X-Dedup"), b, want.status, want.decision, want.body)
		}
	}
}

// The README's "Two commands" transcript, ping by ping: Caddyfile.example
// (in process, on free ports, its own key prefix) answers each curl of the
// README with the status, X-Dedup, X-Dedup-Reason and body the README shows
// beneath it ("..." elides the middle of a body).
func TestTheREADMEsPingsThroughTheExample(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)```sh\n(NOW=.*?)```").FindSubmatch(readme)
	if block == nil {
		t.Fatal("no README sh block starting with NOW=; update this test")
	}
	src, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	globals := regexp.MustCompile(`(?s)\n\{\n.*?\n\}\n`)
	if !globals.Match(src) || !bytes.Contains(src, []byte("key_prefix dedup:")) {
		t.Fatal("the example no longer has a global options block and key_prefix dedup:; update this test")
	}
	config := globals.ReplaceAllLiteralString(string(src), "\n"+caddytestGlobals)
	config = strings.NewReplacer("8080", httpPort, "8081", strconv.Itoa(freePort(t)),
		"key_prefix dedup:", "key_prefix "+strconv.Quote("test:"+t.Name()+":")).Replace(config)
	caddyTester(t, config)
	client := caddytestClient()

	now := time.Now().UTC().Add(-time.Minute).Format(time.RFC3339)
	curl := regexp.MustCompile(`^curl -si localhost:8080(/\S+) -d '(.*)'$`)
	shown := regexp.MustCompile(`^# HTTP/1\.1 (\d{3}) .*?X-Dedup: (\S+)(?:\s+X-Dedup-Reason: (\S+))?\s*(\{.*?\})?\s*(?:<-.*)?$`)
	lines := strings.Split(string(block[1]), "\n")
	pings := 0
	for i := 0; i < len(lines); i++ {
		m := curl.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		pings++
		if i+1 >= len(lines) {
			t.Fatalf("README: %s shows no answer", lines[i])
		}
		want := shown.FindStringSubmatch(lines[i+1])
		if want == nil {
			t.Fatalf("README: the answer to %s is not in the form this test reads: %s", lines[i], lines[i+1])
		}
		wantBody := want[4]
		if i+2 < len(lines) && strings.HasPrefix(lines[i+2], "# {") {
			wantBody = strings.TrimPrefix(lines[i+2], "# ")
		}
		body := strings.ReplaceAll(m[2], "'$NOW'", now)
		req, _ := http.NewRequest(http.MethodPost, "http://"+siteAddr+m[1], strings.NewReader(body))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded") // what curl -d sends
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(res.Body)
		res.Body.Close()
		got := strings.TrimSuffix(string(raw), "\n") // as curl shows it
		bodyOK := true
		if head, tail, elided := strings.Cut(wantBody, "..."); elided {
			bodyOK = strings.HasPrefix(got, head) && strings.HasSuffix(got, tail) && len(got) >= len(head)+len(tail)
		} else if wantBody != "" {
			bodyOK = got == wantBody
		}
		if strconv.Itoa(res.StatusCode) != want[1] || res.Header.Get("X-Dedup") != want[2] || res.Header.Get("X-Dedup-Reason") != want[3] || !bodyOK {
			t.Errorf("%s\ngot  %d X-Dedup=%q X-Dedup-Reason=%q %s\nREADME %s", body, res.StatusCode, res.Header.Get("X-Dedup"), res.Header.Get("X-Dedup-Reason"), got, lines[i+1])
		}
	}
	if pings != 5 {
		t.Errorf("read %d of the README's pings, want its 5; update this test", pings)
	}
}

// The example's backend sees the key header on pings only: a request the
// handler never saw (another path) has no outcome to fill it with, and
// header_up would send the placeholder's own name.
func TestTheExampleSendsTheKeyHeaderWithPingsOnly(t *testing.T) {
	caddy := buildCaddy(t)
	src, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	const demo = "respond `{\"stored\":true}` 201"
	if !bytes.Contains(src, []byte(demo)) {
		t.Fatalf("the example's demo backend is no longer %s; update this test", demo)
	}
	echo := strings.Replace(string(src), demo, "respond `{http.request.header.X-Dedup-Key}` 201", 1)
	front, back := freePort(t), freePort(t)
	site := "http://" + runCaddy(t, caddy, strings.NewReplacer("8080", strconv.Itoa(front), "8081", strconv.Itoa(back)).Replace(echo), front).listen
	at := time.Now().UTC().Add(-2 * time.Minute).Format(time.RFC3339)
	for _, req := range []struct {
		path, body, want string
	}{
		{"/telemetry", `{"asset_id":"veh-88","occurred_at":"` + at + `","lat":52.5200087,"lon":13.4049547}`, "dedup:"},
		{"/status", `{}`, ""},
	} {
		res, err := http.Post(site+req.path, "application/json", strings.NewReader(req.body))
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if !strings.HasPrefix(string(got), req.want) || (req.want == "" && len(got) > 0) {
			t.Errorf("%s: the backend got X-Dedup-Key %q; want %q", req.path, got, req.want+"...")
		}
	}
}

// built is the Caddy binary of this test run, built once for every test
// that needs a separate process.
var built struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// buildCaddy builds Caddy with the module from this checkout, through the
// same recipe and code as `go run ./tools/xbuild`, once per test binary.
func buildCaddy(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds Caddy with xcaddy (minutes); skipped with -short")
	}
	built.once.Do(func() {
		recipe, err := xbuild.Load("..")
		if err != nil {
			built.err = err
			return
		}
		if built.dir, err = os.MkdirTemp("", "telemetry-dedup-caddy-"); err != nil {
			built.err = err
			return
		}
		built.path = filepath.Join(built.dir, "caddy")
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		cmd, err := recipe.Command(ctx, "..", built.path)
		if err != nil {
			built.err = err
			return
		}
		var log bytes.Buffer
		cmd.Stdout, cmd.Stderr = &log, &log
		start := time.Now()
		if err := cmd.Run(); err != nil {
			built.err = fmt.Errorf("xcaddy build: %v\n%s", err, log.String())
			return
		}
		fmt.Fprintf(os.Stderr, "xcaddy built Caddy %s in %s\n", recipe.CaddyVersion, time.Since(start).Round(time.Second))
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.path
}

// serveExample runs the built Caddy on Caddyfile.example, moved to free
// ports so the test does not collide with anything on 8080, 8081 or 2019,
// and returns the ping URL.
func serveExample(t *testing.T, caddy string) string {
	t.Helper()
	src, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	front, back := freePort(t), freePort(t)
	config := strings.NewReplacer("8080", strconv.Itoa(front), "8081", strconv.Itoa(back)).Replace(string(src))
	return "http://" + runCaddy(t, caddy, config, front).listen + "/telemetry"
}

// caddyProcess is a Caddy binary running a Caddyfile.
type caddyProcess struct {
	listen string // host:port of the site
	admin  string // host:port of the admin API
	// stop stops Caddy as Ctrl-C or a service manager does (SIGINT, a
	// graceful stop) and waits for it to exit.
	stop func()
}

// runCaddy starts the built Caddy on a Caddyfile whose site listens on
// port, and stops it when the test ends. Its admin API gets a free port.
func runCaddy(t *testing.T, caddy, caddyfile string, port int) caddyProcess {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(caddyfile), 0o600); err != nil {
		t.Fatal(err)
	}
	p := caddyProcess{listen: fmt.Sprintf("127.0.0.1:%d", port), admin: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	cmd := exec.Command(caddy, "run", "--config", path)
	cmd.Env = append(os.Environ(), "CADDY_ADMIN="+p.admin, "HOME="+dir)
	logFile, err := os.Create(filepath.Join(dir, "caddy.log"))
	if err != nil {
		t.Fatal(err)
	}
	output := func() string { b, _ := os.ReadFile(logFile.Name()); return string(b) }
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var stopOnce sync.Once
	p.stop = func() {
		stopOnce.Do(func() {
			_ = cmd.Process.Signal(os.Interrupt)
			_ = cmd.Wait()
		})
	}
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("caddy output:\n%s", output())
		}
	})
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if c, err := net.Dial("tcp", p.listen); err == nil {
			c.Close()
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("caddy did not listen on %s:\n%s", p.listen, output())
		}
	}
}

func freePort(t *testing.T) int {
	port, err := freeport.Pick()
	if err != nil {
		t.Fatal(err)
	}
	return port
}
