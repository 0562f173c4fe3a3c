package policy

import (
	"errors"
	"fmt"
	"slices"

	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// An aggregation pipeline is read by two parties: the reference walk
// (each stage's name, the namespaces its spec names) and the classifier's
// scan (every $out and $merge at any depth, aggScan). Inside an
// aggregate's own pipeline the scan rides along the walk, so that every
// document of it, stage specs and sub-pipelines included, is read once
// (walkPipeline); elsewhere (an explained aggregate, a view's pipeline,
// a pipeline sent as a document sequence) the walk reads alone, with a
// nil scan, and the classifier reads the pipeline itself.
//
// Both readings must come out as they would apart (FuzzPlanOnePass holds
// them to it): the walk's references in its own order, the scan's writes
// and first refusal in document order. Where the walk reads a field
// later than fields that follow it (a $lookup's pipeline runs on the
// database its from names, which may come after it; an $out's own write
// is known once its whole spec is read), what the scan finds there is
// placed where the document has it (mark).

// walkPipeline is pipeline for an aggregate's own pipeline, read once for
// the walk and the classifier's scan a. It reports whether the pipeline
// is an array of documents read to its end, as the classifier's Documents
// reads it (else the classifier reads it itself, and refuses it).
func (w walker) walkPipeline(db string, v bsoncore.Value, a *aggScan) (clean bool) {
	if v.Type != bson.TypeArray || len(v.Data) < 5 {
		w.pipeline(db, v, nil)
		return false
	}
	clean = true
	it := iterate(v.Data)
	for {
		_, e, ok := it.next()
		if !ok {
			break
		}
		stage, ok := e.DocumentOK()
		if !ok {
			clean = false
			continue
		}
		w.stageDoc(db, stage, a)
	}
	return clean && !it.bad
}

// pipeline walks the stages of an aggregation pipeline v run on db, and
// scans v's contents with a (nil: the walk reads alone). The caller has
// scanned the key v sits under (aggScan.head).
func (w walker) pipeline(db string, v bsoncore.Value, a *aggScan) {
	if v.Type != bson.TypeArray {
		if a.on() && v.Type == bson.TypeEmbeddedDocument {
			a.doc(v.Data)
		}
		return
	}
	it := iterate(v.Data)
	for {
		k, e, ok := it.next()
		if !ok {
			break
		}
		// The codec does not check an array's keys: the scan reads
		// them as any document's.
		if a.on() {
			a.head(k, e)
		}
		if stage, ok := e.DocumentOK(); ok {
			w.stageDoc(db, stage, a)
		} else if a.on() && e.Type == bson.TypeArray {
			a.doc(e.Data)
		}
	}
	if it.bad && a.on() {
		a.err = refuse(anyNS(), "aggregate: unreadable pipeline")
	}
}

// stageDoc walks one stage of a pipeline run on db, and scans all of it
// with a.
func (w walker) stageDoc(db string, stage bsoncore.Document, a *aggScan) {
	it := iterate(stage)
	if k, sv, ok := it.next(); ok {
		w.p.stages = append(w.p.stages, stageName(k))
		w.stage(db, k, sv, a)
		for a.on() {
			k, v, ok := it.next()
			if !ok {
				break
			}
			a.field(k, v)
		}
	}
	if it.bad && a.on() {
		a.err = refuse(anyNS(), "aggregate: unreadable pipeline")
	}
}

// stage walks one stage, named k with spec sv, of a pipeline run on db,
// and scans the field with a.
func (w walker) stage(db string, k []byte, sv bsoncore.Value, a *aggScan) {
	spec, isDoc := sv.DocumentOK()
	switch string(k) {
	case "$lookup", "$graphLookup":
		if isDoc {
			w.lookup(db, spec, a)
			return
		}
	case "$unionWith":
		if isDoc {
			w.unionWith(db, spec, a)
			return
		}
		if s, ok := sv.StringValueOK(); ok {
			w.visit(db, s)
		}
	case "$out":
		if isDoc {
			w.outStage(db, spec, a)
			return
		}
		if w.namedTarget(db, sv, a, WhatOut) {
			return
		}
	case "$merge":
		if isDoc {
			w.merge(db, spec, a)
			return
		}
		if w.namedTarget(db, sv, a, WhatMerge) {
			return
		}
	case "$changeStream":
		if isDoc {
			w.changeStream(spec, a)
			return
		}
	case "$facet":
		if isDoc {
			w.facet(db, spec, a)
			return
		}
	}
	// A spec the walk does not read, or reads as a string: the scan
	// reads it alone.
	if a.on() {
		a.field(k, sv)
	}
}

// namedTarget walks a $out or $merge whose spec sv names a collection of
// db as a string, and has the scan write what there, on the walk's
// namespace, when it is the scan's target too. It reports whether the
// scan is done with the field.
func (w walker) namedTarget(db string, sv bsoncore.Value, a *aggScan, what string) bool {
	s, ok := sv.StringValueOK()
	if !ok {
		return false
	}
	n := w.visit(db, s)
	if !a.on() || !a.same(db, s) {
		return false
	}
	a.ws = append(a.ws, collWrite(n, what))
	return true
}

// once is a spec field the walk reads: its first value, and whether the
// spec gives it again (fieldsOf's error).
type once struct {
	v     bsoncore.Value
	twice bool
}

// see records one value of the field and reports whether it is the first.
func (o *once) see(v bsoncore.Value) bool {
	if o.v.Type == 0 {
		o.v = v
		return true
	}
	o.twice = true
	return false
}

// lookup walks the spec of a $lookup or $graphLookup run on db: from, a
// collection of db or {db, coll}, and the sub-pipeline, run in from's
// database.
func (w walker) lookup(db string, spec bsoncore.Document, a *aggScan) {
	var from, pipe once
	var fromNS nsFields
	var at mark
	it := iterate(spec)
	for {
		k, v, ok := it.next()
		if !ok {
			break
		}
		switch string(k) {
		case "from":
			if from.see(v) && v.Type == bson.TypeEmbeddedDocument {
				fromNS = readNS(v.Data, a)
				continue
			}
		case "pipeline":
			if pipe.see(v) {
				// Walked once from is known; scanned in its place.
				at = a.mark()
				continue
			}
		}
		if a.on() {
			a.field(k, v)
		}
	}
	if it.bad && a.on() {
		a.err = refuse(anyNS(), "aggregate: unreadable pipeline")
	}
	// A field given twice is read as its last value by the server's own
	// parsers of these stages, as its first by Lookup: either could be
	// the lock store.
	if from.twice || pipe.twice || it.bad {
		w.unknown()
		a.valueAt(at, pipe.v)
		return
	}
	target := db
	if s, ok := from.v.StringValueOK(); ok {
		w.visit(db, s)
	} else if from.v.Type == bson.TypeEmbeddedDocument {
		target = w.dbColl(db, fromNS)
	}
	w.pipelineAt(at, target, pipe.v, a)
}

// unionWith walks a $unionWith's {coll, db, pipeline} run on db.
func (w walker) unionWith(db string, spec bsoncore.Document, a *aggScan) {
	var pipe, sdb, coll once
	var at mark
	it := iterate(spec)
	for {
		k, v, ok := it.next()
		if !ok {
			break
		}
		switch string(k) {
		case "pipeline":
			if pipe.see(v) {
				at = a.mark()
				continue
			}
		case "db":
			sdb.see(v)
		case "coll":
			coll.see(v)
		}
		if a.on() {
			a.field(k, v)
		}
	}
	if it.bad && a.on() {
		a.err = refuse(anyNS(), "aggregate: unreadable pipeline")
	}
	if pipe.twice || it.bad {
		w.unknown()
		a.valueAt(at, pipe.v)
		return
	}
	// db or coll given twice: servers differ on which of the two they
	// read.
	target := db
	if sdb.twice || coll.twice {
		w.unknown()
	} else {
		if s, ok := sdb.v.StringValueOK(); ok {
			target = s
		}
		if s, ok := coll.v.StringValueOK(); ok {
			w.visit(target, s)
		}
	}
	w.pipelineAt(at, target, pipe.v, a)
}

// outStage walks {db, coll} of a $out run on db; the scan writes its
// target before anything inside it.
func (w walker) outStage(db string, spec bsoncore.Document, a *aggScan) {
	at := a.mark()
	r := readNS(spec, a)
	w.dbColl(db, r)
	if at.on {
		n, err := r.target(a.db)
		a.wrote(at, n, err, WhatOut)
	}
}

// merge walks a $merge's {into: coll | {db, coll}, ...} run on db; the
// scan writes its target before anything inside it (a whenMatched
// pipeline is the scan's alone: it runs on the documents, not on another
// collection).
func (w walker) merge(db string, spec bsoncore.Document, a *aggScan) {
	at := a.mark()
	var into once
	var intoNS nsFields
	var named namespace.Namespace // into as the walk named it, a string
	it := iterate(spec)
	for {
		k, v, ok := it.next()
		if !ok {
			break
		}
		if string(k) == "into" {
			if into.see(v) && v.Type == bson.TypeEmbeddedDocument {
				intoNS = readNS(v.Data, a)
				continue
			}
		}
		if a.on() {
			a.field(k, v)
		}
	}
	if it.bad && a.on() {
		a.err = refuse(anyNS(), "aggregate: unreadable pipeline")
	}
	switch {
	case into.twice || it.bad:
		w.unknown()
	case into.v.Type == bson.TypeEmbeddedDocument:
		w.dbColl(db, intoNS)
	default:
		if s, ok := into.v.StringValueOK(); ok {
			named = w.visit(db, s)
			if !a.same(db, s) {
				named = namespace.Namespace{}
			}
		}
	}
	if !at.on {
		return
	}
	// mergeTarget's reading, from what the walk read.
	var n namespace.Namespace
	var err error
	switch {
	case into.twice:
		err = fmt.Errorf("field %q appears twice", "into")
	case it.bad:
		err = errUnreadable
	case into.v.Type == 0:
		err = errors.New("no into")
	case into.v.Type == bson.TypeEmbeddedDocument:
		n, err = intoNS.target(a.db)
	case !named.IsZero():
		n = named
	default:
		n, err = outTarget(a.db, into.v)
	}
	a.wrote(at, n, err, WhatMerge)
}

// changeStream walks a $changeStream's spec. One over the whole
// deployment (allChangesForCluster) reads the changes of every
// namespace, documents included (fullDocument), so it names them all;
// one on a database or a collection is the command's own namespace,
// visited already.
func (w walker) changeStream(spec bsoncore.Document, a *aggScan) {
	var all once
	it := iterate(spec)
	for {
		k, v, ok := it.next()
		if !ok {
			break
		}
		if string(k) == "allChangesForCluster" {
			all.see(v)
		}
		if a.on() {
			a.field(k, v)
		}
	}
	if it.bad && a.on() {
		a.err = refuse(anyNS(), "aggregate: unreadable pipeline")
	}
	if all.twice || it.bad || !isFalse(all.v) {
		w.unknown()
	}
}

// facet walks the sub-pipelines of a $facet run on db.
func (w walker) facet(db string, facets bsoncore.Document, a *aggScan) {
	it := iterate(facets)
	for {
		k, p, ok := it.next()
		if !ok {
			break
		}
		if a.on() {
			a.head(k, p) // a facet named $out
		}
		w.pipeline(db, p, a)
	}
	if it.bad && a.on() {
		a.err = refuse(anyNS(), "aggregate: unreadable pipeline")
	}
}

// isFalse reports whether an optional flag is absent or false, as the
// server would read it; a value of another type counts as set, since a
// looser server might read it as true.
func isFalse(v bsoncore.Value) bool {
	set, err := truthy(v, "")
	return err == nil && !set
}

// nsFields is a {db, coll} document ($out's spec, $merge's into,
// $lookup's from) as one reading of it found it: what fieldsOf(d, "db",
// "coll") returns.
type nsFields struct {
	f   [2]bsoncore.Value // db, coll
	err error
}

var errUnreadable = errors.New("unreadable document")

// readNS reads d, a {db, coll} document, once: the two fields for the
// walk and the scan's target, and every field for the scan a.
func readNS(d bsoncore.Document, a *aggScan) (r nsFields) {
	it := iterate(d)
	for {
		k, v, ok := it.next()
		if !ok {
			break
		}
		i := -1
		switch string(k) {
		case "db":
			i = 0
		case "coll":
			i = 1
		}
		if i >= 0 {
			if r.f[i].Type == 0 {
				r.f[i] = v
			} else if r.err == nil {
				r.err = fmt.Errorf("field %q appears twice", k)
			}
		}
		if a.on() {
			a.field(k, v)
		}
	}
	if it.bad {
		if r.err == nil {
			r.err = errUnreadable
		}
		if a.on() {
			a.err = refuse(anyNS(), "aggregate: unreadable pipeline")
		}
	}
	return r
}

// target is dbCollTarget's reading of r.
func (r nsFields) target(db string) (namespace.Namespace, error) {
	return nsTarget(db, r.f[0], r.f[1], r.err)
}

// dbColl visits the namespace r names, its db defaulting to db, and
// returns the database the reference is in. A field given twice is
// unknown: servers differ on which of the two they read.
func (w walker) dbColl(db string, r nsFields) string {
	if r.err != nil {
		w.unknown()
		return db
	}
	if s, ok := r.f[0].StringValueOK(); ok {
		db = s
	}
	if s, ok := r.f[1].StringValueOK(); ok {
		w.visit(db, s)
	}
	return db
}

// pipelineAt walks v, a pipeline run on db, and scans it in its place at,
// which the spec holding it marked.
func (w walker) pipelineAt(at mark, db string, v bsoncore.Value, a *aggScan) {
	if !at.on {
		w.pipeline(db, v, nil)
		return
	}
	n, later := len(a.ws), a.err
	a.err = nil
	w.pipeline(db, v, a)
	a.settle(at, n, later)
}

// aggScan finds the writes of an aggregation pipeline: every $out and
// $merge at any depth (in $facet, in sub-pipelines, anywhere a stage
// could hide one), each targeting a namespace of db, the command's
// database. The first target that cannot be read, in document order,
// ends the scan (err). A nil *aggScan is no scan.
type aggScan struct {
	db  string
	ws  []Write
	err error
	// The walk's scan (walkPipeline): wanted for an aggregate; walked
	// once it scanned the body's first pipeline, clean when that was an
	// array of documents read to its end, as Documents reads it.
	wanted, walked, clean bool
}

// on reports whether a scans and has not ended.
func (a *aggScan) on() bool { return a != nil && a.err == nil }

// same reports whether the target that outTarget reads from collection
// coll, run on db, is the namespace the walk named for it (db is the
// command's, which a sub-pipeline's need not be), so that the scan takes
// the walk's instead of reading and building it again.
func (a *aggScan) same(db, coll string) bool { return a != nil && db == a.db && coll != "" }

// doc scans one document (a stage, or a value inside one).
func (a *aggScan) doc(d []byte) {
	it := iterate(d)
	for a.err == nil {
		k, v, ok := it.next()
		if !ok {
			break
		}
		a.field(k, v)
	}
	if it.bad && a.err == nil {
		a.err = refuse(anyNS(), "aggregate: unreadable pipeline")
	}
}

// field scans one field k with value v of a document of the pipeline.
func (a *aggScan) field(k []byte, v bsoncore.Value) {
	if a.head(k, v) && (v.Type == bson.TypeEmbeddedDocument || v.Type == bson.TypeArray) {
		a.doc(v.Data)
	}
}

// head scans the key k of a field with value v: a $out or $merge there
// writes the namespace v names. It reports whether the scan goes on
// into v.
func (a *aggScan) head(k []byte, v bsoncore.Value) bool {
	switch string(k) {
	case "$out":
		n, err := outTarget(a.db, v)
		if err != nil {
			a.err = refuse(anyNS(), "aggregate $out: %v", err)
			return false
		}
		a.ws = append(a.ws, collWrite(n, WhatOut))
	case "$merge":
		n, err := mergeTarget(a.db, v)
		if err != nil {
			a.err = refuse(anyNS(), "aggregate $merge: %v", err)
			return false
		}
		a.ws = append(a.ws, collWrite(n, WhatMerge))
	}
	return true
}

// mark is a place in the document order of the scan: a field that the
// walk reads later than the fields after it is scanned as if there.
type mark struct {
	pos int  // len(ws) there
	on  bool // the scan had not ended there
}

func (a *aggScan) mark() mark {
	if !a.on() {
		return mark{}
	}
	return mark{pos: len(a.ws), on: true}
}

// valueAt scans v, which sits at at, alone.
func (a *aggScan) valueAt(at mark, v bsoncore.Value) {
	if !at.on || (v.Type != bson.TypeEmbeddedDocument && v.Type != bson.TypeArray) {
		return
	}
	n, later := len(a.ws), a.err
	a.err = nil
	a.doc(v.Data)
	a.settle(at, n, later)
}

// settle places the writes found since a had n, scanning a field that
// sits at at, before those the fields after at found; the first refusal
// in document order stands: one found now, else later's.
func (a *aggScan) settle(at mark, n int, later error) {
	if at.pos < n && n < len(a.ws) {
		slices.Reverse(a.ws[at.pos:n])
		slices.Reverse(a.ws[n:])
		slices.Reverse(a.ws[at.pos:])
	}
	if a.err == nil {
		a.err = later
	}
}

// wrote records a $out's or $merge's own write, on n or the refusal err,
// at at, before what the scan found inside its spec.
func (a *aggScan) wrote(at mark, n namespace.Namespace, err error, what string) {
	if err != nil {
		a.err = refuse(anyNS(), "aggregate %s: %v", what, err)
		return
	}
	a.ws = append(a.ws, collWrite(n, what))
	a.settle(at, len(a.ws)-1, a.err)
}

// usable reports whether the walk's scan is what classifyAggregate's own
// would find: the walk read the whole body, which names one pipeline,
// the one scanned, and no document sequence does.
func (a *aggScan) usable(c *command) bool {
	if !a.wanted || !a.walked || !a.clean || !c.complete {
		return false
	}
	for i := range c.found[:c.nfound] {
		if f := &c.found[i]; f.field == "pipeline" && f.n != 1 {
			return false
		}
	}
	for _, s := range c.Sequences {
		if s.Identifier == "pipeline" {
			return false
		}
	}
	return true
}

// outTarget: "$out": "coll" or {db, coll} (db defaults to the command's).
func outTarget(db string, v bsoncore.Value) (namespace.Namespace, error) {
	if s, ok := v.StringValueOK(); ok {
		if s == "" {
			return namespace.Namespace{}, fmt.Errorf("empty collection name")
		}
		return namespace.New(db, s), nil
	}
	return dbCollTarget(db, v)
}

// dbCollTarget reads {db: "db", coll: "coll"}.
func dbCollTarget(db string, v bsoncore.Value) (namespace.Namespace, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return namespace.Namespace{}, fmt.Errorf("target is a %v, neither a string nor a document", v.Type)
	}
	f, err := fieldsOf(d, "db", "coll")
	return nsTarget(db, f[0], f[1], err)
}

