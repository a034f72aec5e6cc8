// Package proc runs the programs of the tests, the bench and `make run` (the
// controller, the control plane's servers): started, signalled, stopped with grace or
// killed, and started again with the same command line, with their output at hand.
package proc

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/student-controller/student-controller/internal/testenv"
)

// Spec is a program to run.
type Spec struct {
	// Name names it in errors and in the log's restart marker.
	Name string
	Path string
	Args []string
	// Env is added to this process's environment.
	Env []string
	// Log is the file its output goes to: the first Start truncates it, a later one
	// appends after a line "=== NAME starts at TIME". Empty: the output is kept in
	// memory, unless Tee takes it.
	Log string
	// Tee also gets the output, when set (make run shows it on the terminal).
	Tee io.Writer
	// DeathSignal reaches the program when the process that started it dies, even
	// killed without cleaning up (a test binary past its -timeout); SIGKILL when 0.
	// Linux sends it when the OS thread that started the program exits, which Go does
	// only for a goroutine that exits while locked to its thread: nothing here does.
	DeathSignal syscall.Signal
}

// ErrNotRunning is returned for a signal to a program that has exited (and may be
// about to start again).
var ErrNotRunning = errors.New("not running")

// Process is a program of Spec, run any number of times, one run at a time.
type Process struct {
	spec Spec
	mem  *testenv.Output // the output, when Spec.Log is empty

	mu     sync.Mutex
	cmd    *exec.Cmd
	runs   int
	exited chan struct{} // closed when the current run has exited
	err    error         // why the last run exited
}

// New returns a Process of s that has not started.
func New(s Spec) *Process {
	p := &Process{spec: s}
	if s.Log == "" && s.Tee == nil {
		p.mem = &testenv.Output{}
	}
	return p
}

// Start is New and Start.
func Start(s Spec) (*Process, error) {
	p := New(s)
	return p, p.Start()
}

// Start runs the program; it must not be running.
func (p *Process) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && !closed(p.exited) {
		return fmt.Errorf("%s is already running", p.spec.Name)
	}
	var out io.Writer = io.Discard
	if p.mem != nil {
		out = p.mem
	}
	var file *os.File
	if p.spec.Log != "" {
		flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
		if p.runs > 0 {
			flags = os.O_CREATE | os.O_WRONLY | os.O_APPEND
		}
		var err error
		if file, err = os.OpenFile(p.spec.Log, flags, 0o600); err != nil {
			return err
		}
		out = file
	}
	if p.spec.Tee != nil {
		out = io.MultiWriter(out, p.spec.Tee)
	}
	if p.runs > 0 {
		fmt.Fprintf(out, "\n=== %s starts at %s\n", p.spec.Name, time.Now().Format(time.RFC3339Nano))
	}
	cmd := exec.Command(p.spec.Path, p.spec.Args...) // #nosec G204 -- the tests' own programs
	cmd.Stdout, cmd.Stderr = out, out
	// Output through a pipe (memory, Tee) is read until every holder of the pipe has
	// closed it: a grandchild that keeps it must not hold up Wait for ever.
	cmd.WaitDelay = 5 * time.Second
	cmd.Env = append(os.Environ(), p.spec.Env...)
	death := p.spec.DeathSignal
	if death == 0 {
		death = syscall.SIGKILL
	}
	// Its own process group, so that a Ctrl-C meant for the test does not reach it
	// first; and it dies with its parent.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: death}
	if err := cmd.Start(); err != nil {
		if file != nil {
			_ = file.Close()
		}
		return fmt.Errorf("start %s: %w", p.spec.Name, err)
	}
	exited := make(chan struct{})
	p.cmd, p.exited, p.err = cmd, exited, nil
	p.runs++
	go func() {
		err := cmd.Wait()
		if file != nil {
			_ = file.Close() // the program's output; it has exited
		}
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(exited)
	}()
	return nil
}

// Name is Spec.Name.
func (p *Process) Name() string { return p.spec.Name }

// LogPath is Spec.Log: "" when the output is kept in memory.
func (p *Process) LogPath() string { return p.spec.Log }

