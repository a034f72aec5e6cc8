package chaos

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	_ "modernc.org/sqlite"

	"github.com/student-controller/student-controller/internal/registry"
	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/controlplane"
	"github.com/student-controller/student-controller/internal/testenv/ctrlbin"
	"github.com/student-controller/student-controller/internal/testenv/pgtest"
	"github.com/student-controller/student-controller/internal/testenv/proc"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
)

const (
	owner      = "chaos-controller"
	otherOwner = "another-controller"

	// The replicas' Lease: shorter than the default 15 s, 10 s and 2 s so that a run
	// waits less for a takeover.
	leaseDuration = 8 * time.Second
	renewDeadline = 5 * time.Second
	retryPeriod   = time.Second

	// outage is how long a killed or stopped server stays down.
	outage = 3 * time.Second
	// recoveryLimit is how long every invariant may take to hold again once a bulk
	// and its fault are over; the sweep (every 5 minutes) is not needed for it.
	recoveryLimit = 4 * time.Minute
)

// The faults, in the order a run strikes them. Each strikes during a bulk of creates,
// updates and deletes, after a third of its requests (faultRegistryRestored after two
// thirds).
const (
	faultControllersKilled   = "controller SIGKILLed (both replicas), mid-bulk"
	faultAPIServerStopped    = "kube-apiserver stopped (SIGTERM), restarted"
	faultEtcdKilled          = "etcd SIGKILLed, restarted"
	faultLeaderKilled        = "leader SIGKILLed, standby takes over"
	faultAPIServerKilled     = "kube-apiserver SIGKILLed, restarted"
	faultPostgresKilled      = "PostgreSQL SIGKILLed, restarted"
	faultLeaderPaused        = "leader SIGSTOPped past its Lease, then SIGCONT"
	faultControllersOnDelete = "controller SIGKILLed (both replicas) while deletes arrive"
	faultLeaderStopped       = "leader stopped (SIGTERM), hands the Lease and the registry's fence over"
	faultClone               = "a clone of the cluster runs a controller on the same registry and owner"
	faultRegistryRestored    = "registry put back from a backup of the bulk's start, controller scaled to zero meanwhile; an operator confirms"
)

func schedule(postgres bool) []string {
	faults := []string{faultControllersKilled, faultAPIServerStopped, faultEtcdKilled, faultLeaderKilled, faultLeaderStopped,
		faultClone, faultRegistryRestored, faultAPIServerKilled}
	if postgres {
		faults = append(faults, faultPostgresKilled)
	}
	return append(faults, faultLeaderPaused, faultControllersOnDelete)
}

