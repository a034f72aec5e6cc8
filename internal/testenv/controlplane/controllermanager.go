package controlplane

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/student-controller/student-controller/internal/testenv"
)

// Controllers are the kube-controller-manager controllers the local control plane
// runs: what a cluster uses to empty a namespace being deleted and to collect objects
// whose owner is gone. The others (Pods, nodes, volumes, ...) have nothing to do here.
var Controllers = []string{"namespace-controller", "garbage-collector-controller"}

// startedLogs are what kube-controller-manager v1.37 logs once each controller works:
// the garbage collector's line comes after its first look at every resource.
var startedLogs = []string{`"Starting namespace controller"`, `"Proceeding to collect garbage"`}

// process is a control-plane binary that this package runs itself (envtest runs only
// etcd and kube-apiserver).
type process struct {
	cmd    *exec.Cmd
	log    string
	exited chan struct{}
	err    error
}

// startControllerManager runs kube-controller-manager against the API server that
// kubeconfig reaches, logging to logDir, and waits until its controllers have started.
func startControllerManager(bin, kubeconfig, logDir string) (*process, error) {
	if err := os.MkdirAll(logDir, 0o700); err != nil {
		return nil, err
	}
	p := &process{log: filepath.Join(logDir, "kube-controller-manager.log"), exited: make(chan struct{})}
	logFile, err := os.Create(p.log)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	p.cmd = exec.Command(bin,
		"--kubeconfig="+kubeconfig,
		"--controllers="+strings.Join(Controllers, ","),
		"--leader-elect=false",
		"--secure-port=0", // nothing scrapes or probes it here
	)
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	// It dies with the process that started it, even one killed without cleaning up.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start kube-controller-manager: %w", err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()

	deadline := time.After(time.Minute)
	for {
		out, _ := os.ReadFile(p.log)
		started := 0
		for _, line := range startedLogs {
			if bytes.Contains(out, []byte(line)) {
				started++
			}
		}
		if started == len(startedLogs) {
			return p, nil
		}
		select {
		case <-p.exited:
			return nil, fmt.Errorf("kube-controller-manager exited at start (%v); its log %s ends:\n%s", p.err, p.log, testenv.Tail(out, 20))
		case <-deadline:
			return nil, errors.Join(fmt.Errorf("kube-controller-manager did not start %s within a minute; its log %s ends:\n%s",
				strings.Join(Controllers, ", "), p.log, testenv.Tail(out, 20)), p.stop(10*time.Second))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// stop asks the process to stop and kills it if it has not within grace.
func (p *process) stop(grace time.Duration) error {
	select {
	case <-p.exited:
		return nil // already gone: the log says why, and a stop has nothing to add
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return nil
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("kube-controller-manager did not stop within %v; killed it", grace)
	}
}
