package scheme

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/guard/txn"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

// mirrorKeys serialise, within this proxy, the acquires and releases of
// one scheme lock: the lock store decides between owners atomically, but
// two writers with the same identity (one application process under
// holder: client) are one owner to it.
type mirrorKeys struct {
	mu sync.Mutex
	m  map[docid.Key]*schemeKey

	// instance tells this proxy's client-identity holders from the same
	// identity's through another proxy, which the lock store must then
	// decide between.
	once sync.Once
	bind string

	// memo: the lockDocument locks this proxy saw taken (holdings).
	memoOnce sync.Once
	memo     *lru.Cache[docid.Key, holding]
}

// instanceBind is the owner binding of this proxy's client-identity
// holders: random per guard, hashed once.
func (s *mirrorKeys) instanceBind(bind func(string) string) string {
	s.once.Do(func() {
		var b [16]byte
		rand.Read(b[:])
		s.bind = bind("scheme instance " + hex.EncodeToString(b[:]))
	})
	return s.bind
}

type schemeKey struct {
	sync.Mutex
	users int
}

func (s *mirrorKeys) lock(key docid.Key) func() {
	s.mu.Lock()
	if s.m == nil {
		s.m = map[docid.Key]*schemeKey{}
	}
	k := s.m[key]
	if k == nil {
		k = &schemeKey{}
		s.m[key] = k
	}
	k.users++
	s.mu.Unlock()
	k.Lock()
	return func() {
		k.Unlock()
		s.mu.Lock()
		if k.users--; k.users == 0 {
			delete(s.m, key)
		}
		s.mu.Unlock()
	}
}

// schemeOp is the one acquire or release of a command that the proxy
// runs itself, to see its outcome before the mirror lock is kept or
// dropped.
type schemeOp struct {
	rule  policy.Rule
	write policy.Write
	step  policy.Step
	owner lockstore.Owner
	// clause is ANDed into the write's filter before it is sent: the
	// holder value of a lockDocument write that names none.
	clause bsoncore.Document
	// holder is the holder value whose mirror a release drops.
	holder bsoncore.Value
}

// Enforce decides a command that writes to a namespace under a
// locking scheme; ok is false when none of its writes is under one.
func (sc *Schemes) Enforce(ctx context.Context, req *proxy.Request, pol *policy.Policy, writes []policy.Write, rules []policy.Rule, start time.Time) (_ proxy.Decision, ok bool) {
	under := false
	for i := range writes {
		if rules[i].Mode != policy.Off && rules[i].Scheme.Active() {
			under = true
			break
		}
	}
	if !under {
		return proxy.Decision{}, false
	}
	v := &Verdict{Req: req}
	var ops []schemeOp
	// temps are the mirrors taken for one write in flight (checkHolder);
	// a command refused after all must not leave them behind.
	var temps []schemeTemp
	defer func() {
		if v.enforcedViolation() {
			sc.dropTemps(context.WithoutCancel(ctx), temps)
		}
	}()
	for i, w := range writes {
		r := rules[i]
		if r.Mode == policy.Off {
			continue
		}
		v.Writes = append(v.Writes, w)
		if !r.Scheme.Active() {
			v.add(r, w, refuse.ReasonUnclassifiable, nil, "one command writes to a namespace under a locking scheme and to another protected namespace; send them as separate commands")
			continue
		}
		if w.Kind == policy.KindCollectionWrite {
			if !r.AllowCollectionWrites && !lockCollTTLIndex(r, req, w) {
				v.add(r, w, refuse.ReasonCollectionWrite, nil, fmt.Sprintf("%s replaces or removes documents wholesale, which the policy does not allow on %s (allowCollectionWrites is false)", w.What, w.NS))
			}
			continue
		}
		st := policy.SchemeStep(r.Scheme, w)
		if st.Kind != policy.StepOther && st.Kind != policy.StepInsert && (st.ID.Type == bson.TypeString || st.Holder.Type == bson.TypeString) && !sc.cfg.ExactStrings(ctx, w) {
			st = policy.Step{Why: "its string _id or holder value may match other values under the collation in force; use the simple collation"}
		}
		var ids []docid.ID
		if st.ID.Type != 0 {
			id, err := idCopy(st.ID)
			if err != nil {
				v.add(r, w, refuse.ReasonUnclassifiable, nil, fmt.Sprintf("the lock's _id cannot be a document's _id (%v)", err))
				continue
			}
			ids = []docid.ID{id}
			v.name(w.NS, id)
		}
		if r.Scheme.LockSide && st.Kind != policy.StepOther {
			if op, ok := sc.lockCollPlan(ctx, v, req, r, w, st, ids); ok {
				ops = append(ops, op)
			}
			continue
		}
		switch st.Kind {
		case policy.StepInsert:
			sc.insert(ctx, v, req, r, w)
		case policy.StepOther:
			v.add(r, w, ReasonNotFollowed, ids, fmt.Sprintf("it does not follow the %s locking scheme of %s: %s; %s", r.Scheme.Type, w.NS, st.Why, advice(r.Scheme)))
		case policy.StepAcquire:
			if sc.ownHolding(req, r, w, st, ids) {
				// The lock's own client setting the lock it holds again
				// (Tharga.MongoDB's error state: its lock, with an
				// exception attached) by _id alone: its write, not an
				// acquire.
				st.Kind, st.ByIdentity, st.Renew = policy.StepHolder, true, true
				if op, ok := sc.identityWrite(ctx, v, req, r, w, st, ids, &temps); ok {
					ops = append(ops, op)
				}
				continue
			}
			o, ok := sc.owner(req, w.NS, r.Scheme, st.Holder)
			if !ok {
				v.add(r, w, refuse.ReasonNoSession, ids, "the scheme's holder is the logical session (holder: session), and the command carries none; run it in an explicit session")
				continue
			}
			ops = append(ops, schemeOp{rule: r, write: w, step: st, owner: o})
		case policy.StepHolder:
			if st.ReleaseAll {
				o, ok := sc.owner(req, w.NS, r.Scheme, st.Holder)
				if !ok {
					v.add(r, w, refuse.ReasonNoSession, nil, "the scheme's holder is the logical session (holder: session), and the command carries none; run it in an explicit session")
					continue
				}
				ops = append(ops, schemeOp{rule: r, write: w, step: st, owner: o})
				continue
			}
			if st.ByIdentity {
				if op, ok := sc.identityWrite(ctx, v, req, r, w, st, ids, &temps); ok {
					ops = append(ops, op)
				}
				continue
			}
			o, mirrored, ok := sc.checkHolder(ctx, v, req, r, w, st, ids, &temps)
			if ok && mirrored && st.Ends {
				ops = append(ops, schemeOp{rule: r, write: w, step: st, owner: o, holder: st.Holder})
			}
		}
	}
	if len(ops) > 0 && ops[0].step.Kind == policy.StepAcquire && ops[0].rule.Scheme.Type != config.SchemeLockCollection &&
		req.Command != nil && txn.In(req.Command) {
		// lockgate reads the document back to see whether the acquire
		// took the lock, and a transaction's writes are invisible to
		// that read until the commit.
		v.add(ops[0].rule, ops[0].write, ReasonNotFollowed, nil, fmt.Sprintf("it takes a %s lock inside a transaction; take scheme locks outside transactions", ops[0].rule.Scheme.Type))
		ops = nil
	}
	if len(ops) > 0 && (len(writes) > 1 || req.Command == nil || req.Command.MoreToCome) {
		w := ops[0].write
		v.add(ops[0].rule, w, ReasonNotFollowed, nil, fmt.Sprintf("it takes or releases a %s lock %s; send each acquire and release as its own acknowledged single-statement command",
			ops[0].rule.Scheme.Type, map[bool]string{true: "without acknowledgement (w: 0)", false: "together with other statements"}[req.Command != nil && req.Command.MoreToCome && len(writes) == 1]))
		ops = nil
	}
	if len(v.Stale) == 1 && len(v.Violations) == 1 && len(writes) == 1 && v.Violations[0].Rule.Mode == policy.Enforce &&
		req.Command != nil && !req.Command.MoreToCome {
		x := v.Violations[0]
		sc.cfg.Record(req, pol, v, &x, time.Since(start))
		st := policy.SchemeStep(x.Rule.Scheme, x.Write)
		return proxy.Decision{Action: proxy.Reply, Reply: noMatch(x.Write, st, false)}, true
	}
	if len(ops) == 0 || v.enforcedViolation() {
		return sc.cfg.Decide(req, pol, v, start), true
	}
	return sc.run(ctx, req, pol, v, ops[0], start), true
}

