package registry

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"math"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
)

// What a controller does with its registry, in order: Connect when it starts (a
// standby too), Lead once it leads (the fence, the schema, the owner's binding), Hold
// while it writes (renewing the fence, giving it back at the end).

// Connect opens the registry at u for a controller, and learns the cluster it works
// in from clusterOf (the UID of its kube-system namespace): read-only for a dry run
// (opts.ReadOnly: it waits until a controller of this version has migrated the
// registry, and refuses an owner bound to another cluster), else to write once Lead
// has run (a standby changes nothing). While the database or the cluster's identity
// is out of reach it retries with backoff, logging through ctx's logger; what no retry
// fixes (Permanent) ends it at once. A nil registry and no error when ctx ends first.
func Connect(ctx context.Context, u URL, owner string, clusterOf func(context.Context) (string, error), opts Options) (*Registry, string, error) {
	opts.MigrateLater = !opts.ReadOnly
	what := "Registry or cluster identity not available yet; the Pod stays not ready and retries"
	if opts.ReadOnly {
		what = "Registry or cluster identity not available yet, or the registry not yet migrated by a controller of this version; " +
			"the Pod stays not ready and retries"
	}
	var reg *Registry
	var cluster string
	err := retry(ctx, what, Permanent, func() error {
		var err error
		if cluster, err = clusterOf(ctx); err != nil {
			return err
		}
		if opts.ReadOnly {
			reg, err = OpenToRead(ctx, u, owner, cluster, opts)
		} else {
			reg, err = OpenURL(ctx, u, opts)
		}
		return err
	})
	return reg, cluster, err
}

// OpenToRead opens the registry at u read-only for owner's controller in cluster,
// once: neither migrated nor bound, and refused when the registry binds owner to
// another cluster (ErrOtherCluster). ErrNoSchema when it has no schema yet: it then
// holds no rows, and the first controller to lead makes the schema.
func OpenToRead(ctx context.Context, u URL, owner, cluster string, opts Options) (*Registry, error) {
	opts.ReadOnly = true
	r, err := OpenURL(ctx, u, opts)
	if err != nil {
		return nil, err
	}
	if err := r.CheckBinding(ctx, owner, cluster); err != nil {
		return nil, errors.Join(err, r.Close())
	}
	return r, nil
}

// Lead makes the registry this controller's to write, once it leads: it takes the
// owner's write fence, migrates the schema and binds the owner to cluster. Where the
// schema makes the fence a lease (6 and on) the fence comes first, so that a
// controller that finds another live one (a clone's, a newer version's) changes
// nothing, the schema included; an older schema's fence has no holder to wait for,
// and the schema goes first. While another controller holds the fence it waits,
// calling waiting with who holds it each time it asks again (every second, or when
// the holder's lease runs out); while the database fails it retries, as Connect does.
// false when ctx ends first, or with what no retry fixes.
func (r *Registry) Lead(ctx context.Context, owner, cluster string, waiting func(*HeldError)) (bool, error) {
	// A failed read of the schema's version is an error, retried, never an older
	// schema: that would migrate under a live holder's feet.
	var lease bool
	if err := retry(ctx, "Cannot read the registry's schema version yet; retrying", Permanent, func() (err error) {
		lease, err = r.FenceIsLease(ctx)
		return err
	}); err != nil || ctx.Err() != nil {
		return false, err
	}
	fenced := false
	if lease {
		if !r.waitForFence(ctx, owner, waiting) {
			return false, nil
		}
		fenced = true
	}
	if fenced {
		// Migrating and binding may retry for longer than the lease: keep it.
		defer r.keepFence(ctx)()
	}
	done := false
	err := retry(ctx, "Cannot migrate the registry or bind its owner yet; retrying", Permanent, func() error {
		if err := r.Migrate(ctx); err != nil {
			return err
		}
		bindCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := r.bindOwner(bindCtx, owner, cluster); err != nil {
			return err
		}
		done = true
		return nil
	})
	if !done {
		if fenced {
			r.giveBack(ctx)
		}
		return false, err
	}
	if !fenced && !r.waitForFence(ctx, owner, waiting) {
		return false, nil
	}
	r.led.Store(&lead{owner: owner, cluster: cluster})
	return true, nil
}

// lead is what Lead made this registry's: the owner it writes for and the cluster
// that owner is bound to, which Hold checks again at each renewal.
type lead struct{ owner, cluster string }

// Hold renews the write fence every third of its lease until ctx ends, then gives it
// back (the caller has drained its writes), so the next controller takes it at once.
// It returns ErrFenced as soon as another controller has taken the fence (this one's
// renewals failed for a whole lease). With each renewal it checks what Lead found
// too: ErrOtherCluster once the owner was moved to another cluster, ErrSchemaNewer
// once a newer program migrated the schema; it then gives the fence back. Other
// failures are retried at the next renewal.
func (r *Registry) Hold(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	tick := time.NewTicker(r.lease / 3)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			r.giveBack(ctx)
			return nil
		case <-tick.C:
		}
		renewCtx, cancel := context.WithTimeout(ctx, r.lease/3)
		err := r.RenewFence(renewCtx)
		if err == nil {
			err = r.checkLead(renewCtx)
		}
		cancel()
		switch {
		case errors.Is(err, ErrFenced):
			return err
		case errors.Is(err, ErrOtherCluster), errors.Is(err, ErrSchemaNewer):
			r.giveBack(ctx)
			return err
		case err != nil && ctx.Err() == nil:
			logger.Error(err, "Cannot renew the registry's write fence; retrying", "lease", r.lease)
		}
	}
}

