package schemes

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
)

// TestSchemeModel is the model-based test of scheme enforcement
// (docs/SCHEMES.md, "Model-based test"). Per scheme type, two clients
// that follow the scheme's own flow (acquire, write data, renew, release,
// sometimes abandoning a lock to expire) and a rogue whose writes are
// drawn from a grammar (model_rogue_test.go) take random turns, from a
// seeded PRNG, through the two lockgates. After every step the model reads
// the documents straight from the upstream and the mirrors through
// lockStatus, and checks:
//
//   - data fields change only by a write of the document's holder at that
//     time (a new document only where nobody holds its lock);
//   - the document's lock fields agree with the mirror: a live lock is
//     mirrored, for its holder, at least as long as the document says; a
//     free or expired one is not mirrored beyond the margin of a write in
//     flight; a lock of a live holder changes only by that holder; a lock
//     set by a write is the writer's and readable (an expiry of the
//     scheme's type);
//   - a scheme-following acquire succeeds exactly when the document is
//     free or expired, and says so truly; a live holder's write, renewal
//     and release land.
//
// Short form (the default, fixed seeds, run in CI):
//
//	go test ./tests/schemes -run TestSchemeModel
//
// Long form: LOCKGATE_MODEL_STEPS (steps per seed and scheme),
// LOCKGATE_MODEL_SEED (comma-separated seeds, or "random"),
// LOCKGATE_MODEL_SEEDS (that many consecutive seeds from the first),
// LOCKGATE_MODEL_KEEPGOING=1 (after a violation, retire the document and
// go on, to count every kind of violation in one run). A hand-shrunk
// sequence replays with LOCKGATE_MODEL_SCRIPT (model_script_test.go).
//
// The four schemes run beside each other (each in its own database) and
// beside the takeovers and the lock-collection tests that wait out leases,
// not beside the workloads (waitPhase). Most of a scheme's time is its
// clock steps waiting for leases to end and its round trips, not CPU.
// With the four beside each other and beside the workloads, a loaded run
// (SQLite on disk then) reported a flag acquire whose mirror was already
// free (docs/TESTING.md, second round).
func TestSchemeModel(t *testing.T) {
	waitPhase.join(t)
	t.Parallel()
	cfg := modelSettings(t)
	for _, scheme := range schemeNames {
		t.Run(scheme, func(t *testing.T) {
			t.Parallel()
			if script := os.Getenv("LOCKGATE_MODEL_SCRIPT"); script != "" {
				newModel(t, scheme, 0, cfg).runScript(script)
				return
			}
			// The seeds beside each other too, each in its own
			// collection: a seed is mostly its clock steps' sleeps.
			for _, seed := range cfg.seeds {
				t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
					t.Parallel()
					newModel(t, scheme, seed, cfg).run(cfg.steps)
				})
			}
		})
	}
}

const (
	// modelSlack is how far from an expiry a state counts as surely live
	// or surely expired; the step's own duration is added to it.
	modelSlack = 250 * time.Millisecond
	// modelMargin is the gateways' policy.leaseMarginMS (main_test.go).
	modelMargin = 200 * time.Millisecond
	// modelLease is the leaseMS of the rules the model runs under
	// (model_<scheme>.*), and the lease the lockDocument followers give
	// themselves. Unlike the other cases' leases it is not scaled with
	// the load: the model judges each step by the times it observed, with
	// the step's own duration in its slack, and a longer lease would only
	// lengthen its waits.
	modelLease  = baseLeaseMS * time.Millisecond
	modelIDs    = 3
	historySize = 20
)

type modelConfig struct {
	steps     int
	seeds     []uint64
	keepGoing bool
}

// Short form: 2 seeds x 120 steps per scheme (docs/SCHEMES.md has the
// time it takes).
var shortSeeds = []uint64{1, 2}

const shortSteps = 120

func modelSettings(t *testing.T) modelConfig {
	cfg := modelConfig{steps: shortSteps, seeds: shortSeeds, keepGoing: os.Getenv("LOCKGATE_MODEL_KEEPGOING") == "1"}
	if s := os.Getenv("LOCKGATE_MODEL_STEPS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("LOCKGATE_MODEL_STEPS=%q: want a positive number", s)
		}
		cfg.steps = n
	}
	if s := os.Getenv("LOCKGATE_MODEL_SEED"); s != "" {
		cfg.seeds = nil
		for _, f := range strings.Split(s, ",") {
			if f == "random" {
				cfg.seeds = append(cfg.seeds, uint64(time.Now().UnixNano()))
				continue
			}
			n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
			if err != nil {
				t.Fatalf("LOCKGATE_MODEL_SEED=%q: want numbers or random", s)
			}
			cfg.seeds = append(cfg.seeds, n)
		}
	}
	if s := os.Getenv("LOCKGATE_MODEL_SEEDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("LOCKGATE_MODEL_SEEDS=%q: want a positive number", s)
		}
		first := cfg.seeds[0]
		cfg.seeds = nil
		for i := 0; i < n; i++ {
			cfg.seeds = append(cfg.seeds, first+uint64(i))
		}
	}
	t.Logf("model: seeds %v, %d steps each, keepGoing=%v", cfg.seeds, cfg.steps, cfg.keepGoing)
	return cfg
}

type violation struct {
	id  int32
	cat string
	msg string
}

type entry struct {
	step   int
	actor  string // F1, F2, R; "" for the harness and the clock
	desc   string
	result string
	state  string
	t0, t1 time.Time
	// read, readDone: when the state after the step was read.
	read, readDone time.Time
	acked          bool // the rogue's write expects an answer
}

type follower struct {
	name, aid string
	coll      *mongo.Collection
	locks     *mongo.Collection
	holds     bool
	id        int32
	val       string
	seq       int
	// more are lockCollection records held besides id, so that a release
	// of all of them by aid, or of one by aid, has several to free.
	more []int32
}

type model struct {
	t        *testing.T
	kind     string
	seed     uint64
	cfg      modelConfig
	db       string
	coll     string
	lockColl string
	ids      []int32
	nextID   int32
	step     int
	direct   *mongo.Client
	observer *mongo.Client
	f        [2]*follower
	rogue    *rogue
	pre      snap
	hist     []entry
	notes    []string
	found    map[string][]string // keep-going: reports per category
	count    map[string]int
	// triggers are, per category, distinct writes that broke it.
	triggers map[string][]string
	// limbo: mirrors kept, as documented, for an acquire whose connection
	// dropped (the outcome unknown to lockgate), until they expire.
	limbo map[int32]time.Time
	// owners maps holder values to the mirror owner first seen for them,
	// and back.
	owners map[string]string
	// stats counts the steps by kind, for the long runs' figures.
	stats map[string]int
	// planted are the holder values of locks written straight into the
	// documents, which lockgate has not seen (yet) and adopts when a write
	// meets them.
	planted map[int32]string
}

