package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/google/pprof/profile"
)

// module is the import path every package of the proxy starts with.
const module = "github.com/lockgate/lockgate/"

// TestDefaultProfileIsCurrent: default.pgo is the CPU profile `go build`
// optimizes the proxy with (scripts/pgo.sh makes it). A profile whose hot
// functions were renamed, moved or removed since still builds, silently
// unoptimized where it matters; so the profile's hottest functions of
// this module must all be declared in the source as it is, and the
// enforced write's path must be among them.
func TestDefaultProfileIsCurrent(t *testing.T) {
	f, err := os.Open("default.pgo")
	if err != nil {
		t.Fatalf("%v: make it with bash scripts/pgo.sh", err)
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	hot := hottest(p, 40)
	if len(hot) < 40 {
		t.Fatalf("the profile has %d functions of the module, want at least 40: make it again with bash scripts/pgo.sh", len(hot))
	}
	root := filepath.Join("..", "..")
	decls := map[string]map[string]bool{} // package directory -> its declared functions and methods
	for _, fn := range hot {
		dir, name, ok := splitFunc(fn)
		if !ok {
			t.Errorf("cannot read the function name %q", fn)
			continue
		}
		if decls[dir] == nil {
			if decls[dir], err = declared(filepath.Join(root, dir)); err != nil {
				t.Errorf("%s, hot in default.pgo: %v", fn, err)
				continue
			}
		}
		if !decls[dir][name] {
			t.Errorf("%s is hot in default.pgo but not declared in %s: the profile is stale, make it again with bash scripts/pgo.sh", fn, dir)
		}
	}
	// The enforced write: the walk that decides it, the plan it reads,
	// the proxy's request loop and the guard's entry.
	for _, want := range []string{"guard/enforce.(*Walk).Run", "policy.(*Plan).Read", "proxy.(*conn).handleRequest", "guard.(*Guard).enforce"} {
		found := false
		for _, fn := range hot {
			found = found || stripShape(strings.TrimPrefix(fn, module)) == want
		}
		if !found {
			t.Errorf("%s is not among default.pgo's hottest functions: the profile does not cover the enforced write", want)
		}
	}
}

// hottest are the n functions of the module with the most samples in
// whose stacks they are (each counted once a sample), most first.
func hottest(p *profile.Profile, n int) []string {
	in := map[string]int64{}
	for _, s := range p.Sample {
		seen := map[string]bool{}
		for _, loc := range s.Location {
			for _, l := range loc.Line {
				if l.Function == nil || !strings.HasPrefix(l.Function.Name, module) || seen[l.Function.Name] {
					continue
				}
				seen[l.Function.Name] = true
				in[l.Function.Name] += s.Value[len(s.Value)-1]
			}
		}
	}
	names := make([]string, 0, len(in))
	for name := range in {
		names = append(names, name)
	}
	sort.Slice(names, func(i, j int) bool {
		if in[names[i]] != in[names[j]] {
			return in[names[i]] > in[names[j]]
		}
		return names[i] < names[j]
	})
	return names[:min(n, len(names))]
}

// shape is a generic instantiation's type arguments in a symbol name.
var shape = regexp.MustCompile(`\[[^\[\]]*(\[[^\[\]]*\][^\[\]]*)*\]`)

// closure is the suffix of a function literal's or a go/defer wrapper's
// symbol: the function that declares it is what the source holds.
var closure = regexp.MustCompile(`(\.(func|gowrap|deferwrap)\d+)+(\.\d+)*$`)

func stripShape(s string) string { return shape.ReplaceAllString(s, "") }

// splitFunc reads a symbol of the module, such as
// github.com/lockgate/lockgate/guard.(*Guard).appendLine.func1, as its
// package directory (guard) and the name the source declares
// (Guard.appendLine).
func splitFunc(fn string) (dir, name string, ok bool) {
	s := closure.ReplaceAllString(stripShape(strings.TrimPrefix(fn, module)), "")
	slash := strings.LastIndexByte(s, '/')
	dot := strings.IndexByte(s[slash+1:], '.')
	if dot < 0 {
		return "", "", false
	}
	dir, rest := s[:slash+1+dot], s[slash+2+dot:]
	if recv, method, isMethod := strings.Cut(rest, "."); isMethod {
		recv = strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(recv, "("), "*"), ")")
		return dir, recv + "." + method, true
	}
	return dir, rest, true
}

// declared are the functions (name) and methods (Recv.name) that the
// package in dir declares outside its tests.
func declared(dir string) (map[string]bool, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	fset := token.NewFileSet()
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			if fd.Recv == nil || len(fd.Recv.List) == 0 {
				out[fd.Name.Name] = true
				continue
			}
			out[recvName(fd.Recv.List[0].Type)+"."+fd.Name.Name] = true
		}
	}
	if len(out) == 0 {
		return nil, os.ErrNotExist
	}
	return out, nil
}

// recvName is a receiver type's name without its pointer and type
// parameters.
func recvName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return recvName(e.X)
	case *ast.IndexExpr:
		return recvName(e.X)
	case *ast.IndexListExpr:
		return recvName(e.X)
	case *ast.Ident:
		return e.Name
	}
	return ""
}
