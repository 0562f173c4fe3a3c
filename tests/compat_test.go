package tests

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lockgate/lockgate/internal/testkit"
)

// A compatibility client: a real driver or shell, run as a subprocess with
// the same script against the upstream and against the proxy.
type compatClient struct {
	name string
	// check says how to install the runtime when it is missing.
	check func() error
	// command runs the script against uri (with no database path) and db.
	command func(ctx context.Context, uri, db string) *exec.Cmd
}

const nodeDir = "compat/node"

func compatClients() []compatClient {
	nodeModules := func(pkg string) error { return testkit.NodeModule(filepath.Join(nodeDir, "node_modules"), pkg) }
	return []compatClient{
		{
			name:  "pymongo",
			check: testkit.Pymongo,
			command: func(ctx context.Context, uri, db string) *exec.Cmd {
				return exec.CommandContext(ctx, "/usr/bin/python3", "compat/pymongo/compat.py", uri, db)
			},
		},
		{
			name:  "node",
			check: func() error { return nodeModules("mongodb") },
			command: func(ctx context.Context, uri, db string) *exec.Cmd {
				return exec.CommandContext(ctx, "node", filepath.Join(nodeDir, "compat.js"), uri, db)
			},
		},
		{
			name:  "mongosh",
			check: func() error { return nodeModules("mongosh") },
			command: func(ctx context.Context, uri, db string) *exec.Cmd {
				// mongosh takes the database from the connection string.
				return exec.CommandContext(ctx, filepath.Join(nodeDir, "node_modules", ".bin", "mongosh"),
					strings.TrimSuffix(uri, "/")+"/"+db, "--quiet", "--norc", "--file", filepath.Join(nodeDir, "mongosh.js"))
			},
		},
	}
}

// compatSteps are the step names every script prints, in order. Steps in
// compatErrorSteps must fail with a server error (duplicate keys), all
// others must succeed; this keeps a broken script or upstream from passing
// as "identical" with errors on both sides.
var (
	compatSteps = []string{
		"hello", "isMaster", "ping", "buildInfo", "driverView",
		"insertOne_autoId", "insertOne", "insertMany",
		"find_sort_projection_limit", "find_batchSize_getMore", "cursor_close_early",
		"countDocuments", "aggregate_group",
		"updateOne", "updateOne_upsert", "updateMany", "replaceOne", "replaceOne_upsert",
		"deleteOne", "deleteMany",
		"findOneAndUpdate", "findOneAndReplace", "findOneAndDelete",
		"bulkWrite_ordered", "bulkWrite_ordered_error", "bulkWrite_unordered_error",
		"createIndex", "createIndex_unique", "listIndexes",
		"duplicateKey", "duplicateKey_unique_index",
		"session", "final_state", "drop",
	}
	compatErrorSteps = map[string]bool{
		"bulkWrite_ordered_error":   true,
		"bulkWrite_unordered_error": true,
		"duplicateKey":              true,
		"duplicateKey_unique_index": true,
	}
)

// TestCompatibility runs each real client's script directly against the
// upstream and through the proxy and requires the same output after
// normaliseCompat.
//
// The clients run beside each other, each through a gateway of its own
// (whose unknown-command count is its client's alone) in its own
// database: most of their time is their runtimes starting.
func TestCompatibility(t *testing.T) {
	t.Parallel()
	for _, cl := range compatClients() {
		t.Run(cl.name, func(t *testing.T) {
			t.Parallel()
			testkit.RequireTool(t, cl.name, cl.check())
			g := startGateway(t, upstream.URI())
			ctx := testCtx(t, 3*time.Minute)
			db := "compat_" + cl.name
			direct := runCompat(t, ctx, cl, g.Direct, db)
			checkCompatReference(t, cl.name, direct)
			unknown0 := g.metricValue(t, "lockgate_unknown_commands_total", nil)
			proxied := runCompat(t, ctx, cl, g.URI, db)
			// Every command the client sent is in the command table: one
			// that is not would be refused on an enforced namespace.
			if n := g.metricValue(t, "lockgate_unknown_commands_total", nil) - unknown0; n != 0 {
				t.Errorf("%s sent %v commands that are not in wire/commands.go", cl.name, n)
			}

			d, err := normaliseCompat(direct)
			if err != nil {
				t.Fatalf("direct output: %v", err)
			}
			p, err := normaliseCompat(proxied)
			if err != nil {
				t.Fatalf("proxy output: %v", err)
			}
			if ds, ps := d.String(), p.String(); ds != ps {
				t.Errorf("%s: output through the proxy differs from the direct output:\n%s", cl.name, diffText("direct", ds, "proxy ", ps))
			}
		})
	}
}