// TestChaos runs the fault schedule on each registry. CHAOS_N Students in all (300
// when unset, the size `make test` runs); with CHAOS_RESULTS set, the results go into
// that folder as <date>.md and <date>.json. The processes' logs are kept when the run
// fails or CHAOS_KEEP_LOGS is set.
func TestChaos(t *testing.T) {
	n := 300
	if v := os.Getenv("CHAOS_N"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 50 {
			t.Fatalf("CHAOS_N=%q: want a number of Students, at least 50", v)
		}
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin, err := ctrlbin.Build{Race: raceControllers, Root: root, Out: filepath.Join(t.TempDir(), "student-controller")}.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	report := &report{N: n, Started: time.Now().UTC()}
	for _, reg := range []string{"sqlite", "postgres"} {
		t.Run(reg, func(t *testing.T) {
			res := runChaos(t, root, bin, reg, n)
			report.Runs = append(report.Runs, res)
		})
	}
	report.Finished = time.Now().UTC()
	t.Log("\n" + report.markdown())
	if dir := os.Getenv("CHAOS_RESULTS"); dir != "" {
		if err := report.write(dir); err != nil {
			t.Fatal(err)
		}
	}
}

// world is what a run strikes and checks.
type world struct {
	t       *testing.T
	cluster *cluster
	pg      *pgtest.Server
	ctrl    *controllers
	// bin, args and env run a controller; dir holds the run's logs and state.
	bin, dir string
	args     []string
	env      []string
	loader   *loader
	checker  *checker
	// registryURL is the controllers' --registry; db the run's own connection to it.
	registryURL string
	db          *database
	// backup is the one taken as the bulk of faultRegistryRestored began.
	backup *backup
}

func runChaos(t *testing.T, root, bin, reg string, n int) *runResult {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "student-controller-chaos-")
	if err != nil {
		t.Fatal(err)
	}
	res := &runResult{Registry: reg}
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("CHAOS_KEEP_LOGS") != "" {
			t.Logf("logs of the run kept in %s", dir)
		} else {
			os.RemoveAll(dir)
		}
	})

	c, err := startCluster(ctx, root, dir)
	if c != nil {
		t.Cleanup(func() {
			if err := c.Stop(); err != nil {
				t.Error(err)
			}
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, cluster: c, bin: bin, dir: dir}

	// The registry, and rows of another owner that must stay as they are.
	var registryURL string
	var env []string
	var db *sql.DB
	w.db = &database{}
	switch reg {
	case "sqlite":
		path := filepath.Join(dir, "registry.db")
		registryURL = "sqlite://" + path
		w.db.open = func() (*sql.DB, error) { return sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)") }
		db, err = w.db.open()
	case "postgres":
		if w.pg, err = pgtest.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := w.pg.Close(); err != nil {
				t.Error(err)
			}
		})
		if err := w.pg.CreateDatabase(ctx, "registry"); err != nil {
			t.Fatal(err)
		}
		registryURL = w.pg.URL("registry", false)
		env = []string{"REGISTRY_PASSWORD=" + pgtest.Password}
		db, err = sql.Open("pgx", w.pg.URL("registry", true))
	}
	if err != nil {
		t.Fatal(err)
	}
	w.db.p.Store(db)
	w.registryURL = registryURL
	t.Cleanup(func() { w.db.get().Close() })
	others, err := seedOtherOwner(ctx, registryURL, db)
	if err != nil {
		t.Fatal(err)
	}

	args := []string{
		"--kubeconfig", c.controllerKubeconfig,
		"--registry", registryURL, "--registry-owner", owner,
		"--leader-elect", "--leader-elect-namespace", controlplane.ControllerNamespace,
		"--leader-elect-lease-duration", leaseDuration.String(),
		"--leader-elect-renew-deadline", renewDeadline.String(),
		"--leader-elect-retry-period", retryPeriod.String(),
		"--registry-fence-lease", fenceLease.String(),
		// A backup put back brings back a row for each Student deleted since, which
		// one sweep releases once confirmed: about n/50 of them, past the default
		// bound (100) from n = 5000 on.
		"--sweep-max-deletions", strconv.Itoa(max(100, n)),
		"-v=2",
	}
	if strings.HasPrefix(registryURL, "sqlite:") {
		args = append(args, "--sqlite-shared-file") // the replicas share the one file
	}
	w.args, w.env = args, env
	if w.ctrl, err = startControllers(bin, 2, args, env, dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := w.ctrl.stop(); err != nil {
			t.Error(err)
		}
	})
	if _, _, err := w.ctrl.waitLeader(ctx, nil, time.Minute); err != nil {
		t.Fatal(err)
	}

	client := versioned.NewForConfigOrDie(c.admin)
	for _, ns := range namespaces {
		if err := testenv.EnsureNamespace(ctx, kubernetes.NewForConfigOrDie(c.admin), ns); err != nil {
			t.Fatal(err)
		}
	}
	// The loader keeps to 50 requests a second, so that a bulk is still arriving when
	// its fault strikes.
	loaderConfig := rest.CopyConfig(c.admin)
	loaderConfig.QPS, loaderConfig.Burst = 50, 10
	w.loader = &loader{client: versioned.NewForConfigOrDie(loaderConfig), rnd: rand.New(rand.NewPCG(uint64(n), 13))}
	watchCtx, stopWatching := context.WithCancel(ctx)
	defer stopWatching()
	watcher := &generationWatcher{db: w.db}
	go watcher.run(watchCtx, 250*time.Millisecond)
	w.checker = &checker{
		client: client, db: w.db, owner: owner, others: others, watcher: watcher,
		students: func() []*student { return w.loader.all },
		logs:     w.ctrl.logProblems,
	}

	faults := schedule(reg == "postgres")
	creating := len(faults) - 1 // the last bulk only deletes
	start := time.Now()
	for i, fault := range faults {
		creates, updates, deletes, batches := n/creating, n/creating/2, n/creating/5, 1
		if i < n%creating {
			creates++ // n in all
		}
		if i == creating {
			creates, updates, deletes, batches = 0, 0, n/4, 4
		}
		ops, counts := w.loader.plan(creates, updates, deletes, batches)
		ph := w.phase(ctx, fault, ops, start)
		ph.Requests = counts
		res.Phases = append(res.Phases, ph)
		var restored string
		if fault == faultRegistryRestored {
			restored = fmt.Sprintf("; the backup put back left %d rows to write back, %d to release, %d released rows lost",
				ph.RowsToWriteBack, ph.RowsToRelease, ph.RowsLost)
		}
		t.Logf("%s: struck at %v, healed after %v, load took %v, invariants held again after %v (API writes %d, row writes %d)%s",
			fault, ph.StruckAt, ph.Outage, ph.LoadTook, ph.Recovery, ph.APIWrites, ph.RowWrites, restored)
		if !ph.Held {
			t.Errorf("%s: invariants did not all hold within %v: %v", fault, recoveryLimit, ph.Violations)
			break
		}
	}
	res.Took = duration(time.Since(start))

	// The end state, read once more after a pause with nothing going on.
	time.Sleep(5 * time.Second)
	final, err := w.checker.check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res.Final = finalResults(final)
	for _, inv := range res.Final {
		if !inv.Held {
			t.Errorf("%s: %v", inv.Invariant, inv.Violations)
		}
	}
	res.tally(w.loader.all)
	for _, r := range w.ctrl.replicas {
		res.ControllerExits += int(r.exits.Load())
	}
	res.GenerationReads = watcher.count()
	return res
}

