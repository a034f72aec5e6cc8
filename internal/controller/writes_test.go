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
	"Upsert": true, "Delete": true, "Release": true, "Relinquish": true, "RecordPolicy": true, "Bind": true,
	"TakeFence": true, "RenameOwner": true, "MoveCluster": true,
	"Create": true, "Update": true, "UpdateStatus": true, "Patch": true, "Apply": true, "ApplyStatus": true,
	"DeleteCollection": true, "Event": true, "Eventf": true, "AnnotatedEventf": true,
}

// TestWritesTakeOnePath: every write of the controller goes through writes, whose
// guard asks Config.Leading first. It fails when code of this package calls a writing
// method outside the methods of writes (and of timedRegistry, which writes lies
// under), or asks whether it may write anywhere but in guard and processNextWorkItem.
// TestNotLeading shows that what goes through the path is refused.
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
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				checked++
				method := sel.Sel.Name
				switch {
				case writingMethods[method] && !strings.HasPrefix(inside, "writes.") && !strings.HasPrefix(inside, "timedRegistry."):
					t.Errorf("%s: %s calls %s outside writes: route it through writes, which asks Config.Leading first",
						fset.Position(call.Pos()), inside, method)
				case method == "allowed" && inside != "guard" && inside != "Controller.processNextWorkItem":
					t.Errorf("%s: %s asks writes.allowed; writes are guarded by guard alone", fset.Position(call.Pos()), inside)
				case (method == "leading" || method == "Leading") && inside != "writes.allowed":
					t.Errorf("%s: %s asks Config.Leading; only writes.allowed does", fset.Position(call.Pos()), inside)
				}
				return true
			})
		}
	}
	if checked == 0 {
		t.Fatal("no method call found: the test reads no code")
	}
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