// Fence takes owner's write fence for a one-off command (adopt, prune, move-cluster,
// rename-owner, a migration) and holds it, renewing it every third of the lease, until
// the returned release is called, which gives it back. It does not wait: while another
// live controller holds the fence it returns a *HeldError (ErrHeld) that names it.
// Once the renewals fail for a whole lease (a controller took over), the command's
// writes roll back with ErrFenced.
func (r *Registry) Fence(ctx context.Context, owner string) (release func(), err error) {
	if _, err := r.TakeFence(ctx, owner); err != nil {
		return nil, err
	}
	holdCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	held := make(chan struct{})
	go func() {
		defer close(held)
		_ = r.Hold(holdCtx)
	}()
	return func() {
		stop()
		<-held
	}, nil
}

// checkLead checks again what Lead found: the schema no newer than this program's,
// the owner still bound to the cluster. Nothing to check for a registry that did not
// lead (a command's Fence).
func (r *Registry) checkLead(ctx context.Context) error {
	l := r.led.Load()
	if l == nil {
		return nil
	}
	if err := r.CheckSchema(ctx); err != nil {
		return err
	}
	return r.CheckBinding(ctx, l.owner, l.cluster)
}

// keepFence renews the fence this registry holds every third of its lease until the
// returned stop is called, and gives nothing back: the caller's writes go on under it.
func (r *Registry) keepFence(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(r.lease / 3)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			renewCtx, cancelRenew := context.WithTimeout(ctx, r.lease/3)
			if err := r.RenewFence(renewCtx); err != nil && ctx.Err() == nil {
				klog.FromContext(ctx).Error(err, "Cannot renew the registry's write fence while migrating or binding; retrying")
			}
			cancelRenew()
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// fencePoll is how often a controller that waits for another's fence asks again.
const fencePoll = time.Second

// waitForFence takes owner's write fence, retrying while the registry fails and
// waiting while another live controller holds it; false when ctx ends first.
func (r *Registry) waitForFence(ctx context.Context, owner string, waiting func(*HeldError)) bool {
	logger := klog.FromContext(ctx)
	said := false
	for {
		var token int64
		var held *HeldError
		_ = retry(ctx, "Cannot take the registry owner's write fence; retrying", nil, func() (err error) {
			token, err = r.TakeFence(ctx, owner)
			if errors.As(err, &held) {
				return nil
			}
			return err
		})
		switch {
		case token != 0:
			logger.Info("Took the registry owner's write fence", "owner", owner, "token", token, "holder", r.holder, "lease", r.lease)
			return true
		case held == nil: // ctx ended
			return false
		}
		if !said {
			logger.Error(held, "Waiting: writing nothing while another controller of this owner writes. If it is a clone of this cluster "+
				"or a second install, stop it or give it its own --registry-owner; see docs/backup-and-restore.md, \"A clone, or a DR fail-over\"", "owner", owner, "holder", held.Holder)
			said = true
		} else {
			logger.V(2).Info("Still waiting for the registry owner's write fence", "holder", held.Holder, "for", held.For)
		}
		if waiting != nil {
			waiting(held)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(min(held.For+50*time.Millisecond, fencePoll)):
		}
	}
}

// giveBack gives the write fence back, so that the next controller takes it at once;
// on failure it says that the next one waits for the lease to run out.
func (r *Registry) giveBack(ctx context.Context) {
	logger := klog.FromContext(ctx)
	release, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := r.ReleaseFence(release); err != nil {
		logger.Error(err, "Could not give back the registry's write fence: the next controller waits for its lease to run out")
		return
	}
	logger.Info("Gave back the registry owner's write fence")
}

// bindOwner binds owner to cluster on first use, and refuses to go on when the
// registry binds it to another: a wrong kubeconfig would otherwise make every row look
// like an orphan.
func (r *Registry) bindOwner(ctx context.Context, owner, cluster string) error {
	b, err := r.Bind(ctx, owner, cluster)
	if errors.Is(err, ErrOtherCluster) {
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

// CheckBinding refuses, as Lead would, a registry that binds owner to another cluster
// than cluster; an owner bound to none yet is bound when a controller first leads. It
// only reads.
func (r *Registry) CheckBinding(ctx context.Context, owner, cluster string) error {
	b, err := r.BindingOf(ctx, owner)
	switch {
	case errors.Is(err, ErrNotFound):
		return nil
	case err != nil:
		return err
	case b.Cluster != cluster:
		return fmt.Errorf("%w: owner %q is bound to cluster %s since %s, and --kubeconfig reaches cluster %s: "+
			"the controller would refuse to start and write nothing. Check --kubeconfig and --registry",
			ErrOtherCluster, owner, b.Cluster, b.BoundAt.Format(time.RFC3339), cluster)
	}
	return nil
}

// Permanent tells the errors of opening that no retry fixes, so that the process ends
// and says why instead of waiting unready: the owner bound to another cluster, a
// schema newer than this program, a server certificate that does not verify.
func Permanent(err error) bool {
	var unknownAuthority x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	return errors.Is(err, ErrOtherCluster) || errors.Is(err, ErrSchemaNewer) ||
		errors.As(err, &unknownAuthority) || errors.As(err, &hostname) || errors.As(err, &invalid)
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
