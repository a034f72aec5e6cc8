// Package node runs a real one-node cluster on this machine, beside a control plane
// (package controlplane, started with NodeAddress: IP): containerd, runc and the CNI
// plugins from Debian's packages, and kube-scheduler, kubelet and kube-proxy built into
// bin/k8s by `make node`. The node pulls its images from a registry of its own
// (hack/tools/image -serve, in memory), into which it pushes a pause image built here
// from Kubernetes' pause.c, so nothing is downloaded. Everything the node makes lives
// under its folder, with its own sockets, bridge, address, address range and cgroup, so
// nothing collides with anything else on the machine.
//
// New reserves the machine (one node at a time) and gives the node its address; Start
// runs it; Stop removes it all again: containers, shims, mounts, network namespaces,
// nftables tables, cgroups and the bridge, and sets back the sysctls. A node that was
// killed instead leaves a record, from which the next New (or Recover) puts that back.
// Leftovers says what would still be there.
//
// The node needs root, as a kubelet does.
package node