// plantable is a follower holding nothing, for a lock written straight
// into a free document (holderFields, lockDocument): a lock that was
// there before lockgate.
func (m *model) plantable(g *gen) *follower {
	f := m.f[g.r.IntN(2)]
	if f.holds {
		return nil
	}
	return f
}

func (m *model) plant(g *gen, f *follower, e *entry) {
	id := g.id()
	a := m.view(m.pre, id)
	if !a.present || !a.free || m.pre.mir[id].held {
		e.desc = fmt.Sprintf("harness: _id %d is not free, nothing planted", id)
		return
	}
	f.seq++
	val := fmt.Sprintf("%s-%d", f.name, f.seq)
	now := time.Now()
	set := bson.D{{"LockId", val}, {"LockTime", now}}
	if m.kind == "lockDocument" {
		set = bson.D{{"Lock", bson.D{{"actor", val}, {"expiresAt", now.Add(modelLease)}, {"error", nil}}}}
	}
	e.desc = fmt.Sprintf("harness: writes a lock of %s on _id %d straight on the database (%v), as if taken before lockgate started", f.name, id, set)
	if _, err := m.direct.Database(m.db).Collection(m.coll).UpdateOne(context.Background(), bson.D{{"_id", id}}, bson.D{{"$set", set}}); err != nil {
		m.t.Fatalf("planting a lock: %v", err)
	}
	f.holds, f.id, f.val = true, id, val
	m.planted[id] = fmt.Sprintf("%q", val)
}

// ownerOf is the holder value whose mirror owner is session, learnt at
// the first sight of val with a mirror; val itself when they agree.
func (m *model) ownerOf(val, session string) string {
	if s, ok := m.owners["v"+val]; ok {
		if s == session {
			return val
		}
		if v, ok := m.owners["s"+session]; ok {
			return v
		}
		return "another value (owner " + s + " expected)"
	}
	if v, ok := m.owners["s"+session]; ok {
		return v
	}
	m.owners["v"+val], m.owners["s"+session] = session, val
	return val
}

func newModel(t *testing.T, kind string, seed uint64, cfg modelConfig) *model {
	m := &model{t: t, kind: kind, seed: seed, cfg: cfg, db: "model_" + kind, nextID: 100,
		coll:  fmt.Sprintf("model%d_%s", seed, strconv.FormatInt(time.Now().UnixNano()%1e12, 36)),
		found: map[string][]string{}, count: map[string]int{}, triggers: map[string][]string{}, limbo: map[int32]time.Time{}, owners: map[string]string{}, planted: map[int32]string{}, stats: map[string]int{}}
	m.lockColl = m.coll + ".lock"
	for i := int32(1); i <= modelIDs; i++ {
		m.ids = append(m.ids, i)
	}
	m.direct = connect(t, directURI, "model-direct")
	m.observer = connect(t, proxyURI, "model-observer")
	for i, uri := range []string{proxyURI, proxy2URI} {
		name := fmt.Sprintf("F%d", i+1)
		db := connect(t, uri, "model-"+name).Database(m.db)
		m.f[i] = &follower{name: name, aid: name, coll: db.Collection(m.coll), locks: db.Collection(m.lockColl)}
	}
	m.rogue = &rogue{}
	for i, uri := range []string{proxyURI, proxy2URI} {
		m.rogue.clients[i] = connect(t, uri, "model-R")
		m.rogue.raw[i] = &rawConn{addr: strings.TrimSuffix(strings.TrimPrefix(uri, "mongodb://"), "/"), app: "model-R"}
	}
	t.Cleanup(func() {
		for _, rc := range m.rogue.raw {
			rc.close()
		}
	})
	return m
}

func (m *model) seedDoc(id int32) {
	d := bson.D{{"_id", id}, {"n", 0}}
	switch m.kind {
	case "holderFields":
		d = append(d, bson.E{"LockId", nil}, bson.E{"LockTime", nil})
	case "lockDocument":
		d = append(d, bson.E{"Lock", nil})
	case "flag":
		d = append(d, bson.E{"locked", false})
	}
	if _, err := m.direct.Database(m.db).Collection(m.coll).InsertOne(context.Background(), d); err != nil {
		m.t.Fatalf("seeding _id %d: %v", id, err)
	}
}

func (m *model) run(steps int) {
	for _, id := range m.ids {
		m.seedDoc(id)
	}
	m.pre = m.snapshot()
	for m.step = 1; m.step <= steps; m.step++ {
		g := &gen{r: rand.New(rand.NewPCG(m.seed, uint64(m.step))), m: m, now: time.Now()}
		e := entry{step: m.step}
		var after func(snap) []violation
		switch k := g.r.IntN(100); {
		case k < 3:
			m.tick(&e)
			m.stats["clock waits"]++
		case k < 6 && m.absent() != 0:
			id := m.absent()
			e.desc = fmt.Sprintf("harness: re-creates the deleted _id %d, unlocked, straight on the database", id)
			m.seedDoc(id)
			m.stats["harness re-creates a document"]++
		case k < 8 && (m.kind == "holderFields" || m.kind == "lockDocument"):
			if f := m.plantable(g); f != nil {
				m.plant(g, f, &e)
				m.stats["harness plants a lock"]++
			} else {
				e.desc = "harness: both followers hold a lock, nothing planted"
			}
		case k < 36:
			after = m.followerStep(m.f[0], g, &e)
		case k < 66:
			after = m.followerStep(m.f[1], g, &e)
		default:
			op := g.rogueOp()
			e.actor, e.desc = "R", op.String()
			// Closing the connection answers a refused fire-and-forget
			// or legacy write; for any other it is a dropped connection.
			e.acked = op.transport != "unack" && op.transport != "legacy"
			e.t0 = time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			e.result = m.rogue.run(ctx, m.db, op)
			m.stats["rogue "+op.cmd+" via "+op.transport]++
			if rogueLanded(e.result) {
				m.stats["rogue writes answered without an error"]++
			}
			cancel()
			e.t1 = time.Now()
		}
		post := m.snapshot()
		var vs []violation
		if after != nil {
			vs = after(post)
		}
		vs = append(vs, m.check(&e, m.pre, post)...)
		e.state = m.describe(post)
		e.read, e.readDone = post.at, post.done
		m.hist = append(m.hist, e)
		if len(m.hist) > historySize {
			m.hist = m.hist[1:]
		}
		m.reconcile(post)
		if len(vs) > 0 {
			if !m.report(vs) {
				return
			}
			post = m.retire(vs)
		}
		m.pre = post
	}
	m.summary()
}

