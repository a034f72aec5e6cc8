// Package controller is the Student controller: it keeps the student registry in line
// with the Student objects and reports back on each object.
package controller
