package node

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	componentbasev1alpha1 "k8s.io/component-base/config/v1alpha1"
	proxyv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/student-controller/student-controller/internal/testenv/freeport"
	"github.com/student-controller/student-controller/internal/testenv/proc"
)

// containerdConfig is containerd's configuration: every folder and socket under the
// node's own, the CNI bridge, runc with cgroupfs, and the node's registry over HTTP.
//
// restrict_oom_score_adj: a sandbox without CAP_SYS_RESOURCE (this machine's) cannot
// lower a process's OOM score, so containers keep containerd's.
// netns_mounts_under_state_dir: the Pods' network namespaces are mounted in the node's
// folder, not /var/run/netns.
const containerdConfig = `version = 2
root = "{{dir}}/containerd/root"
state = "{{dir}}/containerd/state"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing",
]
[grpc]
  address = "{{dir}}/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "{{dir}}/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{{pause}}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{{cni}}"
    conf_dir = "{{dir}}/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{{runc}}"
        Root = "{{dir}}/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."{{registry}}"]
    endpoint = ["http://{{registry}}"]
`

func (n *Node) startContainerd(ctx context.Context, pause string) error {
	config := strings.NewReplacer("{{dir}}", n.Dir, "{{pause}}", pause, "{{cni}}", cniBin,
		"{{runc}}", runcBin, "{{registry}}", n.Registry).Replace(containerdConfig)
	if err := os.WriteFile(n.path("containerd.toml"), []byte(config), 0o600); err != nil {
		return err
	}
	if err := n.writeCNIConfig(); err != nil {
		return err
	}
	n.Containerd = proc.New(proc.Spec{Env: []string{marker}, Name: "containerd", Path: containerdBin,
		Args: []string{"--config", n.path("containerd.toml")}, Log: n.path("containerd.log")})
	if err := n.Containerd.Start(); err != nil {
		return err
	}
	ok, err := n.Containerd.WaitUntil(ctx, 30*time.Second, func() bool {
		c, err := net.DialTimeout("unix", n.socket(), time.Second)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	})
	if err == nil && !ok {
		err = fmt.Errorf("containerd did not listen on %s within 30 s; its log ends:\n%s", n.socket(), n.Containerd.Tail(20))
	}
	return err
}

// writeCNIConfig gives the Pods a bridge of their own with addresses from PodCIDR
// (kept in the node's folder) and the bridge's address as their gateway. No masquerade:
// Pods reach this machine (the API server, PostgreSQL), nothing beyond it.
func (n *Node) writeCNIConfig() error {
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       Name,
		"plugins": []map[string]any{{
			"type":        "bridge",
			"bridge":      Bridge,
			"isGateway":   true,
			"ipMasq":      false,
			"hairpinMode": true,
			"ipam": map[string]any{
				"type":    "host-local",
				"ranges":  [][]map[string]string{{{"subnet": PodCIDR}}},
				"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
				"dataDir": n.path("cni", "ipam"),
			},
		}},
	}
	b, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(n.path("cni", "net.d"), 0o700); err != nil {
		return err
	}
	return os.WriteFile(n.path("cni", "net.d", "10-student-node.conflist"), b, 0o600)
}