// phase runs one bulk, strikes fault after a third of its requests (two thirds for
// a backup put back), and waits until every invariant holds again.
func (w *world) phase(ctx context.Context, fault string, ops []op, runStart time.Time) phaseResult {
	ph := phaseResult{Fault: fault}
	if fault == faultRegistryRestored {
		var err error
		if w.backup, err = w.takeBackup(ctx); err == nil {
			err = w.waitMarkPast(ctx, w.backup)
		}
		if err != nil {
			w.t.Fatalf("%s: %v", fault, err)
		}
	}
	loadStart := time.Now()
	loadDone := make(chan error, 1)
	var loadTook time.Duration
	w.loader.start()
	go func() {
		err := w.loader.run(ctx, ops, 8)
		loadTook = time.Since(loadStart)
		loadDone <- err
	}()

	strikeAt := len(ops) / 3
	if fault == faultRegistryRestored {
		// Two thirds: Students deleted before the controller goes down leave rows the
		// backup puts back; the last third arrives while it is down.
		strikeAt = 2 * len(ops) / 3
	}
	for w.loader.done.Load() < int64(strikeAt) && len(loadDone) == 0 {
		time.Sleep(20 * time.Millisecond)
	}
	struck := time.Now()
	ph.StruckAt = duration(struck.Sub(runStart))
	healed, takeover, err := w.strike(ctx, fault, &ph)
	if err != nil {
		w.t.Fatalf("%s: %v", fault, err)
	}
	ph.Outage = duration(healed.Sub(struck))
	if ph.Writing > duration(writingLimit) {
		w.t.Errorf("%s: a replica held the registry's fence %v after the leader stopped, more than %v", fault, ph.Writing, writingLimit)
	}
	if ph.CloneRowWrites > 0 || ph.CloneHeldFence {
		w.t.Errorf("%s: the clone's controller wrote %d rows (held the fence: %v), want none", fault, ph.CloneRowWrites, ph.CloneHeldFence)
	}
	if takeover > 0 {
		ph.Takeover = duration(takeover)
		ph.TakeoverLimit = duration(takeoverLimit)
		if takeover > takeoverLimit {
			w.t.Errorf("%s: a replica took the lead %v after the leader stopped, more than %v", fault, takeover, takeoverLimit)
		}
	}
	if err := <-loadDone; err != nil {
		w.t.Fatalf("%s: the loader: %v", fault, err)
	}
	ph.LoadTook = duration(loadTook)

	// From now on nothing changes the Students but the controller.
	settled := time.Now()
	rowsBefore := w.ctrl.rowWrites()
	apiBefore, apiErr := w.cluster.studentWrites(ctx)
	var last violations
	for time.Since(settled) < recoveryLimit {
		v, err := w.checker.check(ctx)
		if err == nil && len(v) == 0 {
			ph.Held = true
			break
		}
		last = v
		if err != nil {
			last = violations{"check": {err.Error()}}
		}
		time.Sleep(500 * time.Millisecond)
	}
	ph.Recovery = duration(time.Since(settled))
	ph.SinceStrike = duration(time.Since(struck))
	ph.RowWrites = rowWritesSince(rowsBefore, w.ctrl.rowWrites())
	apiAfter, err := w.cluster.studentWrites(ctx)
	if err = errors.Join(apiErr, err); err != nil {
		w.t.Errorf("%s: the API server's metrics: %v", fault, err)
	}
	ph.APIWrites = apiAfter - apiBefore
	if !ph.Held {
		ph.Violations = last
	}
	return ph
}

