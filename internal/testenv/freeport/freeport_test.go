package freeport

import (
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestGet: the ports handed out are free, not handed out twice, and never from the
// range the kernel picks from for outgoing connections and for a listener on port 0,
// where any connection could take one before its process binds it.
func TestGet(t *testing.T) {
	first := ephemeralPortsFrom()
	seen := map[int]bool{}
	for range 200 {
		port, err := Get()
		if err != nil {
			t.Fatal(err)
		}
		if port >= first {
			t.Fatalf("Get() = %d, in the kernel's range of ports for outgoing connections (from %d)", port, first)
		}
		if port >= 30000 && port <= 32767 {
			t.Fatalf("Get() = %d, a NodePort", port)
		}
		if seen[port] {
			t.Fatalf("Get() handed out %d twice", port)
		}
		seen[port] = true
	}
}

// TestGetAcrossProcesses: a port one process handed out is not handed out by
// another (go test runs a process per package, each starting its own servers). The
// range is cut to two ports; this process takes one, and a second process of the test
// binary, asked for two, gets the other and then none.
func TestGetAcrossProcesses(t *testing.T) {
	if os.Getenv("FREEPORT_CHILD") != "" {
		portsFrom, portsTo = parsePorts(os.Getenv("FREEPORT_CHILD"))
		for range 2 {
			port, err := Get()
			fmt.Printf("port %d %v\n", port, err)
		}
		return
	}
	low := unheldPair(t)
	portsFrom, portsTo = low, low+1
	t.Cleanup(func() { portsFrom, portsTo = 20000, 29999 })
	mine, err := Get()
	if err != nil {
		t.Fatalf("ports %d and %d: %v", low, low+1, err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestGetAcrossProcesses$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("FREEPORT_CHILD=%d-%d", low, low+1))
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

// unheldPair picks two neighbouring ports that no process holds: this one has not
// handed them out (TestGet hands out 200) and no other holds their locks (the other
// packages of a test run). Either held, and the two processes could not share them.
func unheldPair(t *testing.T) int {
	first := ephemeralPortsFrom()
	for range 1000 {
		low := 20000 + rand.IntN(min(first, 30000)-20000-1) // #nosec G404 -- a port, not a secret
		if unheld(t, low) && unheld(t, low+1) {
			return low
		}
	}
	t.Fatal("no two neighbouring ports that no process holds")
	return 0
}

// unheld says whether no process holds port: this one has not handed it out, and
// portLocks' byte for it could be locked (F_GETLK).
func unheld(t *testing.T, port int) bool {
	handedOutMu.Lock()
	mine := handedOut[port]
	handedOutMu.Unlock()
	if mine {
		return false
	}
	f := lockFile()
	if f == nil {
		t.Fatal("the ports' lock file cannot be opened")
	}
	lock := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: io.SeekStart, Start: int64(port), Len: 1}
	if err := syscall.FcntlFlock(f.Fd(), syscall.F_GETLK, &lock); err != nil {
		t.Fatal(err)
	}
	return lock.Type == syscall.F_UNLCK
}

func parsePorts(s string) (int, int) {
	from, to, _ := strings.Cut(s, "-")
	a, _ := strconv.Atoi(from)
	b, _ := strconv.Atoi(to)
	return a, b
}
