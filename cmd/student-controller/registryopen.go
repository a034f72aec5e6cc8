package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/student-controller/student-controller/internal/controller"
	"github.com/student-controller/student-controller/internal/registry"
)

// openRegistry opens the registry to write, without migrating it yet (see
// startWriting), and reads the cluster's identity. While either is out of reach it
// retries with backoff; what retrying cannot fix ends it at once (see permanent). It
// returns a nil registry and no error when ctx ends first.
func openRegistry(ctx context.Context, opts options, kubeClient kubernetes.Interface) (*registry.Registry, string, error) {
	if err := registry.CheckURL(opts.registryURL); err != nil {
		return nil, "", err
	}
	var reg *registry.Registry
	var cluster string
	err := retry(ctx, "Registry or cluster identity not available yet; the Pod stays not ready and retries", permanent, func() error {
		r, err := registry.Open(ctx, opts.registryURL, registry.Options{
			Password:        opts.registryPassword(),
			MaxOpenConns:    opts.maxOpenConns,
			MaxIdleConns:    opts.maxIdleConns,
			ConnMaxLifetime: opts.connMaxLifetime,
			LeaseDuration:   opts.fenceLease,
			MigrateLater:    true,
		})
		if err != nil {
			return err
		}
		idCtx, cancel := context.WithTimeout(ctx, opts.syncTimeout)
		defer cancel()
		if cluster, err = clusterID(idCtx, kubeClient); err != nil {
			return errors.Join(err, r.Close())
		}
		reg = r
		return nil
	})
	return reg, cluster, err
}

// startWriting makes the registry ready for this controller to write, once it leads
// (a standby changes nothing): it migrates the schema, which may take long on a big
// table, and binds the owner to this cluster (bounded by --sync-timeout), retrying as
// openRegistry does; false when ctx ends first.
func startWriting(ctx context.Context, opts options, reg *registry.Registry, cluster string) (bool, error) {
	done := false
	err := retry(ctx, "Cannot migrate the registry or bind its owner yet; retrying", permanent, func() error {
		if err := reg.Migrate(ctx); err != nil {
			return err
		}
		bindCtx, cancel := context.WithTimeout(ctx, opts.syncTimeout)
		defer cancel()
		if err := bindCluster(bindCtx, reg, opts.owner, cluster); err != nil {
			return err
		}
		done = true
		return nil
	})
	return done, err
}

// openReadOnly opens the registry for what only reads (--dry-run, plan): read-only,
// neither migrated nor bound, and refused when it binds the owner to another cluster
// than kubeClient reaches. A registry with no schema yet holds no rows (noSchema). It
// tries once; the caller retries.
func openReadOnly(ctx context.Context, opts options, kubeClient kubernetes.Interface) (rows readOnlyRegistry, cluster string, closeRegistry func() error, err error) {
	if err := registry.CheckURL(opts.registryURL); err != nil {
		return nil, "", nil, err
	}
	if cluster, err = clusterID(ctx, kubeClient); err != nil {
		return nil, "", nil, err
	}
	r, err := registry.Open(ctx, opts.registryURL, registry.Options{ReadOnly: true, Password: opts.registryPassword(), MaxOpenConns: opts.maxOpenConns})
	if errors.Is(err, registry.ErrNoSchema) {
		return noSchema{display: displayURL(opts.registryURL)}, cluster, func() error { return nil }, nil
	}
	if err != nil {
		return nil, "", nil, err
	}
	if err := checkBinding(ctx, r, opts.owner, cluster); err != nil {
		return nil, "", nil, errors.Join(err, r.Close())
	}
	return r, cluster, r.Close, nil
}

// readOnlyRegistry is what a plan reads of the registry.
type readOnlyRegistry interface {
	Get(ctx context.Context, uid string) (registry.Record, error)
	List(ctx context.Context, owner string) ([]registry.Record, []registry.MalformedRow, error)
	CheckSchema(ctx context.Context) error
	String() string
}

// noSchema is a registry without a schema yet (a new database, a SQLite file not yet
// made): it holds no rows, and the controller makes the schema when it first starts.
type noSchema struct{ display string }

func (noSchema) Get(context.Context, string) (registry.Record, error) {
	return registry.Record{}, registry.ErrNotFound
}

func (noSchema) List(context.Context, string) ([]registry.Record, []registry.MalformedRow, error) {
	return nil, nil, nil
}

func (noSchema) CheckSchema(context.Context) error { return nil }

func (n noSchema) String() string { return n.display + " (no schema yet)" }

// displayURL is a registry URL as logs show it: without its password.
func displayURL(rawURL string) string {
	if u, err := registry.Display(rawURL); err == nil {
		return u
	}
	return "(the registry)"
}

// checkBinding refuses, as the controller's start would, a registry that binds owner
// to another cluster than cluster; an owner bound to none yet is bound when the
// controller first starts. It only reads.
func checkBinding(ctx context.Context, reg *registry.Registry, owner, cluster string) error {
	b, err := reg.BindingOf(ctx, owner)
	switch {
	case errors.Is(err, registry.ErrNotFound):
		return nil
	case err != nil:
		return err
	case b.Cluster != cluster:
		return fmt.Errorf("%w: owner %q is bound to cluster %s since %s, and --kubeconfig reaches cluster %s: "+
			"the controller would refuse to start and write nothing. Check --kubeconfig and --registry",
			registry.ErrOtherCluster, owner, b.Cluster, b.BoundAt.Format(time.RFC3339), cluster)
	}
	return nil
}

