package policy

// The plan as it was built before the one walk (NewPlan): the reference
// walker of the time, copied here, and Classify, each reading the whole
// command. FuzzPlanOnePass compares NewPlan with it.

import (
	"fmt"
	"slices"
	"testing"

	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// twoPassPlan is NewPlan as it was: references by one walk, writes by
// Classify, a second.
func twoPassPlan(msg wire.Message, cmd *wire.Command) *Plan {
	p := &Plan{}
	p.refs, p.stages = p.refBuf[:0], p.stageBuf[:0]
	if cmd == nil {
		if c, err := wire.CommandOf(msg); err == nil {
			cmd = c
		}
	}
	if cmd != nil {
		oracleWalkReferences(p, cmd)
	} else if s := legacyNamespace(msg); s != "" {
		if n, ok := namespace.Split(s); ok {
			p.add(n, Named)
		}
	}
	p.writes, p.err = Classify(msg, cmd)
	for i := range p.writes {
		p.add(writeNamespace(p.writes[i].NS), Written)
	}
	return p
}

func oracleWalkReferences(p *Plan, cmd *wire.Command) {
	w := oracleWalker{p: p}
	w.command(cmd.DB, cmd.Body, cmd.Collection)
	for _, s := range cmd.Sequences {
		switch s.Identifier {
		case "nsInfo", "preCondition":
			for _, d := range s.Documents {
				w.nsField(d)
			}
		case "pipeline", "applyOps", "doTxn":
			// The server reads a document sequence as the array of
			// that name (the classifier reads a pipeline there too).
			arr := bsoncore.NewArrayBuilder()
			for _, d := range s.Documents {
				arr.AppendDocument(d)
			}
			v := bsoncore.Value{Type: bson.TypeArray, Data: arr.Build()}
			if s.Identifier == "pipeline" {
				w.pipeline(cmd.DB, v)
			} else {
				w.applyOps(v)
			}
		}
	}
}

// oracleWalker records what it walks into its plan.
type oracleWalker struct{ p *Plan }

func (w oracleWalker) visit(db, coll string) { w.p.add(namespace.New(db, coll), Named) }

func (w oracleWalker) unknown() { w.p.add(namespace.Unknown(), Named) }

// command walks one command body run on db; first is the first value
// when the caller has it as a string already (the request's own command),
// "" to read it from body.
func (w oracleWalker) command(db string, body bsoncore.Document, first string) {
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
		w.visit(db, s)
		if n, ok := namespace.Parse(s); ok {
			w.p.add(n, Named)
		}
		if oracleWholeDatabase(spec, s) {
			w.visit(db, "")
		}
	} else {
		w.visit(db, "")
	}
	// The first key too: explain and applyOps carry their references in
	// the command's own value.
	w.field(db, k, v, true)
	for {
		k, v, ok := it.next()
		if !ok {
			return
		}
		if spec != nil && slices.Contains(spec.FullNamespaces, string(k)) {
			w.fullNS(v)
			continue
		}
		w.field(db, k, v, false)
	}
}

// field walks one field of a command body run on db.
func (w oracleWalker) field(db string, k []byte, v bsoncore.Value, first bool) {
	switch string(k) {
	case "pipeline":
		w.pipeline(db, v)
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
			w.command(db, d, "")
		}
	case "applyOps", "doTxn":
		w.applyOps(v)
	case "preCondition":
		// applyOps' preconditions read the documents they name.
		oracleEachDocument(v, func(d bsoncore.Document) bool { w.nsField(d); return false })
	case "eval", "$eval":
		// Server-side JavaScript (servers before 4.2) reaches any
		// namespace through its db object.
		if first {
			w.unknown()
		}
	case "nsInfo":
		oracleEachDocument(v, func(d bsoncore.Document) bool { w.nsField(d); return false })
	}
}

