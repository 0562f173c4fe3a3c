package testkit

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/lockgate/lockgate/"

// TestInternalImportsNothingAbove: internal/ holds the leaves every layer
// may use, so no package there imports anything of lockgate outside
// internal/ (tests included: a test that starts a gateway belongs above).
// An arrow from internal/ up into the product would make the product's
// lowest layer depend on its highest.
func TestInternalImportsNothingAbove(t *testing.T) {
	root := filepath.Join("..")
	files := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
			return err
		}
		files++
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if strings.HasPrefix(p, module) && !strings.HasPrefix(p, module+"internal/") {
				t.Errorf("%s imports %s: internal/ may import only internal/", path, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 5 {
		t.Fatalf("read %d Go files under internal/: the walk is broken", files)
	}
}
