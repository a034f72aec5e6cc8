package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/student-controller/student-controller/internal/controller"
	"github.com/student-controller/student-controller/internal/registry"
)

// The registry's mark, kept in the cluster: a ConfigMap named after the leader
// election Lease, in the controller's namespace, which holds the owner and the highest
// mark this cluster has seen the registry at. A registry found below it went back in time; the ConfigMap
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
// else kube-system with --leader-elect); named after the Lease (--leader-elect-id), so
// that the RBAC that names the Lease names it too. Empty namespace: nowhere (a
// controller run outside a Pod without leader election).
func markPlace(opts options) (namespace, name string) {
	namespace = cmp.Or(opts.markNamespace, opts.leaderElectNamespace, os.Getenv("POD_NAMESPACE"))
	if namespace == "" && opts.leaderElect {
		namespace = metav1.NamespaceSystem
	}
	return namespace, opts.leaderElectID + markSuffix
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
	// confirmed, when set, is called once an operator has confirmed a registry that
	// was behind (the controller's SweepSoon).
	confirmed func()
	// failing is the last check's refusal by the API server (RBAC that lets the
	// controller not read or write the ConfigMap), until a check succeeds.
	failing atomic.Pointer[string]
}

// Ready is nil unless the registry is behind the cluster's mark, or the API server
// refused the last check the ConfigMap (RBAC): the Pod is then not ready, and says
// why. A registry outage or an API server that does not answer leaves it ready, as
// readiness never asks the registry; a standby, which checks nothing, is ready.
func (k *markKeeper) Ready() error {
	if msg := k.behind.Load(); msg != nil {
		return errors.New(*msg)
	}
	if msg := k.failing.Load(); msg != nil {
		return fmt.Errorf("cannot compare the registry's mark with the cluster's, so the sweep releases nothing: %s", *msg)
	}
	return nil
}

// checkAndKeep runs check and keeps a refusal by the API server for Ready.
func (k *markKeeper) checkAndKeep(ctx context.Context) error {
	err := k.check(ctx)
	switch {
	case apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err):
		msg := err.Error()
		k.failing.Store(&msg)
	case err == nil:
		k.failing.Store(nil)
	}
	return err
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
		if err := k.checkAndKeep(ctx); err != nil && ctx.Err() == nil {
			logger.Error(err, "Cannot keep the registry's mark in the cluster; retrying", "configMap", klog.KRef(k.namespace, k.name))
		}
	}
}

// check compares the registry's mark with the cluster's: below it, the registry is
// behind until an operator confirms; level or above, the registry's mark advances and
// the cluster's follows. The ConfigMap is read before the mark advances, and written
// only at the version read: a former holder that paused past its fence (its mark
// refused) or past a new holder's write (a conflict) writes nothing.
func (k *markKeeper) check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cms := k.client.CoreV1().ConfigMaps(k.namespace)
	read, err := cms.Get(ctx, k.name, metav1.GetOptions{})
	missing := apierrors.IsNotFound(err)
	if err != nil && !missing {
		return fmt.Errorf("read ConfigMap %s/%s: %w", k.namespace, k.name, err)
	}
	if missing {
		return k.start(ctx, nil)
	}
	cm := read.DeepCopy()
	if cm.Data[markOwner] != k.owner {
		// Another owner's, or nothing yet: this owner's mark starts here.
		return k.start(ctx, cm)
	}
	seen, err := strconv.ParseInt(cm.Data[markValue], 10, 64)
	if err != nil {
		seen = 0 // edited by hand: start again from this registry's
	}
	// The cluster's mark is one the registry committed before the cluster kept it: a
	// registry below it lost that commit. The registry's mark advances only once the
	// comparison says level, so that no retry creeps past the cluster's.
	found := cm.Data[markBehind]
	if found == "" {
		at, err := k.reg.ReadMark(ctx, k.owner)
		if err != nil {
			return err
		}
		if at >= seen {
			return k.advance(ctx, cm, false, seen)
		}
		found = strconv.FormatInt(at, 10)
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
	if err := k.advance(ctx, cm, true, seen); err != nil {
		return err
	}
	klog.FromContext(ctx).Info("An operator confirmed the registry as it is; the sweep lets go of rows again",
		"registryMark", at, "clusterMark", seen, "configMap", klog.KRef(k.namespace, k.name))
	if k.pod != nil {
		k.recorder.Eventf(k.pod, corev1.EventTypeNormal, eventRegistryBehindConfirmed,
			"An operator confirmed the registry as it is (its mark %d, the cluster's %d); the sweep lets go of rows again", at, seen)
	}
	if k.confirmed != nil {
		k.confirmed()
	}
	return nil
}

