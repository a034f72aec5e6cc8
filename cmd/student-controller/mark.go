package main

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/student-controller/student-controller/internal/controller"
	"github.com/student-controller/student-controller/internal/registry"
)

// The registry's mark, kept in the cluster: a ConfigMap named after the owner, in the
// controller's namespace, which holds the owner and the highest mark this cluster has
// seen the registry at. A registry found below it went back in time; the ConfigMap
// then says so (markBehind) until an operator confirms with the annotation.
const (
	markSuffix = "-registry-mark"
	// Data keys of the ConfigMap.
	markOwner  = "owner"
	markValue  = "mark"
	markBehind = "behind"
	// AnnotationBehindConfirmed, set to the ConfigMap's mark, says an operator has
	// seen that the registry went back in time and goes on with it as it is.
	AnnotationBehindConfirmed = "bolingcavalry.k8s.io/registry-behind-confirmed"
	// Event reasons on the controller's Pod.
	eventRegistryBehind          = "RegistryBehind"
	eventRegistryBehindConfirmed = "RegistryBehindConfirmed"
)

// markPlace is where the cluster keeps the registry's mark: in --registry-mark-namespace,
// else the leader election Lease's namespace (--leader-elect-namespace, else the Pod's,
// else kube-system with --leader-elect); named OWNER-registry-mark, or after a hash
// of the owner where that is no valid name. Empty namespace: nowhere (a controller
// run outside a Pod without leader election).
func markPlace(opts options) (namespace, name string) {
	namespace = cmp.Or(opts.markNamespace, opts.leaderElectNamespace, os.Getenv("POD_NAMESPACE"))
	if namespace == "" && opts.leaderElect {
		namespace = metav1.NamespaceSystem
	}
	name = opts.owner + markSuffix
	if len(validation.IsDNS1123Subdomain(name)) > 0 {
		sum := sha256.Sum256([]byte(opts.owner))
		name = "registry-mark-" + hex.EncodeToString(sum[:8])
	}
	return namespace, name
}

// markKeeper keeps the registry's mark in the cluster while this controller holds the
// owner's write fence, and says when the registry is behind it.
type markKeeper struct {
	client          kubernetes.Interface
	namespace, name string
	owner           string
	reg             *registry.Registry
	metrics         *controller.Metrics
	recorder        record.EventRecorder
	pod             *corev1.ObjectReference
	// behind holds what Behind says while the registry is behind the cluster's mark;
	// checked says a check has compared the marks at least once.
	behind  *atomic.Pointer[string]
	checked atomic.Bool
	// cm is the ConfigMap as last read or written; nil before.
	cm *corev1.ConfigMap
}

// Behind is nil once the marks were compared and the registry is not behind the
// cluster's; otherwise it says by how much and how to confirm, or that the marks have
// not been compared yet (the sweep lets go of nothing meanwhile).
func (k *markKeeper) Behind() error {
	if msg := k.behind.Load(); msg != nil {
		return errors.New(*msg)
	}
	if !k.checked.Load() {
		return fmt.Errorf("the registry's mark has not been compared with the cluster's (ConfigMap %s/%s) yet", k.namespace, k.name)
	}
	return nil
}

// run checks the mark every interval until ctx ends. The first check is done by the
// caller (check), before the controller starts.
func (k *markKeeper) run(ctx context.Context, interval time.Duration) {
	logger := klog.FromContext(ctx)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err := k.check(ctx); err != nil && ctx.Err() == nil {
			logger.Error(err, "Cannot keep the registry's mark in the cluster; retrying", "configMap", klog.KRef(k.namespace, k.name))
		}
	}
}