func runCompat(t *testing.T, ctx context.Context, cl compatClient, uri, db string) []byte {
	t.Helper()
	cmd := cl.command(ctx, uri, db)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s against %s: %v\nstderr:\n%s\nstdout:\n%s", cl.name, uri, err, stderr.Bytes(), stdout.Bytes())
	}
	t.Logf("%s against %s: %d bytes of output in %v", cl.name, uri, stdout.Len(), time.Since(start).Round(time.Millisecond))
	return stdout.Bytes()
}

// checkCompatReference makes sure the direct run is a meaningful reference:
// every step ran, and only the duplicate-key steps failed, with code 11000.
func checkCompatReference(t *testing.T, client string, out []byte) {
	t.Helper()
	v, err := parseJSON(out)
	if err != nil {
		t.Fatalf("%s direct output is not JSON: %v\n%s", client, err, out)
	}
	steps, _ := v.get("steps")
	if len(steps.Arr) != len(compatSteps) {
		t.Fatalf("%s direct output has %d steps, want %d", client, len(steps.Arr), len(compatSteps))
	}
	for i, s := range steps.Arr {
		name, _ := s.get("name")
		if name.Leaf != compatSteps[i] {
			t.Fatalf("%s direct output: step %d is %v, want %s", client, i, name.Leaf, compatSteps[i])
		}
		e, failed := s.get("error")
		if failed != compatErrorSteps[compatSteps[i]] {
			t.Fatalf("%s direct output: step %s failed=%v, want %v:\n%s", client, compatSteps[i], failed, !failed, s)
		}
		if failed && !strings.Contains(e.String(), "11000") {
			t.Fatalf("%s direct output: step %s failed without the duplicate key code 11000:\n%s", client, compatSteps[i], e)
		}
	}
}

// normaliseCompat removes from a script's output what legitimately differs
// between two runs or between a direct and a proxied connection, and
// nothing else:
//
//  1. hello/isMaster replies: localTime and connectionId differ on every
//     connection. Nothing else is removed: the embedded upstream is a
//     standalone, whose handshake the proxy passes on unchanged, so a
//     driver must see exactly what it sees directly.
//  2. ObjectIds the driver generated (the auto-id insert) differ per run;
//     every ObjectId not starting with "000000" (the ones the scripts set)
//     becomes "<oid N>", numbered by first appearance, so references to the
//     same id still have to agree.
//  3. buildInfo.ferretdbFeatures.aggregationStages: FerretDB lists these
//     from a Go map, in a different order on every call; sorted.
func normaliseCompat(out []byte) (jsonValue, error) {
	v, err := parseJSON(out)
	if err != nil {
		return v, fmt.Errorf("not JSON: %v\n%s", err, out)
	}
	steps, ok := v.get("steps")
	if !ok {
		return v, fmt.Errorf("no steps in output")
	}
	for i, s := range steps.Arr {
		name, _ := s.get("name")
		res, ok := s.get("result")
		if !ok {
			continue
		}
		switch name.Leaf {
		case "hello", "isMaster":
			steps.Arr[i].set("result", res.without(helloPerConnection...))
		case "buildInfo":
			if f, ok := res.get("ferretdbFeatures"); ok {
				if st, ok := f.get("aggregationStages"); ok {
					f.set("aggregationStages", sortedLeaves(st))
				}
			}
		}
	}
	oids := map[string]string{}
	var walk func(*jsonValue)
	walk = func(x *jsonValue) {
		if x.IsObj && len(x.Obj) == 1 && x.Obj[0].Key == "$oid" {
			if s, ok := x.Obj[0].Value.Leaf.(string); ok && !strings.HasPrefix(s, "000000") {
				if _, ok := oids[s]; !ok {
					oids[s] = fmt.Sprintf("<oid %d>", len(oids)+1)
				}
				x.Obj[0].Value.Leaf = oids[s]
			}
			return
		}
		for i := range x.Obj {
			walk(&x.Obj[i].Value)
		}
		for i := range x.Arr {
			walk(&x.Arr[i])
		}
	}
	walk(&v)
	return v, nil
}
