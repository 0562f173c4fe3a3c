package lockstore

import (
	"errors"
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo/options"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/namespace"
)

// The model test drives two Stores on one collection through random
// sequences of lock operations on a few keys, with an injected clock, the
// janitor run by hand and head documents moved back by hand, and checks
// every answer against a model of who holds what. It is what says that
// the readers' search from a head to the newest claim (newest,
// newestClaim, rollForward) stays sound whatever mixture of changes,
// compaction, tombstones and late head writes it meets.
//
//	LOCKGATE_MODEL_SEED=n   replays one run (its seed is logged)
//	LOCKGATE_MODEL_STEPS=n  steps per run (default modelSteps, modelStepsRace
//	                        under the race detector)

// modelSteps keeps the CI run within a few seconds.
const modelSteps = 120

// modelStepsRace is the default under the race detector, which also
// instruments the embedded FerretDB when it runs in the test's process (a
// developer's go test -race; scripts/test.sh runs it apart): 120 steps
// took most of the package's race run (274 s of 472 s on a loaded
// machine). The package runs without
// the detector too (scripts/test.sh), with modelSteps, and that run is the
// one that explores the sequences and that the mutations were tried
// against (docs/TESTING.md). Under the detector the steps give it the
// store's concurrency to watch (two Stores' background loops, the cache
// refresh beside the checks), which every step reaches.
const modelStepsRace = 30

// modelMaxLate is how far (server time) behind its generation a late head
// write may land: its writer's claim insert and head write are two round
// trips of at most OpTimeout each.
const modelMaxLate = 10 * time.Second

// mHold is one hold as the model sees it.
type mHold struct {
	owner int
	token int64
	exp   time.Time
}

// mKey is the model of one lock key.
type mKey struct {
	id  docid.ID
	rid string
	h   *mHold // nil: free (or never held)
	// moved says that a head document was moved back since the last
	// change written through a Store: readers and writers may then fail
	// closed (not held, busy, not the holder), never the other way.
	moved     bool
	lastToken int64 // the highest token granted, across holders
	saved     *gen  // the head before it was moved back (nil: none)
}

type model struct {
	t      *testing.T
	rng    *rand.Rand
	clock  *fakeClock
	cfg    Config
	stores []*Store
	owners []Owner
	keys   []*mKey
	pad    []docid.ID // never locked: make batch reads take the $in path
	ns     string
	step   int
	// lenient counts answers that were wrong for the holder but allowed
	// because a head was moved back (fail closed), by kind.
	lenient map[string]int
}

func modelSeed(t *testing.T) int64 {
	if v := os.Getenv("LOCKGATE_MODEL_SEED"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("LOCKGATE_MODEL_SEED: %v", err)
		}
		return n
	}
	return time.Now().UnixNano()
}

func modelStepCount(t *testing.T) int {
	if v := os.Getenv("LOCKGATE_MODEL_STEPS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("LOCKGATE_MODEL_STEPS: %q", v)
		}
		return n
	}
	if raceEnabled {
		return modelStepsRace
	}
	return modelSteps
}

// TestModelHeadsAndClaims is the randomized model test of the lock
// store's reading of head documents and claims (see the top of this file).
func TestModelHeadsAndClaims(t *testing.T) {
	t.Parallel()
	seed := modelSeed(t)
	t.Logf("seed %d (replay: LOCKGATE_MODEL_SEED=%d)", seed, seed)
	m := newModel(t, seed)
	n := modelStepCount(t)
	for m.step = 1; m.step <= n && !t.Failed(); m.step++ {
		m.randomStep()
		m.check()
	}
	if t.Failed() {
		t.Logf("failed at step %d; replay with LOCKGATE_MODEL_SEED=%d", m.step-1, seed)
	}
	t.Logf("%d steps; fail-closed answers allowed by a moved-back head: %v", n, m.lenient)
}

