package node

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// marker is in the environment of every process the node starts, and so of
// containerd's shims: how Leftovers and clean find them.
const marker = "STUDENT_NODE=1"

// nftTables are kube-proxy's tables.
var nftTables = []string{"ip kube-proxy", "ip6 kube-proxy"}

// containerLogs is where the kubelet links each container's log, whatever its folders.
const containerLogs = "/var/log/containers"

// The files the node's parts make outside its folder whatever their flags say: the
// kubelet's device-plugin socket and the CNI library's cache of each Pod's result.
const (
	kubeletSocket = "/var/lib/kubelet/device-plugins/kubelet.sock"
	cniResults    = "/var/lib/cni/results"
)

// shimSockets is where containerd's shims listen, whatever containerd's folders; a
// shim that was killed leaves its socket.
const shimSockets = "/run/containerd/s"

// removeStaleSockets removes the sockets in dir that nothing listens on any more.
func removeStaleSockets(dir string) error {
	entries, _ := os.ReadDir(dir)
	var errs []error
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if e.Type()&fs.ModeSocket == 0 {
			continue
		}
		if c, err := net.DialTimeout("unix", p, time.Second); err == nil {
			_ = c.Close()
			continue
		} else if errors.Is(err, syscall.ECONNREFUSED) {
			errs = append(errs, os.Remove(p))
		}
	}
	return errors.Join(errs...)
}

// fixedFolders hold those files (and containerd's shims' sockets, in /run/containerd/s,
// which the shims remove as they exit): Stop removes each that was not there before
// Start, once it is empty. Deepest first.
var fixedFolders = []string{
	"/var/lib/kubelet/device-plugins", "/var/lib/kubelet", cniResults, "/var/lib/cni",
	shimSockets, "/run/containerd", containerLogs,
}

// missingFolders are those of fixedFolders that do not exist.
func missingFolders() []string {
	var missing []string
	for _, d := range fixedFolders {
		if _, err := os.Stat(d); errors.Is(err, os.ErrNotExist) {
			missing = append(missing, d)
		}
	}
	return missing
}

// fixedFiles are the files of the node outside its folder.
func fixedFiles() []string {
	var files []string
	if _, err := os.Lstat(kubeletSocket); err == nil {
		files = append(files, kubeletSocket)
	}
	results, _ := filepath.Glob(filepath.Join(cniResults, Name+"-*"))
	return append(files, results...)
}

// Leftovers lists what a node leaves on the machine while it runs or after it was not
// stopped: its processes (and containerd's shims), containers' cgroups, the bridge,
// kube-proxy's tables, and, when dir is its folder, the mounts under it and the log
// links into it. Empty after Stop.
func Leftovers(dir string) []string {
	var left []string
	for _, pid := range markedProcesses() {
		left = append(left, fmt.Sprintf("process %d: %s", pid, cmdline(pid)))
	}
	hierarchies, _ := cgroupHierarchies()
	for _, h := range hierarchies {
		if _, err := os.Stat(filepath.Join(h, CgroupRoot)); err == nil {
			left = append(left, "cgroup "+filepath.Join(h, CgroupRoot))
		}
	}
	if _, err := os.Stat(filepath.Join("/sys/class/net", Bridge)); err == nil {
		left = append(left, "network interface "+Bridge)
	}
	for _, t := range presentTables() {
		left = append(left, "nftables table "+t)
	}
	for _, f := range fixedFiles() {
		left = append(left, "file "+f)
	}
	if dir != "" {
		for _, m := range mountsUnder(dir) {
			left = append(left, "mount "+m)
		}
		for _, l := range logLinksInto(dir) {
			left = append(left, "log link "+l)
		}
	}
	return left
}

