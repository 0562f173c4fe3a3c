package reliability

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"

	"github.com/lockgate/lockgate/audittrail"
	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/gateway"
	"github.com/lockgate/lockgate/internal/testkit"
	"go.uber.org/zap"
)

// Child gateways keep an audit trail in this directory, signed with the
// key in envChildAuditKey, when it is set.
const (
	envChildAuditDir  = "LOCKGATE_RELIABILITY_CHILD_AUDIT_DIR"
	envChildAuditKey  = "LOCKGATE_RELIABILITY_CHILD_AUDIT_KEY"
	envChildAuditMode = "LOCKGATE_RELIABILITY_CHILD_AUDIT_MODE"
	envChildAuditColl = "LOCKGATE_RELIABILITY_CHILD_AUDIT_COLL"
)

func childAuditConfig(cfg *config.Config) {
	if key := os.Getenv(envChildAuditKey); key != "" {
		auditConfig(cfg, os.Getenv(envChildAuditDir), os.Getenv(envChildAuditColl), key, config.AuditMode(os.Getenv(envChildAuditMode)))
	}
}

// auditConfig turns the trail on: in dir, in the collection coll of the
// lock store's database, or both.
func auditConfig(cfg *config.Config, dir, coll, keyFile string, mode config.AuditMode) {
	cfg.Audit.Mode = mode
	cfg.Audit.Enabled, cfg.Audit.Dir, cfg.Audit.KeyFile = true, dir, keyFile
	cfg.Audit.Collection.Name = coll
	cfg.Audit.Instance = "crash-test"
	cfg.Audit.CheckpointEvery = 25
	cfg.Audit.CheckpointInterval = config.Duration(200 * time.Millisecond)
}

// TestAuditTrailSurvivesSIGKILL: a lockgate writing its audit trail under
// load from several clients is SIGKILLed, in both durability modes, with
// the trail in files, in a collection, and in both. Its trail verifies up
// to the last record that reached the sink (at most a torn line lost,
// which the next start declares); a lockgate restarted on the same
// directory and collection continues the chain (in a new segment linked
// to the old one), and the whole trail, old and new, verifies with the
// key, in every sink. In required mode, every update acknowledged to a
// client before the kill has its allow record in the trail.
func TestAuditTrailSurvivesSIGKILL(t *testing.T) {
	t.Parallel()
	for _, mode := range []config.AuditMode{config.AuditBestEffort, config.AuditRequired} {
		for _, sinks := range []string{"files", "collection", "both"} {
			t.Run(string(mode)+"/"+sinks, func(t *testing.T) { auditTrailSurvivesSIGKILL(t, mode, sinks) })
		}
	}
}

// crashSinks reads the trail of the crash test in each of its sinks.
type crashSinks struct {
	dir  string
	coll *mongo.Collection
	key  audittrail.Key
}

// verify verifies every sink; with both, after a clean stop (final), they
// must hold the same records.
func (s crashSinks) verify(t *testing.T, ctx context.Context, final bool) *audittrail.Report {
	t.Helper()
	var rep *audittrail.Report
	if s.dir != "" {
		r, err := audittrail.Verify(s.dir, []audittrail.Key{s.key})
		if err != nil || !r.OK() {
			t.Fatalf("the files: %v %s", err, r.Verdict())
		}
		rep = r
	}
	if s.coll != nil {
		r, err := audittrail.VerifyCollection(ctx, s.coll, "crash-test", audittrail.VerifyOptions{Keys: []audittrail.Key{s.key}})
		if err != nil || !r.OK() {
			t.Fatalf("the collection: %v %s %q", err, r.Verdict(), r.Notes)
		}
		if rep != nil && rep.Records != r.Records {
			// After the kill the files may hold a batch more: written,
			// then killed before the collection got it (levelled at the
			// restart).
			if final {
				t.Fatalf("files %s; collection %s", rep.Verdict(), r.Verdict())
			}
			t.Logf("files %s; collection %s", rep.Verdict(), r.Verdict())
		}
		if rep == nil {
			rep = r
		}
	}
	return rep
}

// held is how many records the sink that holds fewest has now, while the
// trail is being written: a torn last line is not counted.
func (s crashSinks) held(ctx context.Context) int {
	fewest := -1
	if s.dir != "" {
		n := 0
		audittrail.Read(s.dir, func(*audittrail.Record) error { n++; return nil })
		fewest = n
	}
	if s.coll != nil {
		n, err := s.coll.CountDocuments(ctx, bson.D{{"instance", "crash-test"}})
		if err != nil {
			return 0
		}
		if fewest < 0 || int(n) < fewest {
			fewest = int(n)
		}
	}
	return fewest
}

