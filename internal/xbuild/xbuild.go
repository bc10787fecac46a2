// Package xbuild reads xcaddy.json, the pinned recipe for building Caddy
// with this module, and runs xcaddy with it. The README's build command and
// the integration build test both go through here, so they cannot drift.
package xbuild

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Recipe is the content of xcaddy.json.
type Recipe struct {
	// CaddyVersion is the Caddy release to build, e.g. v2.11.9.
	CaddyVersion string `json:"caddy_version"`
	// XcaddyVersion is the xcaddy release that builds it.
	XcaddyVersion string `json:"xcaddy_version"`
	// Module is this module's path.
	Module string `json:"module"`
	// Env is set for the build. It must hold CGO_ENABLED=1: h3-go is cgo,
	// and xcaddy builds with cgo off unless told otherwise.
	Env map[string]string `json:"env"`
}

// localVersion is the version xcaddy is given for the module. With it, Go
// takes the local replacement without asking the module proxy about a
// module that is not published.
const localVersion = "v0.0.0-00010101000000-000000000000"

// Load reads the recipe in the checkout at dir.
func Load(dir string) (Recipe, error) {
	var r Recipe
	b, err := os.ReadFile(filepath.Join(dir, "xcaddy.json"))
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("xcaddy.json: %v", err)
	}
	if r.CaddyVersion == "" || r.XcaddyVersion == "" || r.Module == "" {
		return r, errors.New("xcaddy.json needs caddy_version, xcaddy_version and module")
	}
	if r.Env["CGO_ENABLED"] != "1" {
		return r, errors.New(`xcaddy.json must set "env": {"CGO_ENABLED": "1"}: the module uses h3-go, which needs cgo`)
	}
	return r, nil
}

// Command returns the xcaddy invocation that builds Caddy with the module
// from the checkout at dir into the binary output. xcaddy itself is run
// through `go run` at the pinned version, so nothing needs to be installed
// beyond Go and a C compiler.
func (r Recipe) Command(ctx context.Context, dir, output string) (*exec.Cmd, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if output, err = filepath.Abs(output); err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, "go", "run", "github.com/caddyserver/xcaddy/cmd/xcaddy@"+r.XcaddyVersion,
		"build", r.CaddyVersion,
		"--with", r.Module+"@"+localVersion+"="+dir,
		"--output", output)
	cmd.Dir = dir
	cmd.Env = os.Environ()
	for k, v := range r.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	return cmd, nil
}
