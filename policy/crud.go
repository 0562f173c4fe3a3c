package policy

import (
	"fmt"

	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// Document writes: insert, update, delete, findAndModify and bulkWrite.

func statements(c *command, ns namespace.Namespace, field string) ([]bsoncore.Document, error) {
	docs, err := c.Documents(field)
	if err != nil {
		return nil, refuse(ns, "%v", err)
	}
	if docs == nil {
		return nil, refuse(ns, "%s without %q", c.Name, field)
	}
	return docs, nil
}

func classifyInsert(c *command) ([]Write, error) {
	ns, err := collectionNS(c)
	if err != nil {
		return nil, err
	}
	list := c.Spec().Statements // "documents"
	docs, err := statements(c, ns, list)
	if err != nil {
		return nil, err
	}
	ws := c.writes(len(docs))
	for i, d := range docs {
		ws[i] = Write{NS: ns, Kind: KindInsert, List: list, Index: i, Doc: d}
	}
	return withIndexInserts(ws, ns), nil
}

func classifyUpdate(c *command) ([]Write, error) {
	ns, err := collectionNS(c)
	if err != nil {
		return nil, err
	}
	spec := c.Spec()
	list, k := spec.Statements, spec.Statement
	docs, err := statements(c, ns, list)
	if err != nil {
		return nil, err
	}
	ws := c.writes(len(docs))
	for i, d := range docs {
		w := Write{NS: ns, Kind: KindUpdate, List: list, Index: i, FilterKey: k.Filter}
		if err := readUpdate(&w, d, k, list, ns); err != nil {
			return nil, err
		}
		ws[i] = w
	}
	return ws, nil
}

// readUpdate fills w from an update statement whose fields k names.
// Errors name errNS.
func readUpdate(w *Write, d bsoncore.Document, k wire.StatementKeys, list string, errNS namespace.Namespace) error {
	var f fields
	err := fieldsInto(&f, d, k.Filter, k.Update, k.Multi, k.Upsert, "collation", "hint", "sort", "upsertSupplied")
	if err != nil {
		return refuse(errNS, "%s[%d]: %v", list, w.Index, err)
	}
	if err := noUpsertSupplied(f[7]); err != nil {
		return refuse(errNS, "%s[%d]: %v", list, w.Index, err)
	}
	if w.Filter, err = requiredDoc(f[0], k.Filter); err == nil {
		w.Update, err = updateValue(f[1], k.Update)
	}
	if err == nil {
		w.Multi, err = truthy(f[2], k.Multi)
	}
	if err == nil {
		w.Upsert, err = truthy(f[3], k.Upsert)
	}
	if err == nil {
		err = readOptions(w, f[4], f[5], f[6])
	}
	if err != nil {
		return refuse(errNS, "%s[%d]: %v", list, w.Index, err)
	}
	return nil
}

func readOptions(w *Write, collation, hint, sort bsoncore.Value) error {
	var err error
	if w.Collation, err = optionalDoc(collation, "collation"); err != nil {
		return err
	}
	if w.Sort, err = optionalDoc(sort, "sort"); err != nil {
		return err
	}
	w.Hint = hint
	return nil
}

func classifyDelete(c *command) ([]Write, error) {
	ns, err := collectionNS(c)
	if err != nil {
		return nil, err
	}
	spec := c.Spec()
	list, k := spec.Statements, spec.Statement
	docs, err := statements(c, ns, list)
	if err != nil {
		return nil, err
	}
	ws := c.writes(len(docs))
	for i, d := range docs {
		w := Write{NS: ns, Kind: KindDelete, List: list, Index: i, FilterKey: k.Filter}
		var f fields
		err := fieldsInto(&f, d, k.Filter, k.Limit, "collation", "hint")
		if err == nil {
			w.Filter, err = requiredDoc(f[0], k.Filter)
		}
		if err == nil {
			w.Multi, err = deleteLimit(f[1])
		}
		if err == nil {
			err = readOptions(&w, f[2], f[3], bsoncore.Value{})
		}
		if err != nil {
			return nil, refuse(ns, "%s[%d]: %v", list, i, err)
		}
		ws[i] = w
	}
	return ws, nil
}

// noUpsertSupplied refuses upsertSupplied: true, the internal option that
// makes the server insert the document under c.new (constants) instead of
// one built from the filter and the update; drivers never send it and
// UpsertID does not read it.
func noUpsertSupplied(v bsoncore.Value) error {
	on, err := truthy(v, "upsertSupplied")
	if err != nil {
		return err
	}
	if on {
		return fmt.Errorf("upsertSupplied: the upserted document is supplied by the client")
	}
	return nil
}

// deleteLimit reads a delete statement's limit: 0 deletes every match
// (multi), 1 deletes one; the server refuses anything else, so do we.
func deleteLimit(v bsoncore.Value) (multi bool, err error) {
	if v.Type == 0 {
		return false, fmt.Errorf("limit is missing")
	}
	n, ok := wire.Integral(v)
	if !ok || (n != 0 && n != 1) {
		return false, fmt.Errorf("limit must be 0 or 1, got %v", v)
	}
	return n == 0, nil
}

func classifyFindAndModify(c *command) ([]Write, error) {
	ns, err := collectionNS(c)
	if err != nil {
		return nil, err
	}
	k := c.Spec().Statement
	w := Write{NS: ns, Kind: KindFindAndModify, List: ListFindAndModify, FilterKey: k.Filter}
	var f fields
	err = fieldsInto(&f, c.Body, k.Filter, k.Update, k.Remove, k.Upsert, "collation", "hint", "sort", "upsertSupplied")
	if err == nil {
		err = noUpsertSupplied(f[7])
	}
	if err == nil {
		if f[0].Type == 0 {
			w.Filter = emptyDoc
		} else {
			w.Filter, err = requiredDoc(f[0], k.Filter)
		}
	}
	if err == nil {
		w.Remove, err = truthy(f[2], k.Remove)
	}
	if err == nil {
		w.Upsert, err = truthy(f[3], k.Upsert)
	}
	if err == nil {
		err = readOptions(&w, f[4], f[5], f[6])
	}
	if err == nil {
		switch {
		case w.Remove && f[1].Type != 0:
			err = fmt.Errorf("both remove and update")
		case w.Remove:
		default:
			w.Update, err = updateValue(f[1], k.Update)
		}
	}
	if err != nil {
		return nil, refuse(ns, "%s: %v", c.Name, err)
	}
	ws := c.writes(1)
	ws[0] = w
	return ws, nil
}

// emptyDoc is {}: the filter of a findAndModify without query.
var emptyDoc = bsoncore.Document{5, 0, 0, 0, 0}

func classifyBulkWrite(c *command) ([]Write, error) {
	spec := c.Spec()
	infos, err := statements(c, anyNS(), spec.Namespaces)
	if err != nil {
		return nil, err
	}
	nss := make([]namespace.Namespace, len(infos))
	for i, d := range infos {
		f, err := fieldsOf(d, spec.NamespaceKey)
		if err != nil {
			return nil, refuse(anyNS(), "bulkWrite nsInfo[%d]: %v", i, err)
		}
		s, ok := f[0].StringValueOK()
		if !ok {
			return nil, refuse(anyNS(), "bulkWrite nsInfo[%d]: ns is a %v, not a string", i, f[0].Type)
		}
		n, ok := namespace.Parse(s)
		if !ok {
			return nil, refuse(anyNS(), "bulkWrite nsInfo[%d]: ns %q is not <db>.<collection>", i, s)
		}
		nss[i] = n
	}
	ops, err := statements(c, anyNS(), spec.Statements)
	if err != nil {
		return nil, err
	}
	ws := c.writes(len(ops))
	for i, op := range ops {
		w, err := bulkOp(spec, op, i, nss)
		if err != nil {
			return nil, err
		}
		ws[i] = w
	}
	return ws, nil
}

// bulkOp reads one bulkWrite op. The server tells the op types apart by the
// first field name (the op kinds of the command table: insert, update or
// delete) whose value is the nsInfo index; a second op-type field is
// refused as ambiguous. Every refusal of a bulkWrite names "*": the command
// spans namespaces, and a refusal on one op's namespace would hide the ops
// on the others.
func bulkOp(spec *wire.CommandSpec, op bsoncore.Document, i int, nss []namespace.Namespace) (Write, error) {
	it := iterate(op)
	key, v, ok := it.next()
	if !ok {
		return Write{}, refuse(anyNS(), "bulkWrite ops[%d] is empty or unreadable", i)
	}
	var w Write
	kind := spec.Op(string(key))
	if kind == nil {
		return Write{}, refuse(anyNS(), "bulkWrite ops[%d]: unknown op type %q", i, key)
	}
	keys := kind.Keys
	switch kind.Writes {
	case wire.WritesInsert:
		w.Kind = KindInsert
	case wire.WritesUpdate:
		w.Kind = KindUpdate
	default:
		w.Kind = KindDelete
	}
	n, ok := wire.Integral(v)
	if !ok || n < 0 || n >= int64(len(nss)) {
		return Write{}, refuse(anyNS(), "bulkWrite ops[%d]: nsInfo index %v is not an index into the %d nsInfo entries", i, v, len(nss))
	}
	w.NS, w.List, w.Index, w.bulk = nss[n], spec.Statements, i, true
	for {
		k, _, ok := it.next()
		if !ok {
			break
		}
		if spec.Op(string(k)) != nil {
			return Write{}, refuse(anyNS(), "bulkWrite ops[%d]: op types %q and %q in one op", i, key, k)
		}
	}
	if it.bad {
		return Write{}, refuse(anyNS(), "bulkWrite ops[%d] is unreadable", i)
	}
	switch w.Kind {
	case KindInsert:
		f, err := fieldsOf(op, keys.Document)
		if err == nil {
			w.Doc, err = requiredDoc(f[0], keys.Document)
		}
		if err != nil {
			return Write{}, refuse(anyNS(), "bulkWrite ops[%d]: %v", i, err)
		}
	case KindUpdate:
		w.FilterKey = keys.Filter
		if err := readUpdate(&w, op, keys, spec.Statements, anyNS()); err != nil {
			return Write{}, err
		}
	case KindDelete:
		w.FilterKey = keys.Filter
		var f fields
		err := fieldsInto(&f, op, keys.Filter, keys.Multi, "collation", "hint")
		if err == nil {
			w.Filter, err = requiredDoc(f[0], keys.Filter)
		}
		if err == nil {
			w.Multi, err = truthy(f[1], keys.Multi)
		}
		if err == nil {
			err = readOptions(&w, f[2], f[3], bsoncore.Value{})
		}
		if err != nil {
			return Write{}, refuse(anyNS(), "bulkWrite ops[%d]: %v", i, err)
		}
	}
	return w, nil
}
