package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// criClient reaches containerd's CRI service, as the kubelet does.
func criClient(socket string) (runtimeapi.RuntimeServiceClient, func() error, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	return runtimeapi.NewRuntimeServiceClient(conn), conn.Close, nil
}

// removeSandboxes stops and removes every Pod sandbox (and so every container) that
// containerd runs: the CNI plugins give back their addresses and veths, the shims exit,
// the mounts go.
func removeSandboxes(socket string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cri, done, err := criClient(socket)
	if err != nil {
		return err
	}
	defer func() { _ = done() }()
	list, err := cri.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return fmt.Errorf("list the Pods' sandboxes: %w", err)
	}
	var errs []error
	for _, sb := range list.Items {
		if _, err := cri.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("stop the sandbox of Pod %s/%s: %w", sb.Metadata.Namespace, sb.Metadata.Name, err))
			continue
		}
		if _, err := cri.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("remove the sandbox of Pod %s/%s: %w", sb.Metadata.Namespace, sb.Metadata.Name, err))
		}
	}
	return errors.Join(errs...)
}

// containerPid is the host's process ID of the running container in namespace/pod.
func containerPid(ctx context.Context, socket, namespace, pod, container string) (int, error) {
	cri, done, err := criClient(socket)
	if err != nil {
		return 0, err
	}
	defer func() { _ = done() }()
	list, err := cri.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
		LabelSelector: map[string]string{
			"io.kubernetes.pod.namespace": namespace, "io.kubernetes.pod.name": pod, "io.kubernetes.container.name": container,
		},
	}})
	if err != nil {
		return 0, err
	}
	if len(list.Containers) != 1 {
		return 0, fmt.Errorf("%d running containers %s in Pod %s/%s, want 1", len(list.Containers), container, namespace, pod)
	}
	status, err := cri.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: list.Containers[0].Id, Verbose: true})
	if err != nil {
		return 0, err
	}
	var info struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(status.Info["info"]), &info); err != nil || info.Pid == 0 {
		return 0, fmt.Errorf("no process ID in the status of container %s of Pod %s/%s: %v", container, namespace, pod, err)
	}
	return info.Pid, nil
}
