package bench

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
)

// buildProxy builds the lockgate binary (./cmd/proxy) into a temporary
// directory, as the enforce family's -enforce-proxy flag expects one.
func buildProxy(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "lockgate")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/lockgate/lockgate/cmd/proxy").CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/proxy: %v\n%s", err, out)
	}
	return bin
}

// TestProcGateway: lockgate in a process of its own serves writes, its
// CPU clock counts the work they made it do (the enforce family adds it to
// each round's), its round-trip counter is read from its /metrics, and it
// stops cleanly on SIGTERM.
func TestProcGateway(t *testing.T) {
	bin := buildProxy(t)
	in, err := StartInstant(4, payload)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	f, err := startFerret()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, err := startProcGateway(bin, "mongodb://"+in.Addr()+"/", f.URI(), LockedNS)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			_ = g.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := connectTo(ctx, g.Addr(), Unprotected, enforceDB, openColl, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// A process that has served nothing yet has used some CPU starting.
	before := g.CPU()
	if before <= 0 {
		t.Fatalf("the gateway process's CPU clock reads %v", before)
	}
	const writes = 2000
	for i := range writes {
		if _, err := c.coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: docID(i % 4)}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: int32(1)}}}}); err != nil {
			t.Fatal(err)
		}
	}
	// Each write crosses the proxy twice (request and reply): far more
	// than 5 µs of its CPU a write.
	if used := g.CPU() - before; used < writes*5*time.Microsecond {
		t.Errorf("the gateway process used %v for %d writes through it", used, writes)
	}
	// The rounds' clock counts both processes.
	p0 := g.CPU()
	if got := cpuClock(g)() - processCPU(); got < p0/2 {
		t.Errorf("the rounds' CPU clock counts %v of the gateway process's %v", got, p0)
	}
	rt, err := g.RoundTrips()
	if err != nil {
		t.Fatal(err)
	}
	if total(rt) == 0 {
		t.Errorf("no lock store round trips read from /metrics: %v", rt)
	}
	closed = true
	if err := g.Close(); err != nil {
		t.Errorf("stopping the gateway process: %v", err)
	}
}

// TestProcGatewayThatExits: a binary that exits before it is ready is an
// error at once, not a 30-second wait.
func TestProcGatewayThatExits(t *testing.T) {
	start := time.Now()
	_, err := startProcGateway("/bin/false", "mongodb://127.0.0.1:1/", "")
	if err == nil || !strings.Contains(err.Error(), "exited before it was ready") {
		t.Fatalf("err = %v", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("took %v", took)
	}
}

// TestEnforceSmokeOwnProcess runs the enforcement benchmark in miniature
// with lockgate in a process of its own: the same checks as
// TestEnforceSmoke (an update without the lock refused, every update in
// the documents), the report saying where lockgate ran.
func TestEnforceSmokeOwnProcess(t *testing.T) {
	cfg := DefaultEnforceConfig()
	cfg.Upstreams = []Upstream{InstantUpstream}
	cfg.Clients = []int{3}
	cfg.Rounds = 1
	cfg.Round = 50 * time.Millisecond
	cfg.Warmup = 0
	cfg.Docs = 6
	cfg.ProxyBinary = buildProxy(t)
	rep, err := RunEnforce(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Cells) != 1 {
		t.Fatalf("%d cells", len(rep.Cells))
	}
	for _, l := range EnforceLegs {
		if rep.Cells[0].Writes(l) == 0 {
			t.Errorf("leg %s made no writes", l)
		}
	}
	if got := rep.Checked[InstantUpstream]; !strings.Contains(got, "refused with LockBusy") || !strings.Contains(got, "a process of its own") {
		t.Errorf("checked: %q", got)
	}
}