// Recover removes what a node of this machine that was killed left behind, from the
// record it wrote, and says what it removed: for `student-node clean-node`. It refuses
// while a node runs (holds the machine's node lock). New does the same by itself.
func Recover() ([]string, error) {
	f, err := os.OpenFile(lockFile, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil { // #nosec G115 -- a file descriptor
		return nil, fmt.Errorf("a node runs on this machine (make cluster, or a test suite's; it holds %s): stop it first: %w", lockFile, err)
	}
	return recoverKilled()
}

// clean removes what the node's processes made outside their own bookkeeping, after
// they stopped: any process left (a shim), the tables, the bridge, the mounts under dir,
// the cgroups, the log links, the files in fixed places and those of made (folders
// that were not there before) that are empty.
func clean(dir string, made []string) error {
	var errs []error
	for _, pid := range markedProcesses() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for _, t := range presentTables() {
		if out, err := exec.Command("nft", append([]string{"delete", "table"}, strings.Fields(t)...)...).CombinedOutput(); err != nil { // #nosec G204 -- a table name of ours
			errs = append(errs, fmt.Errorf("nft delete table %s: %v: %s", t, err, out))
		}
	}
	if _, err := os.Stat(filepath.Join("/sys/class/net", Bridge)); err == nil {
		if out, err := exec.Command("ip", "link", "delete", Bridge).CombinedOutput(); err != nil { // #nosec G204 -- fixed arguments
			errs = append(errs, fmt.Errorf("ip link delete %s: %v: %s", Bridge, err, out))
		}
	}
	if dir != "" {
		errs = append(errs, unmountUnder(dir))
		for _, l := range logLinksInto(dir) {
			errs = append(errs, os.Remove(l))
		}
	}
	errs = append(errs, removeCgroups())
	for _, f := range fixedFiles() {
		errs = append(errs, os.Remove(f))
	}
	for _, d := range made {
		if d == shimSockets {
			errs = append(errs, removeStaleSockets(d))
		}
		remove := os.Remove // only once empty
		if d == "/var/lib/cni" || d == cniResults {
			// The CNI library's cache, which this node's containerd began: its loopback
			// entries too, which carry no name of ours.
			remove = os.RemoveAll
		}
		if err := remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove the folder the node made: %w", err))
		}
	}
	return errors.Join(errs...)
}

// unmountUnder unmounts every mount at or below dir, deepest first, detached: a mount
// that is still busy goes when its last user does.
func unmountUnder(dir string) error {
	var errs []error
	mounts := mountsUnder(dir)
	sort.Sort(sort.Reverse(sort.StringSlice(mounts)))
	for _, m := range mounts {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
		}
	}
	return errors.Join(errs...)
}

// removeCgroups removes CgroupRoot and every cgroup below it, in each hierarchy,
// killing what still runs in them first.
func removeCgroups() error {
	hierarchies, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	var errs []error
	for _, h := range hierarchies {
		root := filepath.Join(h, CgroupRoot)
		var dirs []string
		_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		// Children before parents.
		slices.Reverse(dirs)
		for _, d := range dirs {
			err := os.Remove(d)
			for i := 0; err != nil && errors.Is(err, syscall.EBUSY) && i < 50; i++ {
				for _, pid := range cgroupProcs(d) {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
				time.Sleep(100 * time.Millisecond)
				err = os.Remove(d)
			}
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

func cgroupProcs(dir string) []int {
	b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs")) // #nosec G304 -- a cgroup of ours
	var pids []int
	for f := range strings.FieldsSeq(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// markedProcesses are the processes with the node's marker in their environment.
func markedProcesses() []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ")) // #nosec G304 -- /proc
		if err != nil {
			continue
		}
		if slices.ContainsFunc(bytes.Split(env, []byte{0}), func(v []byte) bool { return string(v) == marker }) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func cmdline(pid int) string {
	b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline")) // #nosec G304 -- /proc
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

func presentTables() []string {
	out, err := exec.Command("nft", "list", "tables").Output()
	if err != nil {
		return nil
	}
	var present []string
	for _, t := range nftTables {
		if slices.Contains(strings.Split(string(out), "\n"), "table "+t) {
			present = append(present, t)
		}
	}
	return present
}

// mountsUnder are the mount points at or below dir, from this process's mount table.
func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var mounts []string
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		// Spaces and the like are octal escapes in the table.
		point := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(f[4])
		if point == dir || strings.HasPrefix(point, dir+"/") {
			mounts = append(mounts, point)
		}
	}
	return mounts
}

func logLinksInto(dir string) []string {
	entries, _ := os.ReadDir(containerLogs)
	var links []string
	for _, e := range entries {
		p := filepath.Join(containerLogs, e.Name())
		if target, err := os.Readlink(p); err == nil && strings.HasPrefix(target, dir+"/") {
			links = append(links, p)
		}
	}
	return links
}

// The sysctls that the kubelet sets (its protectKernelDefaults is off) and the bridge
// plugin sets (a gateway forwards): Stop sets each back.
var sysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes", "net/ipv4/ip_forward",
}

func readSysctls() (map[string]string, error) {
	values := map[string]string{}
	for _, s := range sysctls {
		b, err := os.ReadFile(filepath.Join("/proc/sys", s)) // #nosec G304 -- a fixed sysctl
		if err != nil {
			return nil, err
		}
		values[s] = strings.TrimSpace(string(b))
	}
	return values, nil
}

func restoreSysctls(before map[string]string) error {
	now, err := readSysctls()
	if err != nil {
		return err
	}
	var errs []error
	for _, s := range slices.Sorted(maps.Keys(before)) {
		if now[s] != before[s] {
			if err := os.WriteFile(filepath.Join("/proc/sys", s), []byte(before[s]), 0o644); err != nil { // #nosec G306 -- a sysctl
				errs = append(errs, fmt.Errorf("set %s back to %s: %w", s, before[s], err))
			}
		}
	}
	return errors.Join(errs...)
}