// takeoverLimit bounds how long after the leader stops a new one leads: the Lease runs
// out leaseDuration after the leader's last renewal, and the standby tries every
// retryPeriod, jittered by up to 1.2 times that (client-go), once after seeing the last
// renewal and once after the expiry.
const takeoverLimit = leaseDuration + 2*retryPeriod*22/10 + time.Second

// fenceLease is the replicas' --registry-fence-lease: as long as the Lease, so that the
// fence of a killed leader runs out about when its Lease does.
const fenceLease = leaseDuration

// writingLimit bounds how long after the leader stops a replica holds the registry's
// fence: the takeover, then the fence's lease if it has not run out by then (it was
// renewed at most a third of it before the kill), then a retry.
const writingLimit = takeoverLimit + fenceLease + time.Second

// strike strikes fault and heals it: it returns when the struck part is back (or, for
// the controller, when a replica leads again), and for a leader fault how long until
// a new leader was seen.
func (w *world) strike(ctx context.Context, fault string, ph *phaseResult) (healed time.Time, takeover time.Duration, err error) {
	c := w.cluster
	switch fault {
	case faultControllersKilled, faultControllersOnDelete:
		for _, r := range w.ctrl.replicas {
			// A replica between runs (it exited, say after losing its Lease, and its
			// supervisor starts it again in a second) is down already.
			if err := r.Kill(); err != nil && !errors.Is(err, proc.ErrNotRunning) {
				return time.Time{}, 0, err
			}
		}
		_, seen, err := w.ctrl.waitLeader(ctx, nil, time.Minute)
		return seen, 0, err

	case faultLeaderKilled:
		// The lead may be changing hands after the fault before: wait for a leader.
		leader, _, err := w.ctrl.waitLeader(ctx, nil, time.Minute)
		if err != nil {
			return time.Time{}, 0, fmt.Errorf("no leader to kill: %w", err)
		}
		killed := time.Now()
		if err := leader.Kill(); err != nil {
			return time.Time{}, 0, err
		}
		// The killed replica restarts after a second, under a new identity; whichever
		// leads next took over, and writes once the killed one's fence has run out.
		_, seen, err := w.ctrl.waitLeader(ctx, nil, time.Minute)
		if err != nil {
			return seen, 0, err
		}
		writing, err := w.ctrl.waitWriter(ctx, nil, time.Minute)
		ph.Writing = duration(writing.Sub(killed))
		return seen, seen.Sub(killed), err

	case faultLeaderStopped:
		leader, _, err := w.ctrl.waitLeader(ctx, nil, time.Minute)
		if err != nil {
			return time.Time{}, 0, fmt.Errorf("no leader to stop: %w", err)
		}
		stoppedRun := leader.Exited()
		stopped := time.Now()
		if err := leader.Signal(syscall.SIGTERM); err != nil {
			return time.Time{}, 0, err
		}
		// It drains, gives the fence and the Lease back and exits 0; its supervisor
		// starts it again after a second. The standby leads and writes at once, or the
		// stopped replica's next run does, if it tries the Lease first.
		_, seen, err := w.ctrl.waitLeader(ctx, stoppedRun, time.Minute)
		if err != nil {
			return seen, 0, err
		}
		writing, err := w.ctrl.waitWriter(ctx, stoppedRun, time.Minute)
		ph.Writing = duration(writing.Sub(stopped))
		return seen, seen.Sub(stopped), err

	case faultClone:
		return w.clone(ctx, ph)

	case faultRegistryRestored:
		healed, err := w.restoreBackup(ctx, w.backup, ph)
		return healed, 0, err

	case faultLeaderPaused:
		leader, _, err := w.ctrl.waitLeader(ctx, nil, time.Minute)
		if err != nil {
			return time.Time{}, 0, fmt.Errorf("no leader to pause: %w", err)
		}
		paused := time.Now()
		if err := leader.Signal(syscall.SIGSTOP); err != nil {
			return time.Time{}, 0, err
		}
		_, seen, err := w.ctrl.waitLeader(ctx, leader.Exited(), time.Minute)
		// Stay paused past the Lease, then wake up with a cache as old as the pause.
		time.Sleep(time.Until(paused.Add(leaseDuration + 2*time.Second)))
		if contErr := leader.Signal(syscall.SIGCONT); contErr != nil {
			err = errors.Join(err, contErr)
		}
		return time.Now(), seen.Sub(paused), err

	case faultAPIServerStopped, faultAPIServerKilled:
		if fault == faultAPIServerStopped {
			err = c.APIServer.Stop(time.Minute)
		} else {
			err = c.APIServer.Kill()
		}
		if err != nil {
			return time.Time{}, 0, err
		}
		time.Sleep(outage)
		return time.Now(), 0, c.StartAPIServer(ctx)

	case faultEtcdKilled:
		if err := c.Etcd.Kill(); err != nil {
			return time.Time{}, 0, err
		}
		time.Sleep(outage)
		if err := c.StartEtcd(ctx); err != nil {
			return time.Time{}, 0, err
		}
		return time.Now(), 0, c.WaitReady(ctx)

	case faultPostgresKilled:
		if err := w.pg.Kill(); err != nil {
			return time.Time{}, 0, err
		}
		time.Sleep(outage)
		return time.Now(), 0, w.pg.Start(ctx)
	}
	return time.Time{}, 0, fmt.Errorf("unknown fault %q", fault)
}

// seedOtherOwner writes rows of another owner through the registry, as another
// controller sharing the database would, and returns them as the checker reads them.
func seedOtherOwner(ctx context.Context, registryURL string, db *sql.DB) (map[string]row, error) {
	reg, err := registry.Open(ctx, registryURL, registry.Options{Password: func() (string, error) { return pgtest.Password, nil }})
	if err != nil {
		return nil, err
	}
	defer reg.Close()
	for i := range 20 {
		if _, err := reg.Upsert(ctx, registry.Record{
			UID: fmt.Sprintf("other-%02d", i), Namespace: namespaces[i%len(namespaces)], Name: fmt.Sprintf("s-%05d", i),
			StudentName: "someone else's", School: "another school", Owner: otherOwner, Generation: 1,
		}, registry.Why{Cause: "test"}); err != nil {
			return nil, err
		}
	}
	rows, err := readRows(ctx, db)
	if err != nil {
		return nil, err
	}
	others := map[string]row{}
	for uid, r := range rows {
		if r.owner == otherOwner {
			others[uid] = r
		}
	}
	return others, nil
}
