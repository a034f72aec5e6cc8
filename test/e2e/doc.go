// Package e2e runs the Student controller against a real control plane (etcd,
// kube-apiserver, kube-controller-manager) and a real registry, and checks the state of
// the world it leaves.
//
// A test that shares nothing but the control plane and the PostgreSQL server (its own
// namespaces, its own database or SQLite file, or a control plane or server of its own)
// calls t.Parallel: go test runs those after the serial ones, two at a time on two
// cores. Serial are the tests that change what the others share (the admission policy,
// the CRD, the shared server's state), the leader-election tests, whose Leases of a few
// seconds a busy machine would stretch, and the short tests not yet checked for what
// they share.
package e2e
