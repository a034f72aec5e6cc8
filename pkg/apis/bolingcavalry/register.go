// Package bolingcavalry holds the name of the API group that the Student API belongs to.
package bolingcavalry

// GroupName is the API group of the Student custom resource.
const GroupName = "bolingcavalry.k8s.io"