// start begins this owner's mark in the cluster: in a new ConfigMap (cm nil), or in
// cm, which another owner's mark held.
func (k *markKeeper) start(ctx context.Context, cm *corev1.ConfigMap) error {
	mark, err := k.reg.AdvanceMark(ctx)
	if err != nil {
		return err
	}
	data := map[string]string{markOwner: k.owner, markValue: strconv.FormatInt(mark, 10)}
	if cm == nil {
		_, err = k.client.CoreV1().ConfigMaps(k.namespace).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: k.name, Namespace: k.namespace,
				Labels: map[string]string{"app.kubernetes.io/name": controller.Name}},
			Data: data,
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create ConfigMap %s/%s: %w", k.namespace, k.name, err)
		}
	} else {
		cm.Data = data
		if err := k.update(ctx, cm); err != nil {
			return err
		}
	}
	k.report(ctx, false, mark, mark)
	return nil
}

// advance advances the registry's mark, level with the cluster's (seen) or confirmed
// so, and keeps it in cm: a registry ahead of the cluster, should the update fail, is
// never taken for one behind.
func (k *markKeeper) advance(ctx context.Context, cm *corev1.ConfigMap, confirmed bool, seen int64) error {
	mark, err := k.reg.AdvanceMark(ctx)
	if err != nil {
		return err
	}
	cm.Data[markValue] = strconv.FormatInt(mark, 10)
	if err := k.update(ctx, cm); err != nil {
		return err
	}
	if confirmed {
		seen = mark
	}
	k.report(ctx, false, mark, seen)
	return nil
}

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

// update writes cm at the version the check read; a conflict writes nothing.
func (k *markKeeper) update(ctx context.Context, cm *corev1.ConfigMap) error {
	if _, err := k.client.CoreV1().ConfigMaps(k.namespace).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update ConfigMap %s/%s: %w", k.namespace, k.name, err)
	}
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

// registryBehind reads the cluster's mark for a command (prune, adopt): nil when the
// registry is not behind it, or an operator has confirmed; otherwise an error that
// says so. For prune (required) a mark it cannot find (no namespace given, no
// ConfigMap, another owner's) is an error too: prune deletes nothing on a registry it
// cannot tell is current. Adopt goes on where the cluster keeps no mark of the owner
// yet (a cluster rebuilt adopts before its controller runs): in --registry-mark-namespace
// when given, else anywhere, looked for by its label.
func registryBehind(ctx context.Context, client kubernetes.Interface, opts options, reg *registry.Registry, required bool) error {
	cm, err := findMark(ctx, client, opts, required)
	if err != nil || cm == nil {
		return err
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
	return errors.New(behindMessage(mark, seen, cm.Namespace, cm.Name))
}

// findMark finds the ConfigMap that keeps the owner's mark: nil when there is none
// and it is not required.
func findMark(ctx context.Context, client kubernetes.Interface, opts options, required bool) (*corev1.ConfigMap, error) {
	namespace, name := markPlace(opts)
	if namespace == "" && !required {
		return searchMark(ctx, client, opts.owner)
	}
	if namespace == "" {
		return nil, errors.New("the cluster's mark of the registry is needed to tell that the registry did not go back in time: " +
			"give the controller's namespace with --registry-mark-namespace (and its --leader-elect-id where the Lease is not student-controller)")
	}
	cm, err := client.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) && !required, err == nil && cm.Data[markOwner] != opts.owner && !required:
		if opts.markNamespace != "" {
			return nil, nil // none kept where the operator said
		}
		// Not where the Pod's or the Lease's namespace says: looked for by its label
		// before adopt goes on without it.
		return searchMark(ctx, client, opts.owner)
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("no ConfigMap %s/%s keeps the registry's mark: a controller of this version keeps it once it runs "+
			"(check --registry-mark-namespace and --leader-elect-id)", namespace, name)
	case err != nil:
		return nil, fmt.Errorf("read the cluster's mark of the registry (ConfigMap %s/%s): %w", namespace, name, err)
	case cm.Data[markOwner] != opts.owner:
		return nil, fmt.Errorf("ConfigMap %s/%s keeps the mark of owner %q, not %q: run a controller of this owner first", namespace, name,
			cm.Data[markOwner], opts.owner)
	}
	return cm, nil
}

// searchMark finds the owner's mark in any namespace, by the label the controller
// gives it: nil when there is none, an error when there are several.
func searchMark(ctx context.Context, client kubernetes.Interface, owner string) (*corev1.ConfigMap, error) {
	list, err := client.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + controller.Name})
	if err != nil {
		return nil, fmt.Errorf("look for the cluster's mark of the registry (or give --registry-mark-namespace): %w", err)
	}
	var found []*corev1.ConfigMap
	for i, cm := range list.Items {
		if strings.HasSuffix(cm.Name, markSuffix) && cm.Data[markOwner] == owner {
			found = append(found, &list.Items[i])
		}
	}
	switch len(found) {
	case 0:
		return nil, nil
	case 1:
		return found[0], nil
	}
	return nil, fmt.Errorf("%d ConfigMaps keep the mark of owner %q (%s/%s, %s/%s): give the controller's with --registry-mark-namespace",
		len(found), owner, found[0].Namespace, found[0].Name, found[1].Namespace, found[1].Name)
}
