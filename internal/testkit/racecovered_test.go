package testkit

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestRaceScaledNamesEveryTestThatScales: a test is named when it reads
// raceEnabled itself, through a helper, through a helper's helper, through
// a package-level variable, through a method of a type it only names, or
// when its file builds only with or without the detector; a test that
// reaches none of them is not. A test left out here would run only under
// -race in scripts/test.sh, at its scaled-down size.
func TestRaceScaledNamesEveryTestThatScales(t *testing.T) {
	dir := t.TempDir()
	write := func(name, src string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("race_test.go", "//go:build race\n\npackage p\n\nconst raceEnabled = true\n")
	write("norace_test.go", "//go:build !race\n\npackage p\n\nimport \"testing\"\n\nconst raceEnabled = false\n\nfunc TestOnlyWithoutRace(t *testing.T) {}\n")
	write("a_test.go", `package p

import "testing"

func rounds() int {
	if raceEnabled {
		return 1
	}
	return 10
}

func twice() int { return 2 * rounds() }

var sizes = func() []int { return []int{rounds()} }

type stack struct{}

func (s *stack) Close() error {
	if raceEnabled {
		return nil
	}
	return nil
}

func newStack() *stack { return &stack{} }

func TestDirect(t *testing.T) {
	if raceEnabled {
		t.Skip()
	}
}
func TestHelper(t *testing.T)       { _ = rounds() }
func TestDeepHelper(t *testing.T)   { _ = twice() }
func TestVariable(t *testing.T)     { _ = sizes() }
func TestType(t *testing.T)         { _ = newStack() }
func FuzzScaled(f *testing.F)       { _ = rounds() }
func TestPlain(t *testing.T)        { _ = 1 + 1 }
func ExamplePlain()                 {}
func TestMain(m *testing.M)         { _ = rounds() }
func BenchmarkScaled(b *testing.B) { _ = rounds() }
`)
	scaled, all, err := RaceScaled(dir)
	if err != nil {
		t.Fatal(err)
	}
	wantScaled := []string{"FuzzScaled", "TestDeepHelper", "TestDirect", "TestHelper", "TestOnlyWithoutRace", "TestType", "TestVariable"}
	wantAll := []string{"ExamplePlain", "FuzzScaled", "TestDeepHelper", "TestDirect", "TestHelper", "TestOnlyWithoutRace", "TestPlain", "TestType", "TestVariable"}
	if !slices.Equal(scaled, wantScaled) {
		t.Errorf("scaled %v, want %v", scaled, wantScaled)
	}
	if !slices.Equal(all, wantAll) {
		t.Errorf("all %v, want %v", all, wantAll)
	}
}

// TestOnlyRaceScaledLimitsTheRun runs this test binary again from a
// directory whose only test file names one of its tests as reaching
// raceEnabled: with RaceCoveredEnv set, that test alone runs; without it,
// all of them; with -run given too, the binary fails instead of running
// either set.
func TestOnlyRaceScaledLimitsTheRun(t *testing.T) {
	if os.Getenv(limitEnv) == "1" {
		return // a child run: the test is named, it need not recurse
	}
	dir := t.TempDir()
	src := "package p\n\nconst raceEnabled = false\n\nfunc TestRaceScaledNamesEveryTestThatScales() { _ = raceEnabled }\n\nfunc TestOnPath() {}\n"
	if err := os.WriteFile(filepath.Join(dir, "p_test.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(covered bool, args ...string) (string, error) {
		cmd := exec.Command(os.Args[0], append([]string{"-test.v"}, args...)...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), limitEnv+"=1", RaceCoveredEnv+"=0")
		if covered {
			cmd.Env = append(cmd.Env, RaceCoveredEnv+"=1")
		}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	ran := func(out string) []string {
		var names []string
		for _, l := range strings.Split(out, "\n") {
			if name, ok := strings.CutPrefix(l, "=== RUN   "); ok && !strings.Contains(name, "/") {
				names = append(names, name)
			}
		}
		return names
	}
	out, err := run(true)
	if err != nil {
		t.Fatalf("limited run: %v\n%s", err, out)
	}
	if got := ran(out); !slices.Equal(got, []string{"TestRaceScaledNamesEveryTestThatScales"}) {
		t.Errorf("with %s=1 the run ran %v, want the one test that reaches raceEnabled\n%s", RaceCoveredEnv, got, out)
	}
	out, err = run(false, "-test.run", "^TestOnPath$|^TestRaceScaledNamesEveryTestThatScales$")
	if err != nil {
		t.Fatalf("unlimited run: %v\n%s", err, out)
	}
	if got := ran(out); len(got) != 2 {
		t.Errorf("without %s the run ran %v, want both tests -run names\n%s", RaceCoveredEnv, got, out)
	}
	out, err = run(true, "-test.run", "^TestOnPath$")
	if err == nil || !strings.Contains(out, "unset one of them") {
		t.Errorf("with %s=1 and -run the binary ran (%v)\n%s", RaceCoveredEnv, err, out)
	}
}
