package policy

import (
	"slices"

	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// UnknownNS is the database and the collection of a reference whose
// namespace cannot be told (an applyOps operation that names its
// collection by UUID): a caller that protects namespaces must treat it as
// any of them.
const UnknownNS = namespace.Any

// walkReferences records in p every namespace cmd names, in every
// position the server reads one from, and every aggregation stage at any
// depth. A reference to a whole database (a database-level command such
// as dropDatabase, copydb's todb) has collection ""; one that cannot be
// told is namespace.Unknown.
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
// object) are unknown, since they reach every namespace. Statement and
// document values are data, never namespaces: a field that happens to be
// called "from" in an inserted document or a $match names nothing. The
// walk goes by field name in any command, known or not, so an unknown
// command that names nsInfo is still seen.
//
// Values that are not strings where a name belongs are skipped: the server
// refuses such a command, so it reaches no namespace.
func walkReferences(p *Plan, cmd *wire.Command) {
	w := walker{p: p}
	w.command(cmd.DB, cmd.Body, cmd.Collection, &p.cmd)
	for _, s := range cmd.Sequences {
		switch s.Identifier {
		case "nsInfo", "preCondition":
			for _, d := range s.Documents {
				w.nsField(d)
			}
		case "pipeline", "applyOps", "doTxn":
			// The server reads a document sequence as the array of
			// that name (the classifier reads a pipeline sequence
			// itself: walkPipeline's scan is for the body's).
			arr := bsoncore.NewArrayBuilder()
			for _, d := range s.Documents {
				arr.AppendDocument(d)
			}
			v := bsoncore.Value{Type: bson.TypeArray, Data: arr.Build()}
			if s.Identifier == "pipeline" {
				w.pipeline(cmd.DB, v, nil)
			} else {
				w.applyOps(v)
			}
		}
	}
}

// walker records what it walks into its plan.
type walker struct{ p *Plan }

// visit records collection coll of db, and returns its namespace.
func (w walker) visit(db, coll string) namespace.Namespace {
	n := w.p.ns(db, coll)
	w.p.add(n, Named)
	return n
}

func (w walker) unknown() { w.p.add(namespace.Unknown(), Named) }

// command walks one command body run on db; first is the first value
// when the caller has it as a string already (the request's own command),
// "" to read it from body. top is the request's own command, nil for one
// inside it (explained, an applyOps op): the walk records there what the
// classifier would otherwise walk the body again for.
func (w walker) command(db string, body bsoncore.Document, first string, top *command) {
	it := iterate(body)
	k, v, ok := it.next()
	if !ok {
		return
	}
	spec := wire.LookupCommand(string(k))
	s, isString := first, first != ""
	if !isString {
		s, isString = v.StringValueOK()
	}
	if isString {
		own := w.p.ns(db, s)
		w.p.add(own, Named)
		if top != nil && first != "" && !own.IsUnknown() {
			top.own = own
		}
		if n, ok := namespace.Parse(s); ok {
			w.p.add(n, Named)
		}
		if wholeDatabase(spec, s) {
			w.visit(db, "")
		}
	} else {
		w.visit(db, "")
	}
	// The first key too: explain and applyOps carry their references in
	// the command's own value.
	w.field(db, k, v, true)
	if top != nil {
		top.saw(k, v)
	}
	for {
		k, v, ok := it.next()
		if !ok {
			if top != nil {
				top.complete = !it.bad
			}
			return
		}
		if top != nil {
			top.saw(k, v)
		}
		// Most commands have no full-namespace field: the key is not made
		// a string (a copy) for them.
		if spec != nil && len(spec.FullNamespaces) > 0 && slices.Contains(spec.FullNamespaces, string(k)) {
			w.fullNS(v)
			continue
		}
		if top != nil && top.agg.wanted && !top.agg.walked && string(k) == "pipeline" {
			top.agg.walked = true
			top.agg.db = top.DB
			top.agg.clean = w.walkPipeline(db, v, &top.agg)
			continue
		}
		w.field(db, k, v, false)
	}
}

// field walks one field of a command body run on db.
func (w walker) field(db string, k []byte, v bsoncore.Value, first bool) {
	switch string(k) {
	case "pipeline":
		w.pipeline(db, v, nil)
	case "to":
		w.fullNS(v)
	case "viewOn", "collection", "toCollection":
		if s, ok := v.StringValueOK(); ok {
			w.visit(db, s)
		}
	case "todb", "fromdb":
		if s, ok := v.StringValueOK(); ok {
			w.visit(s, "")
		}
	case "out":
		w.out(db, v)
	case "explain":
		if d, ok := v.DocumentOK(); ok {
			w.command(db, d, "", nil)
		}
	case "applyOps", "doTxn":
		w.applyOps(v)
	case "preCondition":
		// applyOps' preconditions read the documents they name.
		eachDocument(v, func(d bsoncore.Document) bool { w.nsField(d); return false })
	case "eval", "$eval":
		// Server-side JavaScript (servers before 4.2) reaches any
		// namespace through its db object.
		if first {
			w.unknown()
		}
	case "nsInfo":
		eachDocument(v, func(d bsoncore.Document) bool { w.nsField(d); return false })
	}
}

// wholeDatabase reports whether a command whose first value is the string
// s writes every collection of its database, whatever s names: the
// command table's database writes (clone names a host), and an insert into
// system.indexes, by which servers before 4.2 create an index (a TTL index
// on any collection of the database, the classifier reads it so).
func wholeDatabase(spec *wire.CommandSpec, s string) bool {
	if spec == nil {
		return false
	}
	return spec.Writes == wire.WritesDatabase || (spec.Writes == wire.WritesInsert && s == "system.indexes")
}

// out walks mapReduce's out: a collection name, or {replace|merge|
// reduce: <coll>, db: <db>} ({inline: 1} names nothing).
func (w walker) out(db string, v bsoncore.Value) {
	if s, ok := v.StringValueOK(); ok {
		w.visit(db, s)
		return
	}
	d, ok := v.DocumentOK()
	if !ok {
		return
	}
	f, err := fieldsOf(d, "db", "replace", "merge", "reduce")
	if err != nil {
		w.unknown()
		return
	}
	if s, ok := f[0].StringValueOK(); ok {
		db = s
	}
	for _, v := range f[1:4] {
		if s, ok := v.StringValueOK(); ok {
			w.visit(db, s)
		}
	}
}

// applyOps walks applyOps operations: each names its namespace by ns
// ("db.coll", or "db.$cmd" with a command in o) or by ui, a collection
// UUID the proxy cannot map to a name.
func (w walker) applyOps(v bsoncore.Value) {
	eachDocument(v, func(op bsoncore.Document) bool {
		f, err := fieldsOf(op, "ui", "ns", "o")
		if err != nil || f[0].Type != 0 {
			w.unknown()
			return false
		}
		s, ok := f[1].StringValueOK()
		if !ok {
			return false
		}
		n, ok := namespace.Parse(s)
		if !ok {
			return false
		}
		if n.IsCommand() {
			o, _ := f[2].DocumentOK()
			w.command(n.DB(), o, "", nil)
			return false
		}
		w.p.add(n, Named)
		return false
	})
}

// nsField visits the full namespace of d's ns field; twice is unknown.
func (w walker) nsField(d bsoncore.Document) {
	f, err := fieldsOf(d, "ns")
	if err != nil {
		w.unknown()
		return
	}
	w.fullNS(f[0])
}

func (w walker) fullNS(v bsoncore.Value) {
	if s, ok := v.StringValueOK(); ok {
		if n, ok := namespace.Parse(s); ok {
			w.p.add(n, Named)
		}
	}
}

// eachDocument calls f for each document of an array value until it
// returns true.
func eachDocument(v bsoncore.Value, f func(bsoncore.Document) bool) bool {
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