// checkHolder checks a holder's write: who holds the scheme lock must be
// the writer. For holderFields and lockDocument the holder value is in the
// write's filter, so the write itself matches nothing unless the document
// still names that holder; the mirror lock only has to be nobody else's.
// A flag write carries no holder value: the mirror is the only check.
// mirrored reports whether the writer holds the mirror lock (a release
// must then drop it).
func (sc *Schemes) checkHolder(ctx context.Context, v *Verdict, req *proxy.Request, r policy.Rule, w policy.Write, st policy.Step, ids []docid.ID, temps *[]schemeTemp) (o lockstore.Owner, mirrored, ok bool) {
	return sc.checkHolderFrom(ctx, v, req, r, w, st, ids, temps, true)
}

// schemeTemp is a mirror checkHolder took for one write in flight.
type schemeTemp struct {
	owner lockstore.Owner
	ns    namespace.Namespace
	ids   []docid.ID
}

// dropTemps releases the mirrors taken for the writes of a command that
// was refused after all: none of them is in flight.
func (sc *Schemes) dropTemps(ctx context.Context, temps []schemeTemp) {
	for _, t := range temps {
		if _, err := sc.cfg.Store.Release(ctx, t.owner, t.ns, t.ids, ""); err != nil {
			sc.cfg.Log.Warn("releasing the scheme lock of a refused write failed; it expires with its lease", zap.String("ns", t.ns.String()), zap.Error(err))
		}
	}
}

