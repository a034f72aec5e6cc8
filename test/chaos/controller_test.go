package chaos

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/ctrlbin"
)

// replica is one controller process with its own metrics and probe ports.
type replica struct {
	*ctrlbin.Controller
	exits atomic.Int32
}

// controllers are replicas that a supervisor starts again 1 s after any exit, as the
// kubelet restarts a container: killed by a fault, or exited after losing its Lease.
type controllers struct {
	replicas []*replica
	stopping atomic.Bool
	wg       sync.WaitGroup
	// held, under mu, keeps the supervisors from starting any replica: an operator
	// has scaled the controller down (hold).
	mu   sync.Mutex
	held bool
}

// startControllers runs n replicas of bin with args, logging into dir.
func startControllers(bin string, n int, args, env []string, dir string) (*controllers, error) {
	cs := &controllers{}
	for i := range n {
		name := fmt.Sprintf("controller-%d", i)
		c, err := ctrlbin.New(name, bin, filepath.Join(dir, name+".log"), args, env...)
		if err != nil {
			return nil, errors.Join(err, cs.stop())
		}
		r := &replica{Controller: c}
		if err := r.Start(); err != nil {
			return nil, errors.Join(err, cs.stop())
		}
		cs.replicas = append(cs.replicas, r)
		cs.wg.Add(1)
		go cs.supervise(r)
	}
	return cs, nil
}

func (cs *controllers) supervise(r *replica) {
	defer cs.wg.Done()
	for {
		<-r.Exited()
		if cs.stopping.Load() {
			return
		}
		r.exits.Add(1)
		time.Sleep(time.Second)
		for !cs.stopping.Load() {
			if cs.start(r) {
				break
			}
			time.Sleep(time.Second)
		}
		if cs.stopping.Load() {
			return
		}
	}
}

// start starts r again unless the replicas are held down or stopping: whether it did.
func (cs *controllers) start(r *replica) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return !cs.held && !cs.stopping.Load() && r.Start() == nil
}

// hold stops every replica (SIGTERM: each drains and gives the fence back) and keeps
// them down until unhold, as an operator scales the controller to zero.
func (cs *controllers) hold() error {
	cs.mu.Lock()
	cs.held = true
	cs.mu.Unlock()
	var errs []error
	for _, r := range cs.replicas {
		errs = append(errs, r.Stop(50*time.Second))
	}
	return errors.Join(errs...)
}

// unhold lets the supervisors start the replicas again.
func (cs *controllers) unhold() {
	cs.mu.Lock()
	cs.held = false
	cs.mu.Unlock()
}

// stop stops every replica for good.
func (cs *controllers) stop() error {
	cs.mu.Lock() // no supervisor starts a replica from here on
	cs.stopping.Store(true)
	cs.mu.Unlock()
	var errs []error
	for _, r := range cs.replicas {
		errs = append(errs, r.Stop(50*time.Second))
	}
	cs.wg.Wait()
	return errors.Join(errs...)
}

// scrapeTimeout bounds a scrape of a replica's metrics: a paused one never answers.
const scrapeTimeout = 500 * time.Millisecond

// A replicaRun is one start of a replica, named by its Exited channel. Its supervisor
// starts a replica again after any exit, under a new identity: that is another run.
type replicaRun = <-chan struct{}

// waitLeader waits until a replica leads, other than in the run not (nil: any), and
// returns it with the time it was first seen leading.
func (cs *controllers) waitLeader(ctx context.Context, not replicaRun, timeout time.Duration) (*replica, time.Time, error) {
	c, seen, err := ctrlbin.WaitLeader(ctx, timeout, not, cs.controllers()...)
	return cs.replicaOf(c), seen, err
}

// waitWriter waits until a replica holds the registry's write fence, other than in the
// run not (nil: any), and returns the time it was first seen so.
func (cs *controllers) waitWriter(ctx context.Context, not replicaRun, timeout time.Duration) (time.Time, error) {
	_, err := ctrlbin.WaitFor(ctx, timeout, not, "no replica held the registry's write fence", (*ctrlbin.Controller).Writing, cs.controllers()...)
	if err != nil {
		return time.Time{}, err
	}
	return time.Now(), nil
}

func (cs *controllers) controllers() []*ctrlbin.Controller {
	out := make([]*ctrlbin.Controller, len(cs.replicas))
	for i, r := range cs.replicas {
		out[i] = r.Controller
	}
	return out
}

// replicaOf is the replica of c; nil for nil.
func (cs *controllers) replicaOf(c *ctrlbin.Controller) *replica {
	for _, r := range cs.replicas {
		if c != nil && r.Controller == c {
			return r
		}
	}
	return nil
}

// waitSteadyWriter waits until one replica has held the registry's write fence for
// steady without a break. A leader that held the fence before an outage may still say
// so for a moment after it, and then lose its Lease and give the fence back.
func (cs *controllers) waitSteadyWriter(ctx context.Context, steady, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var writer *replica
	var since time.Time
	for time.Now().Before(deadline) {
		var now *replica
		for _, r := range cs.replicas {
			if r.Writing() {
				now = r
				break
			}
		}
		switch {
		case now == nil:
			writer = nil
		case now != writer:
			writer, since = now, time.Now()
		case time.Since(since) >= steady:
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("no replica held the registry's write fence for %v without a break within %v", steady, timeout)
}

// rowWrites is, for each replica that answers, how many registry rows it has written
// (any action) since it last started.
func (cs *controllers) rowWrites() map[*replica]int {
	out := map[*replica]int{}
	for _, r := range cs.replicas {
		if body, err := testenv.Scrape(r.MetricsAddr, scrapeTimeout); err == nil {
			out[r] = int(testenv.MetricSum(body, "student_controller_registry_rows_written_total", nil))
		}
	}
	return out
}

// rowWritesSince is how many rows the replicas wrote between two rowWrites readings. A
// replica whose count went down has restarted in between: it counts from its restart,
// and what it wrote before its exit is not counted.
func rowWritesSince(before, after map[*replica]int) int {
	n := 0
	for r, count := range after {
		if count >= before[r] {
			n += count - before[r]
		} else {
			n += count
		}
	}
	return n
}

// logProblems returns the lines of the replicas' logs that must never be there: a
// panic, a data race, a fatal runtime error.
func (cs *controllers) logProblems() []string {
	var out []string
	for _, r := range cs.replicas {
		for _, line := range strings.Split(r.Output(), "\n") {
			if strings.HasPrefix(line, "panic:") || strings.Contains(line, "WARNING: DATA RACE") || strings.HasPrefix(line, "fatal error:") {
				out = append(out, r.Name()+": "+line)
			}
		}
	}
	return out
}
