// Package controlplane starts a real control plane: kube-apiserver and etcd built into
// bin/k8s by `make controlplane`, with the Student CRD installed. The integration and
// end-to-end tests run against it, and so does `make run`.
package controlplane
