package guard

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestErrorsDocListsEveryCode keeps docs/ERRORS.md, the users' reference,
// true to the code: every error code lockgate answers with (the guard's
// codes, and any other error reply built in the production packages) has a
// row "| code | codeName |", and every refusal reason of the guard, the
// lockgate.reason users match on, is named there.
func TestErrorsDocListsEveryCode(t *testing.T) {
	doc, err := os.ReadFile("../docs/ERRORS.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)

	codes := map[int32]string{}
	for c, n := range codeNames {
		codes[c] = n
	}
	// Error replies built outside the guard: wire.ErrorReplyTo(req, id,
	// code, "Name", ...) and wire.ErrorDocument(code, "Name", ...).
	call := regexp.MustCompile(`(?:ErrorReplyTo\([^\n]*?,\s*|ErrorDocument\(\s*)(\d+),\s*"(\w+)"`)
	for _, pkg := range []string{"../proxy", "../gateway", "../guard", "../wire", "../upstream", "../lockstore", "../policy", "../admin", "../cmd/proxy"} {
		files, _ := filepath.Glob(filepath.Join(pkg, "*.go"))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range call.FindAllStringSubmatch(string(src), -1) {
				n, _ := strconv.Atoi(m[1])
				codes[int32(n)] = m[2]
			}
		}
	}
	if len(codes) <= len(codeNames) {
		t.Errorf("found no error reply outside the guard; the scan is broken (the proxy answers an unreachable upstream with one)")
	}
	for c, n := range codes {
		if !strings.Contains(text, "| "+strconv.Itoa(int(c))+" | "+n+" |") {
			t.Errorf("docs/ERRORS.md has no row for code %d %s", c, n)
		}
	}

	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	reasons := 0
	for _, p := range pkgs {
		ast.Inspect(p, func(n ast.Node) bool {
			vs, ok := n.(*ast.ValueSpec)
			if !ok {
				return true
			}
			for i, name := range vs.Names {
				if !strings.HasPrefix(name.Name, "reason") || i >= len(vs.Values) {
					continue
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					continue
				}
				v, _ := strconv.Unquote(lit.Value)
				reasons++
				if !strings.Contains(text, "`"+v+"`") {
					t.Errorf("docs/ERRORS.md does not name the reason `%s` (%s)", v, name.Name)
				}
			}
			return true
		})
	}
	if reasons < 10 {
		t.Errorf("found %d reason constants; the scan is broken", reasons)
	}
}

// TestErrorsDocReleaseOfAnotherHoldersLock: docs/ERRORS.md said that
// releasing a lock the session does not hold is 107 not_holder, while the
// server answers ok: 1, released: 0 (issue 26), which TestAcquireContendReleaseStatus
// checks ("release by a non-holder"). The doc's 107 row must say what the
// server does.
func TestErrorsDocReleaseOfAnotherHoldersLock(t *testing.T) {
	doc, err := os.ReadFile("../docs/ERRORS.md")
	if err != nil {
		t.Fatal(err)
	}
	var row string
	for _, l := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(l, "| 107 | LockFailed |") {
			row = l
		}
	}
	if row == "" {
		t.Fatal("docs/ERRORS.md has no 107 LockFailed row")
	}
	if strings.Contains(row, "or `releaseLock` of a lock this session does not hold") || !strings.Contains(row, "it answers `ok: 1, released: 0`") {
		t.Errorf("docs/ERRORS.md's 107 row does not say that releaseLock of a lock not held answers ok: 1, released: 0:\n%s", row)
	}
}
