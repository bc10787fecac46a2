// Command xbuild builds Caddy with telemetry_dedup from this checkout, as
// pinned in xcaddy.json, and optionally runs it:
//
//	go run ./tools/xbuild                                   # builds ./caddy
//	go run ./tools/xbuild run --config Caddyfile.example    # builds, then ./caddy run ...
//	go run ./tools/xbuild -o /usr/local/bin/caddy           # builds elsewhere
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/xbuild"
)

func main() {
	output := flag.String("o", "caddy", "where to write the Caddy binary")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: go run ./tools/xbuild [-o caddy] [caddy arguments...]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if err := run(*output, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "xbuild:", err)
		os.Exit(1)
	}
}

func run(output string, caddyArgs []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	recipe, err := xbuild.Load(".")
	if err != nil {
		return fmt.Errorf("%v (run it from the repository root)", err)
	}
	build, err := recipe.Command(ctx, ".", output)
	if err != nil {
		return err
	}
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	fmt.Fprintf(os.Stderr, "xbuild: building Caddy %s with %s (CGO_ENABLED=1) into %s\n", recipe.CaddyVersion, recipe.Module, output)
	if err := build.Run(); err != nil {
		return fmt.Errorf("xcaddy build failed: %v (cgo needs a C compiler such as gcc)", err)
	}
	if len(caddyArgs) == 0 {
		return nil
	}
	binary, err := filepath.Abs(output) // a bare "caddy" would be looked up on PATH
	if err != nil {
		return err
	}
	stop()
	return runCaddy(binary, caddyArgs)
}

// runCaddy runs the built Caddy until it exits. Ctrl-C reaches Caddy from
// the terminal, with the rest of its process group: passed on a second
// time, it was Caddy's "force quit", which skips the graceful shutdown (and
// the module's releases at exit). Only a SIGTERM sent to this command is
// passed on.
func runCaddy(binary string, args []string) error {
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(signals)
	caddy := exec.Command(binary, args...)
	caddy.Stdin, caddy.Stdout, caddy.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := caddy.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- caddy.Wait() }()
	for {
		select {
		case err := <-exited:
			return err
		case s := <-signals:
			if s == syscall.SIGTERM {
				_ = caddy.Process.Signal(s) // Caddy shuts down gracefully on it too
			}
		}
	}
}