func newModel(t *testing.T, seed int64) *model {
	cfg := testConfig(t)
	cfg.OpTimeout = 5 * time.Second
	cfg.CleanupAfter = time.Minute
	cfg.CleanupInterval = -1 // the model runs the janitor
	cfg.MaxLease = cfg.CleanupAfter
	cfg.DefaultLease = 5 * time.Second
	cfg.TakeoverGrace = 2 * time.Second
	cfg.CacheTrust = 20 * time.Millisecond // short quiesce waits, cache still used
	cfg.NewcomerHorizon = noMemoryLocks
	cfg.MinPoll, cfg.MaxPoll = time.Millisecond, 5*time.Millisecond
	clock := newFakeClock()
	m := &model{t: t, rng: rand.New(rand.NewSource(seed)), clock: clock, cfg: cfg, ns: "db.c", lenient: map[string]int{}}
	m.stores = []*Store{openStore(t, cfg, WithClock(clock)), openStore(t, cfg, WithClock(clock))}
	m.owners = []Owner{newOwner("a"), newOwner("b"), newOwner("c")}
	for i := range 3 {
		id := rv(t, fmt.Sprintf("k%d", i))
		m.keys = append(m.keys, &mKey{id: id, rid: ks(t, m.ns, []docid.ID{id})})
	}
	for i := range perKeyReads + 2 {
		m.pad = append(m.pad, rv(t, i))
	}
	return m
}

func (m *model) now() time.Time { n, _ := m.clock.Now(); return n }

func (m *model) failf(format string, args ...any) {
	m.t.Helper()
	m.t.Errorf("step %d: "+format, append([]any{m.step}, args...)...)
}

// allow records a reader's answer that fails closed for a holder where a
// head was moved back; without one it is a failure. Writers have no such
// allowance: they search the claims before they refuse (transition).
func (m *model) allow(k *mKey, kind, format string, args ...any) {
	m.t.Helper()
	if k.moved {
		m.lenient[kind]++
		return
	}
	m.failf(kind+": "+format, args...)
}

// liveHolder is the owner whose hold of k has not ended, or -1.
func (m *model) liveHolder(k *mKey) int {
	if k.h != nil && k.h.exp.After(m.now()) {
		return k.h.owner
	}
	return -1
}

func (m *model) randomStep() {
	si := m.rng.Intn(len(m.stores))
	s := m.stores[si]
	o := m.rng.Intn(len(m.owners))
	k := m.keys[m.rng.Intn(len(m.keys))]
	r := m.rng.Intn(100)
	m.t.Logf("step %d: op %d store s%d owner %d key %s now %s; model %+v moved %v", m.step, r, si+1, o, k.rid, m.now().Format("15:04:05.000"), k.h, k.moved)
	switch {
	case r < 25:
		m.acquire(s, o, k, 0)
	case r < 30:
		m.acquire(s, o, k, 20*time.Millisecond)
	case r < 40:
		m.renew(s, o, k)
	case r < 52:
		m.release(s, o, k)
	case r < 55:
		m.releaseAll(s, o)
	case r < 58:
		m.forceRelease(s, k)
	case r < 70:
		m.clock.Advance(time.Duration(m.rng.Int63n(int64(4 * time.Second))))
	case r < 76:
		m.janitor(s)
	case r < 88:
		m.moveHeadBack(k)
	case r < 96:
		m.plantRelic(k)
	default:
		s.refreshCache(bg)
	}
}

func (m *model) lease() time.Duration {
	if m.rng.Intn(4) == 0 {
		return m.cfg.MaxLease
	}
	return time.Duration(1+m.rng.Intn(8)) * time.Second
}

func (m *model) grant(k *mKey, o int, l Lock, reentrant bool) {
	if reentrant {
		if l.Token != k.h.token {
			m.failf("re-entrant acquire of %s by %d changed the token %d -> %d", k.rid, o, k.h.token, l.Token)
		}
	} else if l.Token <= k.lastToken {
		m.failf("%s granted to %d with token %d, not above %d granted before", k.rid, o, l.Token, k.lastToken)
	}
	k.lastToken = max(k.lastToken, l.Token)
	k.h = &mHold{owner: o, token: l.Token, exp: l.ExpiresAt}
	k.moved = false
}

func (m *model) acquire(s *Store, o int, k *mKey, wait time.Duration) {
	now := m.now()
	// Who may keep others out: a holder until TakeoverGrace after its lease.
	blocker := -1
	if k.h != nil && k.h.exp.Add(m.cfg.TakeoverGrace).After(now) {
		blocker = k.h.owner
	}
	locks, err := s.Acquire(bg, m.owners[o], namespace.Of(m.ns), []docid.ID{k.id}, m.lease(), wait)
	switch {
	case err == nil:
		if blocker != -1 && blocker != o {
			m.failf("%s granted to %d while %d holds it (lease to %s, now %s)", k.rid, o, blocker, k.h.exp, now)
		}
		m.grant(k, o, locks[0], blocker == o)
	case errors.Is(err, ErrBusy) || errors.Is(err, ErrTimeout):
		if blocker == -1 || blocker == o {
			m.failf("acquire refused: "+"acquire of %s by %d (model holder %d): %v", k.rid, o, blocker, err)
		}
	default:
		m.failf("acquire error: "+"acquire of %s by %d: %v", k.rid, o, err)
	}
}

