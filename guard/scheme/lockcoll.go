package scheme

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.uber.org/zap"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/lockgate/lockgate/wire"
)

// A lockCollection record is a small state machine whose state is the
// mirror lock (lock collection namespace, record _id) in the lock store:
// free, held by a client identity, or adopted (a live record lockgate
// did not see inserted: nobody's, until the record's own end). Each write
// to the lock collection is decided from that state, after adopting a
// live record found in the collection, and the mirror follows what the
// database shows it did, record by record.

// recordExists is the database's reply to an acquire of a lock record
// that exists: DuplicateKey for an insert; "matched, not inserted" for an
// upsert; the existing record for a findAndModify upsert (rec).
func recordExists(w policy.Write, st policy.Step, rec bsoncore.Document) bsoncore.Document {
	idx, d := bsoncore.AppendDocumentStart(nil)
	switch w.Kind {
	case policy.KindInsert:
		errmsg := fmt.Sprintf("E11000 duplicate key error collection: %s index: _id_ dup key: { _id: %s }", w.NS, docid.Format(bson.RawValue{Type: st.ID.Type, Value: st.ID.Data}))
		we := (&mongoerr.Error{Code: mongoerr.DuplicateKey, Msg: errmsg}).WriteError(w.Index)
		d = bsoncore.AppendInt32Element(d, "n", 0)
		d = bsoncore.AppendArrayElement(d, "writeErrors", bsoncore.NewArrayBuilder().AppendDocument(we).Build())
	case policy.KindFindAndModify:
		d = bsoncore.AppendDocumentElement(d, "lastErrorObject", bsoncore.NewDocumentBuilder().
			AppendInt32("n", 1).AppendBoolean("updatedExisting", true).Build())
		d = bsoncore.AppendDocumentElement(d, "value", rec)
	default:
		d = bsoncore.AppendInt32Element(d, "n", 1)
		d = bsoncore.AppendInt32Element(d, "nModified", 0)
	}
	d = bsoncore.AppendDoubleElement(d, "ok", 1)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

func lockCollName(s policy.Scheme) string {
	if s.LockColl != "" {
		return s.LockColl
	}
	return "<collection>.lock"
}

// lockCollPlan decides a write to a lock collection that follows the
// scheme (st is not StepOther): an acquire or a release is returned as
// the one operation the proxy runs itself; a refresh is checked here and
// forwarded.
func (sc *Schemes) lockCollPlan(ctx context.Context, v *Verdict, req *proxy.Request, r policy.Rule, w policy.Write, st policy.Step, ids []docid.ID) (schemeOp, bool) {
	o, ok := sc.owner(req, w.NS, r.Scheme, st.Holder)
	if !ok {
		v.add(r, w, refuse.ReasonNoSession, ids, "the scheme's holder is the logical session (holder: session), and the command carries none; run it in an explicit session")
		return schemeOp{}, false
	}
	op := schemeOp{rule: r, write: w, step: st, owner: o}
	if st.Kind == policy.StepAcquire || st.Ends {
		return op, true
	}
	// A refresh: the holder's alone, renewing the mirror to the record's
	// new end before the database moves it.
	store := sc.cfg.Store
	held, _, err := store.Holds(ctx, o, w.NS, ids, 0)
	if err != nil {
		v.Violations = append(v.Violations, Violation{Rule: r, Write: w, Reason: refuse.ReasonUnavailable,
			Detail: fmt.Sprintf("the lock store cannot confirm the scheme lock (%v), so the write is refused (fail closed)", err)})
		return schemeOp{}, false
	}
	if !held {
		v.add(r, w, ReasonNotHolder, ids, fmt.Sprintf("under the lockCollection locking scheme of %s this client does not hold the lock record %s (or its lease of %s ran out); %s", w.NS, ids[0].String(), lockstore.FormatMS(r.Scheme.Lease), advice(r.Scheme)))
		return schemeOp{}, false
	}
	v.check(w.NS, ids)
	v.state(StateHeld)
	if st.Renew {
		lease := recordLease(r.Scheme, st)
		_, err = store.Renew(ctx, o, w.NS, ids, lease)
		if err == nil {
			sc.renewAid(ctx, req, op, lease)
		}
		switch {
		case errors.Is(err, lockstore.ErrInvalidLease):
			v.add(r, w, ReasonNotFollowed, ids, fmt.Sprintf("it refreshes the lock record %s of %s to an end lockgate cannot mirror (%v); %s", ids[0].String(), w.NS, err, advice(r.Scheme)))
		case err != nil:
			v.Violations = append(v.Violations, Violation{Rule: r, Write: w, Reason: refuse.ReasonUnavailable,
				Detail: fmt.Sprintf("the lock store cannot renew the scheme lock (%v), so the write is refused (fail closed)", err)})
		}
	}
	return schemeOp{}, false
}

// recordLease is how long the mirror of a record an acquire or refresh
// writes lives: until the record's end (st.Expires: its expiry, or its
// time plus the lease), and for a refresh time at least the lease from
// now (the record's time was taken before the write reached lockgate). A
// record that would end further ahead than the lock store's maximum lease
// cannot be mirrored: the store refuses the lease, and the write is
// refused, rather than leaving a record that nobody could take over for
// as long.
func recordLease(s policy.Scheme, st policy.Step) time.Duration {
	if st.Expires.IsZero() {
		return s.Lease // $currentDate: the server's now
	}
	d := time.Until(st.Expires)
	if s.ExpiresPath == "" {
		d = max(d, s.Lease)
	}
	// Nearly over, or a refresh to an end already past (an acquire of
	// an ended ExpireAt is refused): the mirror still covers the write in
	// flight.
	return max(d, time.Second)
}

// lockCollRun runs an acquire or a release of lock records on the
// client's own upstream connection, deciding from the mirror and the
// record as the database has it, and answers with the database's reply.
func (sc *Schemes) lockCollRun(ctx context.Context, req *proxy.Request, pol *policy.Policy, v *Verdict, op schemeOp, start time.Time) proxy.Decision {
	switch {
	case op.step.ReleaseAll:
		return sc.lockCollReleaseAll(ctx, req, pol, v, op, start)
	case op.step.Kind == policy.StepAcquire:
		return sc.lockCollAcquire(ctx, req, pol, v, op, start)
	default:
		return sc.lockCollRelease(ctx, req, pol, v, op, start)
	}
}

// lockCollAcquire takes a lock record: the mirror first (the lock store
// decides between contenders atomically), then the record as the database
// has it: a live record is adopted and the acquire is busy; an abandoned
// one (not refreshed for the lease, or past its expiry) is removed, as a
// TTL index would have removed it; then the acquire runs, an upsert
// forwarded so that it can only insert. The mirror stays only if the
// database shows the record inserted.
func (sc *Schemes) lockCollAcquire(ctx context.Context, req *proxy.Request, pol *policy.Policy, v *Verdict, op schemeOp, start time.Time) proxy.Decision {
	w, st, r := op.write, op.step, op.rule
	s := r.Scheme
	id, err := idCopy(st.ID)
	if err != nil {
		v.add(r, w, refuse.ReasonUnclassifiable, nil, fmt.Sprintf("the lock's _id cannot be a document's _id (%v)", err))
		return sc.cfg.Decide(req, pol, v, start)
	}
	ids := []docid.ID{id}
	unlock := sc.keys.lock(docid.KeyOf(w.NS, id))
	defer unlock()
	store := sc.cfg.Store
	// Audit forwards every write unchanged: no insert-only condition, no
	// removal of abandoned records; the decisions and the mirror are the
	// same.
	enforce := r.Mode == policy.Enforce
	body, err := statementBody(req.Command, w)
	if err == nil && w.Upsert && enforce {
		body, err = insertOnly(body, w)
	}
	if err != nil {
		v.add(r, w, refuse.ReasonUnclassifiable, ids, fmt.Sprintf("the proxy cannot run its lockCollection step on its own (%v)", err))
		return sc.cfg.Decide(req, pol, v, start)
	}
	unavailable := func(err error) proxy.Decision {
		v.Violations = append(v.Violations, Violation{Rule: r, Write: w, Reason: refuse.ReasonUnavailable, IDs: ids,
			Detail: fmt.Sprintf("the lock store cannot take the scheme lock (%v); nothing was written", err)})
		return sc.cfg.Decide(req, pol, v, start)
	}
	if s.ExpiresPath != "" && !st.Expires.After(time.Now()) {
		// A TTL index would delete it at once: a lock of nothing. (A ts
		// older than the lease is not refused: the client took it before
		// the write reached lockgate, by as long as the write waited; but
		// such a record is abandoned by the scheme's own rule once it
		// lands, so it keeps no mirror, below.)
		v.add(r, w, ReasonNotFollowed, ids, fmt.Sprintf("its record's %s is already past, so it would lock nothing: a TTL index deletes it at once; %s", s.ExpiresPath, advice(s)))
		return sc.cfg.Decide(req, pol, v, start)
	}
	lease := recordLease(s, st)
	// A ts already older than the lease: the record is abandoned as soon
	// as it lands. Its mirror covers the write in flight only, and is
	// dropped with the answer, so that the scheme's next acquire finds a
	// record it may take over, not a lock of nothing (the holderFields
	// form of this is TestRegressAcquireExpiredAtOnce).
	deadOnArrival := s.ExpiresPath == "" && !st.Expires.IsZero() && !st.Expires.After(time.Now())
	if deadOnArrival {
		lease = time.Second
	}
	// A second record from the holder of the first: the database says
	// DuplicateKey, and must, though its test-and-set may not be atomic.
	mine, _, err := store.Holds(ctx, op.owner, w.NS, ids, 0)
	if err != nil {
		return unavailable(err)
	}
	if mine {
		return sc.lockCollBusy(ctx, req, pol, v, op, nil, start)
	}
	if st.Holder.Type != 0 && !sc.bindAid(ctx, v, op, lease) {
		return sc.cfg.Decide(req, pol, v, start)
	}
	if _, err := store.Acquire(ctx, op.owner, w.NS, ids, lease, 0); err != nil {
		switch {
		case errors.Is(err, lockstore.ErrBusy):
			return sc.lockCollBusy(ctx, req, pol, v, op, nil, start)
		case errors.Is(err, lockstore.ErrInvalidLease):
			v.add(r, w, ReasonNotFollowed, ids, fmt.Sprintf("its record's %s is further ahead than lockgate can mirror a lock (%v); %s", s.TsPath+s.ExpiresPath, err, advice(s)))
			return sc.cfg.Decide(req, pol, v, start)
		}
		return unavailable(err)
	}
	drop := func() {
		if _, err := store.Release(ctx, op.owner, w.NS, ids, ""); err != nil {
			sc.cfg.Log.Warn("scheme lock release after a failed acquire failed; it expires with its lease", zap.String("ns", w.NS.String()), zap.Error(err))
		}
	}
	rec, failed, err := sc.findRecord(ctx, req, w.NS, st.ID, nil)
	if err != nil {
		drop()
		return proxy.Decision{Action: proxy.Close, Reason: "scheme acquire: " + err.Error()}
	}
	if failed != nil {
		drop()
		sc.cfg.Record(req, pol, v, nil, time.Since(start))
		return proxy.Decision{Action: proxy.Reply, Reply: failed}
	}
	if rec != nil {
		end, ok := s.RecordExpiry(rec)
		switch {
		case !ok:
			drop()
			v.add(r, w, ReasonNotFollowed, ids, fmt.Sprintf("the lock record %s of %s has no %s date, so nobody can tell when it ends and no TTL index frees it; remove it by hand", id.String(), w.NS, s.TsPath+s.ExpiresPath))
			return sc.cfg.Decide(req, pol, v, start)
		case end.After(time.Now()):
			drop()
			if why := sc.adopt(ctx, req, w.NS, s, id, end); why != "" {
				v.add(r, w, ReasonNotFollowed, ids, fmt.Sprintf("the lock record %s of %s %s", id.String(), w.NS, why))
				return sc.cfg.Decide(req, pol, v, start)
			}
			return sc.lockCollBusy(ctx, req, pol, v, op, rec, start)
		}
		// Abandoned: remove it as the TTL monitor would, only as read.
		v.state(StateTakeover)
		if enforce {
			if failed, err := sc.removeRecord(ctx, req, w.NS, s, rec); err != nil || failed != nil {
				drop()
				if err != nil {
					return proxy.Decision{Action: proxy.Close, Reason: "scheme acquire: " + err.Error()}
				}
				sc.cfg.Record(req, pol, v, nil, time.Since(start))
				return proxy.Decision{Action: proxy.Reply, Reply: failed}
			}
		}
	}
	if rec == nil {
		v.state(StateFree)
	}
	reply, err := req.Ask(ctx, body)
	if err != nil {
		// Unknown outcome: the mirror stays and expires with its lease.
		return proxy.Decision{Action: proxy.Close, Reason: "scheme acquire: " + err.Error()}
	}
	if inserted(reply, w, st.ID) && !deadOnArrival {
		v.check(w.NS, ids)
	} else {
		drop()
	}
	sc.cfg.Record(req, pol, v, nil, time.Since(start))
	return proxy.Decision{Action: proxy.Reply, Reply: reply}
}

// lockCollBusy answers an acquire of a record that exists with the
// database's own answer (recordExists); a findAndModify gets the record
// (rec, read now if nil). Audited namespaces forward the write.
func (sc *Schemes) lockCollBusy(ctx context.Context, req *proxy.Request, pol *policy.Policy, v *Verdict, op schemeOp, rec bsoncore.Document, start time.Time) proxy.Decision {
	w, r := op.write, op.rule
	v.state(StateBusy)
	if r.Mode != policy.Enforce {
		sc.cfg.Record(req, pol, v, nil, time.Since(start))
		return proxy.Decision{Action: proxy.Forward}
	}
	if w.Kind == policy.KindFindAndModify && rec == nil {
		var fields bsoncore.Document
		if req.Command != nil {
			fields, _ = req.Command.Body.Lookup("fields").DocumentOK()
		}
		got, failed, err := sc.findRecord(ctx, req, w.NS, op.step.ID, fields)
		switch {
		case err != nil:
			return proxy.Decision{Action: proxy.Close, Reason: "scheme acquire: " + err.Error()}
		case failed != nil:
			sc.cfg.Record(req, pol, v, nil, time.Since(start))
			return proxy.Decision{Action: proxy.Reply, Reply: failed}
		case got == nil:
			// Held, but its record is not there (yet, or any more: the
			// holder's acquire or release is in flight). The database's
			// answer to an upsert racing another's insert of the same
			// _id is DuplicateKey, which callers handle as busy.
			sc.cfg.Record(req, pol, v, nil, time.Since(start))
			return proxy.Decision{Action: proxy.Reply, Reply: noMatch(w, op.step, true)}
		}
		rec = got
	}
	sc.cfg.Record(req, pol, v, nil, time.Since(start))
	return proxy.Decision{Action: proxy.Reply, Reply: recordExists(w, op.step, rec)}
}

// findRecord reads one lock record by _id on the client's connection
// (with its authority), projected by fields if given. failed is the
// database's error reply.
func (sc *Schemes) findRecord(ctx context.Context, req *proxy.Request, ns namespace.Namespace, id bsoncore.Value, fields bsoncore.Document) (rec, failed bsoncore.Document, err error) {
	recs, failed, err := sc.findRecords(ctx, req, ns, bsoncore.NewDocumentBuilder().AppendValue("_id", id).Build(), fields, 1)
	if err != nil || failed != nil || len(recs) == 0 {
		return nil, failed, err
	}
	return recs[0], nil, nil
}

// findRecords reads up to limit lock records matching filter.
func (sc *Schemes) findRecords(ctx context.Context, req *proxy.Request, ns namespace.Namespace, filter, projection bsoncore.Document, limit int) (recs []bsoncore.Document, failed bsoncore.Document, err error) {
	db, coll := ns.Parts()
	b := bsoncore.NewDocumentBuilder().AppendString("find", coll).AppendDocument("filter", filter)
	if projection != nil {
		b = b.AppendDocument("projection", projection)
	}
	find := b.AppendInt32("limit", int32(limit)).AppendBoolean("singleBatch", true).AppendString("$db", db).Build()
	found, err := req.Ask(ctx, find)
	if err != nil {
		return nil, nil, err
	}
	if ok, _ := found.Lookup("ok").AsInt64OK(); ok != 1 {
		return nil, found, nil
	}
	batch, _ := found.Lookup("cursor", "firstBatch").ArrayOK()
	vals, _ := batch.Values()
	for _, d := range vals {
		if doc, ok := d.DocumentOK(); ok {
			recs = append(recs, doc)
		}
	}
	return recs, nil, nil
}

// removeRecord deletes an abandoned record as it was read (same _id,
// same time field), as the TTL monitor would.
func (sc *Schemes) removeRecord(ctx context.Context, req *proxy.Request, ns namespace.Namespace, s policy.Scheme, rec bsoncore.Document) (failed bsoncore.Document, err error) {
	db, coll := ns.Parts()
	field := s.TsPath + s.ExpiresPath
	q := bsoncore.NewDocumentBuilder().AppendValue("_id", rec.Lookup("_id")).AppendValue(field, rec.Lookup(field)).Build()
	del := bsoncore.NewDocumentBuilder().AppendString("delete", coll).
		AppendArray("deletes", bsoncore.NewArrayBuilder().AppendDocument(bsoncore.NewDocumentBuilder().
			AppendDocument("q", q).AppendInt32("limit", 1).Build()).Build()).
		AppendString("$db", db).Build()
	reply, err := req.Ask(ctx, del)
	if err != nil {
		return nil, err
	}
	if ok, _ := reply.Lookup("ok").AsInt64OK(); ok != 1 {
		return reply, nil
	}
	if _, err := reply.LookupErr("writeErrors"); err == nil {
		return reply, nil
	}
	return nil, nil
}

// adoptedOwner holds the mirrors of live records lockgate did not see
// inserted: no client is it, so nobody writes under such a record until
// it ends.
func (sc *Schemes) adoptedOwner(ns namespace.Namespace) lockstore.Owner {
	return lockstore.Owner{App: "(a record found in the lock collection)",
		Session: sc.cfg.SessionKey("", []byte("lockgate scheme adopted record v1\x00"+ns.String()))}
}

// adopt mirrors a live record nobody holds until its end; why says why
// it cannot be. The record was read before its mirror was taken, so its
// holder may have deleted it and freed the mirror in between (through
// another proxy): adopted then, it would be a lock of nothing until the
// deleted record's end. So the adoption stands only if the record is
// still there as read once the adoption holds the mirror, from when on
// nobody inserts or deletes it through lockgate.
func (sc *Schemes) adopt(ctx context.Context, req *proxy.Request, ns namespace.Namespace, s policy.Scheme, id docid.ID, end time.Time) string {
	if h := sc.Test; h != nil && h.BeforeAdopt != nil {
		h.BeforeAdopt(ns, id)
	}
	o := sc.adoptedOwner(ns)
	ids := []docid.ID{id}
	_, err := sc.cfg.Store.Acquire(ctx, o, ns, ids, time.Until(end), 0)
	switch {
	case errors.Is(err, lockstore.ErrBusy):
		// Someone holds it already, which is as strict.
		return ""
	case errors.Is(err, lockstore.ErrInvalidLease):
		return fmt.Sprintf("lives until %s, longer than lockgate can mirror a lock (%v); remove it by hand", end.UTC().Format(time.RFC3339), err)
	case err != nil:
		return fmt.Sprintf("cannot be mirrored (%v)", err)
	}
	rec, failed, err := sc.findRecord(ctx, req, ns, id.Core(), nil)
	if err == nil && failed == nil && rec != nil {
		if now, ok := s.RecordExpiry(rec); ok && now.Equal(end) {
			return ""
		}
	}
	// Gone or changed since it was read (or unreadable now): nothing is
	// adopted; the next write that finds a live record adopts that one.
	if _, err := sc.cfg.Store.Release(ctx, o, ns, ids, ""); err != nil {
		sc.cfg.Log.Warn("releasing the mirror of a lock record that was gone when adopted failed; it expires with the record's end",
			zap.String("ns", ns.String()), zap.Error(err))
	}
	return ""
}

// aidNS is where the binding of holder ids to clients lives: a lock per
// holder id value, owned by the client that inserted a record with it.
func aidNS(ns namespace.Namespace, s policy.Scheme) namespace.Namespace {
	return namespace.Of(ns.String() + "#" + s.AidPath)
}

// bindAid binds the acquire's holder id to its client for the record's
// lease (re-entrant: each acquire or refresh carrying it extends it), or
// refuses the acquire if another client's records carry it: a record
// with it would be someone else's lock under another's name (and would
// stand in that client's release of all its records). The binding is
// taken before the record, atomically, so two clients racing with one
// holder id cannot both pass.
func (sc *Schemes) bindAid(ctx context.Context, v *Verdict, op schemeOp, lease time.Duration) bool {
	w, r := op.write, op.rule
	aid, err := idCopy(op.step.Holder)
	if err != nil {
		v.add(r, w, ReasonNotFollowed, nil, fmt.Sprintf("its record's %s cannot be bound to a client (%v); use a string", r.Scheme.AidPath, err))
		return false
	}
	err = sc.extendAid(ctx, op.owner, aidNS(w.NS, r.Scheme), aid, lease)
	var held *lockstore.HeldError
	switch {
	case err == nil:
		return true
	case errors.As(err, &held):
		h := held.Holder
		v.Violations = append(v.Violations, Violation{Rule: r, Write: w, Reason: ReasonNotHolder, Holder: &h,
			Detail: fmt.Sprintf("under the lockCollection locking scheme of %s the %s %s belongs to another client (%s); insert records with your own %s", w.NS, r.Scheme.AidPath, aid.String(), refuse.DescribeHolder(h), r.Scheme.AidPath)})
	default:
		v.Violations = append(v.Violations, Violation{Rule: r, Write: w, Reason: refuse.ReasonUnavailable,
			Detail: fmt.Sprintf("the lock store cannot bind the record's %s (%v), so the write is refused (fail closed)", r.Scheme.AidPath, err)})
	}
	return false
}

// renewAid extends the binding of the refreshed record's holder id to
// its client, so that it lasts as long as the client keeps the record.
func (sc *Schemes) renewAid(ctx context.Context, req *proxy.Request, op schemeOp, lease time.Duration) {
	proj := bsoncore.NewDocumentBuilder().AppendInt32(op.rule.Scheme.AidPath, 1).Build()
	rec, _, err := sc.findRecord(ctx, req, op.write.NS, op.step.ID, proj)
	if err != nil || rec == nil {
		return
	}
	aid, err := rec.LookupErr(op.rule.Scheme.AidPath)
	if err != nil || aid.Type == bson.TypeNull {
		return
	}
	if id, err := idCopy(aid); err == nil {
		// Busy: another client's binding from after this client's ended.
		sc.extendAid(ctx, op.owner, aidNS(op.write.NS, op.rule.Scheme), id, lease)
	}
}

// extendAid makes the binding of aid to owner outlast a record that ends
// lease from now: taken for two leases (one if the store's maximum is
// shorter), and written only when less than a lease is left (Holds
// answers from the cache), so that repeated acquires cost no lock store
// write and a binding is never shortened.
func (sc *Schemes) extendAid(ctx context.Context, owner lockstore.Owner, bns namespace.Namespace, aid docid.ID, lease time.Duration) error {
	ids := []docid.ID{aid}
	if mine, _, err := sc.cfg.Store.Holds(ctx, owner, bns, ids, lease); err == nil && mine {
		return nil
	}
	_, err := sc.cfg.Store.Acquire(ctx, owner, bns, ids, 2*lease, 0)
	if errors.Is(err, lockstore.ErrInvalidLease) {
		_, err = sc.cfg.Store.Acquire(ctx, owner, bns, ids, lease, 0)
	}
	return err
}

// inserted reads the reply to an acquire: did the database insert the
// record of _id id? A modified count is no insert, nor is an upsert that
// inserted another _id.
func inserted(reply bsoncore.Document, w policy.Write, id bsoncore.Value) bool {
	if ok, _ := reply.Lookup("ok").AsInt64OK(); ok != 1 {
		return false
	}
	if _, err := reply.LookupErr("writeErrors"); err == nil {
		return false
	}
	same := func(v bsoncore.Value) bool { return docid.Same(v, id) }
	switch w.Kind {
	case policy.KindInsert:
		n, ok := reply.Lookup("n").AsInt64OK()
		return ok && n > 0
	case policy.KindFindAndModify:
		up, err := reply.LookupErr("lastErrorObject", "upserted")
		return err == nil && same(up)
	}
	up, ok := reply.Lookup("upserted").ArrayOK()
	if !ok {
		return false
	}
	vals, _ := up.Values()
	if len(vals) != 1 {
		return false
	}
	d, ok := vals[0].DocumentOK()
	return ok && same(d.Lookup("_id"))
}

// insertOnly rewrites an upsert's one-statement command so that its
// filter matches no record: the server then inserts, or answers
// DuplicateKey where the record exists, and never writes on an existing
// record. The _id equality stays at the top level, where every server
// copies it into the inserted record.
func insertOnly(body bsoncore.Document, w policy.Write) (bsoncore.Document, error) {
	never := bsoncore.NewArrayBuilder().AppendDocument(bsoncore.NewDocumentBuilder().
		AppendDocument("_id", bsoncore.NewDocumentBuilder().AppendBoolean("$exists", false).Build()).Build()).Build()
	withNever := func(f bsoncore.Document) (bsoncore.Document, error) {
		elems, err := f.Elements()
		if err != nil {
			return nil, err
		}
		idx, d := bsoncore.AppendDocumentStart(nil)
		for _, e := range elems {
			if e.Key() == "$and" {
				return nil, errors.New("an upsert filter with $and")
			}
			d = append(d, e...)
		}
		d = bsoncore.AppendArrayElement(d, "$and", never)
		return bsoncore.AppendDocumentEnd(d, idx)
	}
	return rewriteFilter(body, w, withNever)
}

// rewriteFilter replaces the filter of the one statement of body.
func rewriteFilter(body bsoncore.Document, w policy.Write, f func(bsoncore.Document) (bsoncore.Document, error)) (bsoncore.Document, error) {
	elems, err := body.Elements()
	if err != nil {
		return nil, err
	}
	idx, out := bsoncore.AppendDocumentStart(nil)
	done := false
	for _, e := range elems {
		switch {
		case w.Kind == policy.KindFindAndModify && e.Key() == w.FilterKey:
			q, ok := e.Value().DocumentOK()
			if !ok {
				return nil, errors.New("findAndModify query is not a document")
			}
			nq, err := f(q)
			if err != nil {
				return nil, err
			}
			out = bsoncore.AppendDocumentElement(out, e.Key(), nq)
			done = true
		case (w.Kind == policy.KindUpdate || w.Kind == policy.KindDelete) && e.Key() == w.List:
			arr, ok := e.Value().ArrayOK()
			vals, _ := arr.Values()
			if !ok || len(vals) != 1 {
				return nil, errors.New("not a one-statement write")
			}
			stmt, _ := vals[0].DocumentOK()
			se, err := stmt.Elements()
			if err != nil {
				return nil, err
			}
			sidx, ns := bsoncore.AppendDocumentStart(nil)
			for _, x := range se {
				if x.Key() != w.FilterKey {
					ns = append(ns, x...)
					continue
				}
				q, ok := x.Value().DocumentOK()
				if !ok {
					return nil, errors.New("filter is not a document")
				}
				nq, err := f(q)
				if err != nil {
					return nil, err
				}
				ns = bsoncore.AppendDocumentElement(ns, x.Key(), nq)
				done = true
			}
			ns, _ = bsoncore.AppendDocumentEnd(ns, sidx)
			out = bsoncore.AppendArrayElement(out, e.Key(), bsoncore.NewArrayBuilder().AppendDocument(ns).Build())
		default:
			out = append(out, e...)
		}
	}
	if !done {
		return nil, errors.New("its filter was not found")
	}
	return bsoncore.AppendDocumentEnd(out, idx)
}

// lockCollRelease runs a delete of one record by _id. The holder's
// delete releases its record; anyone's may remove an abandoned record
// (what a TTL index deletes), under a mirror taken for the delete; a live
// record of another, or one lockgate did not see inserted (adopted), is
// refused. The mirror is dropped only if the record is gone afterwards.
func (sc *Schemes) lockCollRelease(ctx context.Context, req *proxy.Request, pol *policy.Policy, v *Verdict, op schemeOp, start time.Time) proxy.Decision {
	w, st, r := op.write, op.step, op.rule
	s := r.Scheme
	id, err := idCopy(st.ID)
	if err != nil {
		v.add(r, w, refuse.ReasonUnclassifiable, nil, fmt.Sprintf("the lock's _id cannot be a document's _id (%v)", err))
		return sc.cfg.Decide(req, pol, v, start)
	}
	ids := []docid.ID{id}
	unlock := sc.keys.lock(docid.KeyOf(w.NS, id))
	defer unlock()
	store := sc.cfg.Store
	body, err := statementBody(req.Command, w)
	if err != nil {
		v.add(r, w, refuse.ReasonUnclassifiable, ids, fmt.Sprintf("the proxy cannot run its lockCollection step on its own (%v)", err))
		return sc.cfg.Decide(req, pol, v, start)
	}
	unavailable := func(err error) proxy.Decision {
		v.Violations = append(v.Violations, Violation{Rule: r, Write: w, Reason: refuse.ReasonUnavailable, IDs: ids,
			Detail: fmt.Sprintf("the lock store cannot confirm the scheme lock (%v), so the write is refused (fail closed)", err)})
		return sc.cfg.Decide(req, pol, v, start)
	}
	notHolder := func(h *lockstore.Holder, why string) proxy.Decision {
		v.Violations = append(v.Violations, Violation{Rule: r, Write: w, Reason: ReasonNotHolder, IDs: ids, Holder: h,
			Detail: fmt.Sprintf("under the lockCollection locking scheme of %s %s; %s", w.NS, why, advice(s))})
		return sc.cfg.Decide(req, pol, v, start)
	}
	enforce := r.Mode == policy.Enforce
	// The holder's delete is pinned to its record as read before the
	// mirror is checked: a mirror that is this client's after the read
	// was this client's all along, so nobody else's acquire ran in
	// between and the record read is the one this client keeps. Sent by
	// _id alone, a delete that reaches the database after the lease ran
	// out (a loaded machine, a late release) removed the record a
	// successor had taken over meanwhile (TestHolderDeleteAfterItsLeaseEnded).
	var own bsoncore.Document
	if enforce {
		var failed bsoncore.Document
		own, failed, err = sc.findRecord(ctx, req, w.NS, st.ID, nil)
		switch {
		case err != nil:
			return proxy.Decision{Action: proxy.Close, Reason: "scheme release: " + err.Error()}
		case failed != nil:
			sc.cfg.Record(req, pol, v, nil, time.Since(start))
			return proxy.Decision{Action: proxy.Reply, Reply: failed}
		}
	}
	held, _, err := store.Holds(ctx, op.owner, w.NS, ids, 0)
	if err != nil {
		return unavailable(err)
	}
	if held {
		v.state(StateHeld)
	}
	if held && enforce {
		if body, err = asRead(body, w, s, own); err != nil {
			v.add(r, w, refuse.ReasonUnclassifiable, ids, fmt.Sprintf("the proxy could not restrict it to the lock record as read (%v)", err))
			return sc.cfg.Decide(req, pol, v, start)
		}
	}
	if !held {
		sts, err := sc.cfg.Confirmed(ctx, op.owner, w.NS, ids)
		if err != nil || len(sts) != 1 {
			return unavailable(err)
		}
		if sts[0].Held {
			h := sts[0].Holder
			return notHolder(&h, fmt.Sprintf("the lock record %s belongs to another holder (%s)", id.String(), refuse.DescribeHolder(h)))
		}
		if h := sc.Test; h != nil && h.BeforeRead != nil {
			h.BeforeRead(w.NS, id)
		}
		rec, failed, err := sc.findRecord(ctx, req, w.NS, st.ID, nil)
		switch {
		case err != nil:
			return proxy.Decision{Action: proxy.Close, Reason: "scheme release: " + err.Error()}
		case failed != nil:
			sc.cfg.Record(req, pol, v, nil, time.Since(start))
			return proxy.Decision{Action: proxy.Reply, Reply: failed}
		}
		if rec != nil {
			end, ok := s.RecordExpiry(rec)
			if !ok || end.After(time.Now()) {
				if ok {
					sc.adopt(ctx, req, w.NS, s, id, end)
				}
				return notHolder(nil, fmt.Sprintf("the lock record %s is live and this client did not insert it (through lockgate)", id.String()))
			}
		}
		// Abandoned or absent: removed under a mirror taken for this
		// delete, so that no acquire runs meanwhile, and only as read:
		// the mirror is short, and a delete that reaches the database
		// after it lapsed (a loaded machine) would otherwise remove a
		// record acquired in between (TestNonHolderDeleteAfterItsMirrorLapsed).
		// Audit forwards the write unchanged, as for an acquire.
		if rec == nil {
			v.state(StateAbsent)
		} else {
			v.state(StateAbandoned)
		}
		if enforce {
			body, err = asRead(body, w, s, rec)
			if err != nil {
				v.add(r, w, refuse.ReasonUnclassifiable, ids, fmt.Sprintf("the proxy could not restrict it to the lock record as read (%v)", err))
				return sc.cfg.Decide(req, pol, v, start)
			}
		}
		short := max(r.LeaseMargin, 100*time.Millisecond)
		if _, err := store.Acquire(ctx, op.owner, w.NS, ids, short, 0); err != nil {
			if errors.Is(err, lockstore.ErrBusy) {
				return notHolder(nil, fmt.Sprintf("the lock record %s has just been taken by another holder", id.String()))
			}
			return unavailable(err)
		}
	}
	if h := sc.Test; h != nil && h.BeforeDelete != nil {
		h.BeforeDelete(w.NS, id)
	}
	reply, err := req.Ask(ctx, body)
	if err != nil {
		// Whether it was deleted is unknown: the mirror stays and
		// expires with its lease; the driver sees a network error.
		return proxy.Decision{Action: proxy.Close, Reason: "scheme release: " + err.Error()}
	}
	gone := deletedCount(reply, w) > 0
	if !gone {
		// Nothing deleted: frees the mirror only if there is no record.
		rec, failed, err := sc.findRecord(ctx, req, w.NS, st.ID, bsoncore.NewDocumentBuilder().AppendInt32("_id", 1).Build())
		gone = err == nil && failed == nil && rec == nil
	}
	if gone {
		if _, err := store.Release(ctx, op.owner, w.NS, ids, ""); err != nil {
			sc.cfg.Log.Warn("scheme lock release failed; it expires with its lease", zap.String("ns", w.NS.String()), zap.Error(err))
		}
	}
	v.check(w.NS, ids)
	sc.cfg.Record(req, pol, v, nil, time.Since(start))
	return proxy.Decision{Action: proxy.Reply, Reply: reply}
}

// asRead narrows a delete of one record (body, with its one statement)
// to the record as it was read, as removeRecord deletes: the same time
// field (rec), or, where there was no record (rec nil), none.
func asRead(body bsoncore.Document, w policy.Write, s policy.Scheme, rec bsoncore.Document) (bsoncore.Document, error) {
	var pin bsoncore.Document
	if rec == nil {
		pin = bsoncore.NewDocumentBuilder().AppendDocument("_id", bsoncore.NewDocumentBuilder().
			AppendBoolean("$exists", false).Build()).Build()
	} else {
		pin = timeAsRead(s, rec)
	}
	return andFilter(body, w, pin)
}

// timeAsRead is the condition that a record's time field is what rec
// shows: the same value, or absent where rec has none. A successor's
// record has another: it was written after this one's end.
func timeAsRead(s policy.Scheme, rec bsoncore.Document) bsoncore.Document {
	field := s.TsPath + s.ExpiresPath
	v, err := rec.LookupErr(field)
	if err != nil {
		return bsoncore.NewDocumentBuilder().AppendDocument(field, bsoncore.NewDocumentBuilder().
			AppendBoolean("$exists", false).Build()).Build()
	}
	return bsoncore.NewDocumentBuilder().AppendValue(field, v).Build()
}

// andFilter ANDs cond into the filter of body's one statement.
func andFilter(body bsoncore.Document, w policy.Write, cond bsoncore.Document) (bsoncore.Document, error) {
	return rewriteFilter(body, w, func(f bsoncore.Document) (bsoncore.Document, error) {
		both := bsoncore.NewArrayBuilder().AppendDocument(f).AppendDocument(cond).Build()
		return bsoncore.NewDocumentBuilder().AppendArray("$and", both).Build(), nil
	})
}

// deletedCount is how many documents a delete or findAndModify remove
// deleted, per its reply.
func deletedCount(reply bsoncore.Document, w policy.Write) int64 {
	if ok, _ := reply.Lookup("ok").AsInt64OK(); ok != 1 {
		return 0
	}
	if w.Kind == policy.KindFindAndModify {
		n, _ := reply.Lookup("lastErrorObject", "n").AsInt64OK()
		return n
	}
	n, _ := reply.Lookup("n").AsInt64OK()
	return n
}

// lockCollReleaseAll runs a delete of every lock record of one holder id
// ({aid: X}, deleteMany or deleteOne): the records it matches are found
// with the client's own authority, and the delete is pinned to those this
// client holds and to abandoned ones nobody holds (taken under a mirror
// for the delete). Another holder's records, and live ones lockgate did
// not see inserted, are left alone: they neither block the release nor
// are deleted. Afterwards, the mirror of each pinned record that is gone
// is released, and only those: a deleteOne deletes one.
func (sc *Schemes) lockCollReleaseAll(ctx context.Context, req *proxy.Request, pol *policy.Policy, v *Verdict, op schemeOp, start time.Time) proxy.Decision {
	w, r := op.write, op.rule
	s := r.Scheme
	store := sc.cfg.Store
	field := s.TsPath + s.ExpiresPath
	proj := bsoncore.NewDocumentBuilder().AppendInt32("_id", 1).AppendInt32(field, 1).Build()
	recs, failed, err := sc.findRecords(ctx, req, w.NS, w.Filter, proj, r.MaxCandidates+1)
	switch {
	case err != nil:
		return proxy.Decision{Action: proxy.Close, Reason: "scheme release-all: " + err.Error()}
	case failed != nil:
		sc.cfg.Record(req, pol, v, nil, time.Since(start))
		return proxy.Decision{Action: proxy.Reply, Reply: failed}
	case len(recs) > r.MaxCandidates:
		v.add(r, w, refuse.ReasonTooManyCandidates, nil, fmt.Sprintf("it deletes more than %d lock records (the policy's maxCandidates); delete them by _id", r.MaxCandidates))
		return sc.cfg.Decide(req, pol, v, start)
	}
	var freed []docid.ID // mirrors to release once their record is gone
	var taken []docid.ID // of those, the ones taken for this delete
	var pins []bsoncore.Value
	// Each pinned record as read ({_id, time field}): the records were
	// read before their mirrors were checked or taken, so a record whose
	// mirror this client holds afterwards is the one read, and a late
	// delete (its lease or the delete's short mirror run out) leaves a
	// successor's record alone, as lockCollRelease does.
	asRead := bsoncore.NewArrayBuilder()
	short := max(r.LeaseMargin, 100*time.Millisecond)
	for _, rec := range recs {
		id, err := idCopy(rec.Lookup("_id"))
		if err != nil {
			continue // no lock can be held on it
		}
		ids := []docid.ID{id}
		held, _, err := store.Holds(ctx, op.owner, w.NS, ids, 0)
		if err != nil {
			v.Violations = append(v.Violations, Violation{Rule: r, Write: w, Reason: refuse.ReasonUnavailable,
				Detail: fmt.Sprintf("the lock store cannot confirm the scheme locks (%v), so the write is refused (fail closed)", err)})
			return sc.cfg.Decide(req, pol, v, start)
		}
		if !held {
			end, ok := s.RecordExpiry(rec)
			if !ok {
				continue
			}
			if end.After(time.Now()) {
				sc.adopt(ctx, req, w.NS, s, id, end)
				continue
			}
			if _, err := store.Acquire(ctx, op.owner, w.NS, ids, short, 0); err != nil {
				continue // someone holds it: not this client's to delete
			}
			taken = append(taken, id)
			v.state(StateAbandoned)
		} else {
			v.state(StateHeld)
		}
		freed = append(freed, id)
		pins = append(pins, id.Core())
		one := timeAsRead(s, rec)
		asRead.AppendDocument(bsoncore.NewDocumentBuilder().AppendValue("_id", id.Core()).
			AppendValue(field, one.Index(0).Value()).Build())
	}
	pinned, _, err := policy.EditMessage(req.Message, req.Command, policy.Edit{Pins: []policy.Pin{{List: w.List, Index: w.Index, IDs: pins}}})
	var body bsoncore.Document
	if err == nil {
		body, err = bodyOf(pinned, w)
	}
	if err == nil && len(pins) > 0 && r.Mode == policy.Enforce {
		body, err = andFilter(body, w, bsoncore.NewDocumentBuilder().AppendArray("$or", asRead.Build()).Build())
	}
	if err != nil {
		sc.releaseMirrors(ctx, op, taken)
		v.add(r, w, refuse.ReasonUnclassifiable, nil, fmt.Sprintf("the proxy could not restrict it to the verified lock records (%v)", err))
		return sc.cfg.Decide(req, pol, v, start)
	}
	if h := sc.Test; h != nil && h.BeforeDelete != nil {
		for _, id := range freed {
			h.BeforeDelete(w.NS, id)
		}
	}
	reply, err := req.Ask(ctx, body)
	if err != nil {
		return proxy.Decision{Action: proxy.Close, Reason: "scheme release-all: " + err.Error()}
	}
	if len(freed) > 0 {
		// What the database deleted: the pinned records no longer there.
		ab := bsoncore.NewArrayBuilder()
		for _, p := range pins {
			ab.AppendValue(p)
		}
		in := bsoncore.NewDocumentBuilder().AppendArray("$in", ab.Build()).Build()
		left, failed, err := sc.findRecords(ctx, req, w.NS, bsoncore.NewDocumentBuilder().AppendDocument("_id", in).Build(),
			bsoncore.NewDocumentBuilder().AppendInt32("_id", 1).Build(), len(pins)+1)
		if err == nil && failed == nil {
			var gone []docid.ID
			for _, id := range freed {
				if !containsID(left, id) {
					gone = append(gone, id)
				}
			}
			sc.releaseMirrors(ctx, op, gone)
		}
	}
	v.check(w.NS, freed)
	sc.cfg.Record(req, pol, v, nil, time.Since(start))
	return proxy.Decision{Action: proxy.Reply, Reply: reply}
}

func containsID(recs []bsoncore.Document, id docid.ID) bool {
	for _, rec := range recs {
		if got, err := idCopy(rec.Lookup("_id")); err == nil && got.Equal(id) {
			return true
		}
	}
	return false
}

func (sc *Schemes) releaseMirrors(ctx context.Context, op schemeOp, ids []docid.ID) {
	if len(ids) == 0 {
		return
	}
	if _, err := sc.cfg.Store.Release(ctx, op.owner, op.write.NS, ids, ""); err != nil {
		sc.cfg.Log.Warn("scheme lock release failed; they expire with their lease", zap.String("ns", op.write.NS.String()), zap.Error(err))
	}
}

// bodyOf is the one-body command of a rewritten message's statement w.
func bodyOf(msg []byte, w policy.Write) (bsoncore.Document, error) {
	m, err := wire.Parse(msg, wire.Limits{})
	if err != nil {
		return nil, err
	}
	cmd, err := wire.CommandOf(m)
	if err != nil {
		return nil, err
	}
	return statementBody(cmd, w)
}

// lockCollTTLIndex reports whether collection write w is a createIndexes
// on a lock collection whose every TTL index is the scheme's own safety
// net: on the record's time field, deleting a record no earlier than the
// scheme counts it abandoned (ts older than leaseMS, or past ExpireAt).
// Such an index only deletes records nobody may hold any more; a record
// it deletes early would leave its mirror held, which is the stricter
// side. The libraries create it themselves (codecentric's
// {ts: 1} expireAfterSeconds 30, alistairjevans' {ExpireAt: 1} 0).
func lockCollTTLIndex(r policy.Rule, req *proxy.Request, w policy.Write) bool {
	s := r.Scheme
	if !s.LockSide || w.What != policy.WhatCreateIndexes || req.Command == nil {
		return false
	}
	idx, err := req.Command.Documents("indexes")
	if err != nil || len(idx) == 0 {
		return false
	}
	field := s.TsPath + s.ExpiresPath
	for _, d := range idx {
		e, err := d.LookupErr("expireAfterSeconds")
		if err != nil {
			continue // deletes nothing
		}
		secs, ok := number(e)
		key, isDoc := d.Lookup("key").DocumentOK()
		keys, _ := key.Elements()
		if !ok || !isDoc || len(keys) != 1 || keys[0].Key() != field {
			return false
		}
		dir, ok := number(keys[0].Value())
		if !ok || (dir != 1 && dir != -1) {
			return false
		}
		min := s.Lease
		if s.ExpiresPath != "" {
			min = 0
		}
		if secs < 0 || time.Duration(secs*float64(time.Second)) < min {
			return false
		}
	}
	return true
}

// number is a numeric BSON value as a float64.
func number(v bsoncore.Value) (float64, bool) {
	switch v.Type {
	case bson.TypeInt32:
		return float64(v.Int32()), true
	case bson.TypeInt64:
		return float64(v.Int64()), true
	case bson.TypeDouble:
		return v.Double(), true
	}
	return 0, false
}
