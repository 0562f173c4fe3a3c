package reliability

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"

	"github.com/lockgate/lockgate/config"
)

// TestLegacyModel is a model-based test of unlockedWriters: two explicit
// sessions (one per lockgate) that lock, write and release, and writers
// that hold no lock (no explicit session, through either lockgate) whose
// writes are drawn from a seeded PRNG (update by _id, update by a filter,
// insert, upsert, delete, a two-statement bulk write), one step at a time.
// A model of the documents and of who holds which lock predicts each
// step's outcome, and after every step the documents (read directly) and
// the locks (lockStatus) must match it:
//
//   - a write of a session that holds none of its locks applies exactly
//     when nobody holds a lock on a document it can touch, else it is
//     refused (refuseIfLocked: LockBusy held_by_other; wait: LockTimeout
//     after unlockedWaitMS) and changes nothing;
//   - a session that holds some but not all of its locks is refused
//     (not_locked), one that holds all writes as ever;
//   - no implicit lock outlives its write.
//
// Short form (CI): seeds 1 and 2, 80 steps. Long form:
// LOCKGATE_LEGACY_MODEL_SEEDS=N (seeds 1..N), LOCKGATE_LEGACY_MODEL_STEPS.
func TestLegacyModel(t *testing.T) {
	t.Parallel()
	seeds, steps := 2, 80
	for env, v := range map[string]*int{"LOCKGATE_LEGACY_MODEL_SEEDS": &seeds, "LOCKGATE_LEGACY_MODEL_STEPS": &steps} {
		if s := os.Getenv(env); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n <= 0 {
				t.Fatalf("%s=%q: want a positive number", env, s)
			}
			*v = n
		}
	}
	for _, mode := range []config.UnlockedWriters{config.UnlockedRefuseIfLocked, config.UnlockedWait} {
		for seed := range uint64(seeds) {
			t.Run(fmt.Sprintf("%s/seed=%d", mode, seed+1), func(t *testing.T) {
				t.Parallel()
				newLegacyModel(t, mode, seed+1).run(steps)
			})
		}
	}
}

const legacyModelIDs = 6 // 0..3 seeded, 4..5 absent at first

type legacyModel struct {
	t      *testing.T
	mode   config.UnlockedWriters
	rng    *rand.Rand
	ctx    context.Context
	coll   string
	direct *mongo.Collection
	// per lockgate: a client with no explicit session, and an explicit
	// session's client and context.
	legacy [2]*mongo.Collection
	exDB   [2]*mongo.Database
	exCtx  [2]context.Context
	// the model
	n      map[int]int64 // present documents' n
	holder [legacyModelIDs]int
	step   int
	// allowed and refused count the predicted outcomes, for the log.
	allowed, refused int
}

func newLegacyModel(t *testing.T, mode config.UnlockedWriters, seed uint64) *legacyModel {
	ctx := testCtx(t, 3*time.Minute)
	lockColl, coll := uniq("locks"), uniq("lmodel")
	ns := relDB + "." + coll
	m := &legacyModel{t: t, mode: mode, rng: rand.New(rand.NewPCG(seed, 23)), ctx: ctx, coll: coll, n: map[int]int64{}}
	m.direct = connect(t, upstream.URI(), "direct").Database(relDB).Collection(coll)
	seedCounters(t, ctx, m.direct, 4)
	for i := range 4 {
		m.n[i] = 0
	}
	for i := range m.holder {
		m.holder[i] = -1
	}
	for k := range 2 {
		cfg := gatewayConfig(upstream.URI(), lockColl, ns)
		cfg.Policy.Namespaces[0].UnlockedWriters = mode
		if mode == config.UnlockedWait {
			cfg.Policy.Namespaces[0].UnlockedWaitMS = 150
		}
		g := startGateway(t, cfg)
		m.legacy[k] = connect(t, g.URI, "legacy", options.Client().SetRetryWrites(false)).Database(relDB).Collection(coll)
		ec := connect(t, g.URI, fmt.Sprintf("editor%d", k))
		s, err := ec.StartSession()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.EndSession(context.Background()) })
		m.exDB[k], m.exCtx[k] = ec.Database(relDB), mongo.NewSessionContext(ctx, s)
	}
	return m
}

