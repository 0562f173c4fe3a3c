package libs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/tests/schemes/internal/twoproxies"
)

// Workload size: K workers, M increments each, per hot document set.
// Workers 0 and 1 want the same document in every round, yet MongoLocks'
// Node.js workers met no busy lock in one run of 8 rounds (their calls
// took turns on the event loop): the libraries keep 20 (docs/TESTING.md,
// tenth round).
const (
	workers    = 3
	increments = 20
)

// A client that runs the libraries' flows: libs.py or libs.js. base is
// the first document id of the driver's runs (ids differ per driver, so
// that locks one run leaves to expire never meet the next).
type libDriver struct {
	name string
	// missing says how to install it, nil when it is there.
	missing func() error
	argv    []string
	base    int
}

func libDrivers() []libDriver {
	return []libDriver{
		{
			name:    "pymongo",
			missing: testkit.Pymongo,
			argv:    []string{"/usr/bin/python3", "pymongo/libs.py"},
			base:    0,
		},
		{
			name:    "node",
			missing: func() error { return testkit.NodeModule("../../compat/node/node_modules", "mongodb") },
			argv:    []string{"node", "node/libs.js"},
			base:    100,
		},
	}
}

type workResult struct {
	Counters     map[string]int64 `json:"counters"`
	RogueLanded  map[string]int   `json:"rogueLanded"`
	RogueRefused []string         `json:"rogueRefused"`
	Outcomes     []string         `json:"outcomes"`
	Errors       []string         `json:"errors"`
}

func itoa(n int) string { return strconv.Itoa(n) }

// runLib runs the driver's script with args and decodes its one line of
// JSON into out.
func runLib(t *testing.T, d libDriver, out any, args ...string) {
	t.Helper()
	runLibs(t, d, libRun{out, args})
}

// A libRun is one run of a driver's script: its args, and where its one
// line of JSON goes.
type libRun struct {
	out  any
	args []string
}

// runLibs runs the driver's script once per run, all at once (each run
// in databases of its own), and decodes each one's output.
func runLibs(t *testing.T, d libDriver, runs ...libRun) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), scriptTimeout())
	defer cancel()
	errs := make([]error, len(runs))
	var wg sync.WaitGroup
	for i, r := range runs {
		wg.Go(func() {
			b, err := twoproxies.RunScript(ctx, libLeaseMS, d.argv, r.args...)
			if err == nil {
				if err = json.Unmarshal(bytes.TrimSpace(b), r.out); err != nil {
					err = fmt.Errorf("%v output %q: %w", r.args, b, err)
				}
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}
