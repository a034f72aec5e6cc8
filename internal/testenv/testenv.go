// Package testenv is the home of what only the tests, the bench and `make run` use: its
// packages start the real control plane (controlplane), PostgreSQL (pgtest) and the
// programs that touch a registry from outside (registrytest); this package holds what
// they share: addresses to give processes, a place for what they print, and scrapes
// of their metrics.
package testenv

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/mod/modfile"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// FreePort returns a TCP port of 127.0.0.1 that was free a moment ago, and that this
// process has not handed out before. It is picked at random from 20000 to 29999, below
// the ports that the kernel hands to outgoing connections (net.ipv4.ip_local_port_range,
// 32768 to 60999 by default) and to NodePorts (30000 to 32767): a port the kernel picks
// itself, as a listener on port 0 gets, is from that range, and any connection opened
// between the pick and the moment a process binds the port may take it (kube-apiserver
// failed to start so, "bind: address already in use"). The processes of one test run
// (go test runs a process per package) never hand out the same port: each holds a lock
// on the port's byte of one file (portLocks) for as long as it lives.
func FreePort() (int, error) {
	low, high := portsFrom, portsTo
	if first := ephemeralPortsFrom(); first <= high {
		high = first - 1
	}
	if low > high {
		// The kernel hands out every port from 20000 on: take one from it.
		return kernelPort()
	}
	for range 1000 {
		port := low + rand.IntN(high-low+1) // #nosec G404 -- a port, not a secret
		handedOutMu.Lock()
		taken := handedOut[port]
		handedOut[port] = true // held while it is tried
		handedOutMu.Unlock()
		if taken {
			continue
		}
		if !lockPort(port) {
			continue // another process handed it out; it stays in handedOut, not ours to try
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // in use; locked and in handedOut, so it is not tried again
		}
		_ = l.Close()
		return port, nil
	}
	return 0, fmt.Errorf("no free port of 127.0.0.1 from %d to %d", low, high)
}

// portLocks is the file whose byte at offset PORT a process locks (an fcntl record
// lock, F_SETLK) when it hands out PORT. The kernel lets go of a process's locks when
// it ends, however it ends, so nothing needs to clean them up; the empty file stays.
var portLocks struct {
	once sync.Once
	f    *os.File
}

// lockPort locks port's byte of portLocks for this process: false when another process
// holds it. Where the file cannot be opened it says true: the ports are then picked as
// if by one process alone.
func lockPort(port int) bool {
	portLocks.once.Do(func() {
		f, err := os.OpenFile(filepath.Join(os.TempDir(), "student-controller-test-ports.lock"), os.O_RDWR|os.O_CREATE, 0o600)
		if err == nil {
			portLocks.f = f
		}
	})
	if portLocks.f == nil {
		return true
	}
	lock := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: io.SeekStart, Start: int64(port), Len: 1}
	return syscall.FcntlFlock(portLocks.f.Fd(), syscall.F_SETLK, &lock) == nil
}

// kernelPort is a port that the kernel picked for a listener, free a moment ago.
func kernelPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// The ports FreePort picks from (variables for TestFreePortAcrossProcesses).
var portsFrom, portsTo = 20000, 29999

var (
	handedOutMu sync.Mutex
	handedOut   = map[int]bool{}
)

// ephemeralPortsFrom is the first port that the kernel hands to outgoing connections
// (32768 when it cannot tell).
func ephemeralPortsFrom() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		return 32768
	}
	port, err := strconv.Atoi(fields[0])
	if err != nil {
		return 32768
	}
	return port
}

// FreeAddr returns 127.0.0.1:PORT for a port that was free a moment ago.
func FreeAddr() (string, error) {
	port, err := FreePort()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("127.0.0.1:%d", port), nil
}

// Addr is FreeAddr for a test, which it fails when no port is free.
func Addr(tb TB) string {
	tb.Helper()
	addr, err := FreeAddr()
	if err != nil {
		tb.Fatalf("find a free port: %v", err)
	}
	return addr
}

// Output collects what a process writes while the test reads it.
type Output struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// Tail returns the last lines of out, for an error that shows where a process's log
// ends.
func Tail(out []byte, lines int) string {
	all := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	return strings.Join(all[max(0, len(all)-lines):], "\n")
}

// Scrape fetches the Prometheus text of http://addr/metrics, waiting at most timeout
// (a paused process must not stall its caller for long).
func Scrape(addr string, timeout time.Duration) (string, error) {
	client := &http.Client{Timeout: timeout}
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

// ScrapeAs GETs url with client and token as the bearer ("" for none), as Prometheus
// scrapes a secured /metrics; it returns the status (0 when the request failed) and the
// body (the error's text then).
func ScrapeAs(client *http.Client, url, token string) (int, string) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, err.Error()
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// MetricSum adds the samples of metric name in Prometheus text whose labels (the text
// between the braces) keep accepts; all of them when keep is nil.
func MetricSum(body, name string, keep func(labels string) bool) float64 {
	var sum float64
	for _, line := range strings.Split(body, "\n") {
		var labels, value string
		switch {
		case strings.HasPrefix(line, name+"{"):
			end := strings.LastIndexByte(line, '}')
			if end < 0 {
				continue
			}
			labels, value = line[len(name)+1:end], strings.TrimSpace(line[end+1:])
		case strings.HasPrefix(line, name+" "):
			value = strings.TrimSpace(line[len(name):])
		default:
			continue
		}
		if keep != nil && !keep(labels) {
			continue
		}
		if v, err := strconv.ParseFloat(value, 64); err == nil {
			sum += v
		}
	}
	return sum
}

// Namespace creates a namespace named prefix and a random suffix, for one test, and
// returns its name. It is left in place when the test ends: a Student whose finalizer
// no controller removes any more would keep it Terminating.
func Namespace(tb TB, kube kubernetes.Interface, prefix string) string {
	tb.Helper()
	ns, err := kube.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix}}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("create a namespace: %v", err)
	}
	return ns.Name
}

// EnsureNamespace creates the namespace name unless it exists.
func EnsureNamespace(ctx context.Context, kube kubernetes.Interface, name string) error {
	_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// RepoRoot returns the repository's root folder: found from this source file, or, in a
// build with -trimpath (whose source paths are import paths: make test's suites without
// the race detector), from the working folder up, which go test makes the package's.
func RepoRoot() (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		root := filepath.Join(filepath.Dir(file), "..", "..")
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
			return "", fmt.Errorf("repository root not found from %s: %w", file, err)
		}
		return filepath.Clean(root), nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	return rootAbove(wd)
}

// rootAbove returns the nearest folder from dir up whose go.mod is the repository's.
func rootAbove(dir string) (string, error) {
	for d := dir; ; d = filepath.Dir(d) {
		if isRepoRoot(d) {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("repository root not found from %s: no go.mod of module %s above it", dir, modulePath)
		}
	}
}

// modulePath is the repository's module, whose go.mod marks its root (hack/tools has
// modules of its own).
const modulePath = "github.com/student-controller/student-controller"

func isRepoRoot(dir string) bool {
	data, err := os.ReadFile(filepath.Join(dir, "go.mod")) // #nosec G304 -- go.mod of a parent folder
	if err != nil {
		return false
	}
	return modfile.ModulePath(data) == modulePath
}

// TB is what the helpers use of a test: the methods of testing.TB they call. An
// interface of its own keeps package testing out of the programs that share these
// packages (make run's launcher).
type TB interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Errorf(format string, args ...any)
	Cleanup(func())
}