func (m *legacyModel) run(steps int) {
	for m.step = range steps {
		m.once()
		m.check()
		if m.t.Failed() {
			return
		}
	}
	m.t.Logf("%d steps: %d predicted allowed, %d predicted refused, all as predicted", steps, m.allowed, m.refused)
}

// free reports whether nobody holds any of ids; mine whether session k
// holds all of them; some whether it holds at least one.
func (m *legacyModel) free(ids ...int) bool {
	for _, id := range ids {
		if m.holder[id] != -1 {
			return false
		}
	}
	return true
}

func (m *legacyModel) mine(k int, ids ...int) (all, some bool) {
	all = true
	for _, id := range ids {
		if m.holder[id] == k {
			some = true
		} else {
			all = false
		}
	}
	return all, some
}

func (m *legacyModel) once() {
	id := m.rng.IntN(legacyModelIDs)
	k := m.rng.IntN(2)
	inc := bson.D{{"$inc", bson.D{{"n", 1}}}}
	switch op := m.rng.IntN(10); op {
	case 0, 1: // explicit acquire, no wait
		// The model knows no lease: it must outlast the run, which took
		// 131 s at load 12 (a 60 s lease ended at its step 25).
		err := m.exDB[k].RunCommand(m.exCtx[k], bson.D{{"acquireLock", m.coll}, {"ids", bson.A{id}}, {"leaseMS", 600000}}).Err()
		m.expect(fmt.Sprintf("session %d acquires %d", k, id), err, m.holder[id] == -1 || m.holder[id] == k, "held")
		if err == nil {
			m.holder[id] = k
		}
	case 2: // explicit release of all
		if err := m.exDB[k].RunCommand(m.exCtx[k], bson.D{{"releaseLock", m.coll}}).Err(); err != nil {
			m.t.Fatalf("step %d: release: %v", m.step, err)
		}
		for i := range m.holder {
			if m.holder[i] == k {
				m.holder[i] = -1
			}
		}
	case 3: // explicit session's write of one document
		_, err := m.exDB[k].Collection(m.coll).UpdateOne(m.exCtx[k], bson.D{{"_id", id}}, inc)
		all, _ := m.mine(k, id)
		m.expectWrite(fmt.Sprintf("session %d writes %d", k, id), err, all || m.free(id), all, id)
	case 4: // explicit session's write of two: mixed holdings are refused
		b := (id + 1) % legacyModelIDs
		_, err := m.exDB[k].Collection(m.coll).UpdateMany(m.exCtx[k], bson.D{{"_id", bson.D{{"$in", bson.A{id, b}}}}}, inc)
		all, some := m.mine(k, id, b)
		ok := all || (!some && m.free(id, b))
		if some && !all {
			m.expect(fmt.Sprintf("session %d writes %d,%d holding one", k, id, b), err, false, "not_locked")
			return
		}
		m.expectWrite(fmt.Sprintf("session %d writes %d,%d", k, id, b), err, ok, all, id, b)
	case 5: // legacy update by _id
		_, err := m.legacy[k].UpdateOne(m.ctx, bson.D{{"_id", id}}, inc)
		m.expectWrite(fmt.Sprintf("legacy writes %d", id), err, m.free(id), false, id)
	case 6: // legacy update by a filter that names no _id
		var cands []int
		for i, n := range m.n {
			if n >= 1 {
				cands = append(cands, i)
			}
		}
		_, err := m.legacy[k].UpdateMany(m.ctx, bson.D{{"n", bson.D{{"$gte", 1}}}}, inc)
		m.expectWrite(fmt.Sprintf("legacy writes n >= 1 (%v)", cands), err, m.free(cands...), false, cands...)
	case 7: // legacy insert or upsert
		if _, present := m.n[id]; present {
			_, err := m.legacy[k].UpdateOne(m.ctx, bson.D{{"_id", id}}, inc, options.Update().SetUpsert(true))
			m.expectWrite(fmt.Sprintf("legacy upserts existing %d", id), err, m.free(id), false, id)
			return
		}
		var err error
		if m.rng.IntN(2) == 0 {
			_, err = m.legacy[k].InsertOne(m.ctx, bson.D{{"_id", id}, {"n", int64(1)}})
		} else {
			_, err = m.legacy[k].UpdateOne(m.ctx, bson.D{{"_id", id}}, inc, options.Update().SetUpsert(true))
		}
		m.expect(fmt.Sprintf("legacy creates %d", id), err, m.free(id), "")
		if err == nil {
			m.n[id] = 1
		}
	case 8: // legacy delete by _id
		_, err := m.legacy[k].DeleteOne(m.ctx, bson.D{{"_id", id}})
		m.expect(fmt.Sprintf("legacy deletes %d", id), err, m.free(id), "")
		if err == nil {
			delete(m.n, id)
		}
	case 9: // legacy two-statement bulk write, all or nothing
		b := (id + 2) % legacyModelIDs
		_, err := m.legacy[k].BulkWrite(m.ctx, []mongo.WriteModel{
			mongo.NewUpdateOneModel().SetFilter(bson.D{{"_id", id}}).SetUpdate(inc),
			mongo.NewUpdateOneModel().SetFilter(bson.D{{"_id", b}}).SetUpdate(inc),
		})
		m.expectWrite(fmt.Sprintf("legacy bulk-writes %d,%d", id, b), err, m.free(id, b), false, id, b)
	}
}