// retry calls attempt until it succeeds, fails for good (permanent, when given), or ctx
// ends, which is no error; between tries it logs what with the failure and waits, from
// 1 s doubling to 30 s.
func retry(ctx context.Context, what string, permanent func(error) bool, attempt func() error) error {
	backoff := wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Steps: math.MaxInt32, Cap: 30 * time.Second}
	for {
		err := attempt()
		switch {
		case err == nil:
			return nil
		case permanent != nil && permanent(err):
			return err
		case ctx.Err() != nil:
			return nil
		}
		delay := backoff.Step()
		klog.FromContext(ctx).Error(err, what, "in", delay.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
	}
}

// permanent tells the errors of opening that no retry fixes, so the process ends and
// says why instead of waiting unready: the owner bound to another cluster, a schema
// newer than this program, a server certificate that does not verify. RBAC that does
// not yet let it read the cluster's identity is waited for: an install applies the
// Deployment and its bindings in no set order.
func permanent(err error) bool {
	var unknownAuthority x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	return errors.Is(err, registry.ErrOtherCluster) || errors.Is(err, registry.ErrSchemaNewer) ||
		errors.As(err, &unknownAuthority) || errors.As(err, &hostname) || errors.As(err, &invalid)
}

// takeFence takes the registry owner's write fence, retrying while the registry fails
// and waiting while another live controller of the owner holds it (waiting says so,
// in the log, the metrics and the readiness probe); false when ctx ends first.
func takeFence(ctx context.Context, reg *registry.Registry, owner string, metrics *controller.Metrics, waiting *atomic.Pointer[string]) bool {
	logger := klog.FromContext(ctx)
	defer waiting.Store(nil)
	for {
		var token int64
		var held *registry.HeldError
		_ = retry(ctx, "Cannot take the registry owner's write fence; retrying", nil, func() (err error) {
			token, err = reg.TakeFence(ctx, owner)
			if errors.As(err, &held) {
				return nil
			}
			return err
		})
		switch {
		case token != 0:
			metrics.ObserveFence(true, false)
			logger.Info("Took the registry owner's write fence", "owner", owner, "token", token, "holder", reg.Holder(), "lease", reg.LeaseDuration())
			return true
		case held == nil: // ctx ended
			return false
		}
		if waiting.Swap(&held.Holder) == nil {
			logger.Error(held, "Waiting: writing nothing while another controller of this owner writes. If it is a clone of this cluster "+
				"or a second install, stop it or give it its own --registry-owner; see docs/operating.md", "owner", owner, "holder", held.Holder)
		} else {
			logger.V(2).Info("Still waiting for the registry owner's write fence", "holder", held.Holder, "for", held.For)
		}
		metrics.ObserveFence(false, true)
		// Try again every second (a holder that stops gives the fence back), or when its
		// lease would run out, if sooner (a holder that crashed).
		select {
		case <-ctx.Done():
			return false
		case <-time.After(min(held.For+50*time.Millisecond, fencePoll)):
		}
	}
}

// fencePoll is how often a controller that waits for another's fence asks again.
const fencePoll = time.Second

// releaseFence gives the write fence back, so that the next controller takes it at
// once; on failure it says that the next one waits for the lease to run out.
func releaseFence(ctx context.Context, reg *registry.Registry, metrics *controller.Metrics) {
	logger := klog.FromContext(ctx)
	release, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	defer metrics.ObserveFence(false, false)
	if err := reg.ReleaseFence(release); err != nil {
		logger.Error(err, "Could not give back the registry's write fence: the next controller waits for its lease to run out")
		return
	}
	logger.Info("Gave back the registry owner's write fence")
}

// holdFence renews the write fence every third of its lease until ctx ends, and then
// gives it back (the caller has drained the writes). It returns ErrFenced at once when
// another controller took the fence (this one's renewals failed for a whole lease);
// other failures are retried at the next renewal.
func holdFence(ctx context.Context, reg *registry.Registry, metrics *controller.Metrics) error {
	logger := klog.FromContext(ctx)
	defer metrics.ObserveFence(false, false)
	tick := time.NewTicker(reg.LeaseDuration() / 3)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			releaseFence(ctx, reg, metrics)
			return nil
		case <-tick.C:
		}
		renewCtx, cancel := context.WithTimeout(ctx, reg.LeaseDuration()/3)
		err := reg.RenewFence(renewCtx)
		cancel()
		switch {
		case errors.Is(err, registry.ErrFenced):
			return err
		case err != nil && ctx.Err() == nil:
			logger.Error(err, "Cannot renew the registry's write fence; retrying", "lease", reg.LeaseDuration())
		}
	}
}

// clusterID names the cluster a client reaches: the UID of its kube-system namespace,
// which lives as long as the cluster does.
func clusterID(ctx context.Context, client kubernetes.Interface) (string, error) {
	ns, err := client.CoreV1().Namespaces().Get(ctx, metav1.NamespaceSystem, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("read the cluster's identity (the UID of namespace kube-system): %w", err)
	}
	return string(ns.UID), nil
}

// bindCluster binds the owner to this cluster in the registry on first use, and
// refuses to go on when the registry binds it to another: a wrong kubeconfig would
// otherwise make every row look like an orphan.
func bindCluster(ctx context.Context, reg *registry.Registry, owner, cluster string) error {
	b, err := reg.Bind(ctx, owner, cluster)
	if errors.Is(err, registry.ErrOtherCluster) {
		return fmt.Errorf("%w. Writing nothing: check --kubeconfig and --registry. If the owner's rows really are to follow "+
			"this cluster now (a rebuilt cluster, a registry moved), move the owner explicitly, with this kubeconfig: "+
			"student-controller registry move-cluster --registry-owner %s --from %s (and the same --registry and --kubeconfig)",
			err, owner, b.Cluster)
	}
	if err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Registry owner bound to this cluster", "owner", owner, "cluster", cluster, "since", b.BoundAt)
	return nil
}
