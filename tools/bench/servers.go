package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/freeport"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/xbuild"
)

// build runs the pinned xcaddy recipe on this checkout.
func build(output string) error {
	recipe, err := xbuild.Load(".")
	if err != nil {
		return fmt.Errorf("%v (run it from the repository root)", err)
	}
	cmd, err := recipe.Command(context.Background(), ".", output)
	if err != nil {
		return err
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("xcaddy build: %v\n%s", err, out)
	}
	return nil
}

// redisServer is the benchmark's throwaway Redis.
type redisServer struct {
	url    string
	client *redis.Client
	pid    int
}

func startRedis(dir string) (*redisServer, func(), error) {
	port := freePort()
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir)
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("starting redis-server (is it installed?): %v", err)
	}
	stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	client := redis.NewClient(&redis.Options{Addr: addr})
	for deadline := time.Now().Add(10 * time.Second); client.Ping(context.Background()).Err() != nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			stop()
			return nil, nil, fmt.Errorf("redis-server on %s did not answer", addr)
		}
	}
	return &redisServer{url: "redis://" + addr + "/0", client: client, pid: cmd.Process.Pid}, stop, nil
}

// startCaddy serves every site, and the upstream, from one Caddy process.
func startCaddy(dir, bin string, sites []*site) (stop func(), adminURL string, pid int, err error) {
	upstream := fmt.Sprintf("127.0.0.1:%d", freePort())
	admin := fmt.Sprintf("127.0.0.1:%d", freePort())
	var b strings.Builder
	fmt.Fprintf(&b, "{\n\tauto_https off\n\tadmin %s\n}\n\nhttp://%s {\n\trespond 201\n}\n", admin, upstream)
	for _, s := range sites {
		s.port = freePort()
		config := s.config
		if strings.Contains(config, "%s") {
			config = fmt.Sprintf(config, upstream)
		}
		fmt.Fprintf(&b, "\nhttp://127.0.0.1:%d {\n\t%s\n}\n", s.port, config)
	}
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return nil, "", 0, err
	}
	cmd := exec.Command(bin, "run", "--config", path)
	cmd.Env = append(os.Environ(), "HOME="+dir)
	logFile, err := os.Create(filepath.Join(dir, "caddy.log"))
	if err != nil {
		return nil, "", 0, err
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, "", 0, err
	}
	stop = func() { _ = cmd.Process.Signal(os.Interrupt); _ = cmd.Wait() }
	for _, s := range sites {
		addr := fmt.Sprintf("127.0.0.1:%d", s.port)
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if c, err := net.Dial("tcp", addr); err == nil {
				c.Close()
				break
			}
			if time.Now().After(deadline) {
				stop()
				log, _ := os.ReadFile(logFile.Name())
				return nil, "", 0, fmt.Errorf("caddy did not listen on %s:\n%s", addr, log)
			}
		}
	}
	return stop, "http://" + admin, cmd.Process.Pid, nil
}

func freePort() int {
	port, err := freeport.Pick()
	if err != nil {
		panic(err)
	}
	return port
}
