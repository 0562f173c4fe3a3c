package enforce

import (
	"context"
	"fmt"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// The insert check compares lock keys exactly, which is what the _id
// index does under the simple collation only. A collection's default
// collation is its _id index's too: under one that ignores case, "C" and
// "c" are one document, so an insert of "C" creates the document another
// session locked as "c". Which strings such a collation equates (locale,
// strength, alternate, numericOrdering...) is ICU's to say, not the
// proxy's, so the check errs towards "equal": an inserted _id that holds a
// string may be any locked _id of its shape (every string alike).

// HeldLister lists the _ids that may be locked in a namespace, for the
// insert check under a collation that is not simple; lockstore.Store and
// memstore have it. It errs towards listing: an _id whose lock may have
// ended is listed, one that may be held is never left out. complete is
// false when more than limit may be held (then ids has at most limit).
type HeldLister interface {
	MayBeHeldIn(ctx context.Context, ns namespace.Namespace, limit int) (ids []docid.ID, complete bool, err error)
}

// MaxCollatedLocks bounds the locks of one namespace the collation check
// reads: past it, an insert it applies to is refused (fail closed) rather
// than the lock store read at length on every such insert.
const MaxCollatedLocks = 256

// StringBearing reports whether a collation can take v for an _id of
// other bytes: a string or symbol (which compare as strings), or a value
// holding one at any depth.
func StringBearing(v bsoncore.Value) bool {
	switch v.Type {
	case bson.TypeString, bson.TypeSymbol:
		return true
	case bson.TypeEmbeddedDocument, bson.TypeArray:
		vals, err := bsoncore.Document(v.Data).Values()
		if err != nil {
			return true // cannot be read: say yes, the check then refuses or finds nothing
		}
		for _, x := range vals {
			if StringBearing(x) {
				return true
			}
		}
	case bson.TypeCodeWithScope:
		_, scope, ok := v.CodeWithScopeOK()
		return !ok || StringBearing(bsoncore.Value{Type: bson.TypeEmbeddedDocument, Data: scope})
	}
	return false
}

// shapeKey is the key of v with every string and symbol in it made "":
// two _ids a collation may take for one have one shape, as a collation
// compares string values only (not field names, numbers or other types).
func shapeKey(v bsoncore.Value) (string, error) {
	id, err := docid.New(bson.RawValue{Type: v.Type, Value: blankStrings(v).Data})
	if err != nil {
		return "", err
	}
	return id.Key(), nil
}

var emptyString = bsoncore.AppendString(nil, "")

// blankStrings is v with every string and symbol made the empty string.
func blankStrings(v bsoncore.Value) bsoncore.Value {
	switch v.Type {
	case bson.TypeString, bson.TypeSymbol:
		return bsoncore.Value{Type: bson.TypeString, Data: emptyString}
	case bson.TypeEmbeddedDocument, bson.TypeArray:
		elems, err := bsoncore.Document(v.Data).Elements()
		if err != nil {
			return v
		}
		idx, doc := bsoncore.AppendDocumentStart(nil)
		for _, e := range elems {
			x := blankStrings(e.Value())
			doc = bsoncore.AppendValueElement(doc, e.Key(), x)
		}
		doc, _ = bsoncore.AppendDocumentEnd(doc, idx)
		return bsoncore.Value{Type: v.Type, Data: doc}
	case bson.TypeCodeWithScope:
		code, scope, ok := v.CodeWithScopeOK()
		if !ok {
			return v
		}
		s := blankStrings(bsoncore.Value{Type: bson.TypeEmbeddedDocument, Data: scope})
		return bsoncore.Value{Type: v.Type, Data: bsoncore.AppendCodeWithScope(nil, code, s.Data)}
	}
	return v
}

// DefaultCollationSimple reports whether ns's default collation (its _id
// index's) is known to be simple; unknown (no resolver, or it fails) is
// not simple. A statement's own collation does not matter here: it
// changes what a filter matches, not which _ids the index takes for one.
func (t *Targets) DefaultCollationSimple(ctx context.Context, ns namespace.Namespace) bool {
	if t.cfg.Resolver == nil {
		return false
	}
	simple, err := t.cfg.Resolver.SimpleCollation(ctx, ns)
	return err == nil && simple
}

// CollatedInsertable refuses write w of ns, whose default collation is not
// simple, inserting ids (each holding a string; the _id of an insert, or
// of an upsert, which inserts it when nothing matches) when another
// session holds a lock there on an _id of the same shape (shapeKey): the
// collation may take it for one of ids. nil: it may go. It fails closed
// when the store cannot list the namespace's locks, or more than
// MaxCollatedLocks may be held there. The refusal names only ids, never
// the locked _id, which the request did not name.
//
// Its namespace is r.LockNamespace's, as Locks.Insertable's.
func (l *Locks) CollatedInsertable(ctx context.Context, o *lockstore.Owner, r *policy.Rule, w policy.Write, ids []docid.ID) *Violation {
	ns := r.LockNamespace(w.NS)
	lister, ok := l.store.(HeldLister)
	if !ok {
		return &Violation{Rule: *r, Write: w, Reason: refuse.ReasonUnavailable,
			Detail: fmt.Sprintf("the default collation of %s is not simple, and this lock store cannot list its locks to confirm that none is on an _id the collation takes for %s", ns, refuse.IDsString(ids))}
	}
	held, complete, err := lister.MayBeHeldIn(ctx, ns, MaxCollatedLocks)
	if err != nil {
		return &Violation{Rule: *r, Write: w, Reason: refuse.ReasonUnavailable,
			Detail: fmt.Sprintf("the lock store cannot confirm that no _id locked in %s, whose default collation is not simple, is one document with %s (%v)", ns, refuse.IDsString(ids), err)}
	}
	if !complete {
		return &Violation{Rule: *r, Write: w, Reason: ReasonInsertLocked, IDs: ids,
			Detail: fmt.Sprintf("the default collation of %s is not simple, and more than %d _ids are locked there, too many to confirm that none is one document with %s under it; insert when fewer are locked", ns, MaxCollatedLocks, refuse.IDsString(ids))}
	}
	// A shape that cannot be told (blanking a DBRef's $ref may leave no
	// valid _id) may be any: such an _id is taken for every other.
	shapes := make(map[string]docid.ID, len(ids))
	anyShape := false
	for _, id := range ids {
		k, err := shapeKey(id.Core())
		if err != nil {
			anyShape = true
			continue
		}
		shapes[k] = id
	}
	var cands []docid.ID
	var of []docid.ID // the inserted _id each candidate may be
	for _, h := range held {
		if !StringBearing(h.Core()) {
			continue
		}
		k, err := shapeKey(h.Core())
		id, ok := shapes[k]
		if err != nil || anyShape {
			id, ok = ids[0], true
		}
		if ok {
			cands, of = append(cands, h), append(of, id)
		}
	}
	if len(cands) == 0 {
		return nil
	}
	sts, err := l.ConfirmedStatus(ctx, *o, ns, cands)
	if err != nil {
		return &Violation{Rule: *r, Write: w, Reason: refuse.ReasonUnavailable,
			Detail: fmt.Sprintf("the lock store cannot confirm that no _id locked in %s, whose default collation is not simple, is one document with %s (%v)", ns, refuse.IDsString(ids), err)}
	}
	for i, st := range sts {
		if st.Held && !st.HeldByYou && i < len(of) {
			h := st.Holder
			return &Violation{Rule: *r, Write: w, Reason: ReasonInsertLocked, IDs: []docid.ID{of[i]}, Holder: &h,
				Detail: fmt.Sprintf("another session has locked an _id in %s that its default collation, which is not simple, may take for _id %s, which this write would create (%s); lockgate cannot tell which strings a collation equates, so it takes any locked _id of that shape for one", ns, of[i], refuse.DescribeHolder(h))}
		}
	}
	return nil
}

// CommitCollated is the collation check of a transaction's commit
// (txn.Config.Collated): the statements' inserts of ids into ns were
// checked when sent (Walk.collated), and a lock taken since on an _id the
// collation may take for one of them is as much in the way. It returns
// why the commit may not insert them, "" when it may; it fails closed as
// CollatedInsertable does. ns is the namespace whose locks apply
// (policy.Rule.LockNamespace).
func CommitCollated(ctx context.Context, t *Targets, l *Locks, o lockstore.Owner, ns namespace.Namespace, ids []docid.ID) string {
	var strs []docid.ID
	for _, id := range ids {
		if StringBearing(id.Core()) {
			strs = append(strs, id)
		}
	}
	if len(strs) == 0 || !l.MayHoldLocks(ns) || t.DefaultCollationSimple(ctx, ns) {
		return ""
	}
	if x := l.CollatedInsertable(ctx, &o, &policy.Rule{}, policy.Write{NS: ns}, strs); x != nil {
		return x.Detail
	}
	return ""
}

// Collatable reports whether a statement of w under r may need the
// collation check (Walk.collated): an insert whose _id is of a type that
// can hold a string, or an upsert, where the rule requires inserted _ids
// unlocked. Cheap: the walk's usual insert pays a type switch.
func Collatable(r *policy.Rule, w *policy.Write, id bsoncore.Value) bool {
	if r.Inserts != policy.InsertsRequireUnlocked {
		return false
	}
	if w.Kind != policy.KindInsert {
		return w.Upsert
	}
	switch id.Type {
	case bson.TypeString, bson.TypeSymbol, bson.TypeEmbeddedDocument, bson.TypeCodeWithScope:
		return true
	}
	return false
}

// collated refuses the inserts and upserts of writes whose _id holds a
// string, into a namespace whose default collation is not simple, where
// another session holds a lock the collation may take for it
// (Locks.CollatedInsertable). Namespaces refused already, and those where
// no lock may be held, cost nothing more.
func (k *Walk[V]) collated(ctx context.Context, b *Verdict, o *lockstore.Owner, writes []policy.Write, rules []policy.Rule) {
	type group struct {
		r   *policy.Rule
		w   policy.Write
		ids []docid.ID
	}
	var groups []group
	for i := range writes {
		r, w := &rules[i], &writes[i]
		if r.Mode == policy.Off || r.Inserts != policy.InsertsRequireUnlocked || (w.Kind != policy.KindInsert && !w.Upsert) {
			continue
		}
		var v bsoncore.Value
		var found, certain bool
		if w.Kind == policy.KindInsert {
			v, found, certain = policy.InsertID(*w)
		} else {
			v, found, certain = policy.UpsertID(*w)
		}
		if !found || !certain || !StringBearing(v) || b.Blocked(w.NS) || !k.Checker.Locks.MayHoldLocks(r.LockNamespace(w.NS)) {
			continue // no _id known: refused elsewhere, or the server makes an ObjectId
		}
		id, err := IDCopy(v)
		if err != nil {
			continue // no _id: the database refuses it
		}
		j := 0
		for j < len(groups) && groups[j].w.NS.String() != w.NS.String() {
			j++
		}
		if j == len(groups) {
			if k.Targets.DefaultCollationSimple(ctx, r.LockNamespace(w.NS)) {
				continue
			}
			groups = append(groups, group{r: r, w: *w})
		}
		groups[j].ids = append(groups[j].ids, id)
	}
	for _, g := range groups {
		if b.Blocked(g.w.NS) {
			continue
		}
		if x := k.Checker.Locks.CollatedInsertable(ctx, o, g.r, g.w, g.ids); x != nil {
			b.Violations = append(b.Violations, *x)
		}
	}
}
