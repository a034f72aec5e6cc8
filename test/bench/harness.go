package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the PostgreSQL driver
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	_ "modernc.org/sqlite"

	"github.com/student-controller/student-controller/internal/controller"
	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/freeport"
	"github.com/student-controller/student-controller/internal/testenv/pgtest"
	"github.com/student-controller/student-controller/internal/testenv/proc"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
	"github.com/student-controller/student-controller/pkg/generated/informers/externalversions"
)

type harness struct {
	n     int
	phase time.Duration
	// peerDeletePhase bounds the peer's delete phase: phase, or shorter
	// (-peer-delete-timeout).
	peerDeletePhase time.Duration
	scratch         string
	kubeconfig      string
	kube            kubernetes.Interface
	students        versioned.Interface
	// policy installs (true) or removes config/admission's policy.
	policy func(ctx context.Context, installed bool) error
	// flags are added to the contender's own, and hold keeps it running after its
	// steady memory is measured: both for investigating one contender (-only).
	flags []string
	hold  time.Duration
	// pg is the PostgreSQL the contenders with a PostgreSQL registry use.
	pg *pgtest.Server
	// restartAPIServer starts kube-apiserver again with extra flags (none: as the
	// control plane started it), which apiServerFlags are now; apiServerCPU is the
	// CPU time kube-apiserver has used since it started.
	restartAPIServer func(ctx context.Context, extra ...string) error
	apiServerFlags   []string
	apiServerCPU     func() float64
	// profiles, when set, is the folder for CPU profiles of kube-apiserver taken in the
	// middle of each contender's converge (-profiles).
	profiles string
}

// point is the number of Ready Students at a time since the loader started.
type point struct {
	Seconds float64 `json:"s"`
	Ready   int     `json:"ready"`
}

type result struct {
	Name     string `json:"name"`
	Describe string `json:"describe"`
	N        int    `json:"n"`

	Converged        bool    `json:"converged"`
	ConvergeSeconds  float64 `json:"convergeSeconds"`  // measured, or when cut off
	ReadyAtCutoff    int     `json:"readyAtCutoff"`    // when not converged
	ProjectedSeconds float64 `json:"projectedSeconds"` // converge time, measured or projected from the rate
	RatioToFloor     float64 `json:"ratioToFloor"`     // to the two-write floor
	// RatioToStatusFloor is to the status-only floor (Students created with the finalizer).
	RatioToStatusFloor float64 `json:"ratioToStatusFloor"`

	RequestsPerStudent map[string]float64 `json:"requestsPerStudent"` // by HTTP method
	// WritesPerStudent counts writes to Students (PUT, PATCH, DELETE); EventsPerStudent
	// the Events posted (POST: a contender creates nothing else).
	WritesPerStudent float64 `json:"writesPerStudent"`
	EventsPerStudent float64 `json:"eventsPerStudent"`

	PeakRSSMiB   float64 `json:"peakRSSMiB"`
	SteadyRSSMiB float64 `json:"steadyRSSMiB"`
	// ConvergeCPUSeconds is the CPU time the process used from its start until it had
	// converged (and settled); APIServerCPUSeconds kube-apiserver's from the first
	// Student created until then.
	ConvergeCPUSeconds  float64 `json:"convergeCPUSeconds"`
	APIServerCPUSeconds float64 `json:"apiServerCPUSeconds,omitempty"`
	// StatusPUTServerMs is kube-apiserver's own mean time to answer a status PUT of a
	// Student over the same span (its apiserver_request_duration_seconds), in ms: what
	// the server took, apart from the client's side of the round trip.
	StatusPUTServerMs float64 `json:"statusPutServerMs,omitempty"`
	// MachineBusyCores is how many of the machine's cores were busy on average over
	// the same span (every process: the control plane, the loader and the bench too),
	// from /proc/stat; StealSeconds the CPU time the hypervisor took from this VM in it.
	MachineBusyCores float64 `json:"machineBusyCores,omitempty"`
	StealSeconds     float64 `json:"stealSeconds"`

	RestartMeasured bool    `json:"restartMeasured"`
	RestartSeconds  float64 `json:"restartSeconds"`
	RestartWrites   int     `json:"restartWrites"`

	// RegistryBytes is the size of the registry once converged: the SQLite file's pages,
	// or the PostgreSQL database's tables with their indexes.
	RegistryBytes int64 `json:"registryBytes,omitempty"`
	// HistoryRows are the registry's history rows once converged: N, or none from the
	// build without the history.
	HistoryRows int `json:"historyRows,omitempty"`

	DeleteDone    bool    `json:"deleteDone"`
	DeleteSeconds float64 `json:"deleteSeconds"`
	DeleteLeft    int     `json:"deleteLeft"`

	// LatencyP50Seconds, LatencyP99Seconds and LatencyMaxSeconds are each Student's time
	// from create to Ready (the watch events that show them), over the converge.
	LatencyP50Seconds float64 `json:"latencyP50Seconds,omitempty"`
	LatencyP99Seconds float64 `json:"latencyP99Seconds,omitempty"`
	LatencyMaxSeconds float64 `json:"latencyMaxSeconds,omitempty"`

	Timeline []point `json:"timeline"`
}

