package controller

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writingMethods are the methods that change something: the registry's row writes,
// the clientset's writes and the recorder's Events.
var writingMethods = map[string]bool{
	"Insert": true, "Upsert": true, "Rewind": true, "Delete": true, "Release": true, "Relinquish": true, "RecordPolicy": true, "MarkObserved": true, "Bind": true, "TakeBack": true, "Prune": true, "Adopt": true,
	"TakeFence": true, "RenameOwner": true, "MoveCluster": true, "PruneHistory": true,
	"Create": true, "Update": true, "UpdateStatus": true, "Patch": true, "Apply": true, "ApplyStatus": true,
	"DeleteCollection": true, "Event": true, "Eventf": true, "AnnotatedEventf": true,
}

// TestWritesTakeOnePath: every write of the controller goes through writes, whose
// guard asks Config.Leading first. It fails when code of this package reaches a writing
// method (called, or taken as a value) anywhere but inside a function that a method of
// writes hands to guard (or in timedRegistry, which writes lies under; or in the
// cache's Put and Remove, which change the cache alone), or asks
// whether it may write anywhere but in guard and mayStart. TestNotLeading shows that
// what goes through the path is refused.
func TestWritesTakeOnePath(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var checked int
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name) // #nosec G304 -- this package's own files
		if err != nil {
			t.Fatal(err)
		}
		file, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range file.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			inside := funcName(fn)
			guarded := guardedBodies(fn)
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if pkg, ok := sel.X.(*ast.Ident); ok && pkg.Name == "decide" {
					return true // decide's Ops name the writes; they write nothing
				}
				checked++
				name := sel.Sel.Name
				switch {
				case writingMethods[name] && strings.HasPrefix(inside, "timedRegistry."):
					// The latency wrapper under writes: it forwards, and writes reach it only through guard.
				case writingMethods[name] && (inside == "Informers.Put" || inside == "Informers.Remove"):
					// The controller's own cache, which tests and the bench fill as a watch would.
				case writingMethods[name] && !(strings.HasPrefix(inside, "writes.") && within(sel, guarded)):
					t.Errorf("%s: %s reaches %s outside a guarded write: route it through writes, whose guard asks Config.Leading first",
						fset.Position(sel.Pos()), inside, name)
				case name == "allowed" && inside != "guard" && inside != "Controller.mayStart":
					t.Errorf("%s: %s asks writes.allowed; only guard (each write) and mayStart (each sync or sweep) do", fset.Position(sel.Pos()), inside)
				case name == "mayStart" && inside != "Controller.processNextWorkItem" && inside != "Controller.Sweep" && inside != "Controller.mayStart":
					t.Errorf("%s: %s calls mayStart; a sync and a sweep start there, nothing else", fset.Position(sel.Pos()), inside)
				case (name == "leading" || name == "Leading") && inside != "writes.allowed" && inside != "New":
					t.Errorf("%s: %s asks Config.Leading; only writes.allowed does", fset.Position(sel.Pos()), inside)
				}
				return true
			})
		}
	}
	if checked == 0 {
		t.Fatal("no method call found: the test reads no code")
	}
}

// guardedBodies are the function literals that fn hands to guard: the only places a
// method of writes may write.
func guardedBodies(fn *ast.FuncDecl) []ast.Node {
	var out []ast.Node
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		callee := call.Fun
		if index, ok := callee.(*ast.IndexExpr); ok { // guard[T](...)
			callee = index.X
		}
		if id, ok := callee.(*ast.Ident); ok && id.Name == "guard" {
			for _, arg := range call.Args {
				if lit, ok := arg.(*ast.FuncLit); ok {
					out = append(out, lit)
				}
			}
		}
		return true
	})
	return out
}

func within(n ast.Node, outer []ast.Node) bool {
	for _, o := range outer {
		if n.Pos() >= o.Pos() && n.End() <= o.End() {
			return true
		}
	}
	return false
}

// funcName is "Type.Method" for a method, the name for a function.
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	typ := fn.Recv.List[0].Type
	if star, ok := typ.(*ast.StarExpr); ok {
		typ = star.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name + "." + fn.Name.Name
	}
	return fn.Name.Name
}
