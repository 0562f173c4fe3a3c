package config

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files of TestYAMLErrorGolden")

// TestYAMLErrorGolden pins the full text of the errors an operator sees
// for broken config files. explainYAMLError rewrites the YAML parser's
// messages with regular expressions, so a parser upgrade that changes its
// wording shows up here as a diff, not as an error that silently loses
// its key. Regenerate with: go test ./config -run TestYAMLErrorGolden -update
func TestYAMLErrorGolden(t *testing.T) {
	inputs, err := filepath.Glob(filepath.Join("testdata", "yamlerr", "*.yaml"))
	if err != nil || len(inputs) == 0 {
		t.Fatalf("no golden inputs: %v", err)
	}
	for _, in := range inputs {
		name := strings.TrimSuffix(filepath.Base(in), ".yaml")
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			_, perr := Parse(data)
			if perr == nil {
				t.Fatalf("%s parsed without an error", in)
			}
			got := perr.Error() + "\n"
			golden := strings.TrimSuffix(in, ".yaml") + ".golden"
			if *updateGolden {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("error for %s:\n%s\nwant (%s):\n%s", in, got, golden, want)
			}
		})
	}
}
