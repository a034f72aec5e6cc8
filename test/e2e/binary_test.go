package e2e

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/ctrlbin"
	"github.com/student-controller/student-controller/internal/testenv/proc"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
)

// TestBinary runs the built controller binary as a user would, with its flags, and
// checks that SIGTERM drains it and it exits 0.
func TestBinary(t *testing.T) {
	bin := ctrlbin.Binary(t)

	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	path := filepath.Join(t.TempDir(), "registry.db")
	db := registrytest.OpenSQLite(t, path)

	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "student-controller ") || !strings.Contains(string(out), "go1.") {
		t.Errorf("--version: %q, %v", out, err)
	}

	// Bad flags get a clear error and exit code 2.
	out, err = exec.Command(bin, "--workers=0", "--registry-owner=").CombinedOutput()
	if code := exitCode(err); code != 2 || !strings.Contains(string(out), "--workers must be at least 1") || !strings.Contains(string(out), "--registry-owner must not be empty") {
		t.Errorf("bad flags: exit %d, output %q", code, out)
	}
	// A registry URL is a flag: one the controller cannot use is refused as the others are.
	out, err = exec.Command(bin, "--kubeconfig", env.Kubeconfig, "--registry", "mysql://x").CombinedOutput()
	if code := exitCode(err); code != 2 || !strings.Contains(string(out), `unsupported scheme "mysql"`) {
		t.Errorf("bad registry URL: exit %d, output %q", code, out)
	}

	c, err := proc.Start(proc.Spec{Name: "controller", Path: bin, Args: []string{
		"--kubeconfig", controllerID.Kubeconfig, "--namespace", ns, "--metrics-bind-address=0", "--health-probe-bind-address=0",
		"--registry", "sqlite://" + path, "--registry-owner", owner, "-v", "2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = c.Kill()
		if t.Failed() {
			t.Logf("controller output:\n%s", c.Output())
		}
	}()

	if _, err := students(ns).Create(context.Background(), newStudent("zhang-san", "深圳中学", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	items := waitAllReady(t, ns, 1, time.Minute)
	assertRowsMatch(t, db, items)

	if err := c.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	switch exited, err := c.Wait(45 * time.Second); {
	case !exited:
		t.Fatal("the controller did not exit within 45s of SIGTERM")
	case err != nil:
		t.Errorf("after SIGTERM the controller exited with %v, want 0", err)
	}
	for _, want := range []string{"Registry open", "Shutting down: finishing the work in flight", "Controller stopped"} {
		if !strings.Contains(c.Output(), want) {
			t.Errorf("controller output lacks %q", want)
		}
	}
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

// TestJSONLogs: with --logging-format=json every line the controller writes is one JSON
// object, and a sync's lines carry the Student, its uid, the action, the generation and
// the sync's duration. An unknown format is refused with exit code 2.
func TestJSONLogs(t *testing.T) {
	bin := ctrlbin.Binary(t)
	out, err := exec.Command(bin, "--logging-format=xml").CombinedOutput()
	if code := exitCode(err); code != 2 || !strings.Contains(string(out), "Unsupported log format") {
		t.Errorf("--logging-format=xml: exit %d, output %q", code, out)
	}

	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	path := filepath.Join(t.TempDir(), "registry.db")
	c := startProcess(t, "controller", "--kubeconfig", controllerID.Kubeconfig, "--namespace", ns,
		"--registry", "sqlite://"+path, "--registry-owner", owner, "--logging-format=json", "-v=4")
	created, err := students(ns).Create(context.Background(), newStudent("zhang-san", "深圳中学", ""), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitAllReady(t, ns, 1, time.Minute)
	c.signal(syscall.SIGTERM)
	if err := c.wait(45 * time.Second); err != nil {
		t.Errorf("after SIGTERM: %v", err)
	}

	type ref struct{ Name, Namespace string }
	var wrote, synced int
	lines := strings.Split(strings.TrimSpace(c.Output()), "\n")
	for _, line := range lines {
		var entry struct {
			Msg        string  `json:"msg"`
			V          *int    `json:"v"`
			Student    ref     `json:"student"`
			UID        string  `json:"uid"`
			Action     string  `json:"action"`
			Generation int64   `json:"generation"`
			Duration   *string `json:"duration"`
		}
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Fatalf("a log line is not JSON (%v): %s", err, line)
		}
		if entry.Msg == "" {
			t.Errorf("a log line has no msg: %s", line)
		}
		student := ref{Name: "zhang-san", Namespace: ns}
		switch {
		case entry.Msg == "Wrote registry row" && entry.Student == student && entry.UID == string(created.UID) &&
			entry.Action == "created" && entry.Generation == 1:
			wrote++
		case entry.Msg == "Synced Student" && entry.Student == student && entry.Duration != nil && *entry.Duration != "":
			synced++
		}
	}
	if wrote != 1 || synced == 0 {
		t.Errorf("%d lines of the row written with student, uid, action and generation (want 1), %d of a sync with its duration (want some), in:\n%s",
			wrote, synced, c.Output())
	}
}
