package testenv

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestFreePort: the ports handed out are free, not handed out twice, and never from the
// range the kernel picks from for outgoing connections and for a listener on port 0,
// where any connection could take one before its process binds it.
func TestFreePort(t *testing.T) {
	first := ephemeralPortsFrom()
	seen := map[int]bool{}
	for range 200 {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if port >= first {
			t.Fatalf("FreePort() = %d, in the kernel's range of ports for outgoing connections (from %d)", port, first)
		}
		if port >= 30000 && port <= 32767 {
			t.Fatalf("FreePort() = %d, a NodePort", port)
		}
		if seen[port] {
			t.Fatalf("FreePort() handed out %d twice", port)
		}
		seen[port] = true
	}
}

// TestFreePortAcrossProcesses: a port one process handed out is not handed out by
// another (go test runs a process per package, each starting its own servers). The
// range is cut to two ports; this process takes one, and a second process of the test
// binary, asked for two, gets the other and then none.
func TestFreePortAcrossProcesses(t *testing.T) {
	if os.Getenv("TESTENV_FREEPORT_CHILD") != "" {
		portsFrom, portsTo = parsePorts(os.Getenv("TESTENV_FREEPORT_CHILD"))
		for range 2 {
			port, err := FreePort()
			fmt.Printf("port %d %v\n", port, err)
		}
		return
	}
	first := ephemeralPortsFrom()
	low := 20000 + rand.IntN(min(first, 30000)-20000-1) // #nosec G404 -- a port, not a secret
	portsFrom, portsTo = low, low+1
	t.Cleanup(func() { portsFrom, portsTo = 20000, 29999 })
	mine, err := FreePort()
	if err != nil {
		t.Fatalf("ports %d and %d: %v", low, low+1, err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestFreePortAcrossProcesses$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("TESTENV_FREEPORT_CHILD=%d-%d", low, low+1))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the second process: %v\n%s", err, out)
	}
	other := 2*low + 1 - mine
	want := fmt.Sprintf("port %d <nil>\nport 0 no free port of 127.0.0.1 from %d to %d\n", other, low, low+1)
	if got, _, _ := strings.Cut(string(out), "PASS"); got != want {
		t.Errorf("this process took %d; the second one printed:\n%s\nwant:\n%s", mine, got, want)
	}
}

func parsePorts(s string) (int, int) {
	from, to, _ := strings.Cut(s, "-")
	a, _ := strconv.Atoi(from)
	b, _ := strconv.Atoi(to)
	return a, b
}

// TestRootAbove: a -trimpath test binary finds the repository from its package's folder,
// past the go.mod of a module of its own (hack/tools has such modules), and says so
// when there is none.
func TestRootAbove(t *testing.T) {
	root := t.TempDir()
	write := func(dir, module string) {
		t.Helper()
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("// a comment\nmodule \""+module+"\" // quoted\n\ngo 1.26.0\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(root, modulePath)
	tool := filepath.Join(root, "hack", "tools", "image")
	write(tool, modulePath+"/hack/tools/image")
	pkg := filepath.Join(tool, "internal")
	if err := os.MkdirAll(pkg, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{root, tool, pkg} {
		if got, err := rootAbove(dir); err != nil || got != root {
			t.Errorf("rootAbove(%s) = %q, %v; want %q", dir, got, err, root)
		}
	}
	if got, err := rootAbove(t.TempDir()); err == nil {
		t.Errorf("rootAbove of a folder outside the repository = %q, want an error", got)
	}
}