func (n *Node) startKubelet() error {
	if err := makeCgroupRoot(); err != nil {
		return err
	}
	if err := n.withoutIptables(); err != nil {
		return err
	}
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	endpoint := "unix://" + n.socket()
	cfg := kubeletv1beta1.KubeletConfiguration{
		TypeMeta: metav1.TypeMeta{APIVersion: "kubelet.config.k8s.io/v1beta1", Kind: "KubeletConfiguration"},
		// The API server reaches the kubelet (logs, exec) on the node's address, which
		// only this machine and its Pods reach; and so anyone who reaches it may.
		Address:      IP.String(),
		Port:         int32(ports[0]), // #nosec G115 -- a port number
		ReadOnlyPort: 0,
		Authentication: kubeletv1beta1.KubeletAuthentication{
			Anonymous: kubeletv1beta1.KubeletAnonymousAuthentication{Enabled: ptr.To(true)},
			Webhook:   kubeletv1beta1.KubeletWebhookAuthentication{Enabled: ptr.To(false)},
		},
		Authorization:      kubeletv1beta1.KubeletAuthorization{Mode: kubeletv1beta1.KubeletAuthorizationModeAlwaysAllow},
		HealthzBindAddress: "127.0.0.1",
		HealthzPort:        ptr.To(int32(ports[1])), // #nosec G115 -- a port number
		// This machine has cgroup v1 and no systemd.
		CgroupDriver: "cgroupfs",
		FailCgroupV1: ptr.To(false),
		CgroupRoot:   CgroupRoot,
		// The sandbox has no CAP_SYS_RESOURCE: no lower OOM score, no more open files
		// than its hard limit.
		OOMScoreAdj:              ptr.To(int32(0)),
		MaxOpenFiles:             maxOpenFiles(),
		ContainerRuntimeEndpoint: endpoint,
		ImageServiceEndpoint:     endpoint,
		FailSwapOn:               ptr.To(false),
		// Never evict for a full disk, never collect images (the pause image is pushed
		// once, at start): a shared test machine's disk is not the node's own.
		EvictionHard:                map[string]string{"nodefs.available": "0%", "nodefs.inodesFree": "0%", "imagefs.available": "0%"},
		ImageGCHighThresholdPercent: ptr.To(int32(100)),
		PodLogsDir:                  n.path("pod-logs"),
		SerializeImagePulls:         ptr.To(false),
		// Projected volumes (tokens, the registry's Secret) and ConfigMaps refresh
		// within seconds.
		SyncFrequency: metav1.Duration{Duration: 10 * time.Second},
		// Stop Pods gracefully when the kubelet is told to shut down? Not here: Stop
		// removes the sandboxes itself.
		ShutdownGracePeriod: metav1.Duration{},
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	if err := os.WriteFile(n.path("kubelet.yaml"), b, 0o600); err != nil {
		return err
	}
	n.Kubelet = proc.New(proc.Spec{Name: "kubelet", Path: filepath.Join(n.cp.Root, "bin", "k8s", "kubelet"),
		Args: []string{
			"--config=" + n.path("kubelet.yaml"),
			"--kubeconfig=" + n.cp.Kubeconfig,
			"--root-dir=" + n.path("kubelet"),
			"--cert-dir=" + n.path("kubelet", "pki"),
			"--hostname-override=" + Name,
			"--node-ip=" + IP.String(),
		},
		Env: []string{marker, "PATH=" + n.path("bin") + ":" + os.Getenv("PATH")},
		Log: n.path("kubelet.log")})
	return n.Kubelet.Start()
}

func (n *Node) startKubeProxy() error {
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	cfg := proxyv1alpha1.KubeProxyConfiguration{
		TypeMeta:           metav1.TypeMeta{APIVersion: "kubeproxy.config.k8s.io/v1alpha1", Kind: "KubeProxyConfiguration"},
		ClientConnection:   componentbasev1alpha1.ClientConnectionConfiguration{Kubeconfig: n.cp.Kubeconfig},
		HostnameOverride:   Name,
		Mode:               "nftables",
		ClusterCIDR:        PodCIDR,
		HealthzBindAddress: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])),
		MetricsBindAddress: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1])),
		NodePortAddresses:  []string{IP.String() + "/32"},
		// Leave the machine's conntrack settings as they are.
		Conntrack: proxyv1alpha1.KubeProxyConntrackConfiguration{
			MaxPerCore:            ptr.To(int32(0)),
			TCPEstablishedTimeout: &metav1.Duration{},
			TCPCloseWaitTimeout:   &metav1.Duration{},
		},
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	if err := os.WriteFile(n.path("kube-proxy.yaml"), b, 0o600); err != nil {
		return err
	}
	n.proxyHealth = "http://" + cfg.HealthzBindAddress + "/healthz"
	n.KubeProxy = proc.New(proc.Spec{Name: "kube-proxy", Path: filepath.Join(n.cp.Root, "bin", "k8s", "kube-proxy"),
		Args: []string{"--config=" + n.path("kube-proxy.yaml")}, Log: n.path("kube-proxy.log"),
		Env: []string{marker, "PATH=" + n.path("bin") + ":" + os.Getenv("PATH")}})
	return n.KubeProxy.Start()
}

