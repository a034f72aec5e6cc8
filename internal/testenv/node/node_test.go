package node

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/student-controller/student-controller/internal/testenv"
)

// TestMain lets the test binary be a node that is killed: with STUDENT_NODE_KILLED
// set, it reserves the machine (New: the lock, the folder, the record, the bridge
// with the node's address), says so and waits for its SIGKILL.
func TestMain(m *testing.M) {
	if root := os.Getenv("STUDENT_NODE_KILLED"); root != "" {
		n, err := New(context.Background(), root, Options{})
		if err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Stdout.WriteString("reserved " + n.Dir + "\n")
		select {}
	}
	os.Exit(m.Run())
}

// A node that was killed (a CI run stopped in the node suite, kill -9 on make
// cluster) leaves its bridge, with the node's address, and its record; the next New
// on the machine puts that back and runs. (It refused, seeing its own address on the
// machine, before it read the record.)
func TestNewAfterAKilledNode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a node needs root")
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if err := checkMachine(root); err != nil {
		t.Skipf("this machine cannot run a node (make node installs what it needs): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	killed := exec.CommandContext(ctx, os.Args[0], "-test.run=^$") // #nosec G204 -- this test binary
	killed.Env = append(os.Environ(), "STUDENT_NODE_KILLED="+root)
	killed.Stderr = os.Stderr
	out, err := killed.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := killed.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "reserved ") {
		_ = killed.Process.Kill()
		_ = killed.Wait()
		t.Fatalf("the node to be killed did not reserve the machine: %q, %v", line, err)
	}
	_ = killed.Process.Kill()
	_ = killed.Wait()
	dir := strings.TrimSpace(strings.TrimPrefix(line, "reserved "))
	if left := Leftovers(dir); len(left) == 0 {
		t.Fatal("the killed node left nothing: the test shows nothing")
	}

	var said []string
	n, err := New(ctx, root, Options{Log: func(f string, args ...any) { said = append(said, f) }})
	if n != nil {
		defer func() {
			if err := n.Stop(); err != nil {
				t.Errorf("Stop: %v", err)
			}
			if left := Leftovers(n.Dir); len(left) > 0 {
				t.Errorf("left behind:\n  %s", strings.Join(left, "\n  "))
			}
			if left := Leftovers(dir); len(left) > 0 {
				t.Errorf("the killed node's parts left behind:\n  %s", strings.Join(left, "\n  "))
			}
		}()
	}
	if err != nil {
		t.Fatalf("New after a killed node: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the killed node's folder %s is still there (%v)", dir, err)
	}
	if !strings.Contains(strings.Join(said, "\n"), "removed what a node that was killed left") {
		t.Errorf("New did not say it put back a killed node; it said:\n%s", strings.Join(said, "\n"))
	}
}
