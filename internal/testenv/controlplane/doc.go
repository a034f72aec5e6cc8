// Package controlplane starts a real control plane: etcd, kube-apiserver and
// kube-controller-manager built into bin/k8s by `make controlplane`, with the Student
// CRD installed. The integration and end-to-end tests, the bench and `make run` run
// against it.
package controlplane
