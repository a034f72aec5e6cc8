// Package testenv is the home of what only the tests, the bench and `make run` use: its
// packages start the real control plane (controlplane), PostgreSQL (pgtest) and the
// programs that touch a registry from outside (registrytest), on ports from freeport;
// this package holds what they share: a place for what they print, scrapes of their
// metrics, and namespaces for a test.
package testenv

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/mod/modfile"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/student-controller/student-controller/internal/testenv/freeport"
)

// Addr is freeport.Addr for a test, which it fails when no port is free.
func Addr(tb TB) string {
	tb.Helper()
	addr, err := freeport.Addr()
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