func (m *model) renew(s *Store, o int, k *mKey) {
	live := m.liveHolder(k) == o
	locks, err := s.Renew(bg, m.owners[o], namespace.Of(m.ns), []docid.ID{k.id}, m.lease())
	var nh *NotHolderError
	switch {
	case err == nil:
		if !live {
			m.failf("renewal of %s by %d, which does not hold it (model %+v)", k.rid, o, k.h)
			return
		}
		if locks[0].Token != k.h.token {
			m.failf("renewal of %s changed the token %d -> %d", k.rid, k.h.token, locks[0].Token)
		}
		k.h.exp = locks[0].ExpiresAt
		k.moved = false
	case errors.As(err, &nh):
		if live {
			m.failf("holder's renewal refused: "+"renewal of %s by its holder %d: %v", k.rid, o, err)
		}
	default:
		if live {
			m.failf("holder's renewal failed: "+"renewal of %s by its holder %d: %v", k.rid, o, err)
		}
	}
}

func (m *model) release(s *Store, o int, k *mKey) {
	holds := k.h != nil && k.h.owner == o
	n, err := s.Release(bg, m.owners[o], namespace.Of(m.ns), []docid.ID{k.id}, "")
	switch {
	case err != nil:
		if !errors.Is(err, errContended) && !errors.Is(err, ErrBusy) {
			// The outcome is unknown: nothing the model can go on from.
			m.t.Fatalf("step %d: release of %s by %d: %v", m.step, k.rid, o, err)
		}
		if holds {
			m.failf("holder's release failed: "+"release of %s by %d: %v", k.rid, o, err)
		}
	case n == 1:
		if !holds {
			m.failf("release of %s by %d, which does not hold it (model %+v)", k.rid, o, k.h)
		}
		k.h, k.moved = nil, false
	case holds:
		m.failf("holder's release did nothing: "+"release of %s by its holder %d freed nothing", k.rid, o)
	}
}

// releaseAll frees every key o holds, those whose head document was
// moved back to another hold included: the store finds them from o's
// claims as well as from the heads that name o. (It used to find them
// from the heads alone, and the model skipped release-all where o held a
// key with a moved-back head.)
func (m *model) releaseAll(s *Store, o int) {
	want := 0
	for _, k := range m.keys {
		if k.h != nil && k.h.owner == o {
			want++
		}
	}
	n, err := s.ReleaseAll(bg, m.owners[o], namespace.Of(m.ns), "")
	if err != nil || n != want {
		m.failf("release-all of %d: %d, %v; the model says %d", o, n, err, want)
		return
	}
	for _, k := range m.keys {
		if k.h != nil && k.h.owner == o {
			k.h, k.moved = nil, false
		}
	}
}

func (m *model) forceRelease(s *Store, k *mKey) {
	_, err := s.ForceRelease(bg, namespace.Of(m.ns), k.id, "model")
	if err != nil {
		if !errors.Is(err, errContended) && !errors.Is(err, ErrBusy) {
			m.t.Fatalf("step %d: force-release of %s: %v", m.step, k.rid, err)
		}
		m.failf("force-release failed: "+"force-release of %s: %v", k.rid, err)
		return
	}
	if k.h != nil || k.lastToken != 0 {
		k.lastToken++ // the force-release's own token
	}
	k.h, k.moved = nil, false
}