func (n *Node) startScheduler() error {
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	n.schedulerHealth = fmt.Sprintf("https://127.0.0.1:%d/healthz", ports[0])
	n.Scheduler = proc.New(proc.Spec{Env: []string{marker}, Name: "kube-scheduler", Path: filepath.Join(n.cp.Root, "bin", "k8s", "kube-scheduler"),
		Args: []string{
			"--kubeconfig=" + n.cp.Kubeconfig,
			"--authentication-kubeconfig=" + n.cp.Kubeconfig,
			"--authorization-kubeconfig=" + n.cp.Kubeconfig,
			"--leader-elect=false",
			"--bind-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(ports[0]),
		},
		Log: n.path("kube-scheduler.log")})
	return n.Scheduler.Start()
}

// withoutIptables puts iptables commands that fail in the node's bin folder, which
// comes first in the PATH of the kubelet and kube-proxy: the node's Services are
// kube-proxy's nftables, and so the kubelet makes no iptables chains (its
// KUBE-FIREWALL and canaries), which nothing would remove after it.
func (n *Node) withoutIptables() error {
	if err := os.MkdirAll(n.path("bin"), 0o700); err != nil {
		return err
	}
	const script = "#!/bin/sh\necho 'the student node uses nftables (kube-proxy), not iptables' >&2\nexit 1\n"
	for _, name := range []string{"iptables", "ip6tables", "iptables-save", "ip6tables-save", "iptables-restore", "ip6tables-restore"} {
		if err := os.WriteFile(n.path("bin", name), []byte(script), 0o700); err != nil { // #nosec G306 -- a script of ours
			return err
		}
	}
	return nil
}

// waitServing waits until kube-proxy has programmed its rules and kube-scheduler
// serves, each answering its health check, and both still run.
func (n *Node) waitServing(ctx context.Context) error {
	client := &http.Client{Timeout: 2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // #nosec G402 -- a local health check of a self-signed server
	for _, c := range []struct {
		p   *proc.Process
		url string
	}{{n.KubeProxy, n.proxyHealth}, {n.Scheduler, n.schedulerHealth}} {
		var last error
		ok, err := c.p.WaitUntil(ctx, time.Minute, func() bool {
			resp, err := client.Get(c.url)
			if last = err; err != nil {
				return false
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				last = errors.New(resp.Status)
			}
			return resp.StatusCode == http.StatusOK
		})
		if err == nil && !ok {
			err = fmt.Errorf("%s not healthy at %s within a minute (last: %v); its log %s ends:\n%s", c.p.Name(), c.url, last, c.p.LogPath(), c.p.Tail(20))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func freePorts(k int) ([]int, error) {
	ports := make([]int, k)
	for i := range ports {
		var err error
		if ports[i], err = freeport.Get(); err != nil {
			return nil, err
		}
	}
	return ports, nil
}

// maxOpenFiles is the kubelet's open-file limit: its default (1000000), or this
// process's hard limit when lower (the kubelet cannot raise it).
func maxOpenFiles() int64 {
	const want = 1000000
	b, err := os.ReadFile("/proc/self/limits")
	if err != nil {
		return want
	}
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(strings.TrimPrefix(line, "Max open files")); strings.HasPrefix(line, "Max open files") && len(f) >= 2 {
			if hard, err := strconv.ParseInt(f[1], 10, 64); err == nil && hard < want {
				return hard
			}
		}
	}
	return want
}

// cgroupHierarchies are the mounted cgroup v1 hierarchies, each once (cpu and cpuacct
// are one, linked twice).
func cgroupHierarchies() ([]string, error) {
	entries, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var dirs []string
	for _, e := range entries {
		dir, err := filepath.EvalSymlinks(filepath.Join("/sys/fs/cgroup", e.Name()))
		if err != nil || seen[dir] {
			continue
		}
		seen[dir] = true
		dirs = append(dirs, dir)
	}
	return dirs, nil
}

// makeCgroupRoot makes CgroupRoot in every hierarchy, as the kubelet wants it there
// before it starts; a new cpuset cgroup gets its parent's CPUs and memory nodes.
func makeCgroupRoot() error {
	dirs, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	for _, h := range dirs {
		dir := filepath.Join(h, CgroupRoot)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("make cgroup %s: %w", dir, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			v, err := os.ReadFile(filepath.Join(h, f))
			if err != nil {
				continue // not the cpuset hierarchy
			}
			if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil { // #nosec G306 G703 -- a cgroup file of ours
				return fmt.Errorf("set %s of cgroup %s: %w", f, dir, err)
			}
		}
	}
	return nil
}
