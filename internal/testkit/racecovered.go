package testkit

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// RaceCoveredEnv, set to "1", tells a package whose TestMain calls
// OnlyRaceScaled that its tests also run under the race detector in the
// same run (scripts/test.sh sets it in go test ./..., whose other stream
// runs the package with -race). A test the detector runs unchanged proves
// nothing more without it, so only the tests that differ under the
// detector run here.
const RaceCoveredEnv = "LOCKGATE_TEST_RACE_COVERED"

// raceIdent is the constant, true in a race build, that lockgate's test
// packages scale their tests with (race_test.go, norace_test.go).
const raceIdent = "raceEnabled"

// OnlyRaceScaled, called from TestMain with the package's raceEnabled,
// limits a build without the detector to the tests RaceScaled names when
// RaceCoveredEnv is "1"; otherwise it does nothing. It fails when the
// caller gave -run too, which the limit would silently override.
func OnlyRaceScaled(race bool) error {
	if os.Getenv(RaceCoveredEnv) != "1" || race {
		return nil
	}
	if !flag.Parsed() {
		flag.Parse()
	}
	run := flag.Lookup("test.run")
	if run == nil {
		return fmt.Errorf("%s=1: no -test.run flag to limit", RaceCoveredEnv)
	}
	if run.Value.String() != "" {
		return fmt.Errorf("%s=1 and -run %q: unset one of them", RaceCoveredEnv, run.Value.String())
	}
	scaled, all, err := RaceScaled(".")
	if err != nil {
		return fmt.Errorf("%s=1: %w", RaceCoveredEnv, err)
	}
	pattern := "^$"
	if len(scaled) > 0 {
		pattern = "^(" + strings.Join(scaled, "|") + ")$"
	}
	if err := run.Value.Set(pattern); err != nil {
		return err
	}
	fmt.Printf("%s=1: %d of %d tests run here, the rest under -race only: %s\n",
		RaceCoveredEnv, len(scaled), len(all), strings.Join(scaled, " "))
	return nil
}

// RaceScaled reads the _test.go files in dir and returns, sorted, the
// top-level tests (Test, Example and Fuzz functions; their seed corpora run
// as tests) that may run differently under the race detector, and all of
// them: those declared in a file with a build constraint naming race, and
// those that reach raceIdent, in their own body or through any function,
// method or package-level variable of the files that does (a type reaches
// it when one of its methods does). The reach is by
// name, over-approximated (a method call counts every method of that name,
// a shadowed name counts the package-level one), so a test may be named
// that does not scale; none that does is left out.
func RaceScaled(dir string) (scaled, all []string, err error) {
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		return nil, nil, err
	}
	if len(files) == 0 {
		return nil, nil, fmt.Errorf("no _test.go files in %s", dir)
	}
	fset := token.NewFileSet()
	// refs: for each declared name, the names its declarations use.
	refs := map[string]map[string]bool{}
	tests := map[string]bool{}
	tagged := map[string]bool{}
	use := func(name string, n ast.Node) {
		r := refs[name]
		if r == nil {
			r = map[string]bool{}
			refs[name] = r
		}
		ast.Inspect(n, func(n ast.Node) bool {
			if id, ok := n.(*ast.Ident); ok {
				r[id.Name] = true
			}
			return true
		})
	}
	for _, path := range files {
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return nil, nil, err
		}
		raceTag := namesRace(f)
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				name := d.Name.Name
				if d.Recv == nil && isTopTest(name) {
					tests[name] = true
					if raceTag {
						tagged[name] = true
					}
				}
				if d.Body != nil {
					use(name, d.Body)
				}
				// A method may run without its name in the test (an
				// interface's caller, fmt's String): naming its type
				// counts as using it.
				if d.Recv != nil && len(d.Recv.List) == 1 {
					if typ := recvType(d.Recv.List[0].Type); typ != "" {
						use(typ, d.Name)
					}
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					if vs, ok := s.(*ast.ValueSpec); ok {
						for _, n := range vs.Names {
							for _, v := range vs.Values {
								use(n.Name, v)
							}
						}
					}
				}
			}
		}
	}
	reach := map[string]bool{raceIdent: true}
	for changed := true; changed; {
		changed = false
		for name, r := range refs {
			if reach[name] {
				continue
			}
			for used := range r {
				if reach[used] {
					reach[name], changed = true, true
					break
				}
			}
		}
	}
	for name := range tests {
		all = append(all, name)
		if reach[name] || tagged[name] {
			scaled = append(scaled, name)
		}
	}
	slices.Sort(scaled)
	slices.Sort(all)
	return scaled, all, nil
}

// recvType is the name of a receiver's type: T of T, *T, T[P] or *T[P].
func recvType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// namesRace reports whether f has a build constraint that names race.
func namesRace(f *ast.File) bool {
	for _, cg := range f.Comments {
		if cg.Pos() > f.Package {
			break
		}
		for _, c := range cg.List {
			if (strings.HasPrefix(c.Text, "//go:build") || strings.HasPrefix(c.Text, "// +build")) && strings.Contains(c.Text, "race") {
				return true
			}
		}
	}
	return false
}

func isTopTest(name string) bool {
	if name == "TestMain" {
		return false
	}
	for _, p := range []string{"Test", "Example", "Fuzz"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}
