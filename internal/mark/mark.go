// Package mark keeps the registry's mark in the cluster, to notice a registry rolled back.
package mark

import (
	"context"
	"errors"
	"fmt"
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
)

// The mark lives in a ConfigMap named after the leader election Lease. It holds the owner
// and the highest registry mark this cluster has seen; a registry below it went back in
// time, and the ConfigMap says so (keyBehind) until an operator confirms (annotation).
const (
	// Suffix ends the ConfigMap's name, after the Lease's.
	Suffix = "-registry-mark"
	// Data keys of the ConfigMap.
	keyOwner  = "owner"
	keyMark   = "mark"
	keyBehind = "behind"
	// AnnotationBehindConfirmed, set to the ConfigMap's mark, accepts the registry as is.
	AnnotationBehindConfirmed = "bolingcavalry.k8s.io/registry-behind-confirmed"
	// Event reasons on the controller's Pod.
	eventRegistryBehind          = "RegistryBehind"
	eventRegistryBehindConfirmed = "RegistryBehindConfirmed"
)

// Place is the ConfigMap that keeps the mark; an empty Namespace means none. Given says
// the operator set --registry-mark-namespace.
type Place struct {
	Namespace, Name string
	Given           bool
}

// Reader reads the registry's mark.
type Reader interface {
	ReadMark(ctx context.Context, owner string) (int64, error)
}

// Registry is what the keeper reads and writes of the registry: its mark.
type Registry interface {
	Reader
	AdvanceMark(ctx context.Context) (int64, error)
}

// BehindError says the registry is behind the cluster's mark, and no operator confirmed it.
type BehindError struct{ message string }

func (e *BehindError) Error() string { return e.message }

// Keeper keeps the registry's mark in the cluster while this controller holds the owner's
// write fence, and reports a registry behind it. Set its fields before the first Check.
type Keeper struct {
	Client   kubernetes.Interface
	Place    Place
	Owner    string
	Registry Registry
	// Recorder posts the Events on Pod, the controller's own; nothing without Pod.
	Recorder record.EventRecorder
	Pod      *corev1.ObjectReference
	// Gauge, when set, is told whether the registry is behind (the metric).
	Gauge interface{ SetRegistryBehind(bool) }
	// Sweeper, when set, is asked to sweep after a confirmation: rows kept meanwhile may go.
	Sweeper interface{ SweepSoon() }

	// behind holds Behind's message while behind; checked says the marks have been compared.
	behind  atomic.Pointer[string]
	checked atomic.Bool
	// failing is the API server's refusal of the last check (RBAC), until a check succeeds.
	failing atomic.Pointer[string]
}

// Ready is nil unless the registry is behind the cluster's mark or the API server refused
// the last check (RBAC). An outage of the registry or API server leaves it ready, and a
// standby, which checks nothing, is ready.
func (k *Keeper) Ready() error {
	if msg := k.behind.Load(); msg != nil {
		return errors.New(*msg)
	}
	if msg := k.failing.Load(); msg != nil {
		return fmt.Errorf("cannot compare the registry's mark with the cluster's, so the sweep releases nothing: %s", *msg)
	}
	return nil
}

// Check compares the marks once and keeps an API server refusal for Ready.
func (k *Keeper) Check(ctx context.Context) error {
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

// Behind is nil once the marks were compared and the registry is not behind. Otherwise it
// says how to confirm, or that no comparison has run yet; the sweep releases nothing then.
func (k *Keeper) Behind() error {
	if msg := k.behind.Load(); msg != nil {
		return errors.New(*msg)
	}
	if !k.checked.Load() {
		return fmt.Errorf("the registry's mark has not been compared with the cluster's (ConfigMap %s/%s) yet", k.Place.Namespace, k.Place.Name)
	}
	return nil
}

// Run checks the mark every interval until ctx ends; the caller runs the first Check.
func (k *Keeper) Run(ctx context.Context, interval time.Duration) {
	logger := klog.FromContext(ctx)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err := k.Check(ctx); err != nil && ctx.Err() == nil {
			logger.Error(err, "Cannot keep the registry's mark in the cluster; retrying", "configMap", klog.KRef(k.Place.Namespace, k.Place.Name))
		}
	}
}

