// Package e2e runs the Student controller against a real control plane (etcd,
// kube-apiserver, kube-controller-manager) and a real registry, and checks the state of
// the world it leaves.
package e2e