// checkHolderFrom is checkHolder; read says whether a mirror nobody
// holds is to be checked against the document first (once: after the
// document's lock is adopted the mirror is the state).
func (sc *Schemes) checkHolderFrom(ctx context.Context, v *Verdict, req *proxy.Request, r policy.Rule, w policy.Write, st policy.Step, ids []docid.ID, temps *[]schemeTemp, read bool) (o lockstore.Owner, mirrored, ok bool) {
	o, ok = sc.owner(req, w.NS, r.Scheme, st.Holder)
	if !ok {
		v.add(r, w, refuse.ReasonNoSession, ids, "the scheme's holder is the logical session (holder: session), and the command carries none; run it in an explicit session")
		return o, false, false
	}
	store := sc.cfg.Store
	mns := r.Scheme.MirrorNS(w.NS)
	unavailable := func(err error) (lockstore.Owner, bool, bool) {
		v.Violations = append(v.Violations, Violation{Rule: r, Write: w, Reason: refuse.ReasonUnavailable,
			Detail: fmt.Sprintf("the lock store cannot confirm the scheme lock (%v), so the write is refused (fail closed)", err)})
		return o, false, false
	}
	held, _, err := store.Holds(ctx, o, mns, ids, r.LeaseMargin)
	if err != nil {
		return unavailable(err)
	}
	lease := mirrorLease(r.Scheme, st)
	if held {
		renew := st.Renew
		if r.Scheme.Type == config.SchemeFlag && !st.Ends {
			// A flag has no lease of its own: the holder's writes keep
			// the mirror alive, renewed once half of it is gone.
			half, _, _ := store.Holds(ctx, o, mns, ids, r.Scheme.Lease/2)
			renew = !half
		}
		if renew && !st.Ends {
			if !sc.renew(ctx, v, r, w, o, ids, lease) {
				return o, false, false
			}
		}
		v.check(w.NS, ids)
		v.state(StateHeld)
		return o, true, true
	}
	sts, err := store.Status(ctx, o, mns, ids)
	if err == nil && len(sts) != 1 {
		err = fmt.Errorf("%d statuses for one lock", len(sts))
	}
	if err != nil {
		return unavailable(err)
	}
	s := sts[0]
	switch {
	case s.Held && !s.HeldByYou:
		h := s.Holder
		if !r.Scheme.IdentityHolder() {
			// A holder whose lock was taken over: on the database its
			// write would match nothing, once the new holder's acquire
			// has landed; it may not land before (conditional writes
			// are not atomic everywhere). It gets the database's answer.
			v.Stale = append(v.Stale, len(v.Violations))
		}
		v.Violations = append(v.Violations, Violation{Rule: r, Write: w, Reason: ReasonNotHolder, IDs: ids, Holder: &h,
			Detail: fmt.Sprintf("under the %s locking scheme of %s the lock on _id %s belongs to another holder (%s); %s", r.Scheme.Type, w.NS, ids[0].String(), refuse.DescribeHolder(h), advice(r.Scheme))})
		return o, false, false
	case s.HeldByYou:
		// Less than the margin left. A flag's holder keeps its lock by
		// writing, and a write that refreshes the scheme's own time
		// (LockTime, expiresAt, ts) renews it; other writes do not,
		// or the scheme's expiry would never come while the holder
		// writes. holderFields and lockDocument writes check the holder
		// in their own filter, so they may go on until the mirror ends;
		// a lockCollection data write has no such check.
		if r.Scheme.Type == config.SchemeFlag || st.Renew {
			if !sc.renew(ctx, v, r, w, o, ids, lease) {
				return o, false, false
			}
			v.state(StateHeld)
			return o, true, true
		} else if !r.Scheme.IdentityHolder() {
			v.state(StateHeld)
			return o, true, true
		}
		v.Violations = append(v.Violations, Violation{Rule: r, Write: w, Reason: ReasonNotHolder, IDs: ids,
			Detail: fmt.Sprintf("under the %s locking scheme of %s this client's lock on _id %s has less than the policy's margin of %s (policy.leaseMarginMS) left; %s", r.Scheme.Type, w.NS, ids[0].String(), lockstore.FormatMS(r.LeaseMargin), advice(r.Scheme))})
		return o, false, false
	}
	// The mirror holds nothing. The document may still show a live lock
	// (taken before lockgate ran, or outliving its mirror): that lock is
	// the state, adopted into the mirror before anything is decided.
	if read && !r.Scheme.IdentityHolder() {
		d, err := sc.readDocLock(ctx, r.Scheme, w.NS, ids[0])
		if err != nil {
			return unavailable(err)
		}
		if err := sc.adoptDocLock(ctx, req, r, w.NS, ids[0], d); err != nil {
			var un *unmirrorableError
			if !errors.As(err, &un) {
				return unavailable(err)
			}
			if !sameHolder(d.holder, st.Holder) {
				v.Violations = append(v.Violations, Violation{Rule: r, Write: w, Reason: ReasonNotFollowed, IDs: ids,
					Detail: fmt.Sprintf("under the %s locking scheme of %s %s, and this write does not name its holder", r.Scheme.Type, w.NS, un.why)})
				return o, false, false
			}
			// The holder itself, of a lock the database checks in the
			// write's own filter: on, under a mirror for the write.
		} else if d.live(time.Now()) {
			return sc.checkHolderFrom(ctx, v, req, r, w, st, ids, temps, false)
		}
		if !sameHolder(d.holder, st.Holder) {
			// The document names another holder, or none: the write
			// matches nothing, and gets that answer without a mirror
			// that would keep a free document busy.
			v.Stale = append(v.Stale, len(v.Violations))
			v.Violations = append(v.Violations, Violation{Rule: r, Write: w, Reason: ReasonNotHolder, IDs: ids,
				Detail: fmt.Sprintf("under the %s locking scheme of %s the document _id %s is not locked by the holder this write names; %s", r.Scheme.Type, w.NS, ids[0].String(), advice(r.Scheme))})
			return o, false, false
		}
	}
	// Nobody holds the mirror, as far as a read can tell (a read may lag
	// an acquire by milliseconds, so it is no permission by itself):
	//   - a holder-field write whose lock expired and was not taken over
	//     lands on the database (its filter still names the holder the
	//     document has), so it goes on;
	//   - clearing a flag (a write that changes nothing else), deleting a
	//     lock record, or releasing an expired holder-field lock is the
	//     recovery of an abandoned lock, which the scheme leaves to
	//     whoever notices (or to a TTL index).
	// Each runs under a mirror taken now, atomically, just long enough
	// for the write in flight: an acquire arriving meanwhile neither
	// races it (conditional writes are not atomic everywhere) nor is
	// undone by it, and a takeover waits at most policy.leaseMarginMS.
	recovery := st.Ends && (!st.Delete || !r.Scheme.IdentityHolder())
	if r.Scheme.Type == config.SchemeFlag {
		// Back to false, as the scheme's acquire expects it, and nothing
		// else: unset or null, the flag could never be taken again.
		recovery = st.Ends && st.FlagFalse && !st.Touches
	}
	if !r.Scheme.IdentityHolder() || recovery {
		short := r.LeaseMargin
		if short < 100*time.Millisecond {
			short = 100 * time.Millisecond
		}
		if st.Renew && !st.Ends && !r.Scheme.IdentityHolder() {
			// The write renews the document's lock: the mirror lives
			// as long.
			short = lease
		}
		_, err := store.Acquire(ctx, o, mns, ids, short, 0)
		switch {
		case err == nil:
			*temps = append(*temps, schemeTemp{owner: o, ns: mns, ids: ids})
			if r.Scheme.IdentityHolder() {
				v.state(StateAbandoned)
			} else {
				v.state(StateExpired)
			}
			return o, true, true
		case errors.Is(err, lockstore.ErrInvalidLease):
			v.Violations = append(v.Violations, Violation{Rule: r, Write: w, Reason: ReasonNotFollowed, IDs: ids,
				Detail: fmt.Sprintf("under the %s locking scheme of %s the lock it sets would last %s, longer than lockstore.maxLeaseMS allows; %s", r.Scheme.Type, w.NS, lockstore.FormatMS(short), advice(r.Scheme))})
		case errors.Is(err, lockstore.ErrBusy):
			if !r.Scheme.IdentityHolder() {
				// Taken over: the database's answer is "nothing matched".
				v.Stale = append(v.Stale, len(v.Violations))
			}
			v.Violations = append(v.Violations, Violation{Rule: r, Write: w, Reason: ReasonNotHolder, IDs: ids,
				Detail: fmt.Sprintf("under the %s locking scheme of %s the lock on _id %s has just been taken by another holder; %s", r.Scheme.Type, w.NS, ids[0].String(), advice(r.Scheme))})
		default:
			return unavailable(err)
		}
		return o, false, false
	}
	why := fmt.Sprintf("this client does not hold the lock on _id %s (or its lease of %s ran out)", ids[0].String(), lockstore.FormatMS(r.Scheme.Lease))
	if r.Scheme.Type == config.SchemeFlag && st.Ends {
		why = fmt.Sprintf("nobody holds the lock on _id %s, and a write that clears its flag must set it to false and change nothing else", ids[0].String())
	}
	v.Violations = append(v.Violations, Violation{Rule: r, Write: w, Reason: ReasonNotHolder, IDs: ids,
		Detail: fmt.Sprintf("under the %s locking scheme of %s %s; %s", r.Scheme.Type, w.NS, why, advice(r.Scheme))})
	return o, false, false
}

