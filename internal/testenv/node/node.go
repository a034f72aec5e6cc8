package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/student-controller/student-controller/internal/testenv/controlplane"
	"github.com/student-controller/student-controller/internal/testenv/freeport"
	"github.com/student-controller/student-controller/internal/testenv/proc"
)

// The node's fixed names. Only one node runs on a machine at a time (New waits for
// the machine's node lock): kube-proxy's nftables tables have one name (kube-proxy, in
// the ip and ip6 families), and so do the bridge and the cgroup.
const (
	// Name is the Node's name.
	Name = "student-node"
	// Bridge is the Pods' bridge. It carries the node's address (IP), the first of
	// PodCIDR: this machine and the Pods reach it, the network outside does not.
	Bridge  = "stu-br0"
	PodCIDR = "10.244.0.0/24"
	// CgroupRoot is the cgroup, in every hierarchy, that holds the Pods' cgroups.
	CgroupRoot = "/student-node"
	// StorageClass is the default StorageClass: the node's local volumes.
	StorageClass = "student-local"
	// pauseTag is the tag of the pause image in the node's registry.
	pauseTag = "3.10.2"
	// dirMarker names a node's folder, which New may empty.
	dirMarker = ".student-node"
)

// IP is the node's address, on Bridge: the API server of a control plane started with
// NodeAddress listens there, the kubelet too, and PostgreSQL for the Pods.
var IP = net.IPv4(10, 244, 0, 1)

// Volumes is how many PersistentVolumes of 1Gi Start provides.
const Volumes = 6

// Node is a node: reserved by New, running after Start, gone after Stop.
type Node struct {
	// Registry is the host:port of the node's image registry (plain HTTP): push to
	// Registry+"/NAME:TAG", and Pods pull from there.
	Registry string
	// Dir holds everything the node makes.
	Dir string
	// Containerd, Kubelet, KubeProxy, Scheduler and Images (the registry) are the
	// node's processes.
	Containerd, Kubelet, KubeProxy, Scheduler, Images *proc.Process

	root      string
	cp        *controlplane.Env
	kube      kubernetes.Interface
	imageTool string
	logf      func(string, ...any)
	rec       record // what Stop, or the next New after a crash, puts back

	proxyHealth, schedulerHealth string
	lock                         *os.File // held from New to Stop: one node per machine
}

// Options say how to run a node.
type Options struct {
	// Dir is the node's folder (make cluster's), emptied first: it must be missing,
	// empty, or a node's folder of an earlier run. A temporary folder, which Stop
	// removes, when empty.
	Dir string
	// Log, when set, gets a line for each step (make cluster shows them).
	Log func(format string, args ...any)
	// LockWait bounds the wait for another node on this machine to stop (make cluster,
	// another suite); 10 minutes when 0.
	LockWait time.Duration
}

// New reserves the machine for a node: it waits until no other node runs here, removes
// what one that was killed left (from its record), makes the node's folder and gives
// the node its address (IP, on Bridge), which the control plane must listen on
// (controlplane.Options.NodeAddress) before Start. root is the repository's root. Call
// Stop when done, also after an error: it removes what New and Start made.
func New(ctx context.Context, root string, opts Options) (*Node, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the node needs root (a kubelet does): run as root")
	}
	if err := checkMachine(root); err != nil {
		return nil, err
	}
	n := &Node{root: root, logf: opts.Log}
	if n.logf == nil {
		n.logf = func(string, ...any) {}
	}
	wait := opts.LockWait
	if wait == 0 {
		wait = 10 * time.Minute
	}
	var err error
	if n.lock, err = lockMachine(ctx, wait, n.logf); err != nil {
		return nil, err
	}
	return n, n.reserve(opts.Dir)
}

func (n *Node) reserve(dir string) error {
	removed, err := recoverKilled()
	if err != nil {
		return err
	}
	if len(removed) > 0 {
		n.logf("node: removed what a node that was killed left: %s", strings.Join(removed, "; "))
	}
	if left := Leftovers(""); len(left) > 0 {
		return fmt.Errorf("this machine runs parts of another Kubernetes node, or a node left them without a record; "+
			"nothing was touched:\n  %s", strings.Join(left, "\n  "))
	}
	if err := checkAddresses(); err != nil {
		return err
	}
	if dir == "" {
		if dir, err = os.MkdirTemp("", "student-node-"); err != nil {
			return err
		}
		n.rec.RemoveDir = true
	} else if err := emptyNodeDir(dir); err != nil {
		return err
	}
	// Mount points in /proc are resolved paths.
	if dir, err = filepath.EvalSymlinks(dir); err != nil {
		return err
	}
	n.Dir, n.rec.Dir = dir, dir
	if err := os.WriteFile(n.path(dirMarker), nil, 0o600); err != nil {
		return err
	}
	// Others may pass through to the volumes (a test reads the registry file as the
	// Pod's user), but list nothing.
	if err := os.Chmod(n.Dir, 0o711); err != nil { // #nosec G302 -- passable, not listable
		return err
	}
	n.rec.Made = missingFolders()
	if n.rec.Sysctls, err = readSysctls(); err != nil {
		return err
	}
	if err := n.rec.save(); err != nil {
		return err
	}
	return makeBridge()
}