// absent is a tracked _id whose document is gone, 0 if none.
func (m *model) absent() int32 {
	for _, id := range m.ids {
		if m.pre.docs[id] == nil && !m.pre.mir[id].held {
			return id
		}
	}
	return 0
}

// tick lets time pass up to the nearest expiry of a document's lock or a
// mirror (within a few leases), on the real clock: abandoned locks must
// expire for takeovers to happen within a short run.
func (m *model) tick(e *entry) {
	now := time.Now()
	var next time.Time
	consider := func(t time.Time) {
		if t.After(now) && t.Before(now.Add(3*modelLease)) && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	for _, id := range m.ids {
		v := m.view(m.pre, id)
		consider(v.exp)
		if mr := m.pre.mir[id]; mr.held {
			consider(mr.expires)
		}
	}
	if next.IsZero() {
		e.desc = "clock: nothing expires soon"
		return
	}
	until := next.Add(modelSlack)
	e.desc = fmt.Sprintf("clock: waits %dms for an expiry", until.Sub(now).Milliseconds())
	// The model's clock step: time passing is what this step is (a lease
	// running out on the real clock the databases and lockgate read), so
	// it waits on real time, never for an event, bounded by a few leases.
	time.Sleep(min(time.Until(until), 4*modelLease))
}

// slack is modelSlack plus the time since the state was read.
func (m *model) slack(since time.Time) time.Duration {
	return modelSlack + time.Since(since)
}

// tol is how long a mirror may outlive a document's lock: the short
// mirror of a write in flight (the policy's margin), and for lockDocument
// the one second lockgate gives at least to a mirror.
func (m *model) tol(slack time.Duration) time.Duration {
	if m.kind == "lockDocument" {
		return modelMargin + time.Second + slack
	}
	return modelMargin + slack
}

// aidBound tells whether lockCollection holder id aid is surely still
// bound to its client at t: the client holds, by state s, a record (its
// mirror) that lives past t. A binding outlasts the client's records by
// up to a lease, and then another client may use the aid (docs/SCHEMES.md,
// lockCollection's limits): a write with it after that is no violation.
func (m *model) aidBound(s snap, aid string, t time.Time) bool {
	if aid != "F1" && aid != "F2" && aid != "R" {
		return false
	}
	for _, id := range m.ids {
		if mr := s.mir[id]; mr.held && mr.actor == aid && mr.expires.After(t) {
			return true
		}
	}
	return false
}

// reconcile drops a follower's belief that it holds a lock the state shows
// taken by another, or freed.
func (m *model) reconcile(post snap) {
	for _, f := range m.f {
		if !f.holds {
			continue
		}
		v, mr := m.view(post, f.id), post.mir[f.id]
		switch m.kind {
		case "holderFields", "lockDocument":
			if v.holder != f.name || !strings.Contains(v.val, `"`+f.val+`"`) {
				f.holds = false
			}
		case "flag":
			if b, ok := v.flag.BooleanOK(); !ok || !b || (mr.held && mr.actor != f.name) {
				f.holds = false
			}
		case "lockCollection":
			var more []int32
			for _, id := range f.more {
				if v, mr := m.view(post, id), post.mir[id]; v.present && !(mr.held && mr.actor != f.name) {
					more = append(more, id)
				}
			}
			f.more = more
			if !v.present || (mr.held && mr.actor != f.name) {
				f.holds = false
				if len(f.more) > 0 {
					f.holds, f.id, f.more = true, f.more[0], f.more[1:]
				}
			}
		}
	}
}

// report records violations; it returns whether the run goes on.
func (m *model) report(vs []violation) bool {
	var b strings.Builder
	fmt.Fprintf(&b, "scheme %s, seed %d, step %d:\n", m.kind, m.seed, m.step)
	for _, v := range vs {
		fmt.Fprintf(&b, "  VIOLATION [%s] _id %d: %s\n", v.cat, v.id, v.msg)
	}
	fmt.Fprintf(&b, "replay: LOCKGATE_MODEL_SEED=%d LOCKGATE_MODEL_STEPS=%d go test ./tests/schemes -run 'TestSchemeModel/%s$' -count=1\n", m.seed, m.step, m.kind)
	fmt.Fprintf(&b, "(the PRNG is seeded per step: the same choices are drawn at each step; outcomes that depend on time may differ)\n")
	fmt.Fprintf(&b, "history, last %d steps (state after each step, read straight from the upstream; mirrors from lockStatus):\n", len(m.hist))
	for _, e := range m.hist {
		who := e.actor
		if who == "" {
			who = "--"
		}
		fmt.Fprintf(&b, "  #%d %s %s\n", e.step, who, e.desc)
		if e.result != "" {
			fmt.Fprintf(&b, "      -> %s\n", e.result)
		}
		fmt.Fprintf(&b, "      after: %s\n", e.state)
		fmt.Fprintf(&b, "      times: %s\n", e.times())
	}
	for _, v := range vs {
		fmt.Fprintf(&b, "  lock store history of _id %d:\n%s", v.id, m.storeHistory(v.id))
	}
	notes := m.notes
	if len(notes) > 5 {
		notes = notes[len(notes)-5:]
	}
	for _, n := range notes {
		fmt.Fprintf(&b, "  note: %s\n", n)
	}
	if !m.cfg.keepGoing {
		m.t.Error(b.String())
		return false
	}
	last := m.hist[len(m.hist)-1]
	for _, v := range vs {
		m.count[v.cat]++
		if len(m.found[v.cat]) < 1 {
			m.found[v.cat] = append(m.found[v.cat], b.String())
		}
		if len(m.triggers[v.cat]) < 12 {
			m.triggers[v.cat] = append(m.triggers[v.cat], fmt.Sprintf("step %d %s %s -> %s", last.step, last.actor, last.desc, last.result))
		}
	}
	return true
}

// retire replaces the documents of violations with fresh ones, so that one
// violation's aftermath is not counted again.
func (m *model) retire(vs []violation) snap {
	for _, v := range vs {
		for i, id := range m.ids {
			if id != v.id {
				continue
			}
			m.ids[i] = m.nextID
			m.seedDoc(m.nextID)
			m.nextID++
			for _, f := range m.f {
				if f.holds && (f.id == id || slices.Contains(f.more, id)) {
					f.holds, f.more = false, nil
				}
			}
		}
	}
	return m.snapshot()
}

// rogueLanded reports whether the answer to a rogue's write carries no
// error (which is not to say it changed anything).
func rogueLanded(result string) bool {
	return !strings.Contains(result, "error") && !strings.Contains(result, "code=") &&
		!strings.Contains(result, "writeErrors") && !strings.Contains(result, "closed=true")
}

func (m *model) summary() {
	var keys []string
	for k := range m.stats {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var st strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&st, "\n  %6d  %s", m.stats[k], k)
	}
	m.t.Logf("scheme %s, seed %d: steps by kind:%s", m.kind, m.seed, st.String())
	if len(m.count) == 0 {
		m.t.Logf("scheme %s, seed %d: %d steps, no violation", m.kind, m.seed, m.step-1)
		return
	}
	var cats []string
	for c := range m.count {
		cats = append(cats, c)
	}
	sort.Strings(cats)
	var b strings.Builder
	fmt.Fprintf(&b, "scheme %s, seed %d: %d steps, violations by kind:\n", m.kind, m.seed, m.step-1)
	for _, c := range cats {
		fmt.Fprintf(&b, "  %4d  %s\n", m.count[c], c)
	}
	for _, c := range cats {
		fmt.Fprintf(&b, "\nsteps that broke [%s]:\n", c)
		for _, t := range m.triggers[c] {
			fmt.Fprintf(&b, "  %s\n", t)
		}
	}
	for _, c := range cats {
		fmt.Fprintf(&b, "\nfirst [%s]:\n%s", c, m.found[c][0])
	}
	m.t.Error(b.String())
}

