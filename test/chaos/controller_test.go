package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/student-controller/student-controller/internal/testenv"
)

// buildController builds the controller with the race detector into dir.
func buildController(root, dir string) (string, error) {
	bin := filepath.Join(dir, "student-controller")
	build := exec.Command("go", "build", "-race", "-o", bin, "./cmd/student-controller")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build -race ./cmd/student-controller: %v\n%s", err, out)
	}
	return bin, nil
}

// replica is one controller process with its own metrics and probe ports.
type replica struct {
	*proc
	metricsAddr string
	exits       atomic.Int32
}

// controllers are replicas that a supervisor starts again 1 s after any exit, as the
// kubelet restarts a container: killed by a fault, or exited after losing its Lease.
type controllers struct {
	replicas []*replica
	stopping atomic.Bool
	wg       sync.WaitGroup
}

// startControllers runs n replicas of bin with args, logging into dir.
func startControllers(bin string, n int, args, env []string, dir string) (*controllers, error) {
	cs := &controllers{}
	for i := range n {
		metricsAddr, err := testenv.FreeAddr()
		if err != nil {
			return nil, err
		}
		probeAddr, err := testenv.FreeAddr()
		if err != nil {
			return nil, err
		}
		name := fmt.Sprintf("controller-%d", i)
		r := &replica{metricsAddr: metricsAddr, proc: &proc{
			name: name,
			path: bin,
			args: append(slices.Clone(args), "--metrics-bind-address", metricsAddr, "--health-probe-bind-address", probeAddr),
			env:  env,
			log:  filepath.Join(dir, name+".log"),
		}}
		if err := r.start(); err != nil {
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
		<-r.running()
		if cs.stopping.Load() {
			return
		}
		r.exits.Add(1)
		time.Sleep(time.Second)
		for !cs.stopping.Load() {
			if err := r.start(); err == nil {
				break
			}
			time.Sleep(time.Second)
		}
		if cs.stopping.Load() {
			return
		}
	}
}

// stop stops every replica for good.
func (cs *controllers) stop() error {
	cs.stopping.Store(true)
	var errs []error
	for _, r := range cs.replicas {
		errs = append(errs, r.stop(50*time.Second))
	}
	cs.wg.Wait()
	return errors.Join(errs...)
}

// scrapeTimeout bounds a scrape of a replica's metrics: a paused one never answers.
const scrapeTimeout = 500 * time.Millisecond

// leader is the replica whose metrics say it leads, or nil.
func (cs *controllers) leader() *replica {
	for _, r := range cs.replicas {
		body, err := testenv.Scrape(r.metricsAddr, scrapeTimeout)
		if err == nil && testenv.MetricSum(body, "leader_election_master_status", nil) == 1 {
			return r
		}
	}
	return nil
}

// waitLeader waits until a replica other than not leads, and returns it with the time
// it was first seen leading.
func (cs *controllers) waitLeader(ctx context.Context, not *replica, timeout time.Duration) (*replica, time.Time, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if r := cs.leader(); r != nil && r != not {
			return r, time.Now(), nil
		}
		select {
		case <-ctx.Done():
			return nil, time.Time{}, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil, time.Time{}, fmt.Errorf("no replica took the lead within %v", timeout)
}

// rowWrites is, for each replica that answers, how many registry rows it has written
// (any action) since it last started.
func (cs *controllers) rowWrites() map[*replica]int {
	out := map[*replica]int{}
	for _, r := range cs.replicas {
		if body, err := testenv.Scrape(r.metricsAddr, scrapeTimeout); err == nil {
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
		log, err := os.ReadFile(r.log)
		if err != nil {
			out = append(out, err.Error())
			continue
		}
		for _, line := range strings.Split(string(log), "\n") {
			if strings.HasPrefix(line, "panic:") || strings.Contains(line, "WARNING: DATA RACE") || strings.HasPrefix(line, "fatal error:") {
				out = append(out, r.name+": "+line)
			}
		}
	}
	return out
}