func (r *result) summary() string {
	s := fmt.Sprintf("converged %v in %.1fs", r.Converged, r.ConvergeSeconds)
	if !r.Converged {
		s = fmt.Sprintf("cut off at %.0fs with %d/%d Ready, projected %.0fs", r.ConvergeSeconds, r.ReadyAtCutoff, r.N, r.ProjectedSeconds)
	}
	return fmt.Sprintf("%s; %.2f Student writes and %.2f Events per Student; CPU %.1fs; steady RSS %.1f MiB; restart %.1fs, %d writes; delete %.1fs (done %v)",
		s, r.WritesPerStudent, r.EventsPerStudent, r.ConvergeCPUSeconds, r.SteadyRSSMiB, r.RestartSeconds, r.RestartWrites, r.DeleteSeconds, r.DeleteDone)
}

func (h *harness) measure(ctx context.Context, c contender) (*result, error) {
	r := &result{Name: c.name, Describe: c.describe, N: h.n}
	if !slices.Equal(c.apiServerFlags, h.apiServerFlags) {
		say("  restarting kube-apiserver with %q", c.apiServerFlags)
		if err := h.restartAPIServer(ctx, c.apiServerFlags...); err != nil {
			return nil, err
		}
		h.apiServerFlags = c.apiServerFlags
		// What a new kube-apiserver does first (its caches, OpenAPI, the CRD's
		// serving) is not the contender's to pay for in its CPU.
		if err := sleep(ctx, 20*time.Second); err != nil {
			return nil, err
		}
	}
	if err := h.policy(ctx, c.policy); err != nil {
		return nil, err
	}
	ns, err := h.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-"}}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	reg, err := h.registryFor(ctx, c)
	if err != nil {
		return nil, err
	}
	defer reg.drop()

	obs, err := h.observe(ctx, ns.Name)
	if err != nil {
		return nil, err
	}
	defer obs.stop()

	p, err := h.start(ctx, c, ns.Name, reg, "1")
	if err != nil {
		return nil, err
	}
	defer p.kill()

	// Converge: the loader creates N Students at high concurrency.
	apiServerCPU := h.apiServerCPU()
	putsBefore := h.statusPUTs(ctx)
	machineBefore, machineErr := readMachineCPU()
	start := time.Now()
	timeline := obs.record(start)
	// The profiles are taken alongside, and end with the contender's measurement.
	profiled := make(chan error, 1)
	if h.profiles != "" {
		profileCtx, stopProfiling := context.WithCancel(ctx)
		defer stopProfiling()
		go func() { profiled <- h.profileAPIServer(profileCtx, c.name) }()
	} else {
		profiled <- nil
	}
	if err := h.load(ctx, ns.Name, c.createdWithFinalizer); err != nil {
		return nil, err
	}
	rows := func() int {
		if !c.registry {
			return h.n
		}
		return reg.rows(ns.Name)
	}
	r.Converged, err = p.WaitUntil(ctx, h.phase-time.Since(start), func() bool { return obs.ready.Load() == int64(h.n) && rows() == h.n })
	if err != nil {
		return nil, fmt.Errorf("converge: %w", err)
	}
	say("  %s: converged %v after %.1fs, %d Ready", c.name, r.Converged, time.Since(start).Seconds(), obs.ready.Load())
	r.ConvergeSeconds = time.Since(start).Seconds()
	r.ReadyAtCutoff = int(obs.ready.Load())
	r.ProjectedSeconds = r.ConvergeSeconds
	if !r.Converged && r.ReadyAtCutoff > 0 && r.ReadyAtCutoff < h.n {
		r.ProjectedSeconds = r.ConvergeSeconds * float64(h.n) / float64(r.ReadyAtCutoff)
	}
	if err := sleep(ctx, 3*time.Second); err != nil { // settle: status writes in flight land, memory steadies
		return nil, err
	}
	r.Timeline = timeline()
	r.LatencyP50Seconds, r.LatencyP99Seconds, r.LatencyMaxSeconds = obs.latency()
	r.APIServerCPUSeconds = h.apiServerCPU() - apiServerCPU
	if machine, err := readMachineCPU(); err == nil && machineErr == nil {
		used := machine.minus(machineBefore)
		r.MachineBusyCores = used.busy / time.Since(start).Seconds()
		r.StealSeconds = used.steal
		say("  %s: the machine had %.2f cores busy over the converge; %.1f s of CPU stolen by the hypervisor", c.name, r.MachineBusyCores, r.StealSeconds)
	} else {
		say("  %s: no reading of the machine's CPU: %v", c.name, errors.Join(machineErr, err))
	}
	if puts := h.statusPUTs(ctx).minus(putsBefore); puts.count > 0 {
		r.StatusPUTServerMs = puts.seconds / puts.count * 1000
	}
	if c.registry {
		if r.RegistryBytes, err = reg.size(); err != nil {
			return nil, err
		}
		if err := reg.query(`SELECT count(*) FROM student_history`, nil, &r.HistoryRows); err != nil {
			return nil, fmt.Errorf("count the history rows: %w", err)
		}
		if err := checkHistory(r.HistoryRows, h.n, c.withoutHistory, r.Converged); err != nil {
			return nil, err
		}
	}

	counts, err := scrapeRequests(p.metricsAddr)
	if err != nil {
		return nil, err
	}
	r.RequestsPerStudent = map[string]float64{}
	for method, v := range counts {
		r.RequestsPerStudent[method] = float64(v) / float64(h.n)
		switch method {
		case "PUT", "PATCH", "DELETE":
			r.WritesPerStudent += float64(v) / float64(h.n)
		case "POST":
			r.EventsPerStudent += float64(v) / float64(h.n)
		}
	}
	usage := p.Usage()
	r.PeakRSSMiB, r.SteadyRSSMiB, r.ConvergeCPUSeconds = usage.PeakRSSMiB, usage.RSSMiB, usage.CPUSeconds
	say("  %s: %.1f s of CPU to converge (kube-apiserver %.1f s), %.1f MiB steady", c.name, r.ConvergeCPUSeconds, r.APIServerCPUSeconds, r.SteadyRSSMiB)
	// A profile that failed costs the profile, not the run. One that runs on past a
	// short converge is waited for here, after what it could have added to was read.
	if err := <-profiled; err != nil {
		say("  %s: no profile of kube-apiserver: %v", c.name, err)
	}
	if h.hold > 0 {
		say("  %s: holding %v for inspection: pid %d, metrics http://%s/metrics", c.name, h.hold, p.Pid(), p.metricsAddr)
		if err := sleep(ctx, h.hold); err != nil {
			return nil, err
		}
	}

	// Restart over N synced Students: time until it has synced them all, and its writes.
	if r.Converged && c.reconciles != "" {
		p.stop()
		restarted := time.Now()
		p, err = h.start(ctx, c, ns.Name, reg, "2")
		if err != nil {
			return nil, err
		}
		defer p.kill()
		r.RestartMeasured, err = p.WaitUntil(ctx, h.phase, func() bool { return scrapeSum(p.metricsAddr, c.reconciles) >= float64(h.n) })
		if err != nil {
			return nil, fmt.Errorf("restart: %w", err)
		}
		r.RestartSeconds = time.Since(restarted).Seconds()
		if err := sleep(ctx, 3*time.Second); err != nil {
			return nil, err
		}
		counts, err := scrapeRequests(p.metricsAddr)
		if err != nil {
			return nil, err
		}
		for method, v := range counts {
			if method != "GET" {
				r.RestartWrites += v
			}
		}
	}

	// Delete all N: until every Student is gone and the registry is empty.
	deleteStart := time.Now()
	if err := h.deleteAll(ctx, ns.Name); err != nil {
		return nil, err
	}
	deletePhase := h.phase
	if c.name == peer {
		deletePhase = h.peerDeletePhase
	}
	r.DeleteDone, err = p.WaitUntil(ctx, deletePhase, func() bool { return obs.count.Load() == 0 && (!c.registry || reg.rows(ns.Name) == 0) })
	if err != nil {
		return nil, fmt.Errorf("delete: %w", err)
	}
	r.DeleteSeconds = time.Since(deleteStart).Seconds()
	r.DeleteLeft = int(obs.count.Load())
	p.stop()
	return r, nil
}