// renew moves the end of o's mirror of ids to lease from now, for a
// write that moves the lock's own time; a renewal the lock store refuses
// refuses the write, which would leave the document's lock outliving its
// mirror.
func (sc *Schemes) renew(ctx context.Context, v *Verdict, r policy.Rule, w policy.Write, o lockstore.Owner, ids []docid.ID, lease time.Duration) bool {
	_, err := sc.cfg.Store.Renew(ctx, o, r.Scheme.MirrorNS(w.NS), ids, lease)
	switch {
	case err == nil:
		return true
	case errors.Is(err, lockstore.ErrInvalidLease):
		v.Violations = append(v.Violations, Violation{Rule: r, Write: w, Reason: ReasonNotFollowed, IDs: ids,
			Detail: fmt.Sprintf("under the %s locking scheme of %s the lock it sets would last %s, longer than lockstore.maxLeaseMS allows; %s", r.Scheme.Type, w.NS, lockstore.FormatMS(lease), advice(r.Scheme))})
	default:
		v.Violations = append(v.Violations, Violation{Rule: r, Write: w, Reason: refuse.ReasonUnavailable,
			Detail: fmt.Sprintf("the lock store cannot renew the scheme lock (%v), so the write is refused (fail closed)", err)})
	}
	return false
}

// sameHolder reports whether holder values a and b are the same value.
func sameHolder(a, b bsoncore.Value) bool {
	return a.Type == b.Type && bytes.Equal(a.Data, b.Data)
}

// run runs an acquire, or a release of a mirrored lock, or a
// lockDocument write that names no holder, on the client's own upstream
// connection and answers with the upstream's reply: the application sees
// exactly what the database said, and the mirror follows what the
// database shows it did (the document's lock fields read back), never a
// modified count alone.
func (sc *Schemes) run(ctx context.Context, req *proxy.Request, pol *policy.Policy, v *Verdict, op schemeOp, start time.Time) proxy.Decision {
	w, st, r := op.write, op.step, op.rule
	if x := sc.cfg.CommitStep(req, pol, v, r, w); x != nil {
		v.Violations = append(v.Violations, *x)
		return sc.cfg.Decide(req, pol, v, start)
	}
	if r.Scheme.LockSide {
		return sc.lockCollRun(ctx, req, pol, v, op, start)
	}
	if st.Pick {
		return sc.pick(ctx, req, pol, v, op, start)
	}
	id, err := idCopy(st.ID)
	if err != nil {
		// Enforce refused such a step already.
		v.add(r, w, refuse.ReasonUnclassifiable, nil, fmt.Sprintf("the lock's _id cannot be a document's _id (%v)", err))
		return sc.cfg.Decide(req, pol, v, start)
	}
	ids := []docid.ID{id}
	mns := r.Scheme.MirrorNS(w.NS)
	unlock := sc.keys.lock(docid.KeyOf(mns, id))
	defer unlock()
	store := sc.cfg.Store
	body, err := statementBody(req.Command, w)
	clause := op.clause
	if err == nil && st.Kind == policy.StepAcquire && r.Scheme.Type != config.SchemeLockCollection {
		// The database itself refuses a steal, whatever the mirror says.
		clause = r.Scheme.FreeCondition(time.Now())
	}
	if err == nil && clause != nil && r.Mode == policy.Enforce {
		// An audited namespace's writes go as they came.
		body, err = policy.JoinFilter(body, w, clause)
	}
	if err != nil {
		v.add(r, w, refuse.ReasonUnclassifiable, ids, fmt.Sprintf("the proxy cannot run its %s step on its own (%v)", r.Scheme.Type, err))
		return sc.cfg.Decide(req, pol, v, start)
	}
	docScheme := r.Scheme.Type != config.SchemeLockCollection
	if st.Kind == policy.StepHolder { // a release, or a write that names no holder
		reply, err := req.Ask(ctx, body)
		if err != nil {
			// Whether it was written is unknown: the mirror stays and
			// expires with its lease; the driver sees a network error.
			return proxy.Decision{Action: proxy.Close, Reason: "scheme release: " + err.Error()}
		}
		if st.Ends && (!docScheme || sc.released(ctx, r, w, id, op.holder)) {
			if _, err := store.Release(ctx, op.owner, mns, ids, ""); err != nil {
				sc.cfg.Log.Warn("scheme lock release failed; it expires with its lease", zap.String("ns", w.NS.String()), zap.Error(err))
			}
			sc.keys.holdings().Remove(docid.KeyOf(mns, id))
		}
		v.check(w.NS, ids)
		sc.cfg.Record(req, pol, v, nil, time.Since(start))
		return proxy.Decision{Action: proxy.Reply, Reply: reply}
	}
	res := sc.acquireOne(ctx, req, v, op, id, body)
	switch {
	case res.final != nil:
		return *res.final
	case res.busy:
		return sc.busy(req, pol, v, r, w, st, start)
	case res.refused:
		return sc.cfg.Decide(req, pol, v, start)
	}
	sc.cfg.Record(req, pol, v, nil, time.Since(start))
	return proxy.Decision{Action: proxy.Reply, Reply: res.reply}
}

// acquireResult is how one acquire ran: busy (the mirror is someone
// else's, nothing sent), refused (a violation was recorded, nothing
// sent), final (the decision to return at once: the connection failed),
// or the database's reply and whether the lock was taken.
type acquireResult struct {
	reply         bsoncore.Document
	taken         bool
	busy, refused bool
	final         *proxy.Decision
}

