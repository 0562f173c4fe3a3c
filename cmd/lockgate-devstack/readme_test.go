package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/lockgate/lockgate/internal/testkit"
)

// TestReadmeWalkthrough runs the README's five-minute walk-through as
// written: the dev stack with its default policy, and the README's mongosh
// block pasted into the shell the README installs. Each line's outcome is
// the one its comment promises: the write outside a lock refused with
// LockBusy, the write in the locking session applied, the status and the
// release; and nothing warns about a collection the walk-through created.
func TestReadmeWalkthrough(t *testing.T) {
	if testing.Short() {
		t.Skip("starts FerretDB")
	}
	mongosh, err := filepath.Abs("../../tests/compat/node/node_modules/.bin/mongosh")
	if err != nil {
		t.Fatal(err)
	}
	testkit.RequireTool(t, "mongosh", testkit.NodeModule("../../tests/compat/node/node_modules", "mongosh"))
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)Paste the walk-through into the shell:\\s*```js\\n(.*?)\\n\\s*```").FindSubmatch(readme)
	if block == nil {
		t.Fatal("README.md: no mongosh walk-through block after \"Paste the walk-through into the shell:\"")
	}
	var script strings.Builder
	for _, line := range strings.Split(string(block[1]), "\n") {
		script.WriteString(strings.TrimSpace(line) + "\n")
	}
	if !strings.Contains(script.String(), `acquireLock: "orders"`) {
		t.Fatalf("the README's block is not the walk-through:\n%s", script.String())
	}

	// The README's connection string and port are the dev stack's defaults;
	// the test runs it on free ports and gives mongosh the one printed.
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, []string{"-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0"}, &stdout, &stderr, nil)
	}()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Error("dev stack did not stop")
		}
	}()
	logOnFailure(t, &stdout, &stderr)
	var uri string
	testkit.Eventually(t, 30*time.Second, "the connection string printed", func() bool {
		select {
		case code := <-done:
			done <- code // for the deferred stop
			t.Fatalf("dev stack exited %d", code)
		default:
		}
		if m := connRE.FindStringSubmatch(stdout.String()); m != nil {
			uri = m[1]
		}
		return uri != ""
	})

	sctx, scancel := context.WithTimeout(ctx, 2*time.Minute)
	defer scancel()
	sh := exec.CommandContext(sctx, mongosh, uri, "--norc")
	sh.Stdin = strings.NewReader(script.String())
	var out bytes.Buffer
	sh.Stdout, sh.Stderr = &out, &out
	if err := sh.Run(); err != nil {
		t.Fatalf("mongosh: %v\n%s", err, out.String())
	}
	got := out.String()
	for _, want := range []string{
		"insertedId: 1",
		"MongoServerError[LockBusy]: lockgate: update on shop.orders refused: this session does not hold the lock on _id 1",
		"ok: 1",
		"session: '",
		"modifiedCount: 1",
		"heldByYou: true",
		"released: 1",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the walk-through's output lacks %q", want)
		}
	}
	if strings.Contains(got, "warnings: [") {
		t.Errorf("the walk-through got a warning")
	}
	if t.Failed() {
		t.Logf("mongosh output:\n%s", got)
	}
}

// TestReadmeNamesMongoshNodeVersion: the README says which Node.js the
// mongosh it installs wants without a deprecation warning (issue 26). The
// figure is read from mongosh itself, so that an upgrade of mongosh that
// raises it makes this test fail until the README says so.
func TestReadmeNamesMongoshNodeVersion(t *testing.T) {
	src, err := os.ReadFile("../../tests/compat/node/node_modules/@mongosh/cli-repl/lib/cli-repl.js")
	if err != nil {
		testkit.RequireTool(t, "mongosh", err)
	}
	m := regexp.MustCompile(`RECOMMENDED_NODEJS = '>=(\d+)\.`).FindSubmatch(src)
	if m == nil {
		t.Fatal("mongosh's cli-repl.js no longer names RECOMMENDED_NODEJS: read how it decides its Node.js deprecation warning and update this test")
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	want := "wants Node.js " + string(m[1]) + " or later"
	if !strings.Contains(strings.Join(strings.Fields(string(readme)), " "), want) {
		t.Errorf("README.md does not say that the installed mongosh %q (its deprecation warning's threshold)", want)
	}
}
