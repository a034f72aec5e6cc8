package proc

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func sh(name, script, log string) Spec {
	return Spec{Name: name, Path: "/bin/sh", Args: []string{"-c", script}, Log: log}
}

// TestRestart: a program runs again with the same command line after it was killed;
// its log keeps both runs, the second after a marker.
func TestRestart(t *testing.T) {
	log := filepath.Join(t.TempDir(), "p.log")
	p, err := Start(sh("sleeper", "echo started; exec sleep 60", log))
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := p.WaitUntil(context.Background(), 10*time.Second, func() bool { return strings.Contains(p.Output(), "started") }); !ok || err != nil {
		t.Fatalf("first run: %v, %v; output %q", ok, err, p.Output())
	}
	if u := p.Usage(); u.RSSMiB <= 0 {
		t.Errorf("usage of a running program: %+v, want its resident memory", u)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(syscall.SIGTERM); !errors.Is(err, ErrNotRunning) {
		t.Errorf("signal after the exit: %v, want ErrNotRunning", err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Kill() }()
	if ok, err := p.WaitUntil(context.Background(), 10*time.Second, func() bool { return strings.Count(p.Output(), "started") == 2 }); !ok || err != nil {
		t.Fatalf("second run: %v, %v; output %q", ok, err, p.Output())
	}
	if !strings.Contains(p.Output(), "=== sleeper starts at ") {
		t.Errorf("no restart marker in %q", p.Output())
	}
}

// TestStop: a program that ignores SIGTERM is killed after the grace period, and Stop
// says so; one that heeds it stops within it.
func TestStop(t *testing.T) {
	stubborn, err := Start(sh("stubborn", `trap "" TERM; echo ready; while true; do sleep 0.1; done`, ""))
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := stubborn.WaitUntil(context.Background(), 10*time.Second, func() bool { return strings.Contains(stubborn.Output(), "ready") }); !ok {
		t.Fatal("the program did not start")
	}
	if err := stubborn.Stop(500 * time.Millisecond); err == nil || !strings.Contains(err.Error(), "killed it") {
		t.Errorf("Stop of a program that ignores SIGTERM: %v, want an error saying it was killed", err)
	}
	if err := stubborn.Stop(time.Second); err != nil {
		t.Errorf("Stop of a stopped program: %v, want nil", err)
	}

	polite, err := Start(sh("polite", "exec sleep 60", ""))
	if err != nil {
		t.Fatal(err)
	}
	if err := polite.Stop(10 * time.Second); err != nil {
		t.Errorf("Stop of a program that heeds SIGTERM: %v", err)
	}
}

// TestWaitUntilExit: waiting on a program that exits is an error that shows where its
// output ends, not a wait to the timeout.
func TestWaitUntilExit(t *testing.T) {
	p, err := Start(sh("quitter", "echo last words; exit 3", ""))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ok, err := p.WaitUntil(context.Background(), time.Minute, func() bool { return false })
	if ok || err == nil || !strings.Contains(err.Error(), "last words") {
		t.Errorf("WaitUntil on an exited program: %v, %v; want an error with its output's tail", ok, err)
	}
	if time.Since(start) > 30*time.Second {
		t.Errorf("WaitUntil took %v: it waited out its timeout", time.Since(start))
	}
	if exited, err := p.Wait(time.Second); !exited || err == nil {
		t.Errorf("Wait: %v, %v; want exited with its status", exited, err)
	}
}