// oracleWholeDatabase reports whether a command whose first value is the string
// s writes every collection of its database, whatever s names: the
// command table's database writes (clone names a host), and an insert into
// system.indexes, by which servers before 4.2 create an index (a TTL index
// on any collection of the database, the classifier reads it so).
func oracleWholeDatabase(spec *wire.CommandSpec, s string) bool {
	if spec == nil {
		return false
	}
	return spec.Writes == wire.WritesDatabase || (spec.Writes == wire.WritesInsert && s == "system.indexes")
}

// pipeline walks the stages of an aggregation pipeline run on db.
func (w oracleWalker) pipeline(db string, v bsoncore.Value) {
	oracleEachDocument(v, func(stage bsoncore.Document) bool {
		it := iterate(stage)
		k, sv, ok := it.next()
		if ok {
			w.p.stages = append(w.p.stages, stageName(k))
			w.stage(db, k, sv)
		}
		return false
	})
}

// stage walks one stage, named k with spec sv, of a pipeline run on db.
func (w oracleWalker) stage(db string, k []byte, sv bsoncore.Value) {
	switch string(k) {
	case "$lookup", "$graphLookup":
		spec, ok := sv.DocumentOK()
		if !ok {
			return
		}
		// A field given twice is read as its last value by the server's
		// own parsers of these stages, as its first by Lookup: either
		// could be the lock store.
		f, err := fieldsOf(spec, "from", "pipeline")
		if err != nil {
			w.unknown()
			return
		}
		target := db
		if s, ok := f[0].StringValueOK(); ok {
			w.visit(db, s)
		} else if d, ok := f[0].DocumentOK(); ok {
			target = w.dbColl(db, d, "coll")
		}
		w.pipeline(target, f[1])
	case "$unionWith":
		if s, ok := sv.StringValueOK(); ok {
			w.visit(db, s)
			return
		}
		spec, ok := sv.DocumentOK()
		if !ok {
			return
		}
		f, err := fieldsOf(spec, "pipeline")
		if err != nil {
			w.unknown()
			return
		}
		w.pipeline(w.dbColl(db, spec, "coll"), f[0])
	case "$out":
		if s, ok := sv.StringValueOK(); ok {
			w.visit(db, s)
		} else if spec, ok := sv.DocumentOK(); ok {
			w.dbColl(db, spec, "coll")
		}
	case "$merge":
		if s, ok := sv.StringValueOK(); ok {
			w.visit(db, s)
			return
		}
		spec, ok := sv.DocumentOK()
		if !ok {
			return
		}
		f, err := fieldsOf(spec, "into")
		if err != nil {
			w.unknown()
			return
		}
		if s, ok := f[0].StringValueOK(); ok {
			w.visit(db, s)
		} else if d, ok := f[0].DocumentOK(); ok {
			w.dbColl(db, d, "coll")
		}
	case "$changeStream":
		// A change stream over the whole deployment reads the changes of
		// every namespace, documents included (fullDocument), so it names
		// them all. One on a database or a collection is the command's own
		// namespace, visited already.
		if spec, ok := sv.DocumentOK(); ok {
			f, err := fieldsOf(spec, "allChangesForCluster")
			if err != nil || !oracleIsFalse(f[0]) {
				w.unknown()
			}
		}
	case "$facet":
		facets, ok := sv.DocumentOK()
		if !ok {
			return
		}
		fit := iterate(facets)
		for {
			_, p, ok := fit.next()
			if !ok {
				return
			}
			w.pipeline(db, p)
		}
	}
}

// oracleIsFalse reports whether an optional flag is absent or false, as the
// server would read it; a value of another type counts as set, since a
// looser server might read it as true.
func oracleIsFalse(v bsoncore.Value) bool {
	set, err := truthy(v, "")
	return err == nil && !set
}