// check advances the registry's mark and compares it with the cluster's: below it,
// the registry is behind until an operator confirms; above it, the cluster's mark
// follows.
func (k *markKeeper) check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	mark, err := k.reg.AdvanceMark(ctx)
	if err != nil {
		return err
	}
	cms := k.client.CoreV1().ConfigMaps(k.namespace)
	if k.cm == nil || k.behind.Load() != nil {
		// First, and while behind (to see the operator's annotation): read it anew.
		cm, err := cms.Get(ctx, k.name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			cm, err = cms.Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: k.name, Namespace: k.namespace,
					Labels: map[string]string{"app.kubernetes.io/name": controller.Name}},
				Data: map[string]string{markOwner: k.owner, markValue: strconv.FormatInt(mark, 10)},
			}, metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("create ConfigMap %s/%s: %w", k.namespace, k.name, err)
			}
			k.cm = cm
			k.report(ctx, false, mark, mark)
			return nil
		case err != nil:
			return fmt.Errorf("read ConfigMap %s/%s: %w", k.namespace, k.name, err)
		}
		k.cm = cm
	}
	cm := k.cm.DeepCopy()
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	if cm.Data[markOwner] != k.owner {
		// Another owner's, or nothing yet: this owner's mark starts here.
		cm.Data = map[string]string{markOwner: k.owner, markValue: strconv.FormatInt(mark, 10)}
		if err := k.update(ctx, cm); err != nil {
			return err
		}
		k.report(ctx, false, mark, mark)
		return nil
	}
	seen, err := strconv.ParseInt(cm.Data[markValue], 10, 64)
	if err != nil {
		seen = 0 // edited by hand: start again from this registry's
	}
	// mark-1 is the registry's mark as this check found it, before it advanced it;
	// the cluster's was an earlier check's, committed to the registry before it was
	// kept: a registry below it lost that commit.
	found := cm.Data[markBehind]
	if found == "" && mark > seen {
		cm.Data[markValue] = strconv.FormatInt(mark, 10)
		if err := k.update(ctx, cm); err != nil {
			return err
		}
		k.report(ctx, false, mark, seen)
		return nil
	}
	if found == "" {
		found = strconv.FormatInt(mark-1, 10)
		cm.Data[markBehind] = found
		if err := k.update(ctx, cm); err != nil {
			return err
		}
	}
	at, _ := strconv.ParseInt(found, 10, 64)
	if cm.Annotations[AnnotationBehindConfirmed] != strconv.FormatInt(seen, 10) {
		k.report(ctx, true, at, seen)
		return nil
	}
	// Confirmed: the cluster's mark follows this registry from now on.
	delete(cm.Annotations, AnnotationBehindConfirmed)
	delete(cm.Data, markBehind)
	cm.Data[markValue] = strconv.FormatInt(mark, 10)
	if err := k.update(ctx, cm); err != nil {
		return err
	}
	klog.FromContext(ctx).Info("An operator confirmed the registry as it is; the sweep lets go of rows again",
		"registryMark", at, "clusterMark", seen, "configMap", klog.KRef(k.namespace, k.name))
	if k.pod != nil {
		k.recorder.Eventf(k.pod, corev1.EventTypeNormal, eventRegistryBehindConfirmed,
			"An operator confirmed the registry as it is (its mark %d, the cluster's %d); the sweep lets go of rows again", at, seen)
	}
	k.report(ctx, false, mark, mark)
	return nil
}

// report says whether the registry is behind: the metric, and once each time it
// becomes so the log line naming both marks and the Pod's Event.
func (k *markKeeper) report(ctx context.Context, behind bool, mark, seen int64) {
	k.metrics.SetRegistryBehind(behind)
	k.checked.Store(true)
	if !behind {
		k.behind.Store(nil)
		return
	}
	msg := behindMessage(mark, seen, k.namespace, k.name)
	if old := k.behind.Swap(&msg); old != nil {
		return
	}
	klog.FromContext(ctx).Error(nil, "The registry is behind the cluster: it went back in time. Rows of live Students are written back; "+
		"no row is released until an operator confirms", "registryMark", mark, "clusterMark", seen, "configMap", klog.KRef(k.namespace, k.name),
		"confirm", confirmCommand(k.namespace, k.name, seen))
	if k.pod != nil {
		k.recorder.Event(k.pod, corev1.EventTypeWarning, eventRegistryBehind, msg)
	}
}

// update writes cm; on a conflict the next check reads it again.
func (k *markKeeper) update(ctx context.Context, cm *corev1.ConfigMap) error {
	updated, err := k.client.CoreV1().ConfigMaps(k.namespace).Update(ctx, cm, metav1.UpdateOptions{})
	if err != nil {
		k.cm = nil
		return fmt.Errorf("update ConfigMap %s/%s: %w", k.namespace, k.name, err)
	}
	k.cm = updated
	return nil
}

// behindMessage says that the registry is behind, by how much, and how to confirm.
func behindMessage(mark, seen int64, namespace, name string) string {
	return fmt.Sprintf("the registry's mark is %d, below the %d this cluster has seen (ConfigMap %s/%s): the registry went back in time "+
		"(an older backup put back, a point-in-time recovery, a failover to a standby that lagged). Rows of live Students are written back; "+
		"no row is released or pruned until an operator confirms the registry as it is: %s",
		mark, seen, namespace, name, confirmCommand(namespace, name, seen))
}

func confirmCommand(namespace, name string, seen int64) string {
	return fmt.Sprintf("kubectl -n %s annotate configmap %s %s=%d", namespace, name, AnnotationBehindConfirmed, seen)
}

// registryBehind reads the cluster's mark for a command (prune): an error saying so
// when the registry is behind it and no operator has confirmed; nil when it is not, or
// when the cluster keeps no mark for the owner.
func registryBehind(ctx context.Context, client kubernetes.Interface, opts options, reg *registry.Registry) error {
	namespace, name := markPlace(opts)
	if namespace == "" {
		return nil
	}
	cm, err := client.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("read the cluster's mark of the registry (ConfigMap %s/%s): %w", namespace, name, err)
	case cm.Data[markOwner] != opts.owner:
		return nil
	}
	seen, _ := strconv.ParseInt(cm.Data[markValue], 10, 64)
	if cm.Annotations[AnnotationBehindConfirmed] == strconv.FormatInt(seen, 10) {
		return nil // confirmed; the controller clears it when it starts
	}
	mark, err := reg.ReadMark(ctx, opts.owner)
	if err != nil {
		return err
	}
	if found, _ := strconv.ParseInt(cm.Data[markBehind], 10, 64); cm.Data[markBehind] != "" {
		mark = found
	} else if mark >= seen {
		return nil
	}
	return errors.New(behindMessage(mark, seen, namespace, name))
}
