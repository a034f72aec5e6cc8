// Package v1 is version v1 of the bolingcavalry.k8s.io API: the Student custom resource.
//
// +k8s:deepcopy-gen=package
// +groupName=bolingcavalry.k8s.io
package v1