// janitor moves the clock by about CleanupAfter and runs compaction and
// the deletion of idle keys, as the background janitor would.
//
// It runs over moved-back heads as they are: compaction keeps the claims
// after a key's head (compactClaims). Before it did, a head moved back and
// left so until compaction deleted the claims after it misled writers
// (TestStaleHeadAfterCompaction, TestStaleFreeHeadAfterCompaction).
// LOCKGATE_MODEL_REPAIR_JANITOR=1 has the janitor first put moved-back
// heads back as the last change wrote them, the workaround the model used
// while that was so.
func (m *model) janitor(s *Store) {
	if os.Getenv("LOCKGATE_MODEL_REPAIR_JANITOR") == "1" {
		for _, k := range m.keys {
			switch {
			case !k.moved:
			case k.saved != nil:
				m.writeHead(k, *k.saved)
			default:
				if _, err := m.stores[0].coll.DeleteOne(bg, bson.D{{Key: "_id", Value: k.rid}}); err != nil {
					m.t.Fatalf("step %d: head of %s: %v", m.step, k.rid, err)
				}
			}
			k.moved, k.saved = false, nil
		}
	}
	// About CleanupAfter (compaction) or twice that (burial too).
	m.clock.Advance(time.Duration(1+m.rng.Intn(2))*m.cfg.CleanupAfter - 5*time.Second + time.Duration(m.rng.Int63n(int64(20*time.Second))))
	// The caches age in local time, which the fake clock does not move:
	// in a real minute they would no longer be built on (guess).
	for _, st := range m.stores {
		st.cache.staleAll()
	}
	if _, err := s.Cleanup(bg); err != nil {
		m.t.Fatalf("step %d: cleanup: %v", m.step, err)
	}
	if _, err := s.CollectHeads(bg); err != nil {
		m.t.Fatalf("step %d: collect heads: %v", m.step, err)
	}
}

// moveHeadBack writes the head document of k as a late head write would:
// one of its claims whose writer may still be writing (younger than
// modelMaxLate), not a tombstone (the janitor writes no head).
func (m *model) moveHeadBack(k *mKey) {
	st := m.stores[0]
	var cands []gen
	cur, err := st.claims.Find(bg, bson.D{{Key: "key", Value: k.rid}, {Key: "kind", Value: bson.D{{Key: "$ne", Value: kindGC}}},
		{Key: "at", Value: bson.D{{Key: "$gt", Value: m.now().Add(-modelMaxLate)}}}})
	if err == nil {
		err = cur.All(bg, &cands)
	}
	if err != nil {
		m.t.Fatalf("step %d: claims of %s: %v", m.step, k.rid, err)
	}
	if len(cands) == 0 {
		return
	}
	if !k.moved {
		// The head the last change wrote, for the janitor to put back.
		h, err := st.head(bg, k.rid)
		if err != nil {
			m.t.Fatalf("step %d: head of %s: %v", m.step, k.rid, err)
		}
		k.saved = h
	}
	m.writeHead(k, cands[m.rng.Intn(len(cands))])
	k.moved = true
}

func (m *model) writeHead(k *mKey, g gen) {
	if _, err := m.stores[0].coll.ReplaceOne(bg, bson.D{{Key: "_id", Value: k.rid}}, g.asHead(), options.Replace().SetUpsert(true)); err != nil {
		m.t.Fatalf("step %d: head of %s: %v", m.step, k.rid, err)
	}
}

// plantRelic puts a tombstone of a previous life of k (CollectHeads'
// relic) some generations ahead of its newest claim, as the janitor
// leaves one when it buries a key that is then started afresh: older
// than the current life's first claim, which must still exist to say so.
func (m *model) plantRelic(k *mKey) {
	st := m.stores[0]
	var cs []gen
	cur, err := st.claims.Find(bg, bson.D{{Key: "key", Value: k.rid}})
	if err == nil {
		err = cur.All(bg, &cs)
	}
	if err != nil {
		m.t.Fatalf("step %d: claims of %s: %v", m.step, k.rid, err)
	}
	var first *gen
	var top int64
	for i := range cs {
		if cs[i].Kind == kindGC {
			return // one relic at a time: an older one is compacted first
		}
		if cs[i].Seq == 1 {
			first = &cs[i]
		}
		top = max(top, cs[i].Seq)
	}
	if first == nil {
		return
	}
	seq := top + 1 + m.rng.Int63n(6)
	relic := &gen{ID: genID(k.rid, seq), Key: k.rid, Seq: seq, NS: m.ns, Kind: kindGC, At: first.At.Add(-time.Millisecond)}
	if _, err := st.insert(bg, opCleanup, relic); err != nil {
		m.t.Fatalf("step %d: relic of %s: %v", m.step, k.rid, err)
	}
	m.t.Logf("step %d: relic of %s at %d, newest claim %d, model %+v", m.step, k.rid, seq, top, k.h)
}