func (m *model) holderPath() string {
	if m.kind == "lockDocument" {
		return "Lock.actor"
	}
	return "LockId"
}

func modified(r *mongo.UpdateResult, err error) (int64, string) {
	if err != nil {
		return -1, "error: " + errSummary(err)
	}
	return r.ModifiedCount, fmt.Sprintf("matched=%d modified=%d upserted=%v", r.MatchedCount, r.ModifiedCount, r.UpsertedID)
}

// followerStep runs one step of a follower's flow; the function it returns
// checks the outcome against the state read after the step.
func (m *model) followerStep(f *follower, g *gen, e *entry) func(snap) []violation {
	pre := m.pre
	if !f.holds {
		id := g.id()
		a, mp := m.view(pre, id), pre.mir[id]
		expired := a.present && a.bad == "" && !a.exp.IsZero() && a.exp.Before(time.Now().Add(-m.slack(pre.at)))
		switch {
		case m.kind == "flag" && a.present && a.clean && !a.free && !mp.held:
			return m.followerAct(f, "recover", id, e)
		case m.kind == "lockCollection" && expired && !mp.held && g.pct(50):
			return m.followerAct(f, "recover", id, e)
		case m.kind == "lockCollection" && g.pct(30):
			return m.followerAct(f, "acquire-upsert", id, e)
		}
		return m.followerAct(f, "acquire", id, e)
	}
	switch k := g.r.IntN(100); {
	case k < 48:
		return m.followerAct(f, "write", f.id, e)
	case k < 62:
		switch {
		case m.kind == "holderFields" && g.pct(30):
			return m.followerAct(f, "renew-variant", f.id, e)
		case m.kind == "lockDocument" && g.pct(15):
			return m.followerAct(f, "renew-variant", f.id, e)
		}
		return m.followerAct(f, "renew", f.id, e)
	case k < 65:
		return m.followerAct(f, "delete", f.id, e)
	case k >= 84 && k < 92 && m.kind == "lockCollection" && len(f.more) == 0:
		if id := g.id(); id != f.id {
			return m.followerAct(f, "acquire-more", id, e)
		}
		return m.followerAct(f, "write", f.id, e)
	case k < 92:
		switch {
		case m.kind == "lockCollection" && len(f.more) > 0 && g.pct(40):
			return m.followerAct(f, pick(g, "release-variant", "release-one-by-aid"), f.id, e)
		case (m.kind == "lockDocument" || m.kind == "lockCollection") && g.pct(30):
			return m.followerAct(f, "release-variant", f.id, e)
		}
		return m.followerAct(f, "release", f.id, e)
	}
	return m.followerAct(f, "abandon", f.id, e)
}