// acquireOne runs acquire op of the document id, body being its
// statement as it is to be sent: the mirror first, then the statement on
// the client's connection, then the document read back.
func (sc *Schemes) acquireOne(ctx context.Context, req *proxy.Request, v *Verdict, op schemeOp, id docid.ID, body bsoncore.Document) acquireResult {
	w, st, r := op.write, op.step, op.rule
	ids := []docid.ID{id}
	mns := r.Scheme.MirrorNS(w.NS)
	store := sc.cfg.Store
	docScheme := r.Scheme.Type != config.SchemeLockCollection
	if r.Scheme.IdentityHolder() {
		// The same holder setting a flag it holds: the database would
		// say "not modified", and must, though it might not (its
		// test-and-set is not atomic everywhere). Likewise a second
		// lock record from the holder of the first.
		mine, _, err := store.Holds(ctx, op.owner, mns, ids, 0)
		if err != nil {
			v.Violations = append(v.Violations, Violation{Rule: r, Write: w, Reason: refuse.ReasonUnavailable, IDs: ids,
				Detail: fmt.Sprintf("the lock store cannot take the scheme lock (%v); nothing was written", err)})
			return acquireResult{refused: true}
		}
		if mine {
			return acquireResult{busy: true}
		}
	}
	var prev docLock // the lock the document showed: an expired one is taken over
	if docScheme && r.Scheme.Type != config.SchemeFlag {
		// A live lock the document shows and no mirror holds is the
		// state: adopted, it makes this acquire "busy".
		d, err := sc.readDocLock(ctx, r.Scheme, w.NS, id)
		prev = d
		if err == nil {
			err = sc.adoptDocLock(ctx, req, r, w.NS, id, d)
		}
		var un *unmirrorableError
		switch {
		case errors.As(err, &un):
			v.add(r, w, ReasonNotFollowed, ids, fmt.Sprintf("under the %s locking scheme of %s %s; nothing was written", r.Scheme.Type, w.NS, un.why))
			return acquireResult{refused: true}
		case err != nil:
			v.Violations = append(v.Violations, Violation{Rule: r, Write: w, Reason: refuse.ReasonUnavailable, IDs: ids,
				Detail: fmt.Sprintf("the proxy cannot read the document's lock (%v); nothing was written", err)})
			return acquireResult{refused: true}
		}
	}
	locks, err := store.Acquire(ctx, op.owner, mns, ids, mirrorLease(r.Scheme, st), 0)
	if err != nil {
		switch {
		case errors.Is(err, lockstore.ErrBusy):
			return acquireResult{busy: true}
		case errors.Is(err, lockstore.ErrInvalidLease):
			v.add(r, w, ReasonNotFollowed, ids, fmt.Sprintf("under the %s locking scheme of %s the lock it takes would last %s, longer than lockstore.maxLeaseMS allows; nothing was written", r.Scheme.Type, w.NS, lockstore.FormatMS(mirrorLease(r.Scheme, st))))
			return acquireResult{refused: true}
		}
		v.Violations = append(v.Violations, Violation{Rule: r, Write: w, Reason: refuse.ReasonUnavailable, IDs: ids,
			Detail: fmt.Sprintf("the lock store cannot take the scheme lock (%v); nothing was written", err)})
		return acquireResult{refused: true}
	}
	if prev.holder.Type != 0 {
		v.state(StateTakeover)
	} else {
		v.state(StateFree)
	}
	reply, err := req.Ask(ctx, body)
	if err != nil {
		// Unknown outcome. Holding the mirror for a lock that may not
		// exist only delays the next acquire by a lease; dropping it
		// could let two holders in.
		return acquireResult{final: &proxy.Decision{Action: proxy.Close, Reason: "scheme acquire: " + err.Error()}}
	}
	taken := acquired(reply, w)
	if docScheme {
		taken = sc.taken(ctx, r, w, id, st.Holder, taken)
	}
	if end, ok := lockEnd(r.Scheme, st); ok && taken && !end.After(time.Now()) {
		// Taken, and already expired by its own time: nothing to hold.
		taken = false
	}
	if !taken {
		if _, err := store.Release(ctx, op.owner, mns, ids, ""); err != nil {
			sc.cfg.Log.Warn("scheme lock release after a failed acquire failed; it expires with its lease", zap.String("ns", w.NS.String()), zap.Error(err))
		}
	} else {
		if r.Scheme.Type == config.SchemeLockDocument && len(locks) == 1 {
			c := sc.client(req)
			sc.keys.holdings().Add(docid.KeyOf(mns, id), holding{session: c.Session, bind: c.Bind,
				holder: bsoncore.Value{Type: st.Holder.Type, Data: append([]byte(nil), st.Holder.Data...)}, token: locks[0].Token})
		}
		v.check(w.NS, ids)
	}
	return acquireResult{reply: reply, taken: taken}
}

// pick runs a findOneAndUpdate acquire whose filter names several
// documents (Tharga.MongoDB's PickForUpdateAsync(filter)) as the database
// would, one free document at a time: the documents the filter matches
// are found (as for any write that does not pin _id), and the statement
// is run pinned to each in turn, under its mirror and the free-or-expired
// condition, until one is taken. Nothing taken answers "no document", as
// the database does when none is free.
func (sc *Schemes) pick(ctx context.Context, req *proxy.Request, pol *policy.Policy, v *Verdict, op schemeOp, start time.Time) proxy.Decision {
	w, r := op.write, op.rule
	if sc.cfg.Resolve == nil {
		v.add(r, w, ReasonNotFollowed, nil, "it takes a lock on one of the documents its filter matches, and this proxy cannot look them up; name the _id")
		return sc.cfg.Decide(req, pol, v, start)
	}
	if why := sc.cfg.MayRead(ctx, req, w.NS); why != "" {
		v.add(r, w, ReasonNotFollowed, nil, why)
		return sc.cfg.Decide(req, pol, v, start)
	}
	cands, _, err := sc.cfg.Resolve(ctx, r, w, r.MaxCandidates+1)
	if err != nil {
		v.Violations = append(v.Violations, Violation{Rule: r, Write: w, Reason: refuse.ReasonUnavailable,
			Detail: fmt.Sprintf("the documents its filter matches could not be looked up (%v); nothing was written", err)})
		return sc.cfg.Decide(req, pol, v, start)
	}
	if len(cands) > r.MaxCandidates {
		v.add(r, w, refuse.ReasonTooManyCandidates, nil, fmt.Sprintf("its filter matches more than %d documents (the policy's maxCandidates); narrow it", r.MaxCandidates))
		return sc.cfg.Decide(req, pol, v, start)
	}
	base, err := statementBody(req.Command, w)
	if err == nil && r.Mode == policy.Enforce {
		base, err = policy.JoinFilter(base, w, r.Scheme.FreeCondition(time.Now()))
	}
	if err != nil {
		v.add(r, w, refuse.ReasonUnclassifiable, nil, fmt.Sprintf("the proxy cannot run its %s step on its own (%v)", r.Scheme.Type, err))
		return sc.cfg.Decide(req, pol, v, start)
	}
	mns := r.Scheme.MirrorNS(w.NS)
	for _, id := range cands {
		body, err := policy.JoinFilter(base, w, bsoncore.NewDocumentBuilder().AppendValue("_id", id.Core()).Build())
		if err != nil {
			v.add(r, w, refuse.ReasonUnclassifiable, nil, fmt.Sprintf("the proxy cannot pin its %s step to one document (%v)", r.Scheme.Type, err))
			return sc.cfg.Decide(req, pol, v, start)
		}
		one := op
		one.step.ID, one.step.Pick = id.Core(), false
		unlock := sc.keys.lock(docid.KeyOf(mns, id))
		res := sc.acquireOne(ctx, req, v, one, id, body)
		unlock()
		switch {
		case res.final != nil:
			return *res.final
		case res.refused:
			return sc.cfg.Decide(req, pol, v, start)
		case res.taken:
			sc.cfg.Record(req, pol, v, nil, time.Since(start))
			return proxy.Decision{Action: proxy.Reply, Reply: res.reply}
		}
	}
	sc.cfg.Record(req, pol, v, nil, time.Since(start))
	return proxy.Decision{Action: proxy.Reply, Reply: noMatch(w, op.step, false)}
}