// emptyNodeDir makes dir an empty folder, refusing one that is not a node's.
func emptyNodeDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return os.MkdirAll(dir, 0o700)
	}
	if err != nil {
		return err
	}
	if len(entries) == 0 {
		return nil
	}
	if _, err := os.Stat(filepath.Join(dir, dirMarker)); err != nil {
		return fmt.Errorf("%s holds files and is not a node's folder (no %s): not emptied", dir, dirMarker)
	}
	// Mounts left under it (a node killed without a record) go first.
	if resolved, err := filepath.EvalSymlinks(dir); err == nil {
		if err := unmountUnder(resolved); err != nil {
			return err
		}
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// makeBridge makes the Pods' bridge with the node's address, before the CNI plugin
// would: the API server listens there before the first Pod runs.
func makeBridge() error {
	_, bits, _ := strings.Cut(PodCIDR, "/")
	for _, args := range [][]string{
		{"link", "add", Bridge, "type", "bridge"},
		{"addr", "add", IP.String() + "/" + bits, "dev", Bridge},
		{"link", "set", Bridge, "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil { // #nosec G204 -- fixed arguments
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// Start runs the node for the control plane cp, which listens on IP
// (controlplane.Options.NodeAddress), and waits until the Node is Ready and
// kube-proxy and kube-scheduler serve.
func (n *Node) Start(ctx context.Context, cp *controlplane.Env) error {
	n.cp, n.kube = cp, kubernetes.NewForConfigOrDie(cp.Config)
	n.logf("node: images: building the image tool and the pause image, and serving a registry")
	pause, err := n.startRegistry(ctx)
	if err != nil {
		return err
	}
	n.logf("node: containerd (runc, CNI bridge %s, Pods in %s)", Bridge, PodCIDR)
	if err := n.startContainerd(ctx, pause); err != nil {
		return err
	}
	n.logf("node: kubelet, kube-proxy (nftables) and kube-scheduler")
	if err := n.startKubelet(); err != nil {
		return err
	}
	if err := n.startKubeProxy(); err != nil {
		return err
	}
	if err := n.startScheduler(); err != nil {
		return err
	}
	if err := n.provideVolumes(ctx); err != nil {
		return err
	}
	n.logf("node: waiting for Node %s to be Ready, kube-proxy and kube-scheduler to serve", Name)
	if err := n.waitReady(ctx); err != nil {
		return err
	}
	return n.waitServing(ctx)
}

// checkMachine says what this machine lacks to run a node, and how to get it.
func checkMachine(root string) error {
	var missing []string
	for _, b := range []string{"kubelet", "kube-proxy", "kube-scheduler"} {
		if _, err := os.Stat(filepath.Join(root, "bin", "k8s", b)); err != nil {
			missing = append(missing, "bin/k8s/"+b+" (make node)")
		}
	}
	for _, p := range []string{containerdBin, runcBin, filepath.Join(cniBin, "bridge"), filepath.Join(cniBin, "host-local"), "/usr/sbin/nft"} {
		if _, err := os.Stat(p); err != nil {
			missing = append(missing, p+" (make packages: Debian's containerd, runc, containernetworking-plugins, nftables)")
		}
	}
	if out, err := exec.Command("gcc", "-print-file-name=libc.a").Output(); err != nil || !filepath.IsAbs(strings.TrimSpace(string(out))) {
		missing = append(missing, "gcc and a static libc, which build the pause image (make packages: Debian's gcc, libc6-dev)")
	}
	if len(missing) > 0 {
		return fmt.Errorf("the node needs:\n  %s", strings.Join(missing, "\n  "))
	}
	// The kubelet runs here with cgroup v1's cgroupfs driver; a machine with the unified
	// hierarchy alone (cgroup v2) is not one the node was made and tested on.
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return errors.New("this machine has cgroup v2 alone; the node runs on cgroup v1 (its kubelet's cgroupfs driver, no systemd), as on the machines it is tested on")
	}
	return nil
}

// checkAddresses says whether an address of this machine is in the node's Pod range.
// New asks after it has put back what a killed node left: the bridge of that node
// carries the node's own address.
func checkAddresses() error {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return err
	}
	_, pods, _ := net.ParseCIDR(PodCIDR)
	for _, a := range addrs {
		if ipnet, ok := a.(*net.IPNet); ok && pods.Contains(ipnet.IP) {
			return fmt.Errorf("this machine already has the address %s, in the node's Pod range %s; nothing was touched", ipnet, PodCIDR)
		}
	}
	return nil
}

// Debian's packages.
const (
	containerdBin = "/usr/bin/containerd"
	runcBin       = "/usr/sbin/runc"
	cniBin        = "/usr/lib/cni"
)

func (n *Node) path(elem ...string) string { return filepath.Join(append([]string{n.Dir}, elem...)...) }

func (n *Node) socket() string { return n.path("containerd.sock") }

// startRegistry builds hack/tools/image, serves its registry and pushes the pause
// image, built from the pause.c of Kubernetes' own module, into it.
func (n *Node) startRegistry(ctx context.Context) (string, error) {
	root := n.root
	n.imageTool = filepath.Join(root, "bin", "tools", "image")
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", n.imageTool, ".") // #nosec G204 -- fixed arguments
	build.Dir = filepath.Join(root, "hack", "tools", "image")
	build.Env = append(os.Environ(), "CGO_ENABLED=0") // static, as make test's other builds: they share the standard library
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build hack/tools/image: %v\n%s", err, out)
	}
	port, err := freeport.Get()
	if err != nil {
		return "", err
	}
	n.Registry = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	n.Images = proc.New(proc.Spec{Env: []string{marker}, Name: "registry", Path: n.imageTool, Args: []string{"-serve", n.Registry}, Log: n.path("registry.log")})
	if err := n.Images.Start(); err != nil {
		return "", err
	}
	if ok, err := n.Images.WaitUntil(ctx, 30*time.Second, func() bool { return strings.Contains(n.Images.Output(), "serving on") }); err != nil || !ok {
		return "", errors.Join(err, fmt.Errorf("the registry did not start; its log ends:\n%s", n.Images.Tail(10)))
	}

	// kubelet's and kubeadm's pause image, built as Kubernetes builds it.
	src, err := moduleFile(ctx, root, "k8s.io/kubernetes", "build/pause/linux/pause.c")
	if err != nil {
		return "", err
	}
	pause := n.path("images", "pause")
	if err := os.MkdirAll(filepath.Dir(pause), 0o700); err != nil {
		return "", err
	}
	cc := exec.CommandContext(ctx, "gcc", "-Os", "-Wall", "-Werror", "-static", "-DVERSION=v"+pauseTag+"-student", "-o", pause, src) // #nosec G204 -- fixed arguments
	if out, err := cc.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the pause image's binary with gcc: %v\n%s", err, out)
	}
	ref := n.Registry + "/pause:" + pauseTag
	digest, err := n.Push(ctx, PushOptions{Binary: pause, Entrypoint: "/pause", User: "65535:65535", Title: "pause", Ref: ref})
	// By digest: whoever else reaches the registry cannot swap it.
	return ref + "@" + digest, err
}