// Pid is the current run's process ID; 0 before the first Start.
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Exited is closed when the current run exits; nil before the first Start.
func (p *Process) Exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

// ExitErr is why the last run exited (nil for status 0, or while it runs).
func (p *Process) ExitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Signal sends sig to the current run; ErrNotRunning when it has exited.
func (p *Process) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || closed(p.exited) {
		return fmt.Errorf("%s: %w", p.spec.Name, ErrNotRunning)
	}
	return p.cmd.Process.Signal(sig)
}

// Kill SIGKILLs the current run and waits until it has exited.
func (p *Process) Kill() error {
	if err := p.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	<-p.Exited()
	return nil
}

// Stop asks the current run to stop (SIGTERM, and SIGCONT in case it is paused), kills
// it after grace, and says so in its error. A program that is not running is stopped.
func (p *Process) Stop(grace time.Duration) error {
	exited := p.Exited()
	if exited == nil || closed(exited) {
		return nil
	}
	_ = p.Signal(syscall.SIGTERM)
	_ = p.Signal(syscall.SIGCONT)
	select {
	case <-exited:
		return nil
	case <-time.After(grace):
		_ = p.Kill()
		return fmt.Errorf("%s did not stop within %v of SIGTERM; killed it", p.spec.Name, grace)
	}
}

// Wait waits at most timeout for the current run to exit: whether it did, and its
// error.
func (p *Process) Wait(timeout time.Duration) (bool, error) {
	select {
	case <-p.Exited():
		return true, p.ExitErr()
	case <-time.After(timeout):
		return false, nil
	}
}

// WaitUntil polls cond every 100 ms until it holds (true) or timeout passes (false).
// The run exiting meanwhile is an error that shows where its output ends, and so is
// ctx ending: nothing waits out its timeout on a program that is gone.
func (p *Process) WaitUntil(ctx context.Context, timeout time.Duration, cond func() bool) (bool, error) {
	deadline := time.Now().Add(timeout)
	exited := p.Exited()
	for {
		if cond() {
			return true, nil
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		select {
		case <-exited:
			where := "its output"
			if p.spec.Log != "" {
				where = "its log " + p.spec.Log
			}
			return false, fmt.Errorf("%s exited (%v); %s ends:\n%s", p.spec.Name, p.ExitErr(), where, p.Tail(30))
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Output is everything the program has written, over all its runs ("" when only Tee
// has it).
func (p *Process) Output() string {
	switch {
	case p.mem != nil:
		return p.mem.String()
	case p.spec.Log != "":
		b, _ := os.ReadFile(p.spec.Log) // #nosec G304 -- the log this package writes
		return string(b)
	}
	return ""
}

// Tail is the last lines of Output.
func (p *Process) Tail(lines int) string { return testenv.Tail([]byte(p.Output()), lines) }

// Usage is what the current run has used so far, read from /proc.
type Usage struct {
	PeakRSSMiB, RSSMiB float64 // VmHWM, VmRSS
	CPUSeconds         float64 // user and system time
}

// Usage reads the current run's memory and CPU time; zero once it has exited.
func (p *Process) Usage() Usage {
	var u Usage
	if exited := p.Exited(); exited == nil || closed(exited) {
		return u // its process ID may be another program's by now
	}
	pid := p.Pid()
	if f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "status")); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 2 {
				continue
			}
			kb, _ := strconv.ParseFloat(fields[1], 64)
			switch fields[0] {
			case "VmHWM:":
				u.PeakRSSMiB = kb / 1024
			case "VmRSS:":
				u.RSSMiB = kb / 1024
			}
		}
		_ = f.Close()
	}
	if b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat")); err == nil {
		// Fields after the command name, which is in parentheses and may hold spaces:
		// state is the first, utime the 12th and stime the 13th, in clock ticks.
		if fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:])); len(fields) >= 13 {
			utime, _ := strconv.ParseFloat(fields[11], 64)
			stime, _ := strconv.ParseFloat(fields[12], 64)
			u.CPUSeconds = (utime + stime) / clockTicks
		}
	}
	return u
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on Linux.
const clockTicks = 100

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