// check asks every Store what it knows of every key and compares.
func (m *model) check() {
	m.t.Helper()
	all := make([]docid.ID, 0, len(m.keys)+len(m.pad))
	for _, k := range m.keys {
		all = append(all, k.id)
	}
	all = append(all, m.pad...)
	neutral := newOwner("x")
	for si, s := range m.stores {
		for _, k := range m.keys {
			live := m.liveHolder(k)
			for o := range m.owners {
				ok, _, err := s.Holds(bg, m.owners[o], namespace.Of(m.ns), []docid.ID{k.id}, 0)
				switch {
				case ok && o != live:
					m.failf("s%d: Holds(%d, %s) true; model holder %d (%+v)", si+1, o, k.rid, live, k.h)
				case !ok && o == live:
					m.allow(k, "Holds false for the holder", "s%d: Holds(%d, %s) false, %v", si+1, o, k.rid, err)
				case err != nil:
					m.failf("s%d: Holds(%d, %s): %v", si+1, o, k.rid, err)
				}
			}
			m.checkStatus(si, k, live, false, []docid.ID{k.id}, neutral)
			m.checkStatus(si, k, live, true, []docid.ID{k.id}, neutral)
		}
		m.checkStatusAll(si, all, neutral, false)
		m.checkStatusAll(si, all, neutral, true)
	}
}

func (m *model) checkStatus(si int, k *mKey, live int, confirmed bool, idv []docid.ID, x Owner) {
	m.t.Helper()
	sts, err := m.status(si, confirmed, idv, x)
	if err != nil {
		m.failf("s%d: status (confirmed %v) of %s: %v", si+1, confirmed, k.rid, err)
		return
	}
	m.compare(si, k, live, confirmed, sts[0])
}

func (m *model) checkStatusAll(si int, all []docid.ID, x Owner, confirmed bool) {
	m.t.Helper()
	sts, err := m.status(si, confirmed, all, x)
	if err != nil || len(sts) != len(all) {
		m.failf("s%d: status (confirmed %v) of %d keys: %d, %v", si+1, confirmed, len(all), len(sts), err)
		return
	}
	for i, k := range m.keys {
		m.compare(si, k, m.liveHolder(k), confirmed, sts[i])
	}
	for i := len(m.keys); i < len(all); i++ {
		if sts[i].Held {
			m.failf("s%d: padding key %v held", si+1, sts[i].ID)
		}
	}
}

func (m *model) status(si int, confirmed bool, idv []docid.ID, x Owner) ([]Status, error) {
	if confirmed {
		return m.stores[si].ConfirmedStatus(bg, x, namespace.Of(m.ns), idv)
	}
	return m.stores[si].Status(bg, x, namespace.Of(m.ns), idv)
}

// compare checks one Status against the model: held only by the live
// holder; not held where the model has one only if a head was moved back,
// and never for ConfirmedStatus (the insert check lets a write through on
// "not held").
func (m *model) compare(si int, k *mKey, live int, confirmed bool, st Status) {
	m.t.Helper()
	switch {
	case st.Held && (live == -1 || st.Holder.SessionPrefix != SessionPrefix(m.owners[live].Session)):
		m.failf("s%d: status (confirmed %v) of %s shows holder %s token %d; model holder %d (%+v)",
			si+1, confirmed, k.rid, st.Holder.SessionPrefix, st.Token, live, k.h)
	case !st.Held && live != -1 && confirmed:
		m.failf("s%d: confirmed status of %s not held; model holder %d (%+v)", si+1, k.rid, live, k.h)
	case !st.Held && live != -1:
		m.allow(k, "status not held", "s%d: status of %s not held; model holder %d", si+1, k.rid, live)
	}
}

