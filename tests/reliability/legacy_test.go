package reliability

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"

	"github.com/lockgate/lockgate/config"
)

// envChildUnlocked sets unlockedWriters on the child gateway's enforced
// rule, with a 5 s default lease (the lease of its implicit locks): the
// survivor must still see the dead proxy's implicit lock after the kill,
// a connect and a session (1.5 s ran out first at load 12).
const envChildUnlocked = "LOCKGATE_RELIABILITY_CHILD_UNLOCKED"

func childLegacyConfig(cfg *config.Config) {
	if u := os.Getenv(envChildUnlocked); u != "" && len(cfg.Policy.Namespaces) > 0 {
		cfg.Policy.Namespaces[0].UnlockedWriters = config.UnlockedWriters(u)
		cfg.Lockstore.DefaultLeaseMS = 5000
		cfg.Policy.LeaseMarginMS = 100
	}
}

// legacyReport is what pymongo/legacy_writer.py prints.
type legacyReport struct {
	Acked   map[string]int64 `json:"acked"`
	Refused []struct {
		Reason string `json:"reason"`
		App    string `json:"app"`
		Code   int    `json:"code"`
	} `json:"refused"`
	Errors []string `json:"errors"`
}

// TestLegacyWriterAndEditorAcrossProxies is issue 23's main proof. An
// unchanged legacy writer (pymongo, $inc in a loop, no sessions, no lock
// calls) writes a few hot counters through lockgate A; lock-aware editors
// (Go driver) do read, think, write under acquireLock with waitMS on the
// same counters through lockgate B, which shares A's lock store. Each
// editor writes with a filter on the value it read, so a legacy write that
// landed between its read and its write makes its write match nothing.
//
//   - wait (with wake-up datagrams between the two): no editor write ever misses, no legacy write is refused, and
//     every counter equals the legacy writer's acknowledged increments
//     plus the editors';
//   - refuseIfLocked: the same, except that legacy writes are refused
//     (held_by_other, naming the editor) while an editor holds the lock;
//   - refuse: every legacy write is refused, as before.
func TestLegacyWriterAndEditorAcrossProxies(t *testing.T) {
	t.Parallel()
	if err := exec.Command("/usr/bin/python3", "-c", "import pymongo").Run(); err != nil {
		t.Fatalf("/usr/bin/python3 cannot import pymongo (%v): run `apt-get install -y python3-pymongo`", err)
	}
	const (
		hot     = 3
		rounds  = 25
		editors = 2
		edits   = 15
	)
	for _, mode := range []config.UnlockedWriters{config.UnlockedWait, config.UnlockedRefuseIfLocked, config.UnlockedRefuse} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t, 3*time.Minute)
			lockColl, collName := uniq("locks"), uniq("legacy")
			ns := relDB + "." + collName
			direct := connect(t, upstream.URI(), "direct").Database(relDB).Collection(collName)
			seedCounters(t, ctx, direct, hot)
			cfg := gatewayConfig(upstream.URI(), lockColl, ns)
			cfg.Policy.Namespaces[0].UnlockedWriters = mode
			cfgB := gatewayConfig(upstream.URI(), lockColl, ns)
			cfgB.Policy.Namespaces[0].UnlockedWriters = mode
			if mode == config.UnlockedWait {
				// Waiters woken across the two by datagrams (and polling).
				cfg.Lockstore.WakeListen, cfgB.Lockstore.WakeListen = "127.0.0.1:0", "127.0.0.1:0"
			}
			a := startGateway(t, cfg)
			b := startGateway(t, cfgB)

			var edited, missed [hot]int64
			var mu sync.Mutex
			var wg sync.WaitGroup
			errs := make(chan error, editors)
			ec := connect(t, b.URI, "editor")
			for e := range editors {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s, err := ec.StartSession()
					if err != nil {
						errs <- err
						return
					}
					defer s.EndSession(context.Background())
					sctx := mongo.NewSessionContext(ctx, s)
					db := ec.Database(relDB)
					coll := db.Collection(collName)
					for i := range edits {
						key := (e + i) % hot
						if err := db.RunCommand(sctx, bson.D{{"acquireLock", collName}, {"ids", bson.A{key}}, {"waitMS", 20000}}).Err(); err != nil {
							errs <- fmt.Errorf("editor acquireLock: %w", err)
							return
						}
						var doc counterDoc
						if err := coll.FindOne(sctx, bson.D{{"_id", key}}).Decode(&doc); err != nil {
							errs <- err
							return
						}
						time.Sleep(3 * time.Millisecond) // think: the window a legacy write would use
						r, err := coll.UpdateOne(sctx, bson.D{{"_id", key}, {"n", doc.N}}, bson.D{{"$set", bson.D{{"n", doc.N + 1}}}})
						if err != nil {
							errs <- fmt.Errorf("editor write: %w", err)
							return
						}
						mu.Lock()
						if r.ModifiedCount == 1 {
							edited[key]++
						} else {
							missed[key]++
						}
						mu.Unlock()
						if err := db.RunCommand(sctx, bson.D{{"releaseLock", collName}, {"ids", bson.A{key}}}).Err(); err != nil {
							errs <- fmt.Errorf("editor releaseLock: %w", err)
							return
						}
					}
				}()
			}
			ids := "0,1,2"
			out, err := exec.CommandContext(ctx, "/usr/bin/python3", "pymongo/legacy_writer.py", a.URI, relDB, collName, strconv.Itoa(rounds), ids).Output()
			if err != nil {
				t.Fatalf("legacy writer: %v", err)
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			var rep legacyReport
			if err := json.Unmarshal(out, &rep); err != nil {
				t.Fatalf("legacy writer's report %q: %v", out, err)
			}
			if len(rep.Errors) > 0 {
				t.Errorf("legacy writer errors: %v", rep.Errors)
			}
			var totalEdits, totalMissed, totalAcked int64
			for k := range hot {
				var doc counterDoc
				if err := direct.FindOne(ctx, bson.D{{"_id", k}}).Decode(&doc); err != nil {
					t.Fatal(err)
				}
				acked := rep.Acked[strconv.Itoa(k)]
				totalEdits, totalMissed, totalAcked = totalEdits+edited[k], totalMissed+missed[k], totalAcked+acked
				if doc.N != acked+edited[k] {
					t.Errorf("counter %d = %d, want %d legacy + %d editor increments", k, doc.N, acked, edited[k])
				}
			}
			if totalMissed > 0 {
				t.Errorf("%d editor writes found their read overwritten by a legacy write", totalMissed)
			}
			t.Logf("%s: %d legacy increments acknowledged, %d refused; %d edits", mode, totalAcked, len(rep.Refused), totalEdits)
			switch mode {
			case config.UnlockedWait:
				if len(rep.Refused) > 0 {
					t.Errorf("wait: legacy writes refused: %v", rep.Refused)
				}
			case config.UnlockedRefuseIfLocked:
				for _, r := range rep.Refused {
					if r.Reason != "held_by_other" || r.App != "editor" {
						t.Errorf("refuseIfLocked: refusal %+v, want held_by_other naming the editor", r)
					}
				}
			case config.UnlockedRefuse:
				if totalAcked != 0 || len(rep.Refused) != hot*rounds {
					t.Errorf("refuse: %d acknowledged, %d refused; want 0 and %d", totalAcked, len(rep.Refused), hot*rounds)
				}
				for _, r := range rep.Refused {
					// Today's refusals: not_locked, or held_by_other while
					// an editor holds the named _id.
					if r.Reason != "not_locked" && (r.Reason != "held_by_other" || r.App != "editor") {
						t.Errorf("refuse: refusal %+v, want not_locked or held_by_other naming the editor", r)
					}
				}
			}
			if totalEdits != editors*edits {
				t.Errorf("%d edits, want %d", totalEdits, editors*edits)
			}
		})
	}
}