// taken reads back whether an acquire of holder took the document's lock:
// the document shows that holder (flag: the reply says it matched, and the
// flag is set). A failed read keeps the mirror, the stricter guess.
func (sc *Schemes) taken(ctx context.Context, r policy.Rule, w policy.Write, id docid.ID, holder bsoncore.Value, replied bool) bool {
	if r.Scheme.Type == config.SchemeFlag && !replied {
		return false
	}
	d, err := sc.readDocLock(ctx, r.Scheme, w.NS, id)
	if err != nil {
		sc.cfg.Log.Warn("reading back a scheme acquire failed; the mirror stays until its lease ends", zap.String("ns", w.NS.String()), zap.Error(err))
		return true
	}
	if r.Scheme.Type == config.SchemeFlag {
		return d.holder.Type != 0
	}
	return sameHolder(d.holder, holder)
}

// released reads back whether a release freed the document's lock: the
// document is gone or no longer shows the holder (flag: the flag set). A
// failed read keeps the mirror.
func (sc *Schemes) released(ctx context.Context, r policy.Rule, w policy.Write, id docid.ID, holder bsoncore.Value) bool {
	d, err := sc.readDocLock(ctx, r.Scheme, w.NS, id)
	if err != nil {
		sc.cfg.Log.Warn("reading back a scheme release failed; the mirror stays until its lease ends", zap.String("ns", w.NS.String()), zap.Error(err))
		return false
	}
	if r.Scheme.Type == config.SchemeFlag || holder.Type == 0 {
		return d.holder.Type == 0
	}
	return !sameHolder(d.holder, holder)
}

// identityWrite checks a lockDocument write that names no holder
// value: it is the holder's only from the client identity this proxy saw
// take the lock that the mirror still holds. It is then run by the proxy
// with that holder value added to its filter, so that the database
// refuses it too if the document's lock is no longer that one.
//
// A write that only clears a lock nobody holds any more (the document's
// lock expired, no mirror: Tharga.MongoDB's ReleaseOneAsync of a lock left
// in its error state) is the recovery of an abandoned lock, allowed from
// anyone as for holderFields, bound to the expired holder's value.
func (sc *Schemes) identityWrite(ctx context.Context, v *Verdict, req *proxy.Request, r policy.Rule, w policy.Write, st policy.Step, ids []docid.ID, temps *[]schemeTemp) (schemeOp, bool) {
	mns := r.Scheme.MirrorNS(w.NS)
	if st.Ends && !st.Touches {
		d, err := sc.readDocLock(ctx, r.Scheme, w.NS, ids[0])
		if err != nil {
			v.Violations = append(v.Violations, Violation{Rule: r, Write: w, Reason: refuse.ReasonUnavailable,
				Detail: fmt.Sprintf("the proxy cannot read the document's lock (%v), so the write is refused (fail closed)", err)})
			return schemeOp{}, false
		}
		if d.holder.Type != 0 && d.bad == "" && !d.live(time.Now()) {
			rec := st
			rec.Holder, rec.ByIdentity = d.holder, false
			o, mirrored, ok := sc.checkHolder(ctx, v, req, r, w, rec, ids, temps)
			if !ok {
				return schemeOp{}, false
			}
			if mirrored {
				return schemeOp{rule: r, write: w, step: rec, owner: o, holder: d.holder, clause: r.Scheme.HolderCondition(d.holder)}, true
			}
		}
	}
	h, known := sc.keys.holdings().Get(docid.KeyOf(mns, ids[0]))
	known = known && h.sameIdentity(sc.client(req))
	if known {
		o, _ := sc.owner(req, w.NS, r.Scheme, h.holder)
		sts, err := sc.cfg.Store.Status(ctx, o, mns, ids)
		if err == nil && !heldWith(sts, h.token) && sc.cfg.Confirmed != nil {
			// Status reads the key's head record, which a late head write
			// of the change before this lock (another proxy's release,
			// overtaken by this client's acquire) can leave showing the
			// key free: the claims decide before the holder is refused.
			sts, err = sc.cfg.Confirmed(ctx, o, mns, ids)
		}
		if err != nil {
			v.Violations = append(v.Violations, Violation{Rule: r, Write: w, Reason: refuse.ReasonUnavailable,
				Detail: fmt.Sprintf("the lock store cannot confirm the scheme lock (%v), so the write is refused (fail closed)", err)})
			return schemeOp{}, false
		}
		if heldWith(sts, h.token) {
			if st.Renew && !st.Ends && !sc.renew(ctx, v, r, w, o, ids, mirrorLease(r.Scheme, st)) {
				return schemeOp{}, false
			}
			st.Holder = h.holder
			v.check(w.NS, ids)
			v.state(StateHeld)
			return schemeOp{rule: r, write: w, step: st, owner: o, holder: h.holder, clause: r.Scheme.HolderCondition(h.holder)}, true
		}
	}
	if !known {
		v.add(r, w, ReasonNotFollowed, ids, fmt.Sprintf("it does not follow the %s locking scheme of %s: it names no holder (%s: <holder> in its filter), and this client did not take the lock on _id %s through this proxy; %s", r.Scheme.Type, w.NS, r.Scheme.HolderPath, ids[0].String(), advice(r.Scheme)))
		return schemeOp{}, false
	}
	v.add(r, w, ReasonNotHolder, ids, fmt.Sprintf("under the %s locking scheme of %s this client's lock on _id %s, which this write does not name, is no longer held; %s", r.Scheme.Type, w.NS, ids[0].String(), advice(r.Scheme)))
	return schemeOp{}, false
}

