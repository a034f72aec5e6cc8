// Package ctrlbin builds the controller (and the bench's other programs) the one way
// the tests, the chaos suite and the bench build it, and starts it with its own metrics
// and probe addresses.
package ctrlbin

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/freeport"
	"github.com/student-controller/student-controller/internal/testenv/proc"
)

// ShippedTags are the build tags of the controller as make build and make image build
// it (the Makefile's GO_TAGS; TestShippedTags checks they agree): every build here has
// them, so that tests and the bench run what ships.
const ShippedTags = "grpcnotrace"

// Build is one `go build` of a package of this repository.
type Build struct {
	// Package is the package to build; ./cmd/student-controller when empty.
	Package string
	// Race builds with the race detector (the chaos suite's controllers under make chaos).
	Race bool
	// Tags are build tags beside ShippedTags, comma-separated (the bench's contender
	// without the history).
	Tags string
	// Root is the repository; found from this file when empty.
	Root string
	// Out is the binary's path; a file in a new temporary folder when empty.
	Out string
}

// Run builds and returns the binary's path. ctx ending stops the build.
func (b Build) Run(ctx context.Context) (path string, err error) {
	pkg := b.Package
	if pkg == "" {
		pkg = "./cmd/student-controller"
	}
	root := b.Root
	if root == "" {
		var err error
		if root, err = testenv.RepoRoot(); err != nil {
			return "", err
		}
	}
	out := b.Out
	if out == "" {
		dir, err := os.MkdirTemp("", "student-controller-bin-")
		if err != nil {
			return "", err
		}
		out = filepath.Join(dir, filepath.Base(pkg))
		defer func() {
			if path == "" {
				_ = os.RemoveAll(dir) // the build failed: nothing to keep
			}
		}()
	}
	args := []string{"build", "-o", out}
	cgo := "CGO_ENABLED=0"
	if b.Race {
		// As go test -race compiles the test binaries: they share every package. The
		// race detector needs cgo on Linux.
		args, cgo = append(args, "-race"), "CGO_ENABLED=1"
	} else {
		// Static, as go vet (make verify), make build, make image and the control plane
		// compile: they share every package.
		args = append(args, "-trimpath")
	}
	tags := ShippedTags
	if b.Tags != "" {
		tags += "," + b.Tags
	}
	args = append(args, "-tags", tags)
	cmd := exec.CommandContext(ctx, "go", append(args, pkg)...) // #nosec G204 -- go build of this repository's packages
	cmd.Dir = root
	cmd.Env = append(os.Environ(), cgo)
	if o, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go %v: %v\n%s", cmd.Args[1:], err, o)
	}
	return out, nil
}

var (
	mu    sync.Mutex
	built = map[Build]string{}
	// failed keeps a failed build's error, so that the other tests fail at once rather
	// than each building again.
	failed = map[Build]error{}
)

// Binary builds b once per test binary and returns its path; tb fails when it cannot.
// The binaries go away with RemoveAll.
func (b Build) Binary(tb testing.TB) string {
	tb.Helper()
	mu.Lock()
	defer mu.Unlock()
	if path, ok := built[b]; ok {
		return path
	}
	if err := failed[b]; err != nil {
		tb.Fatal(err)
	}
	path, err := b.Run(context.Background())
	if err != nil {
		failed[b] = err
		tb.Fatal(err)
	}
	built[b] = path
	return path
}

// Binary is the controller as Build{} makes it, once per test binary.
func Binary(tb testing.TB) string {
	tb.Helper()
	return Build{}.Binary(tb)
}

// RemoveAll removes what Binary built; a TestMain calls it when the tests are done.
func RemoveAll() error {
	mu.Lock()
	defer mu.Unlock()
	var first error
	for b, path := range built {
		if b.Out == "" {
			if err := os.RemoveAll(filepath.Dir(path)); err != nil && first == nil {
				first = err
			}
		}
		delete(built, b)
	}
	return first
}

// Controller is a controller process with metrics and probe addresses of its own.
type Controller struct {
	*proc.Process
	MetricsAddr, ProbeAddr string
}

// New prepares the controller binary bin with args and free 127.0.0.1 metrics and
// probe addresses (given after args, so they win); log and env are as in proc.Spec.
// It does not start it.
func New(name, bin, log string, args []string, env ...string) (*Controller, error) {
	c := &Controller{}
	for _, addr := range []*string{&c.MetricsAddr, &c.ProbeAddr} {
		var err error
		if *addr, err = freeport.Addr(); err != nil {
			return nil, err
		}
	}
	c.Process = proc.New(proc.Spec{
		Name: name,
		Path: bin,
		Args: append(slices.Clone(args), "--metrics-bind-address", c.MetricsAddr, "--health-probe-bind-address", c.ProbeAddr),
		Env:  env,
		Log:  log,
	})
	return c, nil
}

// leaderScrapeTimeout bounds one look at a controller's metrics: a paused controller
// must not stall the wait for another to lead.
const leaderScrapeTimeout = 500 * time.Millisecond

// Leading says whether c reports that it holds the Lease (its
// leader_election_master_status is 1, which client-go sets once it has taken it).
func (c *Controller) Leading() bool {
	body, err := testenv.Scrape(c.MetricsAddr, leaderScrapeTimeout)
	return err == nil && testenv.MetricSum(body, "leader_election_master_status", nil) == 1
}

// Writing says whether c reports that it holds its owner's write fence in the
// registry (student_controller_registry_fence_held is 1): it may write.
func (c *Controller) Writing() bool {
	body, err := testenv.Scrape(c.MetricsAddr, leaderScrapeTimeout)
	return err == nil && testenv.MetricSum(body, "student_controller_registry_fence_held", nil) == 1
}

// WaitLeader waits until one of cs leads, other than in the run not (the Exited
// channel of the run to leave out; nil: none), and returns it with the time it was
// first seen leading. A controller started again after an exit is another run: a
// leader stopped by SIGTERM may lead again in its next run.
func WaitLeader(ctx context.Context, timeout time.Duration, not <-chan struct{}, cs ...*Controller) (*Controller, time.Time, error) {
	c, err := WaitFor(ctx, timeout, not, "no controller took the lead", (*Controller).Leading, cs...)
	if err != nil {
		return nil, time.Time{}, err
	}
	return c, time.Now(), nil
}

// WaitFor polls cs every 100 ms until cond holds for one of them, other than in the
// run not, and returns it; after timeout it fails with failure.
func WaitFor(ctx context.Context, timeout time.Duration, not <-chan struct{}, failure string, cond func(*Controller) bool, cs ...*Controller) (*Controller, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, c := range cs {
			// Exited before cond: once the run not has exited, the controller's
			// addresses answer for its next run only.
			if (not == nil || c.Exited() != not) && cond(c) {
				return c, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil, fmt.Errorf("%s within %v", failure, timeout)
}