// dbColl visits {db: <db>, <collKey>: <coll>}, the db defaulting to db,
// and returns the database the reference is in. A field given twice is
// unknown: servers differ on which of the two they read.
func (w oracleWalker) dbColl(db string, d bsoncore.Document, collKey string) string {
	f, err := fieldsOf(d, "db", collKey)
	if err != nil {
		w.unknown()
		return db
	}
	if s, ok := f[0].StringValueOK(); ok {
		db = s
	}
	if s, ok := f[1].StringValueOK(); ok {
		w.visit(db, s)
	}
	return db
}

// out walks mapReduce's out: a collection name, or {replace|merge|
// reduce: <coll>, db: <db>} ({inline: 1} names nothing).
func (w oracleWalker) out(db string, v bsoncore.Value) {
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
func (w oracleWalker) applyOps(v bsoncore.Value) {
	oracleEachDocument(v, func(op bsoncore.Document) bool {
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
			w.command(n.DB(), o, "")
			return false
		}
		w.p.add(n, Named)
		return false
	})
}

// nsField visits the full namespace of d's ns field; twice is unknown.
func (w oracleWalker) nsField(d bsoncore.Document) {
	f, err := fieldsOf(d, "ns")
	if err != nil {
		w.unknown()
		return
	}
	w.fullNS(f[0])
}

func (w oracleWalker) fullNS(v bsoncore.Value) {
	if s, ok := v.StringValueOK(); ok {
		if n, ok := namespace.Parse(s); ok {
			w.p.add(n, Named)
		}
	}
}

// oracleEachDocument calls f for each document of an array value until it
// returns true.
func oracleEachDocument(v bsoncore.Value, f func(bsoncore.Document) bool) bool {
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

// checkPlanOnePass: NewPlan, which walks a command once, finds what the two
// walks it replaced found: the same references in the same order, the
// same stages, the same writes and the same refusal.
func checkPlanOnePass(t *testing.T, name string, raw []byte) {
	m, err := wire.Parse(raw, wire.Limits{})
	if err != nil {
		return
	}
	for _, cmd := range []*wire.Command{nil, commandOrNil(m)} {
		got, want := NewPlan(m, cmd), twoPassPlan(m, cmd)
		if !slices.Equal(got.Refs(), want.Refs()) {
			t.Errorf("%s: references %v, two passes found %v", name, got.Refs(), want.Refs())
		}
		if !slices.Equal(got.Stages(), want.Stages()) {
			t.Errorf("%s: stages %v, two passes found %v", name, got.Stages(), want.Stages())
		}
		gw, gerr := got.Writes()
		ww, werr := want.Writes()
		if fmt.Sprint(gerr) != fmt.Sprint(werr) {
			t.Errorf("%s: refusal %v, two passes: %v", name, gerr, werr)
		}
		if len(gw) != len(ww) {
			t.Errorf("%s: %d writes, two passes found %d", name, len(gw), len(ww))
			continue
		}
		for i := range gw {
			if !clSameWrite(gw[i], ww[i]) || gw[i].InBulkWrite() != ww[i].InBulkWrite() {
				t.Errorf("%s: write %d is %s, two passes found %s", name, i, clDescribe(gw[i]), clDescribe(ww[i]))
			}
		}
	}
}

func commandOrNil(m wire.Message) *wire.Command {
	c, err := wire.CommandOf(m)
	if err != nil {
		return nil
	}
	return c
}

func TestPlanOnePassMatchesTwo(t *testing.T) {
	for name, raw := range planCorpus(t) {
		checkPlanOnePass(t, name, raw)
	}
}

// FuzzPlanOnePass is the differential fuzz of the one walk against the
// two it replaced; its corpus is the plan's (planCorpus) and
// testdata/fuzz/FuzzPlanOnePass.
func FuzzPlanOnePass(f *testing.F) {
	for _, raw := range planCorpus(f) {
		f.Add(raw)
	}
	f.Fuzz(func(t *testing.T, raw []byte) { checkPlanOnePass(t, "fuzz", raw) })
}
