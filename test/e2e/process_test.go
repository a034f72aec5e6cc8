package e2e

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/student-controller/student-controller/internal/testenv"
)

// process is a student-controller binary running for a test, with its own metrics and
// probe ports.
type process struct {
	t           *testing.T
	name        string
	cmd         *exec.Cmd
	logs        *testenv.Output
	metricsAddr string
	probeAddr   string
	exited      chan struct{}
	exitErr     error
}

// startProcess runs the binary with args plus its own metrics and probe addresses.
func startProcess(t *testing.T, name string, args ...string) *process {
	t.Helper()
	return startProcessEnv(t, name, nil, args...)
}

// startProcessEnv is startProcess with extra environment variables.
func startProcessEnv(t *testing.T, name string, env []string, args ...string) *process {
	t.Helper()
	return startBinary(t, name, controllerBinary(t), env, args...)
}

// startBinary is startProcessEnv for a controller binary of the caller's.
func startBinary(t *testing.T, name, bin string, env []string, args ...string) *process {
	t.Helper()
	p := &process{
		t: t, name: name, logs: &testenv.Output{}, exited: make(chan struct{}),
		metricsAddr: testenv.Addr(t),
		probeAddr:   testenv.Addr(t),
	}
	args = append(args, "--metrics-bind-address", p.metricsAddr, "--health-probe-bind-address", p.probeAddr)
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	p.cmd.Env = append(os.Environ(), env...)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.exitErr = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.signal(syscall.SIGKILL)
		<-p.exited
		if t.Failed() {
			t.Logf("%s output:\n%s", name, p.logs.String())
		}
	})
	return p
}

func (p *process) signal(sig syscall.Signal) {
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Signal(sig)
	}
}

// wait waits for the process to exit and returns its error.
func (p *process) wait(timeout time.Duration) error {
	select {
	case <-p.exited:
		return p.exitErr
	case <-time.After(timeout):
		p.t.Fatalf("%s did not exit within %v", p.name, timeout)
		return nil
	}
}

// get fetches a URL path of the metrics or probe server: status code and body.
func get(url string) (int, string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// metric returns the lines of the /metrics text whose name is name.
func metricLines(body, name string) []string {
	var out []string
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			out = append(out, line)
		}
	}
	return out
}