// check compares the registry's mark with the cluster's: below it, the registry is behind
// until an operator confirms; level or above, both marks advance. The ConfigMap is read
// before the mark advances and written only at the version read, so a former holder paused
// past its fence (mark refused) or past a new holder's write (conflict) writes nothing.
func (k *Keeper) check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cms := k.Client.CoreV1().ConfigMaps(k.Place.Namespace)
	read, err := cms.Get(ctx, k.Place.Name, metav1.GetOptions{})
	missing := apierrors.IsNotFound(err)
	if err != nil && !missing {
		return fmt.Errorf("read ConfigMap %s/%s: %w", k.Place.Namespace, k.Place.Name, err)
	}
	if missing {
		return k.start(ctx, nil)
	}
	cm := read.DeepCopy()
	if cm.Data[keyOwner] != k.Owner {
		// Another owner's, or nothing yet: this owner's mark starts here.
		return k.start(ctx, cm)
	}
	seen, err := strconv.ParseInt(cm.Data[keyMark], 10, 64)
	if err != nil {
		seen = 0 // edited by hand: start again from this registry's
	}
	// The registry committed the cluster's mark first, so a registry below it lost a
	// commit. Advance only once level, so that retries never creep past the cluster's mark.
	found := cm.Data[keyBehind]
	if found == "" {
		at, err := k.Registry.ReadMark(ctx, k.Owner)
		if err != nil {
			return err
		}
		if at >= seen {
			return k.advance(ctx, cm, false, seen)
		}
		found = strconv.FormatInt(at, 10)
		cm.Data[keyBehind] = found
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
	delete(cm.Data, keyBehind)
	if err := k.advance(ctx, cm, true, seen); err != nil {
		return err
	}
	klog.FromContext(ctx).Info("An operator confirmed the registry as it is; the sweep lets go of rows again",
		"registryMark", at, "clusterMark", seen, "configMap", klog.KRef(k.Place.Namespace, k.Place.Name))
	if k.Pod != nil {
		k.Recorder.Eventf(k.Pod, corev1.EventTypeNormal, eventRegistryBehindConfirmed,
			"An operator confirmed the registry as it is (its mark %d, the cluster's %d); the sweep lets go of rows again", at, seen)
	}
	if k.Sweeper != nil {
		k.Sweeper.SweepSoon()
	}
	return nil
}

