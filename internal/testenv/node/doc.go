// Package node runs a real one-node cluster on this machine, beside a control plane
// (package controlplane, started with NodeAddress): containerd, runc and the CNI plugins
// from Debian's packages, and kube-scheduler, kubelet and kube-proxy built into bin/k8s
// by `make node`. The node pulls its images from a registry of its own (hack/tools/image
// -serve, in memory), into which it pushes a pause image built here from Kubernetes'
// pause.c, so nothing is downloaded. Everything the node makes lives under its folder,
// with its own sockets, bridge, address range and cgroup, so nothing collides with
// anything else on the machine, and Stop removes it all again: containers, shims,
// mounts, network namespaces, nftables tables, cgroups and the bridge. Leftovers says
// what would still be there.
//
// The node needs root, as a kubelet does.
package node