// PushOptions say what image Push makes of a binary.
type PushOptions struct {
	Binary string
	// Ref is where it goes: Registry + "/NAME:TAG".
	Ref string
	// Entrypoint, User and Title are hack/tools/image's flags; its defaults (the
	// controller's image) when empty.
	Entrypoint, User, Title string
	// Version labels the image; two versions of one binary are two digests.
	Version string
}

// Push builds an image of one static binary with hack/tools/image and pushes it to
// the node's registry, returning its digest (sha256:...).
func (n *Node) Push(ctx context.Context, o PushOptions) (string, error) {
	out := n.path("images", filepath.Base(o.Ref)+".oci")
	args := []string{"-binary", o.Binary, "-out", out, "-push", o.Ref}
	for flag, v := range map[string]string{"-entrypoint": o.Entrypoint, "-user": o.User, "-title": o.Title, "-version": o.Version} {
		if v != "" {
			args = append(args, flag, v)
		}
	}
	cmd := exec.CommandContext(ctx, n.imageTool, args...) // #nosec G204 -- the project's image tool
	var stderr strings.Builder
	cmd.Stderr = &stderr
	digest, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("image %s: %v\n%s", o.Ref, err, stderr.String())
	}
	return strings.TrimSpace(string(digest)), nil
}

// PushLayout pushes the image of an OCI layout (make image's bin/image/oci) to the
// node's registry as ref, returning its digest.
func (n *Node) PushLayout(ctx context.Context, layout, ref string) (string, error) {
	cmd := exec.CommandContext(ctx, n.imageTool, "-layout", layout, "-push", ref) // #nosec G204 -- the project's image tool
	var stderr strings.Builder
	cmd.Stderr = &stderr
	digest, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("push %s as %s: %v\n%s", layout, ref, err, stderr.String())
	}
	return strings.TrimSpace(string(digest)), nil
}