// TestKilledProxyFreesImplicitLocksByLease: a lockgate process is
// SIGKILLed while a legacy write it forwarded under implicit locks is
// still unanswered (a relay holds it). The other lockgate sees the lock as
// implicit, held by the legacy writer, and an acquireLock through it gets
// the lock once the implicit lease (5 s here) has run out: nothing is
// left behind by the dead proxy.
func TestKilledProxyFreesImplicitLocksByLease(t *testing.T) {
	t.Parallel()
	coll := uniq("legacykill")
	ns := relDB + "." + coll
	locks := uniq("locks")
	relay := newFaultRelay(t, upstream.Addr(), slowMarker, 10*time.Second)
	held := make(chan struct{}, 1)
	relay.onMarked = func() {
		select {
		case held <- struct{}{}:
		default:
		}
	}
	child := startChildGateway(t, "mongodb://"+relay.Addr()+"/", locks, ns,
		envChildStoreURI+"="+upstream.URI(), envChildUnlocked+"="+string(config.UnlockedWait))
	cfg := gatewayConfig(upstream.URI(), locks, ns)
	cfg.Policy.Namespaces[0].UnlockedWriters = config.UnlockedWait
	survivor := startGateway(t, cfg)
	ctx := testCtx(t, time.Minute)
	seedCounters(t, ctx, connect(t, upstream.URI(), "seed").Database(relDB).Collection(coll), 1)

	legacy := connect(t, child.URI, "legacy-writer", options.Client().SetRetryWrites(false))
	go legacy.Database(relDB).Collection(coll).UpdateOne(ctx, bson.D{{"_id", 0}}, bson.D{{"$inc", bson.D{{"n", 1}}}},
		options.Update().SetComment(slowMarker))
	select {
	case <-held:
	case <-time.After(20 * time.Second):
		t.Fatal("the legacy write never reached the relay")
	}
	if err := child.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	editor := connect(t, survivor.URI, "editor")
	s, err := editor.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.EndSession(ctx)
	sctx := mongo.NewSessionContext(ctx, s)
	var st bson.M
	if err := editor.Database(relDB).RunCommand(sctx, bson.D{{"lockStatus", coll}, {"ids", bson.A{0}}}).Decode(&st); err != nil {
		t.Fatal(err)
	}
	l := st["locks"].(bson.A)[0].(bson.M)
	owner, _ := l["holder"].(bson.M)
	if l["held"] != true || owner["implicit"] != true || owner["app"] != "legacy-writer" {
		t.Fatalf("lockStatus after the kill: %v, want held implicitly by legacy-writer", l)
	}
	if err := editor.Database(relDB).RunCommand(sctx, bson.D{{"acquireLock", coll}, {"ids", bson.A{0}}, {"waitMS", 15000}}).Err(); err != nil {
		t.Fatalf("the dead proxy's implicit lock was not freed by its lease: %v", err)
	}
	t.Logf("implicit lock of the killed proxy taken over %v after the kill (lease 5 s)", time.Since(killed).Round(time.Millisecond))
}