// TestStaleHeadAfterCompaction is what the model test found, here through
// the writers' own paths: a's renewal's head write is overtaken by a's
// release (through another store) and b's acquire, and lands last, so the
// head shows a's hold again (TestHeadMovedBackHoldsNobody). Nothing
// changes the key for CleanupAfter; compaction deletes the claims that
// showed the head stale. The next acquirer builds on the stale head, takes
// a's ended hold over with a's token + 1 and inserts a generation whose
// claim is gone: b's token is handed out a second time (docs/LOCKS.md:
// tokens strictly increase per key). Compaction now keeps the claims
// after a key's head (compactClaims).
func TestStaleHeadAfterCompaction(t *testing.T) {
	t.Parallel()
	cfg, clock, s := compactionStores(t)
	a, b, c := newOwner("a"), newOwner("b"), newOwner("c")
	const ns = "db.c"
	key := ids(t, "k")
	mustAcquire(t, s[0], a, ns, key, 5*time.Second, 0)

	landRenewal := holdHeadWrite(s[0], kindRenew, func() error {
		_, err := s[0].Renew(bg, a, namespace.Of(ns), key, 5*time.Second)
		return err
	})
	if n, err := s[1].Release(bg, a, namespace.Of(ns), key, ""); n != 1 || err != nil {
		t.Fatalf("a's release: %d %v", n, err)
	}
	bt := mustAcquire(t, s[1], b, ns, key, 5*time.Second, 0)[0].Token
	if err := landRenewal(); err != nil {
		t.Logf("the overtaken renewal: %v", err)
	}

	clock.Advance(cfg.CleanupAfter + time.Second)
	if _, err := s[1].Cleanup(bg); err != nil {
		t.Fatal(err)
	}
	for _, st := range s {
		st.cache.staleAll() // a minute has passed for them too
	}
	ct := mustAcquire(t, s[1], c, ns, key, 5*time.Second, 0)[0].Token
	if ct <= bt {
		t.Errorf("c was granted token %d after b's %d", ct, bt)
	}
}

// TestStaleFreeHeadAfterCompaction is the same gap with a free stale
// head, through the writers' own paths: a releases its ended hold and the
// release's head write is overtaken by b's takeover (which found the
// release's claim) and b's renewal 4 s later with a lease of
// CleanupAfter, and lands last: the head shows the key free. Compaction
// deletes the claims right after the head while b's renewal is younger
// and kept: readers stop at the first missing claim, so ConfirmedStatus
// says "not held" while b's hold is live, and c's acquire, built on the
// free head, inserts the compacted generation: c is granted the key b
// holds. (docs say a head moved back behind a compacted claim matters
// only for a hold longer than CleanupAfter; b's, not the head's, is the
// one that counts.) Compaction now keeps the claims after a key's head
// (compactClaims).
func TestStaleFreeHeadAfterCompaction(t *testing.T) {
	t.Parallel()
	cfg, clock, s := compactionStores(t)
	a, b, c := newOwner("a"), newOwner("b"), newOwner("c")
	const ns = "db.c"
	key := ids(t, "k")
	mustAcquire(t, s[0], a, ns, key, time.Second, 0)
	clock.Advance(2 * time.Second) // a's lease has ended

	landRelease := holdHeadWrite(s[0], kindRelease, func() error {
		_, err := s[0].Release(bg, a, namespace.Of(ns), key, "")
		return err
	})
	mustAcquire(t, s[1], b, ns, key, 5*time.Second, 0)
	clock.Advance(4 * time.Second)
	if _, err := s[1].Renew(bg, b, namespace.Of(ns), key, cfg.MaxLease); err != nil {
		t.Fatal(err)
	}
	if err := landRelease(); err != nil {
		t.Logf("the overtaken release: %v", err)
	}

	clock.Advance(cfg.CleanupAfter - 2*time.Second) // b's lease has 2 s left
	for _, st := range s {
		st.cache.staleAll()
	}
	if _, err := s[1].Cleanup(bg); err != nil {
		t.Fatal(err)
	}
	if sts, err := s[1].ConfirmedStatus(bg, c, namespace.Of(ns), key); err != nil || !sts[0].Held {
		t.Errorf("ConfirmedStatus: held %v, %v; b holds the key", len(sts) == 1 && sts[0].Held, err)
	}
	if _, err := s[1].Acquire(bg, c, namespace.Of(ns), key, 5*time.Second, 0); err == nil {
		t.Error("c was granted the key b holds")
	}
}

// compactionStores opens two stores on one collection and one fake clock,
// with CleanupAfter and MaxLease a minute and no background janitor: the
// tests move the clock and compact by hand.
func compactionStores(t *testing.T) (Config, *fakeClock, []*Store) {
	cfg := testConfig(t)
	cfg.CleanupAfter, cfg.MaxLease, cfg.OpTimeout = time.Minute, time.Minute, 5*time.Second
	cfg.CleanupInterval = -1
	cfg.NewcomerHorizon = noMemoryLocks
	clock := newFakeClock()
	return cfg, clock, []*Store{openStore(t, cfg, WithClock(clock)), openStore(t, cfg, WithClock(clock))}
}