// moduleFile is the path of file in module's folder of the module cache, at the
// version hack/tools/controlplane requires, downloading the module when missing.
func moduleFile(ctx context.Context, root, module, file string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", module) // #nosec G204 -- fixed arguments
	cmd.Dir = filepath.Join(root, "hack", "tools", "controlplane")
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %w", module, err)
	}
	const key = `"Dir": "`
	i := strings.Index(string(out), key)
	if i < 0 {
		return "", fmt.Errorf("go mod download %s: no folder in %s", module, out)
	}
	dir, _, _ := strings.Cut(string(out[i+len(key):]), `"`)
	return filepath.Join(dir, file), nil
}

// provideVolumes makes the default StorageClass and Volumes local PersistentVolumes of
// 1Gi under the node's folder, so that claims bind as on a cluster with storage.
func (n *Node) provideVolumes(ctx context.Context) error {
	sc := &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{Name: StorageClass,
			Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}},
		Provisioner:       "kubernetes.io/no-provisioner",
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
		ReclaimPolicy:     ptr.To(corev1.PersistentVolumeReclaimRetain),
	}
	if _, err := n.kube.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	for i := range Volumes {
		name := fmt.Sprintf("%s-volume-%d", Name, i)
		dir := n.path("volumes", name)
		if err := os.MkdirAll(dir, 0o711); err != nil {
			return err
		}
		if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil { // #nosec G302 -- passable, not listable
			return err
		}
		pv := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
				StorageClassName:              StorageClass,
				PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: dir}},
				NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
					MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{Name}}},
				}}}},
			},
		}
		if _, err := n.kube.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return nil
}

// waitReady waits until the Node is Ready and carries no taint, so Pods schedule.
func (n *Node) waitReady(ctx context.Context) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		node, err := n.kube.CoreV1().Nodes().Get(ctx, Name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
				last = fmt.Sprintf("Ready=%s: %s", c.Status, c.Message)
				return false, nil
			}
		}
		if len(node.Spec.Taints) > 0 {
			last = fmt.Sprintf("taints %v", node.Spec.Taints)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("node %s not ready within 2 minutes (last: %s); kubelet's log %s ends:\n%s", Name, last, n.Kubelet.LogPath(), n.Kubelet.Tail(20))
	}
	return nil
}

// Stop stops the node and removes everything it made: the Pods' containers and
// sandboxes (through the CRI, so the CNI plugins give back their addresses), the
// processes, kube-proxy's nftables tables, the bridge, every mount under the node's
// folder, the cgroups; it sets back the sysctls that kubelet and the bridge plugin
// changed, and removes the folder if New made it. It copes with a node that New or
// Start left half made.
func (n *Node) Stop() error {
	var errs []error
	stop := func(p *proc.Process, grace time.Duration) {
		if p != nil {
			errs = append(errs, p.Stop(grace))
		}
	}
	stop(n.Scheduler, 10*time.Second)
	stop(n.Kubelet, 10*time.Second)
	if n.Containerd != nil && n.Containerd.Pid() != 0 {
		errs = append(errs, removeSandboxes(n.socket()))
	}
	stop(n.Containerd, 10*time.Second)
	stop(n.KubeProxy, 10*time.Second)
	stop(n.Images, 5*time.Second)
	if n.rec.Dir != "" {
		errs = append(errs, n.rec.putBack())
	}
	if n.lock != nil {
		errs = append(errs, n.lock.Close())
	}
	return errors.Join(errs...)
}

// lockFile is held by the node that runs on this machine.
const lockFile = "/run/student-node.lock"

// lockMachine waits until no other node runs on this machine (a test suite's, make
// cluster's), up to wait, and holds the machine's node lock until the returned file is
// closed (or the process exits).
func lockMachine(ctx context.Context, wait time.Duration, logf func(string, ...any)) (*os.File, error) {
	f, err := os.OpenFile(lockFile, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(wait)
	for said := false; ; said = true {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) // #nosec G115 -- a file descriptor
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			_ = f.Close()
			return nil, fmt.Errorf("another node runs on this machine (make cluster, or a test suite's; it holds %s) after %s: %w", lockFile, wait, err)
		}
		if !said {
			logf("node: another node runs on this machine (make cluster, or a test suite's); waiting up to %s for it to stop", wait)
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

// Signal sends sig to the main process of the container named container in the Pod
// namespace/pod, as a process in the container would see it (SIGSTOP freezes it).
func (n *Node) Signal(ctx context.Context, namespace, pod, container string, sig syscall.Signal) error {
	pid, err := containerPid(ctx, n.socket(), namespace, pod, container)
	if err != nil {
		return err
	}
	return syscall.Kill(pid, sig)
}