// followerAct runs one action of a follower's flow: acquire,
// acquire-upsert (lockCollection), recover (clear an abandoned flag,
// delete an abandoned record), and on the lock it holds write, renew,
// renew-variant (holderFields: with $currentDate; lockDocument: past
// maxLeaseMS), delete (the document), release, release-variant
// (lockDocument: leaving an error; lockCollection: all its records by
// aid), release-one-by-aid, abandon. The function it
// returns checks the outcome against the state read after the step.
func (m *model) followerAct(f *follower, act string, id int32, e *entry) func(snap) []violation {
	e.actor = f.name
	m.stats["follower "+act]++
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pre := m.pre
	switch act {
	case "acquire", "acquire-upsert":
		if f.holds {
			e.desc = act + ": already holds a lock"
			return nil
		}
		return m.acquire(f, act == "acquire-upsert", false, id, e)
	case "acquire-more":
		if m.kind != "lockCollection" || !f.holds || f.id == id {
			e.desc = act + ": only a lockCollection holder takes a second record"
			return nil
		}
		defer func() { e.desc += " (a second record)" }()
		return m.acquire(f, false, true, id, e)
	case "recover":
		switch m.kind {
		case "flag":
			// The scheme's manual recovery of a flag whose holder is gone.
			e.desc = fmt.Sprintf("clears the abandoned flag of _id %d: updateOne({_id}, {$set: {locked: false}})", id)
			e.t0 = time.Now()
			n, res := modified(f.coll.UpdateOne(ctx, bson.D{{"_id", id}}, bson.D{{"$set", bson.D{{"locked", false}}}}))
			e.t1, e.result = time.Now(), res
			return func(post snap) []violation {
				if n != 1 {
					return []violation{{id, "recovery refused", fmt.Sprintf("clearing the flag of _id %d, which no mirror held, answered %s", id, res)}}
				}
				return nil
			}
		case "lockCollection":
			// What the TTL index does to a record nobody refreshed.
			e.desc = fmt.Sprintf("deletes the abandoned lock record %d as the TTL monitor would: deleteOne({_id})", id)
			e.t0 = time.Now()
			r, err := f.locks.DeleteOne(ctx, bson.D{{"_id", id}})
			e.t1 = time.Now()
			if err != nil {
				e.result = "error: " + errSummary(err)
			} else {
				e.result = fmt.Sprintf("deleted=%d", r.DeletedCount)
			}
			return func(post snap) []violation {
				if err != nil || r.DeletedCount != 1 {
					return []violation{{id, "recovery refused", fmt.Sprintf("deleting the expired record %d, which no mirror held, answered %s", id, e.result)}}
				}
				return nil
			}
		}
		e.desc = "recover: no recovery under " + m.kind
		return nil
	}
	if !f.holds || f.id != id {
		e.desc = fmt.Sprintf("%s: holds no lock on _id %d", act, id)
		return nil
	}
	val := f.val
	a, mp := m.view(pre, id), pre.mir[id]
	// live: the follower's lock lasts past the write with the margin to
	// spare, so lockgate must let its holder's writes through.
	// The follower's lock ends at until (zero: it does not hold it by
	// the state read before); live tells, once the step is over, that
	// it lasted past the write with the margin to spare, so lockgate had
	// to let its holder's write through.
	var until time.Time
	switch m.kind {
	case "holderFields", "lockDocument":
		if a.holder == f.name && strings.Contains(a.val, `"`+val+`"`) && a.bad == "" {
			until = a.exp
		}
	case "flag":
		if b, _ := a.flag.BooleanOK(); b && mp.held && mp.actor == f.name {
			until = mp.expires
		}
	default:
		if a.present && mp.held && mp.actor == f.name {
			until = mp.expires
		}
	}
	liveAt := func(t1 time.Time) bool { return until.After(t1.Add(modelMargin + modelSlack)) }
	mine := bson.D{{"_id", id}}
	if m.kind == "holderFields" || m.kind == "lockDocument" {
		mine = append(mine, bson.E{m.holderPath(), val})
	}
	switch act {
	case "write":
		f.seq++
		n := 1000*int(f.name[1]-'0') + f.seq
		e.desc = fmt.Sprintf("writes data of _id %d: updateOne(%v, {$set: {n: %d}})", id, mine, n)
		e.t0 = time.Now()
		got, res := modified(f.coll.UpdateOne(ctx, mine, bson.D{{"$set", bson.D{{"n", n}}}}))
		e.t1, e.result = time.Now(), res
		if got != 1 {
			f.holds, f.more = false, nil
		}
		return func(post snap) []violation {
			if liveAt(e.t1) && pre.docs[id] != nil && got != 1 {
				return []violation{{id, "holder write refused", fmt.Sprintf("%s holds a live lock on _id %d, its write answered %s", f.name, id, res)}}
			}
			return nil
		}
	case "renew", "renew-variant":
		if m.kind != "holderFields" && m.kind != "lockDocument" {
			act = "renew"
		}
		now := time.Now()
		var got int64
		var res string
		e.t0 = now
		// must: lockgate has to let a live holder's renewal through; a
		// renewal past maxLeaseMS may be refused instead (issue 22,
		// design 9), but never land with a shorter mirror.
		must := true
		switch {
		case m.kind == "holderFields" && act == "renew-variant":
			e.desc = fmt.Sprintf("renews _id %d: updateOne(%v, {$currentDate: {LockTime: true}})", id, mine)
			got, res = modified(f.coll.UpdateOne(ctx, mine, bson.D{{"$currentDate", bson.D{{"LockTime", true}}}}))
		case m.kind == "lockDocument" && act == "renew-variant":
			must = false
			e.desc = fmt.Sprintf("renews _id %d past maxLeaseMS: updateOne(%v, {$set: {Lock.expiresAt: now+11min}})", id, mine)
			got, res = modified(f.coll.UpdateOne(ctx, mine, bson.D{{"$set", bson.D{{"Lock.expiresAt", now.Add(11 * time.Minute)}}}}))
		}
		switch {
		case act == "renew-variant":
		case m.kind == "holderFields":
			e.desc = fmt.Sprintf("renews _id %d: updateOne(%v, {$set: {LockTime: now}})", id, mine)
			got, res = modified(f.coll.UpdateOne(ctx, mine, bson.D{{"$set", bson.D{{"LockTime", now}}}}))
		case m.kind == "lockDocument":
			e.desc = fmt.Sprintf("renews _id %d: updateOne(%v, {$set: {Lock.expiresAt: now+lease}})", id, mine)
			got, res = modified(f.coll.UpdateOne(ctx, mine, bson.D{{"$set", bson.D{{"Lock.expiresAt", now.Add(modelLease)}}}}))
		case m.kind == "flag":
			f.seq++
			e.desc = fmt.Sprintf("keeps _id %d alive by writing: updateOne({_id}, {$set: {n}})", id)
			got, res = modified(f.coll.UpdateOne(ctx, mine, bson.D{{"$set", bson.D{{"n", 1000*int(f.name[1]-'0') + f.seq}}}}))
		default:
			e.desc = fmt.Sprintf("refreshes record %d: updateOne({_id}, {$set: {ts: now}})", id)
			got, res = modified(f.locks.UpdateOne(ctx, mine, bson.D{{"$set", bson.D{{"ts", now}}}}))
		}
		e.t1, e.result = time.Now(), res
		if got != 1 && must {
			f.holds, f.more = false, nil
		}
		return func(post snap) []violation {
			if must && liveAt(e.t1) && pre.docs[id] != nil && got != 1 {
				return []violation{{id, "holder write refused", fmt.Sprintf("%s holds a live lock on _id %d, its renewal answered %s", f.name, id, res)}}
			}
			return nil
		}
	case "delete":
		e.desc = fmt.Sprintf("deletes the document _id %d it holds: deleteOne(%v)", id, mine)
		e.t0 = time.Now()
		r, err := f.coll.DeleteOne(ctx, mine)
		e.t1 = time.Now()
		var n int64 = -1
		if err != nil {
			e.result = "error: " + errSummary(err)
		} else {
			n, e.result = r.DeletedCount, fmt.Sprintf("deleted=%d", r.DeletedCount)
		}
		if m.kind != "lockCollection" {
			// The document and its lock are gone; a lock record stays.
			f.holds, f.more = false, nil
		}
		return func(post snap) []violation {
			if liveAt(e.t1) && pre.docs[id] != nil && n != 1 {
				return []violation{{id, "holder write refused", fmt.Sprintf("%s holds a live lock on _id %d, its delete answered %s", f.name, id, e.result)}}
			}
			return nil
		}
	case "release", "release-variant", "release-one-by-aid":
		e.t0 = time.Now()
		var res string
		var ok bool
		switch m.kind {
		case "holderFields":
			e.desc = fmt.Sprintf("releases _id %d: updateOne(%v, {$set: {LockId: null, LockTime: null}})", id, mine)
			n, r := modified(f.coll.UpdateOne(ctx, mine, bson.D{{"$set", bson.D{{"LockId", nil}, {"LockTime", nil}}}}))
			ok, res = n == 1, r
		case "lockDocument":
			set := bson.D{{"Lock", nil}}
			if act == "release-variant" {
				set = bson.D{{"Lock.actor", nil}, {"Lock.error", "failed"}}
			}
			e.desc = fmt.Sprintf("releases _id %d: updateOne(%v, {$set: %v})", id, mine, set)
			n, r := modified(f.coll.UpdateOne(ctx, mine, bson.D{{"$set", set}}))
			ok, res = n == 1, r
		case "flag":
			e.desc = fmt.Sprintf("releases _id %d: updateOne({_id}, {$set: {locked: false}})", id)
			n, r := modified(f.coll.UpdateOne(ctx, mine, bson.D{{"$set", bson.D{{"locked", false}}}}))
			ok, res = n == 1, r
		default:
			var r *mongo.DeleteResult
			var err error
			switch act {
			case "release-variant":
				e.desc = fmt.Sprintf("releases all its records (holding %d and %v): deleteMany({aid: %q})", id, f.more, f.aid)
				r, err = f.locks.DeleteMany(ctx, bson.D{{"aid", f.aid}})
			case "release-one-by-aid":
				e.desc = fmt.Sprintf("releases one of its records (holding %d and %v): deleteOne({aid: %q})", id, f.more, f.aid)
				r, err = f.locks.DeleteOne(ctx, bson.D{{"aid", f.aid}})
			default:
				e.desc = fmt.Sprintf("releases record %d: deleteOne({_id})", id)
				r, err = f.locks.DeleteOne(ctx, mine)
			}
			if err != nil {
				res = "error: " + errSummary(err)
			} else {
				ok, res = r.DeletedCount >= 1, fmt.Sprintf("deleted=%d", r.DeletedCount)
			}
		}
		e.t1, e.result = time.Now(), res
		switch act {
		case "release-one-by-aid":
			// Which record went is for reconcile to see.
			return nil
		case "release-variant":
			f.holds, f.more = false, nil
		default:
			f.holds = false
			if len(f.more) > 0 {
				f.holds, f.id, f.more = true, f.more[0], f.more[1:]
			}
		}
		return func(post snap) []violation {
			if !liveAt(e.t1) {
				return nil
			}
			b, mq := m.view(post, id), post.mir[id]
			freed := b.holder == "" && !mq.held
			if m.kind == "lockCollection" {
				freed = !b.present && !mq.held
			}
			if !ok || !freed {
				return []violation{{id, "holder release failed", fmt.Sprintf("%s released its live lock on _id %d: %s; after it the lock is %s (mirror %s)", f.name, id, res, b.val, mirrorString(mq, post.done))}}
			}
			return nil
		}
	default:
		e.desc = fmt.Sprintf("abandons its lock on _id %d and %v (never releases them)", id, f.more)
		f.holds, f.more = false, nil
		return nil
	}
}