// profileAPIServer takes CPU profiles of kube-apiserver from a little after the
// loader starts, into h.profiles: n<N>-<contender>-kube-apiserver-cpu-<i>.pprof, one
// per stretch of at most 50 s (a longer request would meet kube-apiserver's request
// timeout of 60 s). `go tool pprof` reads them together. The window is set from N at
// the floor's pace (about 4 to 5 ms per Student on the development machine), so that
// it falls inside every contender's converge.
func (h *harness) profileAPIServer(ctx context.Context, contender string) error {
	delay := min(max(time.Duration(h.n)*500*time.Microsecond, 5*time.Second), time.Minute)
	window := min(max(time.Duration(h.n)*1500*time.Microsecond, 10*time.Second), 150*time.Second)
	pieces := int((window + 50*time.Second - 1) / (50 * time.Second))
	if err := sleep(ctx, delay); err != nil {
		return err
	}
	for i := range pieces {
		seconds := int((window / time.Duration(pieces)).Seconds())
		b, err := h.kube.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
			Param("seconds", strconv.Itoa(seconds)).DoRaw(ctx)
		if err != nil {
			return err
		}
		name := fmt.Sprintf("n%d-%s-kube-apiserver-cpu-%d.pprof", h.n, contender, i+1)
		if err := os.WriteFile(filepath.Join(h.profiles, name), b, 0o644); err != nil {
			return err
		}
	}
	say("  %s: %d CPU profiles of kube-apiserver (%v in all, from %v after the loader started) in %s", contender, pieces, window.Round(time.Second), delay, h.profiles)
	return nil
}