// TestImplicitWriteIsFenced: under fence: document, a legacy write's
// implicit lock is a holder like any other: its token is stamped into the
// document before the write (above the previous holder's), the write is
// fenced on it and applies, and an insert and an upsert of a legacy writer
// carry their implicit lock's token.
func TestImplicitWriteIsFenced(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, time.Minute)
	collName := uniq("legacyfence")
	ns := relDB + "." + collName
	cfg := fencedConfig(upstream.URI(), ns, true)
	cfg.Policy.Namespaces[0].UnlockedWriters = config.UnlockedWait
	g := startGateway(t, cfg)
	direct := connect(t, upstream.URI(), "direct").Database(relDB).Collection(collName)
	seedCounters(t, ctx, direct, 1)

	holder := connect(t, g.URI, "holder")
	s, err := holder.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.EndSession(ctx)
	sctx := mongo.NewSessionContext(ctx, s)
	hdb := holder.Database(relDB)
	var acq struct {
		Locks []struct {
			Token int64 `bson:"token"`
		} `bson:"locks"`
	}
	if err := hdb.RunCommand(sctx, bson.D{{"acquireLock", collName}, {"ids", bson.A{0}}}).Decode(&acq); err != nil {
		t.Fatal(err)
	}
	if _, err := hdb.Collection(collName).UpdateOne(sctx, bson.D{{"_id", 0}}, bson.D{{"$inc", bson.D{{"n", 1}}}}); err != nil {
		t.Fatal(err)
	}
	if err := hdb.RunCommand(sctx, bson.D{{"releaseLock", collName}}).Err(); err != nil {
		t.Fatal(err)
	}
	before, _ := stampOf(t, ctx, direct, 0)
	if before != acq.Locks[0].Token {
		t.Fatalf("holder's stamp %d, token %d", before, acq.Locks[0].Token)
	}

	lc := connect(t, g.URI, "legacy-writer").Database(relDB).Collection(collName)
	if _, err := lc.UpdateOne(ctx, bson.D{{"_id", 0}}, bson.D{{"$inc", bson.D{{"n", 1}}}}); err != nil {
		t.Fatalf("legacy write under a fence: %v", err)
	}
	after, ok := stampOf(t, ctx, direct, 0)
	if !ok || after <= before {
		t.Fatalf("stamp after the legacy write %d (present %v), want above the holder's %d", after, ok, before)
	}
	var doc counterDoc
	if err := direct.FindOne(ctx, bson.D{{"_id", 0}}).Decode(&doc); err != nil || doc.N != 2 {
		t.Fatalf("counter %d (%v), want 2: the fenced legacy write did not apply", doc.N, err)
	}
	if _, err := lc.InsertOne(ctx, bson.D{{"_id", 10}, {"n", 0}}); err != nil {
		t.Fatalf("legacy insert under a fence: %v", err)
	}
	if _, err := lc.UpdateOne(ctx, bson.D{{"_id", 11}}, bson.D{{"$inc", bson.D{{"n", 1}}}}, options.Update().SetUpsert(true)); err != nil {
		t.Fatalf("legacy upsert under a fence: %v", err)
	}
	for _, id := range []int{10, 11} {
		if st, ok := stampOf(t, ctx, direct, id); !ok || st <= 0 {
			t.Errorf("document %d created by a legacy write carries no fencing token (%d, %v)", id, st, ok)
		}
	}
}