// acquire runs the scheme's acquire and checks that it succeeds exactly
// when the document is free or expired.
func (m *model) acquire(f *follower, upsert, more bool, id int32, e *entry) func(snap) []violation {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pre := m.pre
	a, mp := m.view(pre, id), pre.mir[id]
	f.seq++
	val := fmt.Sprintf("%s-%d", f.name, f.seq)
	var got bool
	var unexpected error
	now := time.Now()
	e.t0 = now
	switch m.kind {
	case "holderFields":
		e.desc = fmt.Sprintf("acquires _id %d as %s: findOneAndUpdate({_id, $or: [{LockId: null}, {LockTime: {$lt: now-lease}}]}, {$set: {LockId, LockTime: now}}, upsert, after)", id, val)
		raw, err := f.coll.FindOneAndUpdate(ctx, bson.D{{"_id", id}, {"$or", bson.A{bson.D{{"LockId", nil}}, bson.D{{"LockTime", bson.D{{"$lt", now.Add(-modelLease)}}}}}}},
			bson.D{{"$set", bson.D{{"LockId", val}, {"LockTime", now}}}}, options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)).Raw()
		switch {
		case err == nil:
			s, _ := raw.Lookup("LockId").StringValueOK()
			got = s == val
			e.result = "returned " + raw.String()
		case code(err) == 11000:
			e.result = "DuplicateKey: busy"
		default:
			unexpected, e.result = err, "error: "+errSummary(err)
		}
	case "lockDocument":
		e.desc = fmt.Sprintf("acquires _id %d as %s: updateOne({_id, $or: [{Lock.actor: null}, {Lock.expiresAt: {$lt: now}}]}, {$set: {Lock: {actor, expiresAt: now+lease, error: null}}})", id, val)
		r, err := f.coll.UpdateOne(ctx, bson.D{{"_id", id}, {"$or", bson.A{bson.D{{"Lock.actor", nil}}, bson.D{{"Lock.expiresAt", bson.D{{"$lt", now}}}}}}},
			bson.D{{"$set", bson.D{{"Lock", bson.D{{"actor", val}, {"expiresAt", now.Add(modelLease)}, {"error", nil}}}}}})
		n, res := modified(r, err)
		got, e.result = n == 1, res
		if err != nil {
			unexpected = err
		}
	case "flag":
		e.desc = fmt.Sprintf("acquires _id %d: updateOne({_id, locked: false}, {$set: {locked: true}})", id)
		r, err := f.coll.UpdateOne(ctx, bson.D{{"_id", id}, {"locked", false}}, bson.D{{"$set", bson.D{{"locked", true}}}})
		n, res := modified(r, err)
		got, e.result = n == 1, res
		if err != nil {
			unexpected = err
		}
	case "lockCollection":
		if upsert {
			e.desc = fmt.Sprintf("acquires record %d: updateOne({_id}, {$setOnInsert: {ts: now, aid: %q}}, upsert)", id, f.aid)
			r, err := f.locks.UpdateOne(ctx, bson.D{{"_id", id}}, bson.D{{"$setOnInsert", bson.D{{"ts", now}, {"aid", f.aid}}}}, options.Update().SetUpsert(true))
			_, res := modified(r, err)
			e.result = res
			switch {
			case err == nil:
				got = r.UpsertedID != nil
			case code(err) == 11000:
			default:
				unexpected = err
			}
		} else {
			e.desc = fmt.Sprintf("acquires record %d: insertOne({_id, ts: now, aid: %q})", id, f.aid)
			_, err := f.locks.InsertOne(ctx, bson.D{{"_id", id}, {"ts", now}, {"aid", f.aid}})
			switch {
			case err == nil:
				got, e.result = true, "inserted"
			case code(err) == 11000:
				e.result = "DuplicateKey: busy"
			default:
				unexpected, e.result = err, "error: "+errSummary(err)
			}
		}
	}
	t1 := time.Now()
	e.t1 = t1
	slack := m.slack(pre.at)
	// want: the scheme's own filter, on the state before, takes the lock;
	// sure: the state was not within the slack of an expiry.
	var want, sure bool
	switch m.kind {
	case "holderFields", "lockDocument":
		switch {
		case !a.clean:
		case a.free && (a.present || m.kind == "holderFields"):
			want, sure = true, true
		case !a.present || a.free:
			sure = true
		default:
			expired, lv := a.exp.Before(now.Add(-slack)), a.exp.After(t1.Add(slack))
			want, sure = expired, expired || lv
		}
	case "flag":
		want, sure = a.present && a.free, !a.present || a.clean
	case "lockCollection":
		switch {
		case !a.present:
			want, sure = true, true
		case a.bad == "":
			expired, lv := a.exp.Before(now.Add(-slack)), a.exp.After(t1.Add(slack))
			want, sure = expired, expired || lv
		}
	}
	switch {
	case got && more:
		f.more = append(f.more, id)
	case got:
		f.holds, f.id, f.val = true, id, val
	}
	return func(post snap) []violation {
		var vs []violation
		b, mq := m.view(post, id), post.mir[id]
		if unexpected != nil {
			vs = append(vs, violation{id, "follower error", fmt.Sprintf("%s's acquire of _id %d got %v, where the database answers with the scheme's own signal", f.name, id, errSummary(unexpected))})
		}
		switch {
		case sure && want && !got && !(mp.held && mp.expires.Before(t1.Add(m.tol(slack)))) && !m.limbo[id].After(now):
			vs = append(vs, violation{id, "acquire refused on a free or expired lock", fmt.Sprintf("%s's acquire of _id %d failed (%s); before it the lock was %s (expiry %s), mirror %s",
				f.name, id, e.result, a.val, fmtTime(a.exp, pre.done), mirrorString(mp, pre.done))})
		case sure && !want && got:
			vs = append(vs, violation{id, "acquire took a live lock", fmt.Sprintf("%s's acquire of _id %d succeeded (%s); before it the lock was %s (expiry %s), mirror %s",
				f.name, id, e.result, a.val, fmtTime(a.exp, pre.done), mirrorString(mp, pre.done))})
		}
		// flag and lockCollection: the lock is the mirror, taken for the
		// lease from when the acquire reached lockgate, so from e.t0 at
		// the earliest. A step that, with the state read after it, took
		// nearly that long (a loaded machine: 1.5 s acquires were seen
		// with 12 models beside each other) may find it run out by its
		// own lease, as the lock store's history then shows; the acquire
		// is judged by the document alone.
		mirrorOK := mq.held && mq.actor == f.name
		if !post.done.Before(e.t0.Add(modelLease-modelSlack)) && !mq.held {
			mirrorOK = true
		}
		var shows bool
		switch m.kind {
		case "holderFields", "lockDocument":
			shows = b.holder == f.name && strings.Contains(b.val, `"`+val+`"`)
		case "flag":
			fl, _ := b.flag.BooleanOK()
			shows = fl && mirrorOK
		default:
			shows = b.present && mirrorOK
		}
		changed := m.lockFields(pre, id) != m.lockFields(post, id)
		switch {
		case got && !shows:
			vs = append(vs, violation{id, "acquire result untrue", fmt.Sprintf("%s's acquire of _id %d reported success (%s), but after it the lock is %s, mirror %s", f.name, id, e.result, b.val, mirrorString(mq, post.done))})
		case !got && shows && changed:
			vs = append(vs, violation{id, "acquire result untrue", fmt.Sprintf("%s's acquire of _id %d reported busy (%s), but it took the lock: %s", f.name, id, e.result, b.val)})
		}
		return vs
	}
}