// start begins this owner's mark: in a new ConfigMap (cm nil), or in another owner's cm.
func (k *Keeper) start(ctx context.Context, cm *corev1.ConfigMap) error {
	mark, err := k.Registry.AdvanceMark(ctx)
	if err != nil {
		return err
	}
	data := map[string]string{keyOwner: k.Owner, keyMark: strconv.FormatInt(mark, 10)}
	if cm == nil {
		_, err = k.Client.CoreV1().ConfigMaps(k.Place.Namespace).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: k.Place.Name, Namespace: k.Place.Namespace,
				Labels: map[string]string{"app.kubernetes.io/name": controller.Name}},
			Data: data,
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create ConfigMap %s/%s: %w", k.Place.Namespace, k.Place.Name, err)
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

// advance advances the registry's mark (level with seen, or confirmed) and then stores it
// in cm: should the update fail, the registry is ahead, never taken for behind.
func (k *Keeper) advance(ctx context.Context, cm *corev1.ConfigMap, confirmed bool, seen int64) error {
	mark, err := k.Registry.AdvanceMark(ctx)
	if err != nil {
		return err
	}
	cm.Data[keyMark] = strconv.FormatInt(mark, 10)
	if err := k.update(ctx, cm); err != nil {
		return err
	}
	if confirmed {
		seen = mark
	}
	k.report(ctx, false, mark, seen)
	return nil
}

func (k *Keeper) report(ctx context.Context, behind bool, mark, seen int64) {
	if k.Gauge != nil {
		k.Gauge.SetRegistryBehind(behind)
	}
	k.checked.Store(true)
	if !behind {
		k.behind.Store(nil)
		return
	}
	msg := behindMessage(mark, seen, k.Place.Namespace, k.Place.Name)
	if old := k.behind.Swap(&msg); old != nil {
		return
	}
	klog.FromContext(ctx).Error(nil, "The registry is behind the cluster: it went back in time. Rows of live Students are written back; "+
		"no row is released until an operator confirms", "registryMark", mark, "clusterMark", seen, "configMap", klog.KRef(k.Place.Namespace, k.Place.Name),
		"confirm", confirmCommand(k.Place.Namespace, k.Place.Name, seen))
	if k.Pod != nil {
		k.Recorder.Event(k.Pod, corev1.EventTypeWarning, eventRegistryBehind, msg)
	}
}

// update writes cm at the version the check read; a conflict writes nothing.
func (k *Keeper) update(ctx context.Context, cm *corev1.ConfigMap) error {
	if _, err := k.Client.CoreV1().ConfigMaps(k.Place.Namespace).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update ConfigMap %s/%s: %w", k.Place.Namespace, k.Place.Name, err)
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

// Behind checks the cluster's mark for prune, adopt and plan: nil when the registry is not
// behind it or an operator confirmed, else an error. If required (prune), no mark is an
// error too: prune deletes nothing unless the registry is known current. Adopt goes on
// without one (a rebuilt cluster adopts before its controller runs); see find.
func Behind(ctx context.Context, client kubernetes.Interface, place Place, owner string, reg Reader, required bool) error {
	cm, err := find(ctx, client, place, owner, required)
	if err != nil || cm == nil {
		return err
	}
	return behind(ctx, cm, owner, reg)
}

// behind is Behind of the ConfigMap cm.
func behind(ctx context.Context, cm *corev1.ConfigMap, owner string, reg Reader) error {
	seen, _ := strconv.ParseInt(cm.Data[keyMark], 10, 64)
	if cm.Annotations[AnnotationBehindConfirmed] == strconv.FormatInt(seen, 10) {
		return nil // confirmed; the controller clears it when it starts
	}
	mark, err := reg.ReadMark(ctx, owner)
	if err != nil {
		return err
	}
	if found, _ := strconv.ParseInt(cm.Data[keyBehind], 10, 64); cm.Data[keyBehind] != "" {
		mark = found
	} else if mark >= seen {
		return nil
	}
	return &BehindError{behindMessage(mark, seen, cm.Namespace, cm.Name)}
}

// Confirm accepts a registry that is behind the cluster's mark as it is, as an operator
// would by annotating the ConfigMap with the mark: the controller then lets go of rows
// again. It says what it did, and writes nothing when the registry is not behind or
// was confirmed already. The update fails if the mark moved since it was read.
func Confirm(ctx context.Context, client kubernetes.Interface, place Place, owner string, reg Reader) (string, error) {
	cm, err := find(ctx, client, place, owner, true)
	if err != nil {
		return "", err
	}
	seen := cm.Data[keyMark]
	if seen == "" {
		return "", fmt.Errorf("ConfigMap %s/%s holds no mark yet: a controller keeps one once it runs", cm.Namespace, cm.Name)
	}
	var why *BehindError
	switch err := behind(ctx, cm, owner, reg); {
	case cm.Annotations[AnnotationBehindConfirmed] == seen:
		return fmt.Sprintf("the restore is confirmed already (ConfigMap %s/%s, mark %s)", cm.Namespace, cm.Name, seen), nil
	case err == nil:
		return fmt.Sprintf("the registry is not behind the cluster's mark %s (ConfigMap %s/%s): nothing to confirm", seen, cm.Namespace, cm.Name), nil
	case !errors.As(err, &why):
		return "", err
	}
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	cm.Annotations[AnnotationBehindConfirmed] = seen
	if _, err := client.CoreV1().ConfigMaps(cm.Namespace).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		return "", fmt.Errorf("confirm the restore (ConfigMap %s/%s): %w", cm.Namespace, cm.Name, err)
	}
	return fmt.Sprintf("confirmed the registry as it is at the cluster's mark %s (ConfigMap %s/%s); the controller lets go of rows again "+
		"at its next check of the mark, and registry prune and adopt run", seen, cm.Namespace, cm.Name), nil
}

// find returns the ConfigMap with the owner's mark; nil when none and not required.
func find(ctx context.Context, client kubernetes.Interface, place Place, owner string, required bool) (*corev1.ConfigMap, error) {
	namespace, name := place.Namespace, place.Name
	if namespace == "" && !required {
		return search(ctx, client, owner)
	}
	if namespace == "" {
		return nil, errors.New("the cluster's mark of the registry is needed to tell that the registry did not go back in time: " +
			"give the controller's namespace with --registry-mark-namespace (and its --leader-elect-id where the Lease is not student-controller)")
	}
	cm, err := client.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) && !required, err == nil && cm.Data[keyOwner] != owner && !required:
		if place.Given {
			return nil, nil // none kept where the operator said
		}
		// Not in the Pod's or Lease's namespace: search by label before going without it.
		return search(ctx, client, owner)
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("no ConfigMap %s/%s keeps the registry's mark: a controller of this version keeps it once it runs "+
			"(check --registry-mark-namespace and --leader-elect-id)", namespace, name)
	case err != nil:
		return nil, fmt.Errorf("read the cluster's mark of the registry (ConfigMap %s/%s): %w", namespace, name, err)
	case cm.Data[keyOwner] != owner:
		return nil, fmt.Errorf("ConfigMap %s/%s keeps the mark of owner %q, not %q: run a controller of this owner first", namespace, name,
			cm.Data[keyOwner], owner)
	}
	return cm, nil
}

// search finds the owner's mark by label in any namespace; several is an error.
func search(ctx context.Context, client kubernetes.Interface, owner string) (*corev1.ConfigMap, error) {
	list, err := client.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + controller.Name})
	if err != nil {
		return nil, fmt.Errorf("look for the cluster's mark of the registry (or give --registry-mark-namespace): %w", err)
	}
	var found []*corev1.ConfigMap
	for i, cm := range list.Items {
		if strings.HasSuffix(cm.Name, Suffix) && cm.Data[keyOwner] == owner {
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
