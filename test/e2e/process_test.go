package e2e

import (
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/student-controller/student-controller/internal/testenv/ctrlbin"
)

// process is a student-controller binary running for a test, with its own metrics and
// probe ports. Its output is kept in memory and shown when the test fails.
type process struct {
	*ctrlbin.Controller
	t *testing.T
}

// startProcess runs the binary with args plus its own metrics and probe addresses.
func startProcess(t *testing.T, name string, args ...string) *process {
	t.Helper()
	return startProcessEnv(t, name, nil, args...)
}

// startProcessEnv is startProcess with extra environment variables.
func startProcessEnv(t *testing.T, name string, env []string, args ...string) *process {
	t.Helper()
	return startBinary(t, name, ctrlbin.Binary(t), env, args...)
}

// startBinary is startProcessEnv for a controller binary of the caller's.
func startBinary(t *testing.T, name, bin string, env []string, args ...string) *process {
	t.Helper()
	c, err := ctrlbin.New(name, bin, "", args, env...)
	if err == nil {
		err = c.Start()
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Kill()
		if t.Failed() {
			t.Logf("%s output:\n%s", name, c.Output())
		}
	})
	return &process{Controller: c, t: t}
}

// signal sends sig, unless the process has exited.
func (p *process) signal(sig syscall.Signal) { _ = p.Signal(sig) }

// wait waits for the process to exit and returns its error; the test fails when it
// does not exit within timeout.
func (p *process) wait(timeout time.Duration) error {
	exited, err := p.Wait(timeout)
	if !exited {
		p.t.Fatalf("%s did not exit within %v", p.Name(), timeout)
	}
	return err
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