// heldWith reports whether sts, the status of one key, says the owner
// asked about holds it under token.
func heldWith(sts []lockstore.Status, token int64) bool {
	return len(sts) == 1 && sts[0].HeldByYou && sts[0].Token == token
}

// busy answers an acquire of a lock someone else holds with the
// scheme's own failure signal: "not modified" for an update, no document
// for findAndModify, DuplicateKey where the upsert would have collided
// with the holder's document. Audited namespaces forward the write.
func (sc *Schemes) busy(req *proxy.Request, pol *policy.Policy, v *Verdict, r policy.Rule, w policy.Write, st policy.Step, start time.Time) proxy.Decision {
	v.state(StateBusy)
	if r.Mode != policy.Enforce {
		sc.cfg.Record(req, pol, v, nil, time.Since(start))
		return proxy.Decision{Action: proxy.Forward}
	}
	sc.cfg.Record(req, pol, v, nil, time.Since(start))
	return proxy.Decision{Action: proxy.Reply, Reply: noMatch(w, st, w.Upsert && r.Scheme.Type != config.SchemeFlag)}
}

// noMatch is the reply of the database to write w when its filter matches
// nothing: DuplicateKey where an upsert would then collide with the
// existing document (dup), "nothing matched" otherwise.
func noMatch(w policy.Write, st policy.Step, dup bool) bsoncore.Document {
	errmsg := fmt.Sprintf("E11000 duplicate key error collection: %s index: _id_ dup key: { _id: %s }", w.NS, docid.Format(bson.RawValue{Type: st.ID.Type, Value: st.ID.Data}))
	idx, d := bsoncore.AppendDocumentStart(nil)
	switch {
	case w.Kind == policy.KindFindAndModify && dup:
		extra := bsoncore.AppendDocumentElement(nil, "keyPattern", bsoncore.NewDocumentBuilder().AppendInt32("_id", 1).Build())
		extra = bsoncore.AppendDocumentElement(extra, "keyValue", bsoncore.NewDocumentBuilder().AppendValue("_id", st.ID).Build())
		return (&mongoerr.Error{Code: mongoerr.DuplicateKey, Msg: errmsg}).Document(extra)
	case w.Kind == policy.KindFindAndModify:
		d = bsoncore.AppendDocumentElement(d, "lastErrorObject", bsoncore.NewDocumentBuilder().
			AppendInt32("n", 0).AppendBoolean("updatedExisting", false).Build())
		d = bsoncore.AppendNullElement(d, "value")
	case w.Kind == policy.KindDelete:
		d = bsoncore.AppendInt32Element(d, "n", 0)
	default:
		d = bsoncore.AppendInt32Element(d, "n", 0)
		d = bsoncore.AppendInt32Element(d, "nModified", 0)
		if dup {
			we := (&mongoerr.Error{Code: mongoerr.DuplicateKey, Msg: errmsg}).WriteError(w.Index)
			d = bsoncore.AppendArrayElement(d, "writeErrors", bsoncore.NewArrayBuilder().AppendDocument(we).Build())
		}
	}
	d = bsoncore.AppendDoubleElement(d, "ok", 1)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// acquired reads the upstream's reply to an acquire: did it take the lock?
func acquired(reply bsoncore.Document, w policy.Write) bool {
	if ok, _ := reply.Lookup("ok").AsInt64OK(); ok != 1 {
		return false
	}
	if w.Kind == policy.KindFindAndModify {
		leo, ok := reply.Lookup("lastErrorObject").DocumentOK()
		if !ok {
			return false
		}
		if b, ok := leo.Lookup("updatedExisting").BooleanOK(); ok && b {
			return true
		}
		_, err := leo.LookupErr("upserted")
		return err == nil
	}
	if _, err := reply.LookupErr("writeErrors"); err == nil {
		return false
	}
	if w.Kind == policy.KindInsert {
		n, ok := reply.Lookup("n").AsInt64OK()
		return ok && n > 0
	}
	if n, ok := reply.Lookup("nModified").AsInt64OK(); ok && n > 0 {
		return true
	}
	if up, ok := reply.Lookup("upserted").ArrayOK(); ok {
		vals, _ := up.Values()
		return len(vals) > 0
	}
	return false
}

// statementBody is the command of write w as one body document, its
// statement folded in from a document sequence if it sat in one: the form
// Request.Ask sends.
func statementBody(cmd *wire.Command, w policy.Write) (bsoncore.Document, error) {
	if cmd == nil {
		return nil, errors.New("not a command")
	}
	elems, err := cmd.Body.Elements()
	if err != nil {
		return nil, err
	}
	idx, b := bsoncore.AppendDocumentStart(nil)
	hasDB := false
	for _, e := range elems {
		if w.List != "" && e.Key() == w.List {
			continue
		}
		hasDB = hasDB || e.Key() == "$db"
		b = append(b, e...)
	}
	if w.List != "" {
		docs, err := cmd.Documents(w.List)
		if err != nil {
			return nil, err
		}
		if w.Index < 0 || w.Index >= len(docs) {
			return nil, fmt.Errorf("statement %d of %s is missing", w.Index, w.List)
		}
		b = bsoncore.AppendArrayElement(b, w.List, bsoncore.NewArrayBuilder().AppendDocument(docs[w.Index]).Build())
	}
	if !hasDB {
		b = bsoncore.AppendStringElement(b, "$db", cmd.DB)
	}
	b, err = bsoncore.AppendDocumentEnd(b, idx)
	return b, err
}

// owner is the mirror lock's owner. holderFields and lockDocument:
// the holder value itself (keyed, per namespace), so that whoever names it
// is the holder, as in the scheme. flag: the client identity the rule
// names.
func (sc *Schemes) owner(req *proxy.Request, ns namespace.Namespace, s policy.Scheme, holder bsoncore.Value) (lockstore.Owner, bool) {
	c := req.Client
	o := lockstore.Owner{App: c.AppName(), Client: c.Addr, User: c.User()}
	if !s.IdentityHolder() {
		key := append([]byte("lockgate scheme holder v1\x00"+ns.String()+"\x00"), byte(holder.Type))
		o.Session = sc.cfg.SessionKey("", append(key, holder.Data...))
		return o, true
	}
	if s.Holder == config.SchemeHolderSession {
		if req.Command == nil {
			return o, false
		}
		sid, ok := req.Command.SessionID()
		if !ok {
			return o, false
		}
		return sc.cfg.Owner(req, sid, ""), true
	}
	return sc.client(req), true
}

// client is the client identity of a request (holder: client): its
// application name, host and user, through this proxy.
func (sc *Schemes) client(req *proxy.Request) lockstore.Owner {
	c := req.Client
	o := lockstore.Owner{App: c.AppName(), Client: c.Addr, User: c.User()}
	host := c.Addr
	if a, ok := c.RemoteAddr.(*net.TCPAddr); ok {
		host = a.IP.String()
	} else if h, _, err := net.SplitHostPort(c.Addr); err == nil {
		host = h
	}
	o.Session = sc.cfg.SessionKey(o.User, []byte("lockgate scheme client v1\x00"+o.App+"\x00"+host))
	// One application process is one owner per proxy: two proxies that
	// see the same identity must not both be granted the same flag.
	o.Bind = sc.keys.instanceBind(sc.cfg.Bind)
	return o
}

// mirrorLease is how long the mirror lives after an acquire or renew: as
// long as the document's lock will, by the proxy's clock; a lock that
// ends at once gets a mirror that lasts only for the write.
func mirrorLease(s policy.Scheme, st policy.Step) time.Duration {
	end, ok := lockEnd(s, st)
	if !ok {
		return s.Lease
	}
	return max(time.Until(end), minSchemeLease)
}

// minSchemeLease is the mirror of a write whose lock ends at once: long
// enough for the write in flight.
const minSchemeLease = 200 * time.Millisecond

// lockEnd is when the lock a write sets ends by the document's own time
// (holderFields: its time plus the lease; lockDocument: its expiry); ok is
// false when the write sets no time.
func lockEnd(s policy.Scheme, st policy.Step) (time.Time, bool) {
	switch {
	case s.Type == config.SchemeLockDocument && !st.Expires.IsZero():
		return st.Expires, true
	case s.Type == config.SchemeHolderFields && !st.LockTime.IsZero():
		return st.LockTime.Add(s.Lease), true
	}
	return time.Time{}, false
}

// advice says how a writer follows the scheme.
func advice(s policy.Scheme) string {
	switch s.Type {
	case config.SchemeHolderFields:
		return fmt.Sprintf("take the lock with findOneAndUpdate({_id, $or: [{%[1]s: null}, {%[2]s older than the lease}]}, {$set: {%[1]s: <your id>, %[2]s: now}}, upsert), name %[1]s: <your id> in the filter of every write, and release by setting %[1]s to null", s.HolderPath, s.TimePath)
	case config.SchemeLockDocument:
		return fmt.Sprintf("take the lock by setting %s (with %s) where there is none or it has expired, name %s: <you> in the filter of every write, and release by clearing %s", s.HolderPath, s.ExpiresPath, s.HolderPath, s.LockPath)
	case config.SchemeLockCollection:
		return fmt.Sprintf("take the lock by inserting {_id: <document _id>, %s, %s} into %s from this client (DuplicateKey: busy), write, then delete that record", s.TsPath, s.AidPath, lockCollName(s))
	case config.SchemeFlag:
		return fmt.Sprintf("take the lock with updateOne({_id, %[1]s: false}, {$set: {%[1]s: true}}) from this client, write, then set %[1]s back to false", s.LockPath)
	}
	return "follow the namespace's locking scheme"
}

// insert refuses, under inserts: requireUnlocked, an insert of an
// _id whose scheme lock someone else holds (lock, then create): as for
// lockgate's own locks, with no lock store read where no lock is held in
// the namespace.
func (sc *Schemes) insert(ctx context.Context, v *Verdict, req *proxy.Request, r policy.Rule, w policy.Write) {
	if r.Inserts != policy.InsertsRequireUnlocked {
		return
	}
	id, found, certain := policy.InsertID(w)
	if !certain {
		v.add(r, w, refuse.ReasonUnclassifiable, nil, "the inserted document's _id cannot be told with certainty (it appears twice)")
		return
	}
	if !found {
		return
	}
	if id, found = r.Scheme.MirrorID(id); !found {
		return // no lock record can name it
	}
	mns := r.Scheme.MirrorNS(w.NS)
	if h, ok := sc.cfg.Store.(interface {
		MayHoldLocks(ns namespace.Namespace) bool
	}); ok && !h.MayHoldLocks(mns) {
		return
	}
	var o lockstore.Owner
	if r.Scheme.IdentityHolder() {
		o, _ = sc.owner(req, w.NS, r.Scheme, bsoncore.Value{})
	}
	if o.Session == nil {
		o.Session = make([]byte, 16) // nobody: a holder-field insert names no holder
	}
	did, err := idCopy(id)
	if err != nil {
		return // no lock can be held on it; the database refuses it
	}
	ids := []docid.ID{did}
	sts, err := sc.cfg.Confirmed(ctx, o, mns, ids)
	if err != nil {
		v.Violations = append(v.Violations, Violation{Rule: r, Write: w, Reason: refuse.ReasonUnavailable,
			Detail: fmt.Sprintf("the lock store cannot confirm that the inserted _id is unlocked (%v)", err)})
		return
	}
	if len(sts) == 1 && sts[0].Held && !sts[0].HeldByYou {
		h := sts[0].Holder
		v.name(w.NS, did)
		v.Violations = append(v.Violations, Violation{Rule: r, Write: w, Reason: refuse.ReasonInsertLocked, IDs: ids, Holder: &h,
			Detail: fmt.Sprintf("another holder has locked _id %s under the %s locking scheme, and this insert would create it (%s)", ids[0].String(), r.Scheme.Type, refuse.DescribeHolder(h))})
	}
}

// ownHolding reports whether this proxy saw the request's client take the
// lockDocument lock on ids[0], with the holder value st sets (if any).
func (sc *Schemes) ownHolding(req *proxy.Request, r policy.Rule, w policy.Write, st policy.Step, ids []docid.ID) bool {
	if r.Scheme.Type != config.SchemeLockDocument || len(ids) != 1 {
		return false
	}
	h, known := sc.keys.holdings().Get(docid.KeyOf(r.Scheme.MirrorNS(w.NS), ids[0]))
	return known && h.sameIdentity(sc.client(req)) && (st.Kind != policy.StepAcquire || sameHolder(h.holder, st.Holder))
}
