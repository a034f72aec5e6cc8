package main

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

// runLeading runs fn only while this process holds the Lease. On shutdown it lets fn
// drain first and then releases the Lease, so a standby takes over at once and never
// overlaps with this process's last writes.
func runLeading(ctx context.Context, opts options, kubeClient kubernetes.Interface, recorder record.EventRecorder,
	watchdog *leaderelection.HealthzAdaptor, gate *leaseGate, fn func(context.Context) error) error {
	logger := klog.FromContext(ctx)
	host, _ := os.Hostname()
	id := host + "_" + uuid.NewString()
	ns := opts.leaderElectNamespace
	if ns == "" {
		ns = os.Getenv("POD_NAMESPACE")
	}
	if ns == "" {
		ns = "kube-system"
	}
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, ns, opts.leaderElectID,
		kubeClient.CoreV1(), kubeClient.CoordinationV1(),
		resourcelock.ResourceLockConfig{Identity: id, EventRecorder: recorder})
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
		LeaseDuration:   opts.leaseDuration,
		RenewDeadline:   opts.renewDeadline,
		RetryPeriod:     opts.retryPeriod,
		ReleaseOnCancel: true,
		WatchDog:        watchdog,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(leading context.Context) {
				logger.Info("Became the leader", "lease", klog.KRef(ns, opts.leaderElectID), "identity", id)
				runCtx, cancel := context.WithCancel(ctx)
				defer cancel()
				defer context.AfterFunc(leading, cancel)()
				fnErr = fn(runCtx)
				close(fnDone)
				// fn ended on its own (fenced, the owner moved): no leader that does
				// nothing; the Lease goes, and the process exits with fn's error.
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
	gate.set(elector, opts.renewDeadline-opts.leaseDuration)
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

// leaseGate tells the controller whether this replica may still write (its
// Config.Leading). client-go's elector stands down only once a renewal has failed, and a
// leader paused past its Lease (SIGSTOP, a frozen VM) learns that only after it resumes
// and tries, acting meanwhile on a cache as old as the pause while another replica
// leads. The gate closes as soon as the last renewal is older than the
// renew deadline, before any write, whether or not the elector has noticed.
type leaseGate struct {
	elector atomic.Pointer[leaderelection.LeaderElector]
	// slack is what Check may add to the lease duration: renew deadline minus lease
	// duration, so the gate closes at the renew deadline.
	slack time.Duration
}

func (g *leaseGate) set(e *leaderelection.LeaderElector, slack time.Duration) {
	g.slack = slack
	g.elector.Store(e)
}

// check is nil while writes may go ahead. Without leader election (no elector) they
// always may.
func (g *leaseGate) check() error {
	e := g.elector.Load()
	switch {
	case e == nil:
		return nil
	case !e.IsLeader():
		return errors.New("another replica holds the Lease")
	}
	return e.Check(g.slack)
}
