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

	"github.com/lockgate/lockgate/mongoerr"
)

// TestErrorsDocListsEveryCode keeps docs/ERRORS.md, the users' reference,
// true to the code: every error code lockgate answers with
// (mongoerr.Answered) has a row "| code | codeName |", every row of the
// table is such a code with its name, no production package writes a code
// as a bare number (so that none escapes the list), and every refusal
// reason of the guard, the lockgate.reason users match on, is named there.
func TestErrorsDocListsEveryCode(t *testing.T) {
	if raceEnabled {
		// One goroutine reading files: nothing for the detector to check,
		// and its regexps ran 16 times slower under it (4.9 s against
		// 0.3 s). go test ./..., where this package must stay
		// (scripts/test.sh), runs it.
		t.Skip("no concurrency to check; runs without the race detector")
	}
	doc, err := os.ReadFile("../docs/ERRORS.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)

	answered := map[mongoerr.Code]bool{}
	for _, c := range mongoerr.Answered() {
		answered[c] = true
		if !strings.Contains(text, "| "+strconv.Itoa(int(c))+" | "+c.Name()+" |") {
			t.Errorf("docs/ERRORS.md has no row for code %v", c)
		}
	}
	rows := regexp.MustCompile(`(?m)^\| (\d+) \| (\w+)`).FindAllStringSubmatch(text, -1)
	for _, m := range rows {
		n, _ := strconv.Atoi(m[1])
		if c := mongoerr.Code(n); !answered[c] || c.Name() != m[2] {
			t.Errorf("docs/ERRORS.md has a row for %s %s, which is not a code lockgate answers with (mongoerr.Answered)", m[1], m[2])
		}
	}
	if len(rows) < len(answered) {
		t.Errorf("read %d rows of docs/ERRORS.md's table; the scan is broken", len(rows))
	}

	// A code written as a number, in a reply built or a reply read.
	bare := regexp.MustCompile(`(?:"code",\s*|[Cc]ode:\s*|[Cc]ode\s*[!=]=\s*|HasErrorCode\(|mongoerr\.New\()\d+\b`)
	scanned := 0
	for _, pkg := range []string{"../proxy", "../gateway", "../guard", "../guard/refuse", "../guard/boundary", "../guard/reqplan", "../guard/inflight", "../guard/sessions", "../guard/authority", "../guard/lockcmd", "../guard/fence", "../guard/txn", "../guard/scheme", "../wire", "../upstream", "../lockstore", "../policy", "../admin", "../cmd/proxy", "../client/lockgate", "../audittrail", "../bench", "../bench/cmd/lockgate-bench", "../cmd/devstack", "../cmd/lockgate-devstack", "../docid", "../namespace", "../config"} {
		files, _ := filepath.Glob(filepath.Join(pkg, "*.go"))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			scanned++
			for _, m := range bare.FindAllString(string(src), -1) {
				t.Errorf("%s: %q: name the code from package mongoerr", f, m)
			}
		}
	}
	if scanned < 50 {
		t.Errorf("scanned %d files; the scan is broken", scanned)
	}

	// The guard and its stage packages (guard/refuse holds the reasons
	// several stages give; each stage declares its own).
	fset := token.NewFileSet()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	dirs := []string{"."}
	for _, e := range entries {
		if e.IsDir() && e.Name() != "testdata" {
			dirs = append(dirs, e.Name())
		}
	}
	pkgs := map[string]*ast.Package{}
	for _, dir := range dirs {
		ps, err := parser.ParseDir(fset, dir, func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
		if err != nil {
			t.Fatal(err)
		}
		for name, p := range ps {
			pkgs[dir+"/"+name] = p
		}
	}
	reasons := 0
	for _, p := range pkgs {
		ast.Inspect(p, func(n ast.Node) bool {
			vs, ok := n.(*ast.ValueSpec)
			if !ok {
				return true
			}
			for i, name := range vs.Names {
				if !strings.HasPrefix(strings.ToLower(name.Name), "reason") || i >= len(vs.Values) {
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
