package policy

import (
	"strings"
	"time"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// LockNS is the lock collection's namespace for data namespace ns.
func (s Scheme) LockNS(ns namespace.Namespace) namespace.Namespace {
	db, coll := ns.Parts()
	if s.LockColl != "" {
		return namespace.New(db, s.LockColl)
	}
	return namespace.New(db, coll+".lock")
}

// recordTemplate splits the recordId template around its {_id}; both are
// empty for the identity template.
func (s Scheme) recordTemplate() (prefix, suffix string) {
	prefix, suffix, _ = strings.Cut(s.RecordID, config.RecordIDPlaceholder)
	return prefix, suffix
}

// RecordOf is the lock record _id that locks the document of _id id under
// a lockCollection scheme: id itself, or the recordId template filled with
// it (string _ids only). ok is false for an _id the template cannot map.
func (s Scheme) RecordOf(id bsoncore.Value) (bsoncore.Value, bool) {
	prefix, suffix := s.recordTemplate()
	if prefix == "" && suffix == "" {
		return id, true
	}
	str, ok := id.StringValueOK()
	if !ok {
		return bsoncore.Value{}, false
	}
	return bsoncore.Value{Type: bson.TypeString, Data: bsoncore.AppendString(nil, prefix+str+suffix)}, true
}

// fitsRecord reports whether a lock record _id is one the recordId
// template makes: a record outside it would lock no document.
func (s Scheme) fitsRecord(id bsoncore.Value) bool {
	prefix, suffix := s.recordTemplate()
	if prefix == "" && suffix == "" {
		return true
	}
	str, ok := id.StringValueOK()
	return ok && len(str) >= len(prefix)+len(suffix) && strings.HasPrefix(str, prefix) && strings.HasSuffix(str, suffix)
}

// MirrorID is the _id of the mirror lock of document _id id in ns: the
// record's for lockCollection, id itself otherwise. ok is false when the
// document can have no lock record.
func (s Scheme) MirrorID(id bsoncore.Value) (bsoncore.Value, bool) {
	if s.Type == config.SchemeLockCollection && !s.LockSide {
		return s.RecordOf(id)
	}
	return id, true
}

// RecordExpiry is when the lock record rec ends: its expiry field, or its
// refresh time plus the lease. ok is false for a record whose end cannot
// be read (the field missing or not a date): such a record can be
// neither mirrored nor freed by a TTL index.
func (s Scheme) RecordExpiry(rec bsoncore.Document) (time.Time, bool) {
	field, lease := s.TsPath, s.Lease
	if s.ExpiresPath != "" {
		field, lease = s.ExpiresPath, 0
	}
	v, err := rec.LookupErr(field)
	if err != nil || v.Type != bson.TypeDateTime {
		return time.Time{}, false
	}
	return time.UnixMilli(v.DateTime()).Add(lease), true
}

// lockSide returns the rule of a lock collection namespace, if n is the
// lock collection of a lockCollection rule.
func (p *Policy) lockSide(n namespace.Namespace) (Rule, bool) {
	db, coll := n.Parts()
	for i, r := range p.lockRules {
		rdb, rcoll := p.lockNS[i].Parts()
		if rdb != db {
			continue
		}
		s := r.Scheme
		var side bool
		switch {
		case s.LockColl != "":
			side = coll == s.LockColl
		case rcoll != "*":
			// "<coll>.lock" next to the rule's collection, compared
			// without building the name: Lookup runs for every write.
			side = strings.HasPrefix(coll, rcoll) && coll[len(rcoll):] == ".lock"
		default:
			side = strings.HasSuffix(coll, ".lock") && len(coll) > len(".lock")
		}
		if side {
			r.Scheme.LockSide = true
			return r, true
		}
	}
	return Rule{}, false
}

// lockCollectionStep reads a write under a lockCollection scheme. On the
// data collection every write is the holder's, of the record its _id maps
// to. On the lock collection an insert (or upsert) of a record acquires, a
// delete releases (by _id, or every record of one holder id), an update of
// a record refreshes it. Only what the write does to the record decides,
// and it must be told exactly: the record an acquire creates (its expiry a
// date, its holder id), and a refresh that changes nothing but the
// record's time (as a date) and fields of no meaning to the scheme.
func lockCollectionStep(s Scheme, w Write) Step {
	if !s.LockSide {
		switch w.Kind {
		case KindInsert:
			return Step{Kind: StepInsert}
		case KindUpdate, KindDelete, KindFindAndModify:
		default:
			return Step{Why: "it is not a single-document write"}
		}
		ids, _, ok := PinnedIDs(w.Filter)
		if !ok || len(ids) != 1 {
			return Step{Why: "under a locking scheme every write must name exactly one _id in its filter"}
		}
		rid, ok := s.RecordOf(ids[0])
		if !ok {
			return Step{Why: "its _id is not a string, so the recordId template " + s.RecordID + " gives it no lock record; such a document cannot be locked"}
		}
		return Step{Kind: StepHolder, ID: rid}
	}
	if w.Kind == KindInsert {
		id, found, certain := InsertID(w)
		if !found || !certain {
			return Step{Why: "a lock record must carry the locked document's _id"}
		}
		return s.acquireStep(id, w.Doc)
	}
	switch w.Kind {
	case KindUpdate, KindDelete, KindFindAndModify:
	default:
		return Step{Why: "it is not a single-record write"}
	}
	ids, _, ok := PinnedIDs(w.Filter)
	if w.Kind == KindDelete && !ok {
		// Release every lock of one holder: {aid: <holder id>}.
		if v, ok := filterEq(w.Filter, s.AidPath); ok && v.Type != bson.TypeNull && !isRegexOrOperator(v) {
			return Step{Kind: StepHolder, Ends: true, ReleaseAll: true, Holder: v}
		}
	}
	if !ok || len(ids) != 1 {
		return Step{Why: "a write to the lock collection must name one record's _id (or, to release all of a holder's locks, delete by " + s.AidPath + ")"}
	}
	if w.Kind == KindDelete || w.Remove {
		return Step{Kind: StepHolder, ID: ids[0], Ends: true}
	}
	if w.Update.Type != bson.TypeEmbeddedDocument {
		return Step{Why: "a pipeline update cannot be read as a step of the scheme; use update operators"}
	}
	u := w.Update.Document()
	if w.Upsert {
		rec, why := upsertRecord(w, ids[0], u)
		if why != "" {
			return Step{Why: why}
		}
		return s.acquireStep(ids[0], rec)
	}
	return s.refreshStep(ids[0], u)
}

// acquireStep checks the record an acquire creates: an _id of the
// template, an expiry that is a date (the TTL index frees nothing else,
// and the mirror is measured from it), and its holder id, which the guard
// binds to the inserting client.
func (s Scheme) acquireStep(id bsoncore.Value, rec bsoncore.Document) Step {
	if !s.fitsRecord(id) {
		return Step{Why: "the record's _id does not fit the recordId template " + s.RecordID + ", so it would lock no document"}
	}
	st := Step{Kind: StepAcquire, ID: id}
	field := s.TsPath
	if s.ExpiresPath != "" {
		field = s.ExpiresPath
	}
	v, err := rec.LookupErr(field)
	if err != nil || v.Type != bson.TypeDateTime {
		return Step{Why: "a lock record must carry " + field + " as a date (a TTL index frees no other record, and lockgate mirrors the lock from it)"}
	}
	st.Expires = s.recordEnd(time.UnixMilli(v.DateTime()).UTC())
	if a, err := rec.LookupErr(s.AidPath); err == nil && a.Type != bson.TypeNull && a.Type != bson.TypeUndefined {
		st.Holder = a
	}
	return st
}

// refreshStep reads an update of one record by its holder: it may set
// the record's time or expiry to a date (renewing the lock) and fields
// the scheme gives no meaning; never the holder id, which stays bound to
// the client that inserted the record.
func (s Scheme) refreshStep(id bsoncore.Value, u bsoncore.Document) Step {
	if !isOperatorDoc(u) {
		return Step{Why: "a replacement of a lock record cannot be read as a refresh; refresh it with $set of " + s.timeField()}
	}
	st := Step{Kind: StepHolder, ID: id}
	ops, _ := u.Elements()
	for _, op := range ops {
		fields, ok := op.Value().DocumentOK()
		if !ok {
			return Step{Why: "its update operator " + op.Key() + " is not a document"}
		}
		fs, _ := fields.Elements()
		for _, f := range fs {
			top, _, dotted := strings.Cut(f.Key(), ".")
			switch {
			case top == "_id":
				return Step{Why: "it changes a lock record's _id"}
			case top == s.AidPath:
				return Step{Why: "it changes " + s.AidPath + ", which is bound to the client that inserted the record"}
			case top != s.timeField():
				if op.Key() == "$rename" && (renamesOnto(f.Value(), s.timeField()) || renamesOnto(f.Value(), s.AidPath) || renamesOnto(f.Value(), "_id")) {
					return Step{Why: "it renames a field onto the record's " + s.timeField() + " or " + s.AidPath}
				}
				continue
			}
			date, ok := setsDate(op.Key(), f.Value())
			if dotted || !ok {
				return Step{Why: "a refresh must set " + s.timeField() + " to a date (a TTL index frees no other record, and lockgate mirrors the lock from it)"}
			}
			st.Renew = true
			if s.ExpiresPath != "" && date.IsZero() {
				return Step{Why: "a refresh must set " + s.ExpiresPath + " to a date value, not the server's current time"}
			}
			if !date.IsZero() {
				st.Expires = s.recordEnd(date)
			}
		}
	}
	return st
}

// recordEnd is when a record whose time field holds t ends: t itself
// for an expiry, t plus the lease for a refresh time.
func (s Scheme) recordEnd(t time.Time) time.Time {
	if s.ExpiresPath != "" {
		return t
	}
	return t.Add(s.Lease)
}

// timeField is the record field that carries the lock's time: the
// refresh time, or the absolute expiry.
func (s Scheme) timeField() string {
	if s.ExpiresPath != "" {
		return s.ExpiresPath
	}
	return s.TsPath
}

// setsDate reports whether operator op sets a field to a date with value
// v: $set/$setOnInsert of a date (returned), $currentDate as a date (zero
// time: the server's now).
func setsDate(op string, v bsoncore.Value) (time.Time, bool) {
	switch op {
	case "$set":
		if v.Type == bson.TypeDateTime {
			return time.UnixMilli(v.DateTime()).UTC(), true
		}
	case "$currentDate":
		if b, ok := v.BooleanOK(); ok {
			return time.Time{}, b
		}
		if d, ok := v.DocumentOK(); ok {
			t, ok := d.Lookup("$type").StringValueOK()
			if n, _ := d.Elements(); ok && len(n) == 1 && t == "date" {
				return time.Time{}, true
			}
		}
	}
	return time.Time{}, false
}

// upsertRecord is the record an upsert of _id id inserts when no record
// matches: the _id with the update's $setOnInsert, $set and $currentDate
// (the server's now, here the proxy's), or the replacement. why says what
// keeps it from being told exactly: a filter with more than the _id
// (the server would copy its equalities), other operators, a field set
// twice or in part, a findAndModify that would modify an existing record
// (its busy answer is that record, as the database returns it, which only
// holds for $setOnInsert alone).
func upsertRecord(w Write, id bsoncore.Value, u bsoncore.Document) (bsoncore.Document, string) {
	if n, _ := w.Filter.Elements(); len(n) != 1 || isRegexOrOperator(w.Filter.Lookup("_id")) {
		// Only a plain {_id: <value>} is copied into the inserted record
		// by every server.
		return nil, "an upsert of a lock record must filter by {_id: <value>} alone"
	}
	if _, found, certain := UpsertID(w); !found || !certain {
		return nil, "the _id an upsert of a lock record inserts cannot be told"
	}
	if !isOperatorDoc(u) {
		if w.Kind == KindFindAndModify {
			return nil, "a findAndModify upsert of a lock record must only $setOnInsert its fields"
		}
		return u, ""
	}
	idx, rec := bsoncore.AppendDocumentStart(nil)
	rec = bsoncore.AppendValueElement(rec, "_id", id)
	seen := map[string]bool{"_id": true}
	now := bsoncore.Value{Type: bson.TypeDateTime, Data: bsoncore.AppendDateTime(nil, time.Now().UnixMilli())}
	ops, _ := u.Elements()
	for _, op := range ops {
		if w.Kind == KindFindAndModify && op.Key() != "$setOnInsert" {
			return nil, "a findAndModify upsert of a lock record must only $setOnInsert its fields"
		}
		fields, ok := op.Value().DocumentOK()
		if !ok {
			return nil, "its update operator " + op.Key() + " is not a document"
		}
		fs, _ := fields.Elements()
		for _, f := range fs {
			k := f.Key()
			if k == "_id" {
				if (op.Key() == "$setOnInsert" || op.Key() == "$set") && sameValue(f.Value(), id) {
					continue
				}
				return nil, "it sets the record's _id to another value than its filter's"
			}
			if strings.Contains(k, ".") || seen[k] {
				return nil, "it sets a field of the lock record twice or in part (" + k + ")"
			}
			seen[k] = true
			switch op.Key() {
			case "$set", "$setOnInsert":
				rec = bsoncore.AppendValueElement(rec, k, f.Value())
			case "$currentDate":
				if _, ok := setsDate(op.Key(), f.Value()); !ok {
					return nil, "an upsert of a lock record may $currentDate a date only"
				}
				rec = bsoncore.AppendValueElement(rec, k, now)
			default:
				return nil, "an upsert of a lock record may only $set, $setOnInsert or $currentDate its fields (" + op.Key() + ")"
			}
		}
	}
	rec, _ = bsoncore.AppendDocumentEnd(rec, idx)
	return rec, ""
}

// isRegexOrOperator reports whether a filter value matches by pattern or
// by operator rather than by equality.
func isRegexOrOperator(v bsoncore.Value) bool {
	if v.Type == bson.TypeRegex {
		return true
	}
	d, ok := v.DocumentOK()
	if !ok {
		return false
	}
	first, err := d.IndexErr(0)
	return err == nil && strings.HasPrefix(first.Key(), "$")
}