// nsTarget is the namespace of {db, coll} read as fieldsOf read it (err),
// its db defaulting to db.
func nsTarget(db string, fdb, fcoll bsoncore.Value, err error) (namespace.Namespace, error) {
	if err != nil {
		return namespace.Namespace{}, err
	}
	if fdb.Type != 0 {
		s, ok := fdb.StringValueOK()
		if !ok || s == "" {
			return namespace.Namespace{}, fmt.Errorf("db is not a non-empty string")
		}
		db = s
	}
	s, ok := fcoll.StringValueOK()
	if !ok || s == "" {
		return namespace.Namespace{}, fmt.Errorf("coll is not a non-empty string")
	}
	return namespace.New(db, s), nil
}

// mergeTarget: "$merge": "coll" or {into: "coll" | {db, coll}, ...}.
func mergeTarget(db string, v bsoncore.Value) (namespace.Namespace, error) {
	if s, ok := v.StringValueOK(); ok {
		if s == "" {
			return namespace.Namespace{}, fmt.Errorf("empty collection name")
		}
		return namespace.New(db, s), nil
	}
	d, ok := v.DocumentOK()
	if !ok {
		return namespace.Namespace{}, fmt.Errorf("$merge is a %v, neither a string nor a document", v.Type)
	}
	f, err := fieldsOf(d, "into")
	if err != nil {
		return namespace.Namespace{}, err
	}
	if f[0].Type == 0 {
		return namespace.Namespace{}, fmt.Errorf("no into")
	}
	return outTarget(db, f[0])
}