func mirrorString(ms mirrorState, ref time.Time) string {
	if !ms.held {
		return "free"
	}
	return fmt.Sprintf("held by %s for %dms", ms.actor, ms.expires.Sub(ref).Milliseconds())
}

func fmtTime(t, ref time.Time) string {
	if t.IsZero() {
		return "none"
	}
	return fmt.Sprintf("%+dms", t.Sub(ref).Milliseconds())
}

// check applies the invariants that hold after any step, whoever made it.
func (m *model) check(e *entry, pre, post snap) []violation {
	var vs []violation
	slack := modelSlack + post.done.Sub(pre.at)
	tol := m.tol(slack)
	for _, id := range m.ids {
		a, b := m.view(pre, id), m.view(post, id)
		mp, mq := pre.mir[id], post.mir[id]
		add := func(cat, format string, args ...any) {
			vs = append(vs, violation{id, cat, fmt.Sprintf(format, args...)})
		}
		lockChanged := m.lockFields(pre, id) != m.lockFields(post, id)
		actor := e.actor
		if actor == "R" && e.acked && (strings.Contains(e.result, "closed") || strings.Contains(e.result, "EOF")) &&
			mq.held && mq.actor == "R" && !(mp.held && mp.actor == "R") && !lockChanged {
			m.limbo[id] = mq.expires
			m.notes = append(m.notes, fmt.Sprintf("step %d: the connection dropped during the rogue's write and lockgate kept a mirror on _id %d without a lock in the document (documented: the outcome is unknown); its checks wait for it to expire", m.step, id))
		}
		inLimbo := !m.limbo[id].IsZero() && mq.held && !mq.expires.After(m.limbo[id].Add(time.Millisecond))

		// Data: only the holder at the time writes it.
		if actor != "" && m.dataOf(pre.docs[id]) != m.dataOf(post.docs[id]) {
			var holder string
			switch m.kind {
			case "holderFields", "lockDocument":
				holder = a.holder
			default:
				if mp.held && mp.expires.After(pre.done) {
					holder = mp.actor
				}
			}
			// A new document is anyone's to create, unless another
			// holder's lock on its _id outlived the whole step.
			created := pre.docs[id] == nil
			ok := holder == actor || (created && !(mp.held && mp.actor != actor && mp.expires.After(post.done)))
			if !ok {
				if holder == "" {
					holder = "nobody"
				}
				add("data written by a non-holder", "%s changed the data of _id %d from %s to %s; the holder was %s (lock %s, mirror %s)",
					actor, id, m.dataOf(pre.docs[id]), m.dataOf(post.docs[id]), holder, a.val, mirrorString(mp, pre.done))
			}
		}

		// Transitions: a live lock changes only by its holder; a lock
		// set by a write is the writer's.
		if actor != "" && lockChanged {
			switch m.kind {
			case "holderFields", "lockDocument":
				preLive := a.holder != "" && a.bad == "" && a.exp.After(post.done.Add(slack))
				switch {
				case preLive && actor != a.holder:
					add("live lock changed by a non-holder", "%s changed the lock of _id %d, live for %s until %s, from %s to %s",
						actor, id, a.holder, fmtTime(a.exp, post.done), a.val, b.val)
				case b.holder != "" && b.holder != actor && b.bad == "" && b.exp.After(post.done.Add(slack)) && !(a.holder == b.holder && !a.exp.Before(b.exp)):
					add("lock given to another holder", "%s's write made the lock of _id %d live for %s (%s until %s), from %s",
						actor, id, b.holder, b.val, fmtTime(b.exp, post.done), a.val)
				case b.holder == actor && a.hval != b.hval && b.bad == "" && b.exp.After(post.done.Add(slack)) && !(mq.held && mq.actor == actor):
					add("lock set without a mirror", "%s's write locked _id %d (%s until %s), but the mirror is %s",
						actor, id, b.val, fmtTime(b.exp, post.done), mirrorString(mq, post.done))
				}
				if b.holder != "" && b.bad != "" {
					add("lock the mirror cannot follow", "%s's write left _id %d locked by %s with %s: the scheme's own acquire can never take it, and lockgate cannot mirror its lease", actor, id, b.val, b.bad)
				}
			case "flag":
				preLive := mp.held && mp.expires.After(post.done.Add(slack))
				fl, isBool := b.flag.BooleanOK()
				switch {
				case preLive && actor != mp.actor:
					add("live lock changed by a non-holder", "%s changed the flag of _id %d, held by %s for %s, from %s to %s",
						actor, id, mp.actor, fmtTime(mp.expires, post.done), a.val, b.val)
				case b.present && isBool && fl && !(mq.held && mq.actor == actor) && post.done.Before(e.t0.Add(modelLease-modelSlack)):
					// (A mirror taken by this step lasts the lease from
					// e.t0 at least: a slower step may outlast it.)
					add("lock set without a mirror", "%s set the flag of _id %d (%s to %s), but the mirror is %s: nobody can take it, or its holder is not who set it",
						actor, id, a.val, b.val, mirrorString(mq, post.done))
				case a.present && b.present && !isBool && !(preLive && actor == mp.actor):
					// (A document someone creates is theirs to shape.)
					add("flag set to a value no acquire takes", "%s set the flag of _id %d to %s (from %s): the scheme's acquire ({locked: false}) never matches it again",
						actor, id, b.val, a.val)
				}
			case "lockCollection":
				preLive := mp.held && mp.expires.After(post.done.Add(slack))
				switch {
				case preLive && actor != mp.actor:
					add("live lock changed by a non-holder", "%s changed record %d, held by %s for %s, from %s to %s",
						actor, id, mp.actor, fmtTime(mp.expires, post.done), m.lockFields(pre, id), m.lockFields(post, id))
				case b.present && b.exp.After(post.done.Add(slack)) && !(mq.held && mq.actor == actor):
					// A record expired by its own time when written is no
					// lock (TestRegressLockCollAcquireExpiredAtOnce).
					add("lock set without a mirror", "%s wrote record %d (%s), but its mirror is %s", actor, id, m.lockFields(post, id), mirrorString(mq, post.done))
				case b.present && b.val != `"`+actor+`"` && m.aidBound(pre, strings.Trim(b.val, `"`), post.done.Add(slack)):
					add("record with another holder's aid", "%s wrote record %d with aid %s: the aid names a holder that did not take it (its release of all its records by aid then deletes it, or fails)", actor, id, b.val)
				}
				if b.present && b.bad != "" {
					add("lock the mirror cannot follow", "%s's write left record %d with %s", actor, id, b.bad)
				}
			}
		}

		// Agreement of the document (or record) with the mirror.
		longMirror := mq.held && mq.expires.After(post.done.Add(tol)) && !inLimbo
		switch m.kind {
		case "holderFields", "lockDocument", "lockCollection":
			locked := b.holder != "" || (m.kind == "lockCollection" && b.present)
			switch {
			case !locked || !b.present:
				if longMirror {
					add("mirror held on a free lock", "_id %d is free (%s) but its mirror is held by %s for %dms: the scheme's acquire gets a false busy",
						id, b.val, mq.actor, mq.expires.Sub(post.done).Milliseconds())
				}
			case b.bad != "":
				// Reported when written.
			case m.planted[id] == b.hval && !mq.held:
				// Not seen by lockgate yet: adopted when a write meets it.
			case b.exp.After(post.done.Add(slack)):
				switch {
				case !mq.held:
					add("live lock not mirrored", "_id %d is locked by %s until %s, but no mirror holds it: an acquire without the scheme's condition steals it",
						id, b.val, fmtTime(b.exp, post.done))
				case m.kind != "lockCollection" && m.ownerOf(b.hval, mq.session) != b.hval:
					add("mirror of another holder", "_id %d is locked by %s (%s), but its mirror's owner %s is the one of %s", id, b.holder, b.hval, mq.session, m.ownerOf(b.hval, mq.session))
				case mq.expires.Before(b.exp.Add(-slack)):
					add("mirror ends before the lock", "_id %d is locked by %s until %s, but its mirror ends at %s: an acquire without the scheme's condition steals it in between",
						id, b.val, fmtTime(b.exp, post.done), fmtTime(mq.expires, post.done))
				}
			case b.exp.Before(post.at.Add(-slack)) && longMirror:
				add("mirror held on a free lock", "_id %d's lock %s expired at %s, but its mirror is held by %s for %dms: the scheme's acquire gets a false busy",
					id, b.val, fmtTime(b.exp, post.done), mq.actor, mq.expires.Sub(post.done).Milliseconds())
			}
		case "flag":
			fl, _ := b.flag.BooleanOK()
			if mq.held && mq.expires.After(post.done.Add(slack)) && !(b.present && fl) && !inLimbo {
				add("mirror held on a free lock", "the flag of _id %d is %s, but its mirror is held by %s for %dms",
					id, b.val, mq.actor, mq.expires.Sub(post.done).Milliseconds())
			}
		}
	}
	return vs
}
