// Module gosec pins gosec, which make lint runs through the small command in this
// folder (main.go says why not gosec's own). It is separate from the product module,
// whose go.mod never holds gosec's dependencies.
module github.com/student-controller/student-controller/hack/tools/gosec

go 1.26.0

toolchain go1.26.11

require github.com/securego/gosec/v2 v2.30.0

require (
	github.com/ccojocar/zxcvbn-go v1.0.4 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/gookit/color v1.6.3 // indirect
	github.com/xo/terminfo v1.2.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/mod v0.42.0 // indirect
	golang.org/x/sync v0.25.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/tools v0.52.0 // indirect
)
