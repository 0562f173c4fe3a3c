package policy

// The reference walk as it was before the plan (policy/references.go at
// 60352d5), kept while the plan is compared with it.

import (
	"slices"
	"strings"

	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// oldVisitNamespaces calls visit for every namespace cmd names, in every
// position the server reads one from, and stops as soon as visit returns
// true (which it then returns). coll is "" for a reference to a whole
// database (a database-level command such as dropDatabase, copydb's
// todb); db and coll are both UnknownNS where the namespace cannot be
// told.
//
// The positions are the command's own collection (the first value, also
// read as a full "db.coll" namespace, which dataSize, renameCollection and
// cloneCollection take), the full namespaces of renameCollection's to,
// applyOps' and bulkWrite's ns, a view's viewOn, getMore's collection,
// mapReduce's out, copydb's databases, explain's inner command, and the
// pipeline stages that read or write another collection ($lookup,
// $graphLookup, $unionWith, $out, $merge, at any depth, in $facet and in
// sub-pipelines), applyOps' preCondition; a change stream over the whole
// deployment (allChangesForCluster) and eval (JavaScript with a db
// object) are UnknownNS, since they reach every namespace. Statement and document values are data, never
// namespaces: a field that happens to be called "from" in an inserted
// document or a $match names nothing.
//
// Values that are not strings where a name belongs are skipped: the server
// refuses such a command, so it reaches no namespace.
func oldVisitNamespaces(cmd *wire.Command, visit func(db, coll string) bool) bool {
	return oldVisitReferences(cmd, visit, nil)
}

// oldVisitReferences is oldVisitNamespaces that also calls stage with the name
// of every aggregation stage, at any depth, until either returns true.
// stage may be nil.
func oldVisitReferences(cmd *wire.Command, visit func(db, coll string) bool, stage func(name string) bool) bool {
	w := oldWalker{ns: visit, stage: stage}
	if w.command(cmd.DB, cmd.Body) {
		return true
	}
	for _, s := range cmd.Sequences {
		switch s.Identifier {
		case "nsInfo", "preCondition":
			for _, d := range s.Documents {
				if oldVisitNSField(d, visit) {
					return true
				}
			}
		case "pipeline", "applyOps", "doTxn":
			// The server reads a document sequence as the array of
			// that name (policy.Classify reads a pipeline there too).
			arr := bsoncore.NewArrayBuilder()
			for _, d := range s.Documents {
				arr.AppendDocument(d)
			}
			v := bsoncore.Value{Type: bson.TypeArray, Data: arr.Build()}
			hit := false
			if s.Identifier == "pipeline" {
				hit = w.pipeline(cmd.DB, v)
			} else {
				hit = w.applyOps(v)
			}
			if hit {
				return true
			}
		}
	}
	return false
}

// oldWalker carries the callbacks through the recursion.
type oldWalker struct {
	ns    func(db, coll string) bool
	stage func(name string) bool
}

// command walks one command body run on db.
func (w oldWalker) command(db string, body bsoncore.Document) bool {
	visit := w.ns
	it := iterate(body)
	var spec *wire.CommandSpec
	for first := true; ; first = false {
		k, v, ok := it.next()
		if !ok {
			return false
		}
		if first {
			spec = wire.LookupCommand(string(k))
			if s, ok := v.StringValueOK(); ok {
				if visit(db, s) {
					return true
				}
				if d, c, ok := oldSplitNS(s); ok && visit(d, c) {
					return true
				}
				if oldWholeDatabase(spec, s) && visit(db, "") {
					return true
				}
			} else if visit(db, "") {
				return true
			}
		} else if spec != nil && slices.Contains(spec.FullNamespaces, string(k)) {
			if oldVisitFullNS(v, visit) {
				return true
			}
			continue
		}
		// The first key too: explain and applyOps carry their
		// references in the command's own value.
		var hit bool
		switch string(k) {
		case "pipeline":
			hit = w.pipeline(db, v)
		case "to":
			hit = oldVisitFullNS(v, visit)
		case "viewOn", "collection", "toCollection":
			if s, ok := v.StringValueOK(); ok {
				hit = visit(db, s)
			}
		case "todb", "fromdb":
			if s, ok := v.StringValueOK(); ok {
				hit = visit(s, "")
			}
		case "out":
			hit = oldVisitOut(db, v, visit)
		case "explain":
			if d, ok := v.DocumentOK(); ok {
				hit = w.command(db, d)
			}
		case "applyOps", "doTxn":
			hit = w.applyOps(v)
		case "preCondition":
			// applyOps' preconditions read the documents they name.
			hit = oldEachDocument(v, func(d bsoncore.Document) bool { return oldVisitNSField(d, visit) })
		case "eval", "$eval":
			// Server-side JavaScript (servers before 4.2) reaches any
			// namespace through its db object.
			hit = first && visit(UnknownNS, UnknownNS)
		case "nsInfo":
			hit = oldEachDocument(v, func(d bsoncore.Document) bool { return oldVisitNSField(d, visit) })
		}
		if hit {
			return true
		}
	}
}

// oldWholeDatabase reports whether a command whose first value is the string
// s writes every collection of its database, whatever s names: the
// command table's database writes (clone names a host), and an insert into
// system.indexes, by which servers before 4.2 create an index (a TTL index
// on any collection of the database, policy.Classify reads it so).
func oldWholeDatabase(spec *wire.CommandSpec, s string) bool {
	if spec == nil {
		return false
	}
	return spec.Writes == wire.WritesDatabase || (spec.Writes == wire.WritesInsert && s == "system.indexes")
}

// pipeline walks the stages of an aggregation pipeline run on db.
func (w oldWalker) pipeline(db string, v bsoncore.Value) bool {
	visit := w.ns
	return oldEachDocument(v, func(stage bsoncore.Document) bool {
		it := iterate(stage)
		k, sv, ok := it.next()
		if !ok {
			return false
		}
		if w.stage != nil && w.stage(string(k)) {
			return true
		}
		switch string(k) {
		case "$lookup", "$graphLookup":
			spec, ok := sv.DocumentOK()
			if !ok {
				return false
			}
			// A field given twice is read as its last value by the
			// server's own parsers of these stages, as its first by
			// Lookup: either could be the lock store.
			f, err := fieldsOf(spec, "from", "pipeline")
			if err != nil {
				return visit(UnknownNS, UnknownNS)
			}
			target := db
			if s, ok := f[0].StringValueOK(); ok {
				if visit(db, s) {
					return true
				}
			} else if d, ok := f[0].DocumentOK(); ok {
				var hit bool
				target, hit = oldVisitDBColl(db, d, "coll", visit)
				if hit {
					return true
				}
			}
			return w.pipeline(target, f[1])
		case "$unionWith":
			if s, ok := sv.StringValueOK(); ok {
				return visit(db, s)
			}
			spec, ok := sv.DocumentOK()
			if !ok {
				return false
			}
			f, err := fieldsOf(spec, "pipeline")
			if err != nil {
				return visit(UnknownNS, UnknownNS)
			}
			target, hit := oldVisitDBColl(db, spec, "coll", visit)
			return hit || w.pipeline(target, f[0])
		case "$out":
			if s, ok := sv.StringValueOK(); ok {
				return visit(db, s)
			}
			if spec, ok := sv.DocumentOK(); ok {
				_, hit := oldVisitDBColl(db, spec, "coll", visit)
				return hit
			}
		case "$merge":
			if s, ok := sv.StringValueOK(); ok {
				return visit(db, s)
			}
			spec, ok := sv.DocumentOK()
			if !ok {
				return false
			}
			f, err := fieldsOf(spec, "into")
			if err != nil {
				return visit(UnknownNS, UnknownNS)
			}
			into := f[0]
			if s, ok := into.StringValueOK(); ok {
				return visit(db, s)
			}
			if d, ok := into.DocumentOK(); ok {
				_, hit := oldVisitDBColl(db, d, "coll", visit)
				return hit
			}
		case "$changeStream":
			// A change stream over the whole deployment reads the changes
			// of every namespace, documents included (fullDocument), so it
			// names them all. One on a database or a collection is the
			// command's own namespace, visited already.
			if spec, ok := sv.DocumentOK(); ok {
				f, err := fieldsOf(spec, "allChangesForCluster")
				if err != nil || !oldIsFalse(f[0]) {
					return visit(UnknownNS, UnknownNS)
				}
			}
		case "$facet":
			facets, ok := sv.DocumentOK()
			if !ok {
				return false
			}
			fit := iterate(facets)
			for {
				_, p, ok := fit.next()
				if !ok {
					return false
				}
				if w.pipeline(db, p) {
					return true
				}
			}
		}
		return false
	})
}

// oldIsFalse reports whether an optional flag is absent or false, as the
// server would read it; a value of another type counts as set, since a
// looser server might read it as true.
func oldIsFalse(v bsoncore.Value) bool {
	set, err := truthy(v, "")
	return err == nil && !set
}

// oldVisitDBColl visits {db: <db>, <collKey>: <coll>}, the db defaulting to
// db, and returns the database the reference is in. A field given twice
// is UnknownNS: servers differ on which of the two they read.
func oldVisitDBColl(db string, d bsoncore.Document, collKey string, visit func(db, coll string) bool) (string, bool) {
	f, err := fieldsOf(d, "db", collKey)
	if err != nil {
		return db, visit(UnknownNS, UnknownNS)
	}
	if s, ok := f[0].StringValueOK(); ok {
		db = s
	}
	if s, ok := f[1].StringValueOK(); ok {
		return db, visit(db, s)
	}
	return db, false
}

// oldVisitOut walks mapReduce's out: a collection name, or {replace|merge|
// reduce: <coll>, db: <db>} ({inline: 1} names nothing).
func oldVisitOut(db string, v bsoncore.Value, visit func(db, coll string) bool) bool {
	if s, ok := v.StringValueOK(); ok {
		return visit(db, s)
	}
	d, ok := v.DocumentOK()
	if !ok {
		return false
	}
	f, err := fieldsOf(d, "db", "replace", "merge", "reduce")
	if err != nil {
		return visit(UnknownNS, UnknownNS)
	}
	if s, ok := f[0].StringValueOK(); ok {
		db = s
	}
	for _, v := range f[1:4] {
		if s, ok := v.StringValueOK(); ok && visit(db, s) {
			return true
		}
	}
	return false
}

// applyOps walks applyOps operations: each names its namespace by ns
// ("db.coll", or "db.$cmd" with a command in o) or by ui, a collection
// UUID the proxy cannot map to a name.
func (w oldWalker) applyOps(v bsoncore.Value) bool {
	visit := w.ns
	return oldEachDocument(v, func(op bsoncore.Document) bool {
		f, err := fieldsOf(op, "ui", "ns", "o")
		if err != nil || f[0].Type != 0 {
			return visit(UnknownNS, UnknownNS)
		}
		ns, ok := f[1].StringValueOK()
		if !ok {
			return false
		}
		db, coll, ok := oldSplitNS(ns)
		if !ok {
			return false
		}
		if coll == "$cmd" {
			o, _ := f[2].DocumentOK()
			return w.command(db, o)
		}
		return visit(db, coll)
	})
}

// oldVisitNSField visits the full namespace of d's ns field; twice is
// UnknownNS.
func oldVisitNSField(d bsoncore.Document, visit func(db, coll string) bool) bool {
	f, err := fieldsOf(d, "ns")
	if err != nil {
		return visit(UnknownNS, UnknownNS)
	}
	return oldVisitFullNS(f[0], visit)
}

func oldVisitFullNS(v bsoncore.Value, visit func(db, coll string) bool) bool {
	s, ok := v.StringValueOK()
	if !ok {
		return false
	}
	db, coll, ok := oldSplitNS(s)
	return ok && visit(db, coll)
}

// oldEachDocument calls f for each document of an array value until it
// returns true.
func oldEachDocument(v bsoncore.Value, f func(bsoncore.Document) bool) bool {
	if v.Type != bson.TypeArray {
		return false
	}
	it := iterate(v.Data)
	for {
		_, e, ok := it.next()
		if !ok {
			return false
		}
		if d, ok := e.DocumentOK(); ok && f(d) {
			return true
		}
	}
}

// oldSplitNS splits "db.coll" at its first dot, as the server does.
func oldSplitNS(s string) (db, coll string, ok bool) {
	db, coll, ok = strings.Cut(s, ".")
	return db, coll, ok && db != "" && coll != ""
}
