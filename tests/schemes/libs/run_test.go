package libs

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"testing"

	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/tests/schemes/internal/twoproxies"
)

// Workload size: K workers, M increments each, per hot document set.
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
	ctx, cancel := context.WithTimeout(context.Background(), scriptTimeout())
	defer cancel()
	b, err := twoproxies.RunScript(ctx, libLeaseMS, d.argv, args...)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(bytes.TrimSpace(b), out); err != nil {
		t.Fatalf("%v output %q: %v", args, b, err)
	}
}