// expectWrite checks an increment of ids and applies it to the model.
func (m *legacyModel) expectWrite(what string, err error, ok, holder bool, ids ...int) {
	reason := ""
	if holder {
		reason = "none" // a holder's write is never refused here
	}
	m.expect(what, err, ok, reason)
	if err == nil {
		for _, id := range ids {
			if _, present := m.n[id]; present {
				m.n[id]++
			}
		}
	}
}

// expect checks that a step was allowed, or refused as the mode refuses
// (wantReason, when set, is the reason expected instead).
func (m *legacyModel) expect(what string, err error, ok bool, wantReason string) {
	m.t.Helper()
	if ok {
		m.allowed++
		if err != nil {
			m.t.Errorf("step %d: %s: refused, want allowed: %v", m.step, what, err)
		}
		return
	}
	m.refused++
	if err == nil {
		m.t.Errorf("step %d: %s: allowed, want refused (holders %v)", m.step, what, m.holder)
		return
	}
	code := commandCode(err)
	switch {
	case wantReason == "held": // acquireLock of a held lock
		if code != 46 {
			m.t.Errorf("step %d: %s: %v, want LockBusy", m.step, what, err)
		}
	case wantReason == "not_locked":
		if code != 46 || !containsAny(err.Error(), "does not hold the lock") {
			m.t.Errorf("step %d: %s: %v, want not_locked", m.step, what, err)
		}
	case m.mode == config.UnlockedWait:
		if code != 24 {
			m.t.Errorf("step %d: %s: %v, want LockTimeout after unlockedWaitMS", m.step, what, err)
		}
	default:
		if code != 46 || !containsAny(err.Error(), "is locked by another session") {
			m.t.Errorf("step %d: %s: %v, want LockBusy held_by_other", m.step, what, err)
		}
	}
}

// check compares the documents and the locks with the model.
func (m *legacyModel) check() {
	cur, err := m.direct.Find(m.ctx, bson.D{})
	if err != nil {
		m.t.Fatal(err)
	}
	var docs []counterDoc
	if err := cur.All(m.ctx, &docs); err != nil {
		m.t.Fatal(err)
	}
	got := map[int]int64{}
	for _, d := range docs {
		got[d.ID] = d.N
	}
	if fmt.Sprint(got) != fmt.Sprint(m.n) {
		m.t.Errorf("step %d: documents %v, model %v", m.step, got, m.n)
	}
	ids := bson.A{}
	for i := range legacyModelIDs {
		ids = append(ids, i)
	}
	var st struct {
		Locks []struct {
			ID    int    `bson:"_id"`
			Held  bool   `bson:"held"`
			Owner bson.M `bson:"holder"`
		} `bson:"locks"`
	}
	if err := m.exDB[0].RunCommand(m.exCtx[0], bson.D{{"lockStatus", m.coll}, {"ids", ids}}).Decode(&st); err != nil {
		m.t.Fatal(err)
	}
	for _, l := range st.Locks {
		if l.Held != (m.holder[l.ID] != -1) {
			m.t.Errorf("step %d: _id %d held %v (owner %v), model holder %d", m.step, l.ID, l.Held, l.Owner, m.holder[l.ID])
		}
		if l.Owner["implicit"] == true {
			m.t.Errorf("step %d: an implicit lock on _id %d outlived its write: %v", m.step, l.ID, l.Owner)
		}
	}
}
