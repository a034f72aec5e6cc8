package chaos

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// proc is one program the harness runs, and runs again after a fault, with the same
// command line: each run appends to the same log file.
type proc struct {
	name string
	path string
	args []string
	env  []string
	log  string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when the current run has exited
	err    error         // why the current run exited
}

// start runs the program; it must not be running.
func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && !isClosed(p.exited) {
		return fmt.Errorf("%s is already running", p.name)
	}
	logFile, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logFile.Close()
	fmt.Fprintf(logFile, "\n=== chaos: %s starts at %s\n", p.name, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.path, p.args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(), p.env...)
	// Its own process group: a Ctrl-C meant for the test does not reach it first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	exited := make(chan struct{})
	p.cmd, p.exited, p.err = cmd, exited, nil
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(exited)
	}()
	return nil
}

// running returns the channel closed when the current run exits; nil when it never
// started.
func (p *proc) running() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

// errNotRunning: the program has exited (and may be about to start again).
var errNotRunning = errors.New("not running")

// signal sends sig to the current run, if it runs.
func (p *proc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || isClosed(p.exited) {
		return fmt.Errorf("%s: %w", p.name, errNotRunning)
	}
	return p.cmd.Process.Signal(sig)
}

// kill SIGKILLs the current run and waits until it has exited.
func (p *proc) kill() error {
	if err := p.signal(syscall.SIGKILL); err != nil {
		return err
	}
	<-p.running()
	return nil
}

// stop asks the current run to stop (SIGTERM, and SIGCONT in case it was paused),
// SIGKILLs it after grace, and tells which it took. A run that is not running is
// already stopped.
func (p *proc) stop(grace time.Duration) error {
	exited := p.running()
	if exited == nil || isClosed(exited) {
		return nil
	}
	_ = p.signal(syscall.SIGTERM)
	_ = p.signal(syscall.SIGCONT)
	select {
	case <-exited:
		return nil
	case <-time.After(grace):
		_ = p.kill()
		return fmt.Errorf("%s did not stop within %v of SIGTERM; killed it", p.name, grace)
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
