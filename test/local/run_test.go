// Package local drives `make run` as a newcomer would and checks what they would see.
package local

import (
	"bufio"
	"database/sql"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	_ "modernc.org/sqlite"

	"github.com/student-controller/student-controller/internal/testenv"
)

// TestMakeRun runs `make run`, follows the printed instructions from "another
// terminal" (kubectl get stu with the printed kubeconfig, the printed registry file),
// then presses Ctrl-C and checks that nothing it started is left running.
func TestMakeRun(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	// What make run builds first, built here with a limit of its own: on a fresh
	// machine, compiling the controller can take longer than starting everything (and
	// longer still while other suites load the machine); the five minutes below are
	// for the start.
	build := exec.Command("make", "--no-print-directory", "controlplane", "build")
	build.Dir = root
	built := make(chan error, 1)
	var buildOut []byte
	go func() {
		var err error
		buildOut, err = build.CombinedOutput()
		built <- err
	}()
	select {
	case err := <-built:
		if err != nil {
			t.Fatalf("make controlplane build: %v\n%s", err, buildOut)
		}
	case <-time.After(20 * time.Minute):
		_ = build.Process.Kill()
		t.Fatal("make controlplane build took more than 20 minutes")
	}

	state := t.TempDir()
	flags := fmt.Sprintf("--health-probe-bind-address=%s --metrics-bind-address=%s", testenv.Addr(t), testenv.Addr(t))
	cmd := exec.Command("make", "--no-print-directory", "run", "STATE_DIR="+state, "RUN_FLAGS="+flags)
	cmd.Dir = root
	// A terminal's Ctrl-C signals the whole foreground process group: give make one.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	exited := make(chan error, 1)
	transcript := &testenv.Output{}
	lines := make(chan string, 1000)
	go func() {
		sc := bufio.NewScanner(io.TeeReader(out, transcript))
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		exited <- cmd.Wait()
	}()
	defer func() {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		if t.Failed() {
			t.Logf("make run printed:\n%s", transcript.String())
		}
	}()

	// What it says before the slow part, and the exact kubectl line once up.
	kubectlLine := regexp.MustCompile(`^\s+kubectl --kubeconfig (\S+) get stu$`)
	registryLine := regexp.MustCompile(`The registry is the SQLite file (\S+\.db)$`)
	var kubeconfig, registryFile string
	sawStarting := false
	timeout := time.After(5 * time.Minute)
	for kubeconfig == "" || registryFile == "" {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("make run ended before it was up: %v", <-exited)
			}
			if strings.Contains(line, "Starting the local control plane") && strings.Contains(line, "kube-controller-manager") {
				sawStarting = true
			}
			if m := kubectlLine.FindStringSubmatch(line); m != nil {
				kubeconfig = m[1]
			}
			if m := registryLine.FindStringSubmatch(line); m != nil {
				registryFile = m[1]
			}
		case <-timeout:
			t.Fatal("make run was not up within 5 minutes")
		}
	}
	go func() { // keep draining its output
		for range lines {
		}
	}()
	if !sawStarting {
		t.Error("make run did not say what it was starting (kube-controller-manager too) before it was up")
	}
	if !strings.HasPrefix(registryFile, state) || !strings.HasPrefix(kubeconfig, state) {
		t.Errorf("kubeconfig %s and registry %s are not under the state folder %s", kubeconfig, registryFile, state)
	}

	// From another terminal: the samples, Ready.
	want := map[string]string{"zhang-san": "张三", "li-si": "李四", "ada-lovelace": "Ada Lovelace"}
	var table string
	deadline := time.Now().Add(time.Minute)
	for {
		got, err := exec.Command("kubectl", "--kubeconfig", kubeconfig, "get", "stu", "-n", "default").CombinedOutput()
		table = string(got)
		if err == nil && allReady(table, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kubectl get stu never listed the samples as Ready:\n%s (%v)", table, err)
		}
		time.Sleep(500 * time.Millisecond)
	}

	// The registry file holds their rows.
	db, err := sql.Open("sqlite", "file:"+registryFile+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT name, student_name FROM students WHERE namespace = 'default'`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for rows.Next() {
		var name, studentName string
		if err := rows.Scan(&name, &studentName); err != nil {
			t.Fatal(err)
		}
		got[name] = studentName
	}
	rows.Close()
	for name, display := range want {
		if got[name] != display {
			t.Errorf("registry row for %s: %q, want %q (rows %v)", name, got[name], display, got)
		}
	}

	// Deleting a namespace with Students finishes, as in a cluster, each row handled per
	// its Student's deletionPolicy.
	kubectl := func(stdin string, args ...string) string {
		t.Helper()
		cmd := exec.Command("kubectl", append([]string{"--kubeconfig", kubeconfig}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	kubectl("", "create", "namespace", "cleanup")
	kubectl(`
apiVersion: bolingcavalry.k8s.io/v1
kind: Student
metadata: {name: goes, namespace: cleanup}
spec: {name: "王五", school: "深圳中学"}
---
apiVersion: bolingcavalry.k8s.io/v1
kind: Student
metadata: {name: stays, namespace: cleanup}
spec: {name: "赵六", school: "深圳中学", deletionPolicy: Orphan}
`, "apply", "-f", "-")
	kubectl("", "wait", "--for=condition=Ready", "stu", "--all", "-n", "cleanup", "--timeout=60s")
	kubectl("", "delete", "namespace", "cleanup", "--timeout=2m")
	left := map[string]string{}
	rows, err = db.Query(`SELECT name, COALESCE(owner, '(released)') FROM students WHERE namespace = 'cleanup'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var name, owner string
		if err := rows.Scan(&name, &owner); err != nil {
			t.Fatal(err)
		}
		left[name] = owner
	}
	rows.Close()
	if diff := cmp.Diff(map[string]string{"stays": "(released)"}, left); diff != "" {
		t.Errorf("rows of the deleted namespace (-want +got):\n%s", diff)
	}

	kcfg, err := os.ReadFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	server := regexp.MustCompile(`server: https://(\S+)`).FindStringSubmatch(string(kcfg))
	if server == nil {
		t.Fatalf("no API server address in %s", kubeconfig)
	}

	// Ctrl-C: everything stops, nothing survives.
	if err := syscall.Kill(-pgid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(2 * time.Minute):
		t.Fatal("make run did not stop within 2 minutes of Ctrl-C")
	}
	if !strings.Contains(transcript.String(), "==> Stopped") {
		t.Errorf("make run did not say it stopped cleanly")
	}
	if err := syscall.Kill(-pgid, 0); err != syscall.ESRCH {
		t.Errorf("processes of make run's group survive Ctrl-C (kill -0: %v)", err)
	}
	if conn, err := net.DialTimeout("tcp", server[1], time.Second); err == nil {
		conn.Close()
		t.Errorf("the API server at %s still answers after Ctrl-C", server[1])
	}
	if survivors := processesMentioning(t, state); len(survivors) > 0 {
		t.Errorf("processes started by make run survive Ctrl-C:\n%s", strings.Join(survivors, "\n"))
	}
}

func allReady(table string, want map[string]string) bool {
	for name, display := range want {
		found := false
		for _, line := range strings.Split(table, "\n") {
			f := strings.Fields(line)
			if len(f) > 0 && f[0] == name && strings.Contains(line, display) && strings.Contains(line, " True ") {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// processesMentioning lists running processes whose command line names dir: the
// controller (its registry and kubeconfig) and etcd (its data folder) do.
func processesMentioning(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		line := strings.ReplaceAll(string(cmdline), "\x00", " ")
		if strings.Contains(line, dir) && !strings.Contains(line, "run_test") {
			out = append(out, e.Name()+": "+line)
		}
	}
	return out
}
