package integration

import (
	"fmt"
	"os"
	"testing"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/student-controller/student-controller/internal/testenv/controlplane"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
)

// env is the control plane that every test in this package shares; each test works in
// a namespace of its own.
var env *controlplane.Env

func TestMain(m *testing.M) {
	var err error
	env, err = controlplane.Start(controlplane.Options{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "integration tests cannot run: %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "stop control plane: %v\n", err)
	}
	os.Exit(code)
}

// clients are the clients a test uses, all as the cluster administrator.
type clients struct {
	kube    kubernetes.Interface
	student versioned.Interface
	dynamic dynamic.Interface
}

func newClients(t *testing.T) clients {
	t.Helper()
	return clients{
		kube:    kubernetes.NewForConfigOrDie(env.Config),
		student: versioned.NewForConfigOrDie(env.Config),
		dynamic: dynamic.NewForConfigOrDie(env.Config),
	}
}
