package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestBinary runs the built controller binary as a user would, with its flags, and
// checks that SIGTERM drains it and it exits 0.
func TestBinary(t *testing.T) {
	bin := controllerBinary(t)

	ns := newNamespace(t)
	path := filepath.Join(t.TempDir(), "registry.db")
	db := rawDB(t, path)

	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "student-controller ") || !strings.Contains(string(out), "go1.") {
		t.Errorf("--version: %q, %v", out, err)
	}

	// Bad flags get a clear error and exit code 2.
	out, err = exec.Command(bin, "--workers=0", "--registry-owner=").CombinedOutput()
	if code := exitCode(err); code != 2 || !strings.Contains(string(out), "--workers must be at least 1") || !strings.Contains(string(out), "--registry-owner must not be empty") {
		t.Errorf("bad flags: exit %d, output %q", code, out)
	}
	out, err = exec.Command(bin, "--kubeconfig", env.Kubeconfig, "--registry", "mysql://x").CombinedOutput()
	if code := exitCode(err); code != 1 || !strings.Contains(string(out), `unsupported scheme "mysql"`) {
		t.Errorf("bad registry URL: exit %d, output %q", code, out)
	}

	cmd := exec.Command(bin, "--kubeconfig", controllerID.kubeconfig, "--namespace", ns, "--metrics-bind-address=0", "--health-probe-bind-address=0",
		"--registry", "sqlite://"+path, "--registry-owner", owner, "-v", "2")
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("controller output:\n%s", logs.String())
		}
	}()

	if _, err := students(ns).Create(context.Background(), newStudent("zhang-san", "深圳中学", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	items := waitAllReady(t, ns, 1, time.Minute)
	assertRowsMatch(t, db, items)

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("after SIGTERM the controller exited with %v, want 0", err)
		}
	case <-time.After(45 * time.Second):
		t.Fatal("the controller did not exit within 45s of SIGTERM")
	}
	for _, want := range []string{"Registry open", "Shutting down: finishing the work in flight", "Controller stopped"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("controller output lacks %q", want)
		}
	}
}

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// controllerBinary builds cmd/student-controller once for the package's tests.
func controllerBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "student-controller-bin-")
		if err != nil {
			buildErr = err
			return
		}
		builtBin = filepath.Join(dir, "student-controller")
		build := exec.Command("go", "build", "-o", builtBin, "./cmd/student-controller")
		build.Dir = env.Root
		if out, err := build.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return -1
}