// load creates N Students from 32 goroutines, with the controller's finalizer already
// on them when withFinalizer is set.
func (h *harness) load(ctx context.Context, ns string, withFinalizer bool) error {
	var finalizers []string
	if withFinalizer {
		finalizers = []string{controller.Finalizer}
	}
	return inParallel(h.n, 32, func(i int) error {
		_, err := h.students.BolingcavalryV1().Students(ns).Create(ctx, &studentv1.Student{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("s-%05d", i), Finalizers: finalizers},
			Spec:       studentv1.StudentSpec{Name: fmt.Sprintf("学生 %d", i), School: "深圳中学"},
		}, metav1.CreateOptions{})
		return err
	})
}

// deleteAll deletes every Student of the namespace, one request each from 32
// goroutines, as `kubectl delete stu --all` does one by one (a single DeleteCollection
// of thousands of finalized objects outlasts the server's request timeout).
func (h *harness) deleteAll(ctx context.Context, ns string) error {
	students := h.students.BolingcavalryV1().Students(ns)
	return inParallel(h.n, 32, func(i int) error {
		if err := students.Delete(ctx, fmt.Sprintf("s-%05d", i), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		return nil
	})
}

// inParallel calls do for 0 to n-1 from workers goroutines, and returns the first
// error; a worker stops at its first error.
func inParallel(n, workers int, do func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := do(i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// observer follows the namespace's Students through a watch and counts the Ready ones.
// It also times each Student from the watch event that brings it (its create) to the
// first that shows it Ready: the wait a user sees, to the millisecond (a Ready
// condition's time is to the second).
type observer struct {
	ready, count atomic.Int64
	stop         func()

	mu        sync.Mutex
	seen      map[string]time.Time // until first Ready
	latencies []time.Duration
}

// latency is the p50, p99 and greatest of the times from create to Ready, in seconds;
// zero before any Student was Ready.
func (o *observer) latency() (p50, p99, most float64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.latencies) == 0 {
		return 0, 0, 0
	}
	l := slices.Clone(o.latencies)
	slices.Sort(l)
	at := func(q float64) float64 { return l[min(len(l)-1, int(q*float64(len(l))))].Seconds() }
	return at(0.50), at(0.99), l[len(l)-1].Seconds()
}

func (h *harness) observe(ctx context.Context, ns string) (*observer, error) {
	o := &observer{seen: map[string]time.Time{}}
	factory := externalversions.NewSharedInformerFactoryWithOptions(h.students, 0, externalversions.WithNamespace(ns))
	informer := factory.Bolingcavalry().V1().Students().Informer()
	var mu sync.Mutex
	state := map[string]bool{}
	set := func(obj any, gone bool) {
		s, ok := obj.(*studentv1.Student)
		if !ok {
			if t, isTomb := obj.(cache.DeletedFinalStateUnknown); isTomb {
				s, ok = t.Obj.(*studentv1.Student)
			}
			if !ok {
				return
			}
		}
		mu.Lock()
		defer mu.Unlock()
		was, existed := state[s.Name]
		if gone {
			delete(state, s.Name)
			o.count.Add(-1)
			if was {
				o.ready.Add(-1)
			}
			return
		}
		ready := meta.IsStatusConditionTrue(s.Status.Conditions, studentv1.ConditionReady)
		state[s.Name] = ready
		if !existed {
			o.count.Add(1)
		}
		o.mu.Lock()
		if !existed && !ready {
			o.seen[s.Name] = time.Now()
		} else if at, ok := o.seen[s.Name]; ok && ready {
			o.latencies = append(o.latencies, time.Since(at))
			delete(o.seen, s.Name)
		}
		o.mu.Unlock()
		if ready && !was {
			o.ready.Add(1)
		} else if !ready && was {
			o.ready.Add(-1)
		}
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { set(obj, false) },
		UpdateFunc: func(_, obj any) { set(obj, false) },
		DeleteFunc: func(obj any) { set(obj, true) },
	}); err != nil {
		return nil, err
	}
	stopCh := make(chan struct{})
	factory.Start(stopCh)
	factory.WaitForCacheSync(stopCh)
	o.stop = func() { close(stopCh); factory.Shutdown() }
	return o, nil
}

// record samples the Ready count every 250 ms until the returned function is called.
func (o *observer) record(start time.Time) func() []point {
	var mu sync.Mutex
	var points []point
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			mu.Lock()
			points = append(points, point{Seconds: time.Since(start).Seconds(), Ready: int(o.ready.Load())})
			mu.Unlock()
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() []point {
		close(done)
		mu.Lock()
		defer mu.Unlock()
		return points
	}
}

// process is a running contender.
type process struct {
	*proc.Process
	metricsAddr, probeAddr string
}

func (h *harness) start(ctx context.Context, c contender, ns string, reg registryDB, run string) (*process, error) {
	p := &process{}
	for _, addr := range []*string{&p.metricsAddr, &p.probeAddr} {
		var err error
		if *addr, err = freeport.Addr(); err != nil {
			return nil, err
		}
	}
	var err error
	p.Process, err = proc.Start(proc.Spec{
		Name: c.name,
		Path: c.bin,
		Args: append(c.args(h, ns, reg.url, p.metricsAddr, p.probeAddr), h.flags...),
		Env:  slices.Concat(reg.env, c.clientEnv),
		Log:  filepath.Join(h.scratch, c.name+"-"+run+".log"),
	})
	if err != nil {
		return nil, err
	}
	up, err := p.WaitUntil(ctx, time.Minute, func() bool {
		resp, err := http.Get("http://" + p.metricsAddr + "/metrics")
		if err == nil {
			_ = resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
	if err == nil && !up {
		err = fmt.Errorf("%s did not come up within a minute; see %s", c.name, p.LogPath())
	}
	if err != nil {
		p.kill()
		return nil, err
	}
	return p, nil
}

// stop stops the contender, killing it after a minute.
func (p *process) stop() { _ = p.Stop(time.Minute) }

// kill kills the contender, if it still runs.
func (p *process) kill() { _ = p.Kill() }

// sleep waits d, or less if ctx ends first.
func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// registryDB is a contender's registry, as the bench reads it beside the contender.
type registryDB struct {
	url    string   // the contender's --registry
	env    []string // and its environment (the password, as a Secret would give it)
	driver string   // how the bench opens it: read-only for SQLite
	dsn    string
	// sizeSQL returns the registry's size in bytes.
	sizeSQL string
	// drop removes the registry once measured.
	drop func()
}

// registryFor makes a new, empty registry for contender c: a SQLite file in the
// scratch folder, or a new database of the bench's PostgreSQL.
func (h *harness) registryFor(ctx context.Context, c contender) (registryDB, error) {
	if !c.postgres {
		file := filepath.Join(h.scratch, c.name+".db")
		return registryDB{
			url: "sqlite://" + file, driver: "sqlite", dsn: "file:" + file + "?mode=ro&_pragma=busy_timeout(5000)",
			sizeSQL: `SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()`,
			drop:    func() {}, // the scratch folder goes at the next run
		}, nil
	}
	if h.pg == nil {
		return registryDB{}, fmt.Errorf("%s needs PostgreSQL, which the bench did not start", c.name)
	}
	name := strings.ReplaceAll(c.name, "-", "_")
	if err := h.pg.CreateDatabase(ctx, name); err != nil {
		return registryDB{}, err
	}
	return registryDB{
		url: h.pg.URL(name, false), env: []string{"REGISTRY_PASSWORD=" + pgtest.Password}, driver: "pgx", dsn: h.pg.URL(name, true),
		// Dropped, so that its dead rows' vacuum does not run into the next contender's turn.
		drop: func() {
			if err := h.pg.DropDatabase(context.Background(), name); err != nil {
				say("  %s: drop its database: %v", c.name, err)
			}
		},
		sizeSQL: `SELECT CAST(coalesce(sum(pg_total_relation_size(c.oid)), 0) AS bigint) FROM pg_class c
			JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = current_schema() AND c.relkind = 'r'`,
	}, nil
}

// rows counts the owned rows of namespace ns; -1 when the registry cannot be read (yet).
func (r registryDB) rows(ns string) int {
	var n int
	if err := r.query(`SELECT count(*) FROM students WHERE namespace = $1 AND owner IS NOT NULL`, []any{ns}, &n); err != nil {
		return -1
	}
	return n
}

// size is the registry's size in bytes.
func (r registryDB) size() (int64, error) {
	var n int64
	if err := r.query(r.sizeSQL, nil, &n); err != nil {
		return 0, fmt.Errorf("the size of the registry: %w", err)
	}
	return n, nil
}

func (r registryDB) query(q string, args []any, into any) error {
	db, err := sql.Open(r.driver, r.dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	return db.QueryRow(q, args...).Scan(into)
}

// scrapeRequests sums client-go's rest_client_requests_total by HTTP method.
func scrapeRequests(addr string) (map[string]int, error) {
	body, err := scrape(addr)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, "rest_client_requests_total{") {
			continue
		}
		method := between(line, `method="`, `"`)
		v, _ := strconv.ParseFloat(line[strings.LastIndex(line, " ")+1:], 64)
		out[method] += int(v)
	}
	return out, nil
}

// served is how many requests kube-apiserver answered and the seconds it took for them.
type served struct{ seconds, count float64 }

func (s served) minus(before served) served {
	return served{s.seconds - before.seconds, s.count - before.count}
}

// statusPUTs reads kube-apiserver's /metrics for the status PUTs of Students it has
// answered so far (apiserver_request_duration_seconds, every scope and code). A failed
// read counts nothing: the result then leaves the figure out.
func (h *harness) statusPUTs(ctx context.Context) served {
	body, err := h.kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		say("  kube-apiserver's /metrics: %v", err)
		return served{}
	}
	statusPUT := func(labels string) bool {
		return strings.Contains(labels, `verb="PUT"`) && strings.Contains(labels, `resource="students"`) &&
			strings.Contains(labels, `subresource="status"`)
	}
	return served{
		seconds: testenv.MetricSum(string(body), "apiserver_request_duration_seconds_sum", statusPUT),
		count:   testenv.MetricSum(string(body), "apiserver_request_duration_seconds_count", statusPUT),
	}
}

// scrapeSum sums every series of one metric.
func scrapeSum(addr, name string) float64 {
	body, err := scrape(addr)
	if err != nil {
		return 0
	}
	return testenv.MetricSum(body, name, nil)
}

func scrape(addr string) (string, error) { return testenv.Scrape(addr, 10*time.Second) }

func between(s, from, to string) string {
	_, after, ok := strings.Cut(s, from)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(after, to)
	return v
}

// checkHistory checks that a contender is the build it says, with the history row or
// without: a pair compares the two. Once converged, the build with it has written at
// least one history row per Student; a contender cut off before converging (the
// original settings) has written fewer, and only the build without it is checked.
func checkHistory(rows, n int, withoutHistory, converged bool) error {
	if withoutHistory && rows != 0 || !withoutHistory && converged && rows < n {
		return fmt.Errorf("%d history rows over %d Students (converged %v), built without the history %v", rows, n, converged, withoutHistory)
	}
	return nil
}