// read calls fn with every record, from the files when there are any.
func (s crashSinks) read(ctx context.Context, fn func(*audittrail.Record) error) error {
	if s.dir != "" {
		return audittrail.Read(s.dir, fn)
	}
	return audittrail.ReadCollection(ctx, s.coll, "crash-test", fn)
}

// crashIncrements is how many locked increments the child gateway
// acknowledges before it is killed: with four records each (acquire,
// update, refused update, release) and a checkpoint every 25 records,
// about eight checkpoints and the unsigned records after the last. Most of
// a case's CPU is this load (FerretDB serving the lock store, the
// increments and the collection sink); 150, the first figure, took three
// times as long and showed nothing more: the recovery, the chain across
// the restart and, in required mode, an allow record for every
// acknowledged update are checked the same way whatever the count.
const crashIncrements = 50

func auditTrailSurvivesSIGKILL(t *testing.T, mode config.AuditMode, sinks string) {
	ctx := testCtx(t, 3*time.Minute)
	dir := filepath.Join(t.TempDir(), "trail")
	collName := ""
	if sinks != "files" {
		collName = uniq("audit")
	}
	if sinks == "collection" {
		dir = ""
	}
	keyFile := filepath.Join(t.TempDir(), "audit.key")
	secret := "crash-test-crash-test-crash-test-crash-test"
	if err := os.WriteFile(keyFile, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	key := audittrail.NewKey([]byte(secret))
	appColl := uniq("auditcrash")
	ns := relDB + "." + appColl
	lockColl := uniq("locks")
	direct := connect(t, upstream.URI(), "direct")
	seedCounters(t, ctx, direct.Database(relDB).Collection(appColl), 5) // 0-3 for the load, 4 after the restart
	sk := crashSinks{dir: dir, key: key}
	if collName != "" {
		sk.coll = direct.Database(config.Default().Lockstore.Database).Collection(collName)
	}

	// Given to the child only, not set here: the test runs beside others.
	child := startChildGateway(t, upstream.URI(), lockColl, ns,
		envChildAuditDir+"="+dir, envChildAuditColl+"="+collName, envChildAuditKey+"="+keyFile, envChildAuditMode+"="+string(mode))

	// Load: locked increments on four keys, and refused writes, until the
	// child dies under them.
	c := connect(t, child.URI, "crash-load")
	// The load's own context, cancelled once the child is dead: its
	// clients' next call then ends at once instead of waiting out the
	// driver's server selection (10 s) for a server that is gone.
	loadCtx, endLoad := context.WithCancel(ctx)
	defer endLoad()
	var acked atomic.Int64
	var updatesAcked [4]atomic.Int64 // replaceOne acknowledged, per key
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			s, err := c.StartSession()
			if err != nil {
				return
			}
			sctx := mongo.NewSessionContext(loadCtx, s)
			db := c.Database(relDB)
			for loadCtx.Err() == nil {
				if db.RunCommand(sctx, bson.D{{"acquireLock", appColl}, {"ids", bson.A{w}}, {"waitMS", 2000}}).Err() != nil {
					return // the child is gone
				}
				if increment(sctx, db.Collection(appColl), w) != nil {
					return
				}
				updatesAcked[w].Add(1)
				// Refused: nobody holds 99.
				db.Collection(appColl).UpdateOne(sctx, bson.D{{"_id", 99}}, bson.D{{"$set", bson.D{{"x", 1}}}})
				if db.RunCommand(sctx, bson.D{{"releaseLock", appColl}, {"ids", bson.A{w}}}).Err() != nil {
					return
				}
				acked.Add(1)
			}
		})
	}
	// Kill once the trail has several checkpoints behind it and the load
	// is in full swing. In bestEffort mode the sink need not keep pace
	// with the clients (a slow fsync on a busy machine holds the writer
	// back while the buffer fills and drops), so wait for the records in
	// every sink, not for the clients' acknowledgements alone.
	testkit.Eventually(t, time.Minute, fmt.Sprintf("%d locked increments, %d records in every sink", crashIncrements, crashIncrements), func() bool {
		return acked.Load() >= crashIncrements && sk.held(ctx) >= crashIncrements
	})
	if err := child.cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	child.cmd.Wait()
	// Dead, so no reply is on its way any more: what a worker counts now
	// it was answered before the kill.
	endLoad()
	wg.Wait()
	// Its server is gone: a disconnect on the live context would wait up
	// to 10 s to end the sessions there.
	c.Disconnect(loadCtx)

	rep := sk.verify(t, ctx, false)
	before := rep.Records
	segsBefore := rep.Segments
	if rep.LastCheckpoint == 0 || before < crashIncrements {
		t.Fatalf("after %d acknowledged increments the trail holds %d records, last checkpoint %d", acked.Load(), before, rep.LastCheckpoint)
	}
	t.Logf("killed after %d locked increments: %s (notes %q)", acked.Load(), rep.Verdict(), rep.Notes)
	var recorded [4]int64
	sk.read(ctx, func(r *audittrail.Record) error {
		if r.NS == ns && r.Kind == audittrail.KindDecision && r.Op == "update" && r.Verdict == audittrail.VerdictAllow && len(r.IDs) == 1 {
			for k := range recorded {
				if r.IDs[0] == fmt.Sprint(k) {
					recorded[k]++
				}
			}
		}
		return nil
	})
	for k := range recorded {
		t.Logf("key %d: %d updates acknowledged, %d allow records", k, updatesAcked[k].Load(), recorded[k])
		if mode == config.AuditRequired && recorded[k] < updatesAcked[k].Load() {
			t.Errorf("required mode: key %d had %d updates acknowledged but only %d allow records in the trail", k, updatesAcked[k].Load(), recorded[k])
		}
	}

	// Restart on the same directory, write, stop cleanly.
	cfg := gatewayConfig(upstream.URI(), lockColl, ns)
	auditConfig(cfg, dir, collName, keyFile, mode)
	// The killed gateway's registry record is still there, so the restart
	// waits before its first grant: a second (CacheTrust) with memory
	// locks off, instead of their 3 s horizon. Its clients took explicit
	// locks only, so there is no memory-locked write to wait out.
	cfg.Lockstore.NewcomerHorizonMS = -1
	gctx, stop := context.WithCancel(context.Background())
	defer stop()
	g, err := gateway.Start(gctx, cfg, zap.NewNop())
	if err != nil {
		t.Fatalf("restart on the trail of the killed gateway: %v", err)
	}
	cl := connect(t, "mongodb://"+g.ProxyAddr().String()+"/", "after-restart")
	s, err := cl.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.EndSession(context.Background())
	sctx := mongo.NewSessionContext(ctx, s)
	db := cl.Database(relDB)
	// Key 4: the killed gateway's clients may still hold 0-3 until their
	// leases end.
	if err := db.RunCommand(sctx, bson.D{{"acquireLock", appColl}, {"ids", bson.A{4}}}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := increment(sctx, db.Collection(appColl), 4); err != nil {
		t.Fatal(err)
	}
	// Before the gateway stops: after, the disconnect at the test's end
	// would wait up to 10 s to end the sessions on a server that is gone.
	s.EndSession(ctx)
	cl.Disconnect(ctx)
	stop()
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}

	rep = sk.verify(t, ctx, true)
	if (dir != "" && rep.Segments <= segsBefore) || rep.Records <= before || rep.Unsigned != 0 {
		t.Fatalf("after the restart: %s; before it %d records in %d segments", rep.Verdict(), before, segsBefore)
	}
	// The restarted run opens with a start record, and its write comes
	// after it. Into a collection, the killed gateway's last insert can
	// land after the kill: it was already in the socket to the database,
	// which runs it though its sender is gone. So there, records of the
	// killed run may sit between the first count and the start record
	// (never one of the restarted client's); a file gets no write after
	// the kill.
	var late []string
	var startSeq uint64
	var afterRestart bool
	sk.read(ctx, func(r *audittrail.Record) error {
		switch {
		case r.Seq <= before:
		case startSeq == 0 && r.Kind == audittrail.KindStart:
			startSeq = r.Seq
		case startSeq == 0:
			late = append(late, fmt.Sprintf("%d %s %s", r.Seq, r.Kind, r.App))
			if r.App == "after-restart" {
				t.Errorf("the restarted client's record %d comes before the restart's start record", r.Seq)
			}
		case r.App == "after-restart" && r.Kind == audittrail.KindDecision && r.Verdict == audittrail.VerdictAllow:
			afterRestart = true
		}
		return nil
	})
	if startSeq == 0 || !afterRestart || (dir != "" && len(late) > 0) {
		t.Fatalf("after the crash: start record at seq %d (0: none), before it %q; the restarted gateway's write recorded after it: %v", startSeq, late, afterRestart)
	}
	if len(late) > 0 {
		t.Logf("the killed run's records that landed after the kill: %q", late)
	}
	t.Log(rep.Verdict(), strings.Join(rep.Notes, "; "))
}
