package embedded_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"

	"github.com/lockgate/lockgate/internal/testkit"
	"github.com/lockgate/lockgate/testserver/embedded"
)

func TestMain(m *testing.M) { os.Exit(testkit.RunMain(m, nil)) }

// TestChildProcessUpstream: with ChildEnv naming a testserver/ferretdb
// binary, Start runs FerretDB in that child (the race step's form,
// scripts/test.sh): it serves, keeps its data in the directory given, and
// Close ends the process and frees its port, so that a restart on the
// same address and directory (tests/restart_test.go) finds it free.
func TestChildProcessUpstream(t *testing.T) {
	testkit.RequireTool(t, "go", testkit.OnPath("go", "install Go and put its bin directory on PATH"))
	bin := filepath.Join(t.TempDir(), "ferretdb")
	build := exec.Command("go", "build", "-o", bin, "github.com/lockgate/lockgate/testserver/ferretdb")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./testserver/ferretdb: %v\n%s", err, out)
	}
	t.Setenv(embedded.ChildEnv, bin)
	dir := t.TempDir()

	srv, err := embedded.Start(embedded.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if !running(t, bin) {
		t.Fatalf("no process of %s: FerretDB did not start in a child", bin)
	}
	write(t, srv.URI(), 1)
	addr := srv.Addr()
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if running(t, bin) {
		t.Fatalf("a process of %s is still running after Close", bin)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatalf("%s still accepts connections after Close", addr)
	}

	// The same address and directory again: the document is still there.
	srv, err = embedded.Start(embedded.Options{Addr: addr, Dir: dir})
	if err != nil {
		t.Fatalf("restart on %s: %v", addr, err)
	}
	defer srv.Close()
	if n := write(t, srv.URI(), 2); n != 2 {
		t.Fatalf("documents after the restart: %d, want 2 (the first one was lost)", n)
	}
}

// running reports whether a process of this machine runs the program
// bin (Linux's /proc).
func running(t *testing.T, bin string) bool {
	t.Helper()
	exes, err := filepath.Glob("/proc/[0-9]*/exe")
	if err != nil {
		t.Fatal(err)
	}
	for _, exe := range exes {
		if target, err := os.Readlink(exe); err == nil && target == bin {
			return true
		}
	}
	return false
}

// write inserts a document with _id id through uri and returns how many
// documents the collection then holds.
func write(t *testing.T, uri string, id int) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := mongo.Connect(ctx, options.Client().ApplyURI(uri))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Disconnect(context.Background())
	coll := c.Database("embedded_test").Collection("c")
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: id}}); err != nil {
		t.Fatalf("insert through %s: %v", uri, err)
	}
	n, err := coll.CountDocuments(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestTemporaryDataDirectory: a temporary data directory is in memory
// (/dev/shm) where the machine has a writable one, so a test's writes do
// not wait for disk syncs, and on disk when OnDisk asks (the dev stack,
// whose data may outgrow a container's small /dev/shm); Close removes it
// either way.
func TestTemporaryDataDirectory(t *testing.T) {
	st, err := os.Stat("/dev/shm")
	shm := err == nil && st.IsDir() && st.Mode().Perm()&0o002 != 0
	for _, onDisk := range []bool{false, true} {
		srv, err := embedded.StartInProcess(embedded.Options{OnDisk: onDisk})
		if err != nil {
			t.Fatal(err)
		}
		dir := srv.Dir()
		if inMemory := filepath.Dir(dir) == "/dev/shm"; inMemory != (shm && !onDisk) {
			t.Errorf("OnDisk %v: the data directory is %s", onDisk, dir)
		}
		if err := srv.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("OnDisk %v: %s outlived Close (%v)", onDisk, dir, err)
		}
	}
}
