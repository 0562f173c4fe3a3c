package policy

import (
	"strings"

	"go.mongodb.org/mongo-driver/bson"
)

// LockNS is the lock collection's namespace for data namespace ns.
func (s Scheme) LockNS(ns string) string {
	db, coll, _ := strings.Cut(ns, ".")
	if s.LockColl != "" {
		return db + "." + s.LockColl
	}
	return db + "." + coll + ".lock"
}

// lockSide returns the rule of a lock collection namespace, if ns is the
// lock collection of a lockCollection rule.
func (p *Policy) lockSide(ns string) (Rule, bool) {
	db, coll, ok := strings.Cut(ns, ".")
	if !ok {
		return Rule{}, false
	}
	for _, r := range p.lockRules {
		rdb, rcoll, _ := strings.Cut(r.Match, ".")
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

// lockCollectionStep reads a write under a lockCollection scheme: on the
// data collection every write is the holder's; on the lock collection an
// insert (or upsert) of a record acquires, a delete releases, an update of
// a record refreshes it.
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
		return Step{Kind: StepHolder, ID: ids[0]}
	}
	if w.Kind == KindInsert {
		id, found, certain := InsertID(w)
		if !found || !certain {
			return Step{Why: "a lock record must carry the locked document's _id"}
		}
		return Step{Kind: StepAcquire, ID: id}
	}
	switch w.Kind {
	case KindUpdate, KindDelete, KindFindAndModify:
	default:
		return Step{Why: "it is not a single-record write"}
	}
	ids, _, ok := PinnedIDs(w.Filter)
	if w.Kind == KindDelete && !ok {
		// Release every lock of one holder: {aid: <holder id>}.
		if v, ok := filterEq(w.Filter, s.AidPath); ok && v.Type != bson.TypeNull {
			return Step{Kind: StepHolder, Ends: true, ReleaseAll: true, Holder: v}
		}
	}
	if !ok || len(ids) != 1 {
		return Step{Why: "a write to the lock collection must name one record's _id (or, to release all of a holder's locks, delete by " + s.AidPath + ")"}
	}
	step := Step{ID: ids[0]}
	switch {
	case w.Kind == KindDelete || w.Remove:
		step.Kind, step.Ends = StepHolder, true
	case w.Upsert && w.Kind == KindFindAndModify:
		return Step{Why: "take a lock record with insertOne, or updateOne with upsert, not findAndModify"}
	case w.Upsert:
		step.Kind = StepAcquire
	case w.Update.Type != bson.TypeEmbeddedDocument:
		return Step{Why: "a pipeline update cannot be read as a step of the scheme; use update operators"}
	default:
		step.Kind = StepHolder
		if _, st := updatePath(w.Update.Document(), s.TsPath, true); st != untouched {
			step.Renew = true
		}
	}
	return step
}
