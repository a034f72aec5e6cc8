// Package leader runs work only while this replica holds the Lease, and gates writes on it.
package leader

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/student-controller/student-controller/internal/controller"
)

// Config says which Lease Run takes, with what timings and clients.
type Config struct {
	Namespace, Name                           string
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	Client                                    kubernetes.Interface
	// Recorder posts the Lease's Events; Watchdog, if set, fails /healthz for a hung leader.
	Recorder record.EventRecorder
	Watchdog *leaderelection.HealthzAdaptor
	// Gate is opened to this replica's elector: Check then says whether it may write.
	Gate *Gate
}

// Run runs fn only while this process holds the Lease. On shutdown fn drains before the
// Lease is released, so a standby takes over at once and never overlaps fn's last writes.
func Run(ctx context.Context, cfg Config, fn func(context.Context) error) error {
	logger := klog.FromContext(ctx)
	host, _ := os.Hostname()
	id := host + "_" + uuid.NewString()
	ns := cfg.Namespace
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, ns, cfg.Name,
		cfg.Client.CoreV1(), cfg.Client.CoordinationV1(),
		resourcelock.ResourceLockConfig{Identity: id, EventRecorder: cfg.Recorder})
	if err != nil {
		return fmt.Errorf("leader election lock: %w", err)
	}

	// The elector's context outlives ctx until fn has drained.
	electorCtx, stopElector := context.WithCancel(context.WithoutCancel(ctx))
	defer stopElector()
	var fnErr error
	fnDone := make(chan struct{})
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		Name:            controller.Name,
		LeaseDuration:   cfg.LeaseDuration,
		RenewDeadline:   cfg.RenewDeadline,
		RetryPeriod:     cfg.RetryPeriod,
		ReleaseOnCancel: true,
		WatchDog:        cfg.Watchdog,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(leading context.Context) {
				logger.Info("Became the leader", "lease", klog.KRef(ns, cfg.Name), "identity", id)
				runCtx, cancel := context.WithCancel(ctx)
				defer cancel()
				defer context.AfterFunc(leading, cancel)()
				fnErr = fn(runCtx)
				close(fnDone)
				// fn ended on its own (fenced, the owner moved): rather than lead idle,
				// give up the Lease and exit with fn's error.
				stopElector()
			},
			OnStoppedLeading: func() { logger.Info("Stopped leading", "identity", id) },
			OnNewLeader: func(identity string) {
				if identity != id {
					logger.Info("Another replica leads; standing by", "leader", identity)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	if cfg.Gate != nil {
		cfg.Gate.set(elector, cfg.RenewDeadline-cfg.LeaseDuration)
	}
	go func() {
		<-ctx.Done()
		if elector.IsLeader() {
			<-fnDone
		}
		stopElector()
	}()
	elector.Run(electorCtx)

	select {
	case <-fnDone:
		if fnErr != nil {
			return fnErr
		}
	default:
	}
	if ctx.Err() == nil {
		// The Lease was lost while still wanted: another replica may already be writing.
		return errors.New("lost the leader election Lease")
	}
	select {
	case <-fnDone:
		return fnErr
	default:
		return nil
	}
}

// Gate says whether this replica may still write (its Config.Leading). client-go's
// elector stands down only after a renewal fails, so a leader paused past its Lease
// (SIGSTOP, a frozen VM) would write from a stale cache while another replica leads.
// The gate closes once the last renewal is older than the renew deadline.
type Gate struct {
	elector atomic.Pointer[leaderelection.LeaderElector]
	// slack makes the elector's Check fail at the renew deadline, not the lease duration.
	slack time.Duration
}

func (g *Gate) set(e *leaderelection.LeaderElector, slack time.Duration) {
	g.slack = slack
	g.elector.Store(e)
}

// Check is nil while writes may go ahead, always so without an elector.
func (g *Gate) Check() error {
	e := g.elector.Load()
	switch {
	case e == nil:
		return nil
	case !e.IsLeader():
		return errors.New("another replica holds the Lease")
	}
	return e.Check(g.slack)
}
