package telemetrydedup

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// readmeSection returns the README's "## title" section, up to the next
// section of that level.
func readmeSection(t *testing.T, title string) string {
	t.Helper()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, found := strings.Cut(string(readme), "\n## "+title+"\n")
	if !found {
		t.Fatalf("README has no section ## %s", title)
	}
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	return section
}

// firstColumn lists the backquoted names of a section's table rows' first
// column ("| `a`, `b` | what |" gives a and b).
func firstColumn(section string) []string {
	var names []string
	for _, row := range regexp.MustCompile(`(?m)^\| ([^|]*) \|`).FindAllStringSubmatch(section, -1) {
		for _, name := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(row[1], -1) {
			names = append(names, name[1])
		}
	}
	return names
}

// The README's "Dependencies, and why each is there" names every direct
// requirement of go.mod, and nothing that is not one (a package counts for
// its module: golang.org/x/crypto/blake2b for golang.org/x/crypto).
func TestREADMEDependenciesAreGoModsDirectRequirements(t *testing.T) {
	gomod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	var direct []string
	for _, m := range regexp.MustCompile(`(?m)^(?:require )?\s*(\S+) v\S+\s*$`).FindAllStringSubmatch(string(gomod), -1) {
		direct = append(direct, m[1]) // a line with "// indirect" does not match
	}
	if len(direct) == 0 {
		t.Fatal("found no direct requirement in go.mod")
	}
	documented := firstColumn(readmeSection(t, "Dependencies, and why each is there"))
	ofModule := func(name, module string) bool { return name == module || strings.HasPrefix(name, module+"/") }
	for _, module := range direct {
		if !slices.ContainsFunc(documented, func(name string) bool { return ofModule(name, module) }) {
			t.Errorf("go.mod requires %s directly, and README's Dependencies does not say why", module)
		}
	}
	for _, name := range documented {
		if !slices.ContainsFunc(direct, func(module string) bool { return ofModule(name, module) }) {
			t.Errorf("README's Dependencies lists %s, which go.mod does not require directly", name)
		}
	}
}

// The README's Layout names every top-level file and folder of the
// repository (and each folder of internal/, tools/ and testdata/), and
// every path it names exists.
func TestREADMELayoutNamesTheTree(t *testing.T) {
	out, err := exec.Command("git", "ls-files").Output()
	if err != nil {
		t.Skipf("not a git checkout (%v): no list of tracked files", err)
	}
	named := firstColumn(readmeSection(t, "Layout"))
	for _, name := range named {
		if _, err := os.Stat(strings.TrimSuffix(name, "/")); err != nil {
			t.Errorf("README's Layout names %s: %v", name, err)
		}
	}
	var want []string
	for _, file := range strings.Fields(string(out)) {
		parts := strings.Split(file, "/")
		entry := parts[0]
		switch {
		case len(parts) == 1 && (strings.HasSuffix(file, "_test.go") || slices.Contains([]string{"README.md", "go.mod", "go.sum", ".gitignore"}, file)):
			continue // the tests sit beside the code they test; the rest is the usual frame
		case len(parts) > 2 && slices.Contains([]string{"internal", "tools", "testdata"}, entry):
			entry = path.Join(parts[0], parts[1])
		}
		if !slices.Contains(want, entry) {
			want = append(want, entry)
		}
	}
	for _, entry := range want {
		if !slices.ContainsFunc(named, func(name string) bool {
			return name == entry || name == entry+"/" || strings.HasPrefix(name, entry+"/")
		}) {
			t.Errorf("README's Layout does not name %s", entry)
		}
	}
}

// What building and profiling write into the checkout is ignored: a built
// Caddy, the tools built with go build, test binaries and profiles.
func TestGitignoreCoversBuildOutputs(t *testing.T) {
	if err := exec.Command("git", "rev-parse", "--git-dir").Run(); err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	outputs := []string{"caddy", "telemetrydedup.test", "cover.out", "cpu.prof", "caddy.pprof"}
	tools, err := os.ReadDir("tools")
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools {
		if tool.IsDir() {
			outputs = append(outputs, tool.Name()) // go build ./tools/<name> writes ./<name>
		}
	}
	for _, output := range outputs {
		if err := exec.Command("git", "check-ignore", "-q", "--no-index", output).Run(); err != nil {
			t.Errorf("%s is not ignored: add /%s to .gitignore", output, output)
		}
	}
}

// The README's row of decisions_total names every reason the metric can
// carry, as the code declares them: dedup's, the rules of ping and the
// handler's own. It left out sent_back, added for the pings of a batch
// sent back whole, which an operator alerting on a reason could not know.
func TestREADMENamesEveryReasonTheDecisionsMetricCarries(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `caddy_telemetry_dedup_decisions_total` \\|.*$").Find(readme)
	if row == nil {
		t.Fatal("README has no row for caddy_telemetry_dedup_decisions_total")
	}
	reasons := declaredReasons(t)
	for _, kind := range []string{"redelivery", "range", "sent_back"} { // one of each declaration
		if !slices.Contains(reasons, kind) {
			t.Fatalf("found the reasons %q in the code, not %s", reasons, kind)
		}
	}
	for _, reason := range reasons {
		if !strings.Contains(string(row), "`"+reason+"`") {
			t.Errorf("README's decisions_total row does not name the reason %s", reason)
		}
	}
}

// declaredReasons are the values of the constants that name a ping's
// reason: dedup's Reasons, ping's Rules and the handler's reason* ones.
func declaredReasons(t *testing.T) []string {
	t.Helper()
	var reasons []string
	for _, file := range []string{"dedup/decision.go", "ping/errors.go", "respond.go"} {
		f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			spec, ok := n.(*ast.ValueSpec)
			if !ok {
				return true
			}
			typ, _ := spec.Type.(*ast.Ident)
			for i, name := range spec.Names {
				named := typ == nil && strings.HasPrefix(name.Name, "reason") || typ != nil && (typ.Name == "Reason" || typ.Name == "Rule")
				if !named || i >= len(spec.Values) {
					continue
				}
				if lit, ok := spec.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					reason, _ := strconv.Unquote(lit.Value)
					reasons = append(reasons, reason)
				}
			}
			return true
		})
	}
	return reasons
}
