package policy

import (
	"fmt"
	"strings"

	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson/bsontype"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// Kind is the kind of one write a message performs.
type Kind int

// The kinds of writes. KindCollectionWrite covers every command that writes
// a whole collection or database at once (drop, rename, $out, ...); its
// Write.What says which.
const (
	KindInsert Kind = iota + 1
	KindUpdate
	KindDelete
	KindFindAndModify
	KindCollectionWrite
)

// String returns the kind's name as used in logs and metric labels.
func (k Kind) String() string {
	switch k {
	case KindInsert:
		return "insert"
	case KindUpdate:
		return "update"
	case KindDelete:
		return "delete"
	case KindFindAndModify:
		return "findAndModify"
	case KindCollectionWrite:
		return "collectionWrite"
	default:
		return "unknown"
	}
}

// Namespace conventions of Write.NS and ClassifyError.NS, beside "db.coll":
//
//   - "db.*" means every namespace of database db (dropDatabase, an applyOps
//     command op, an $out whose collection is unknown but whose db is);
//   - "*" (NSAll) means any namespace of any database (an applyOps op that
//     names its collection by UUID, a bulkWrite that cannot be read).
//
// The engine must treat "db.*" as touching every protected namespace of db,
// and "*" as touching every protected namespace.
const NSAll = "*"

// DBNamespace returns "db.*", the namespace that stands for the whole db.
func DBNamespace(db string) string { return db + ".*" }

// Statement lists, the values of Write.List besides the command fields.
const (
	ListFindAndModify = ""        // the findAndModify body itself
	ListLegacy        = "legacy"  // OP_UPDATE, OP_DELETE, OP_INSERT
	ListCommand       = "command" // collection writes
)

// Values of Write.What for KindCollectionWrite. Each names the command (or
// stage) that performs the write. Not classified, because they write no
// document: create (a view or an empty collection; it fails when the
// namespace exists), collMod and createIndexes unless they make the server
// delete documents (below), dropIndexes, validate, compact.
const (
	WhatDrop                    = "drop"
	WhatDropDatabase            = "dropDatabase" // NS is "db.*"
	WhatRenameCollection        = "renameCollection"
	WhatOut                     = "$out"
	WhatMerge                   = "$merge"
	WhatMapReduce               = "mapReduce"
	WhatApplyOps                = "applyOps"
	WhatConvertToCapped         = "convertToCapped"
	WhatCloneCollectionAsCapped = "cloneCollectionAsCapped" // NS is the toCollection
	WhatEmptyCapped             = "emptycapped"
	// WhatCollMod: collMod that sets expireAfterSeconds (clustered TTL or an
	// index's TTL) or shrinks a capped collection (cappedSize, cappedMax):
	// the server then deletes documents on its own.
	WhatCollMod = "collMod"
	// WhatCreateIndexes: createIndexes with an index that has
	// expireAfterSeconds (a TTL index deletes documents), or an insert into
	// "<db>.system.indexes" (how servers before 4.2 created indexes; NS is
	// then "db.*"), reported after the insert writes.
	WhatCreateIndexes = "createIndexes"
	// Commands removed from current servers that wrote arbitrary documents
	// (eval and $eval ran JavaScript, NS "*"; copydb, clone and
	// cloneCollection copied into a db or collection).
	WhatEval            = "eval"
	WhatCopyDB          = "copydb"
	WhatClone           = "clone"
	WhatCloneCollection = "cloneCollection"
)

// Write is one write a message performs. Its documents and values are views
// into the message's bytes and share their lifetime; strings are copies.
type Write struct {
	NS   string // "db.coll" it writes to; "db.*" or "*" (see NSAll) for collection writes that reach further
	Kind Kind
	// List is where the statement sits: "updates", "deletes", "documents",
	// "ops" (body array or kind-1 sequence alike), "" for findAndModify
	// (the body), "legacy" for OP_UPDATE/OP_DELETE/OP_INSERT, "command" for
	// collection writes.
	List  string
	Index int // index in List; 0 for single-statement forms
	// Filter is q (update/delete), query (findAndModify), filter (bulkWrite
	// ops) or the selector (legacy); nil for inserts and collection writes.
	// An absent findAndModify query is the empty document (all documents).
	Filter bsoncore.Document
	// FilterKey is the key Filter sits under in its statement: "q",
	// "query" (also when the findAndModify query is absent), "filter", or
	// "" for legacy opcodes.
	FilterKey string
	// Update is u / update / updateMods: a document (modifiers or a
	// replacement) or an array (pipeline); zero for deletes, inserts and
	// findAndModify with remove.
	Update    bsoncore.Value
	Multi     bool // may touch more than one document
	Upsert    bool
	Remove    bool              // findAndModify remove:true
	Collation bsoncore.Document // the statement's collation, nil if none
	Hint      bsoncore.Value    // zero if none
	Sort      bsoncore.Document // findAndModify / update / bulkWrite update sort, nil if none
	Doc       bsoncore.Document // insert: the document
	What      string            // collection writes: one of the What* constants
}

// ClassifyError says that a message is, or may be, a write that cannot be
// classified with certainty. NS is the best known namespace: "db.coll",
// "db.*" when only the database is known, "*" when not even that is.
type ClassifyError struct {
	NS     string
	Reason string
}

func (e *ClassifyError) Error() string {
	return "cannot classify write on " + e.NS + ": " + e.Reason
}

func refuse(ns, format string, args ...any) error {
	return &ClassifyError{NS: ns, Reason: fmt.Sprintf(format, args...)}
}

// Legacy opcode flags.
const (
	legacyUpsert       = 1 << 0 // OP_UPDATE
	legacyMultiUpdate  = 1 << 1 // OP_UPDATE
	legacySingleRemove = 1 << 0 // OP_DELETE
)

// Classify returns every write msg performs, in statement order. cmd is
// wire.CommandOf(msg) (nil for legacy opcodes; when nil for a command
// message Classify computes it). OP_COMPRESSED is classified by its inner
// message. Reads and unrelated commands return no writes and no error.
// Command names match exactly, as the server matches them (with the
// aliases findandmodify and mapreduce); a case variant of a write command
// name is refused, for upstreams that fold case. Writes inside
// transactions are the same commands and classify the same way. An
// explained update, delete, insert, findAndModify or bulkWrite writes
// nothing; an explained aggregate or mapReduce is classified as if it ran
// (see classifyExplain).
//
// Multi is set for update multi, delete limit 0, bulkWrite multi, legacy
// MultiUpdate and legacy deletes without SingleRemove; for findAndModify
// it is always false. Boolean options given as numbers are read as the
// server reads a truthy value; other types are refused.
//
// An error is always a *ClassifyError: the message is or may be a write
// that cannot be classified with certainty, and must not be forwarded to a
// protected namespace that NS covers.
//
// Classify is pure and safe for concurrent use; the documents of msg must
// be valid BSON (as wire.Parse guarantees).
func Classify(msg wire.Message, cmd *wire.Command) ([]Write, error) {
	switch m := msg.(type) {
	case *wire.OpCompressed:
		if m.Inner == nil {
			return nil, refuse(NSAll, "OP_COMPRESSED without an inner message")
		}
		return Classify(m.Inner, cmd)
	case *wire.OpUpdate:
		return classifyLegacyUpdate(m)
	case *wire.OpDelete:
		return classifyLegacyDelete(m)
	case *wire.OpInsert:
		return classifyLegacyInsert(m)
	case *wire.OpMsg, *wire.OpQuery:
		if cmd == nil {
			c, err := wire.CommandOf(msg)
			if err != nil {
				return nil, refuse(NSAll, "unreadable command: %v", err)
			}
			if c == nil {
				return nil, nil // a plain OP_QUERY: a read
			}
			cmd = c
		}
		return classifyCommand(cmd)
	default:
		return nil, nil
	}
}

// legacyNS checks the fullCollectionName of a legacy write.
func legacyNS(op, ns string) error {
	db, coll, ok := strings.Cut(ns, ".")
	if !ok || db == "" || coll == "" {
		return refuse(NSAll, "%s on namespace %q that is not <db>.<collection>", op, ns)
	}
	if coll == "$cmd" || strings.HasPrefix(coll, "$cmd.") {
		return refuse(DBNamespace(db), "%s on command namespace %q", op, ns)
	}
	return nil
}

func classifyLegacyUpdate(m *wire.OpUpdate) ([]Write, error) {
	if err := legacyNS("OP_UPDATE", m.FullCollectionName); err != nil {
		return nil, err
	}
	return []Write{{
		NS:     m.FullCollectionName,
		Kind:   KindUpdate,
		List:   ListLegacy,
		Filter: m.Selector,
		Update: bsoncore.Value{Type: bsontype.EmbeddedDocument, Data: m.Update},
		Multi:  m.Flags&legacyMultiUpdate != 0,
		Upsert: m.Flags&legacyUpsert != 0,
	}}, nil
}

func classifyLegacyDelete(m *wire.OpDelete) ([]Write, error) {
	if err := legacyNS("OP_DELETE", m.FullCollectionName); err != nil {
		return nil, err
	}
	return []Write{{
		NS:     m.FullCollectionName,
		Kind:   KindDelete,
		List:   ListLegacy,
		Filter: m.Selector,
		Multi:  m.Flags&legacySingleRemove == 0,
	}}, nil
}

func classifyLegacyInsert(m *wire.OpInsert) ([]Write, error) {
	if err := legacyNS("OP_INSERT", m.FullCollectionName); err != nil {
		return nil, err
	}
	ws := make([]Write, len(m.Documents))
	for i, d := range m.Documents {
		ws[i] = Write{NS: m.FullCollectionName, Kind: KindInsert, List: ListLegacy, Index: i, Doc: d}
	}
	return withIndexInserts(ws, m.FullCollectionName), nil
}

// withIndexInserts adds a collection write on the whole db to inserts into
// "<db>.system.indexes": servers before 4.2 created the index described by
// the document (a TTL index deletes documents).
func withIndexInserts(ws []Write, ns string) []Write {
	db, coll, _ := strings.Cut(ns, ".")
	if coll != "system.indexes" || len(ws) == 0 {
		return ws
	}
	return append(ws, collWrite(DBNamespace(db), WhatCreateIndexes))
}

// writeCommands are the command names classified here, for the case check.
var writeCommands = []string{
	"insert", "update", "delete", "findAndModify", "bulkWrite", "drop",
	"dropDatabase", "renameCollection", "aggregate", "mapReduce", "applyOps",
	"convertToCapped", "cloneCollectionAsCapped", "emptycapped", "collMod",
	"createIndexes", "eval", "$eval", "copydb", "clone", "cloneCollection", "doTxn",
	"internalRenameIfOptionsAndIndexesMatch",
}

func classifyCommand(c *wire.Command) ([]Write, error) {
	switch c.Name {
	case "insert":
		return classifyInsert(c)
	case "update":
		return classifyUpdate(c)
	case "delete":
		return classifyDelete(c)
	case "findAndModify", "findandmodify":
		return classifyFindAndModify(c)
	case "bulkWrite":
		return classifyBulkWrite(c)
	case "aggregate":
		return classifyAggregate(c)
	case "mapReduce", "mapreduce":
		return classifyMapReduce(c)
	case "applyOps", "doTxn":
		return classifyApplyOps(c)
	case "drop", "convertToCapped", "emptycapped", "cloneCollection":
		return classifyCollectionCommand(c)
	case "dropDatabase":
		return []Write{collWrite(DBNamespace(c.DB), WhatDropDatabase)}, nil
	case "renameCollection", "internalRenameIfOptionsAndIndexesMatch":
		return classifyRename(c)
	case "cloneCollectionAsCapped":
		return classifyCloneAsCapped(c)
	case "collMod":
		return classifyCollMod(c)
	case "createIndexes":
		return classifyCreateIndexes(c)
	case "eval", "$eval":
		return []Write{collWrite(NSAll, WhatEval)}, nil
	case "copydb":
		return classifyCopyDB(c)
	case "clone":
		return []Write{collWrite(DBNamespace(c.DB), WhatClone)}, nil
	case "explain":
		return classifyExplain(c)
	}
	// The server matches names exactly and answers CommandNotFound to
	// "UPDATE"; an upstream that folds case would run it. Refuse.
	for _, w := range writeCommands {
		if asciiFoldEqual(c.Name, w) {
			return nil, refuse(NSAll, "command %q differs from the write command %q only by case", c.Name, w)
		}
	}
	return nil, nil
}

// classifyExplain: explain never executes an update, delete, insert,
// findAndModify or bulkWrite. It did execute $out (and so mapReduce output)
// at executionStats verbosity before MongoDB 4.2 (SERVER-38063), so an
// explained aggregate or mapReduce is classified as if it ran.
func classifyExplain(c *wire.Command) ([]Write, error) {
	inner, ok := firstValue(c.Body).DocumentOK()
	if !ok {
		return nil, nil // the server refuses it
	}
	it := iterate(inner)
	k, v, ok := it.next()
	if !ok {
		return nil, nil
	}
	name := string(k)
	switch name {
	case "aggregate", "mapReduce", "mapreduce":
	default:
		if asciiFoldEqual(name, "aggregate") || asciiFoldEqual(name, "mapReduce") {
			return nil, refuse(NSAll, "explained command %q differs from a write command only by case", name)
		}
		return nil, nil
	}
	ic := &wire.Command{Name: name, DB: c.DB, Body: inner}
	ic.Collection, _ = v.StringValueOK()
	return classifyCommand(ic)
}

// asciiFoldEqual compares ASCII case-insensitively; it runs for every
// command that is not a write, so it fails fast on the length.
func asciiFoldEqual(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

func collWrite(ns, what string) Write {
	return Write{NS: ns, Kind: KindCollectionWrite, List: ListCommand, What: what}
}

// commandNS is the best known namespace of a command: db.coll when the
// first value is a non-empty string, db.* otherwise.
func commandNS(c *wire.Command) string {
	if c.Collection != "" {
		return c.DB + "." + c.Collection
	}
	return DBNamespace(c.DB)
}

// collectionNS returns db.coll for commands whose first value must name a
// collection.
func collectionNS(c *wire.Command) (string, error) {
	if c.Collection == "" {
		v := firstValue(c.Body)
		return "", refuse(DBNamespace(c.DB), "%s: the collection is a %v, not a non-empty string", c.Name, v.Type)
	}
	return c.DB + "." + c.Collection, nil
}

func firstValue(d bsoncore.Document) bsoncore.Value {
	it := iterate(d)
	_, v, _ := it.next()
	return v
}

func statements(c *wire.Command, ns, field string) ([]bsoncore.Document, error) {
	docs, err := c.Documents(field)
	if err != nil {
		return nil, refuse(ns, "%v", err)
	}
	if docs == nil {
		return nil, refuse(ns, "%s without %q", c.Name, field)
	}
	return docs, nil
}

func classifyInsert(c *wire.Command) ([]Write, error) {
	ns, err := collectionNS(c)
	if err != nil {
		return nil, err
	}
	docs, err := statements(c, ns, "documents")
	if err != nil {
		return nil, err
	}
	ws := make([]Write, len(docs))
	for i, d := range docs {
		ws[i] = Write{NS: ns, Kind: KindInsert, List: "documents", Index: i, Doc: d}
	}
	return withIndexInserts(ws, ns), nil
}

func classifyUpdate(c *wire.Command) ([]Write, error) {
	ns, err := collectionNS(c)
	if err != nil {
		return nil, err
	}
	docs, err := statements(c, ns, "updates")
	if err != nil {
		return nil, err
	}
	ws := make([]Write, len(docs))
	for i, d := range docs {
		w := Write{NS: ns, Kind: KindUpdate, List: "updates", Index: i, FilterKey: "q"}
		if err := readUpdate(&w, d, "q", "u", "updates", ns); err != nil {
			return nil, err
		}
		ws[i] = w
	}
	return ws, nil
}

// readUpdate fills w from an update statement whose filter and update sit
// under filterKey and updateKey.
// Errors name errNS.
func readUpdate(w *Write, d bsoncore.Document, filterKey, updateKey, list, errNS string) error {
	f, err := fieldsOf(d, filterKey, updateKey, "multi", "upsert", "collation", "hint", "sort", "upsertSupplied")
	if err != nil {
		return refuse(errNS, "%s[%d]: %v", list, w.Index, err)
	}
	if err := noUpsertSupplied(f[7]); err != nil {
		return refuse(errNS, "%s[%d]: %v", list, w.Index, err)
	}
	if w.Filter, err = requiredDoc(f[0], filterKey); err == nil {
		w.Update, err = updateValue(f[1], updateKey)
	}
	if err == nil {
		w.Multi, err = truthy(f[2], "multi")
	}
	if err == nil {
		w.Upsert, err = truthy(f[3], "upsert")
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

func classifyDelete(c *wire.Command) ([]Write, error) {
	ns, err := collectionNS(c)
	if err != nil {
		return nil, err
	}
	docs, err := statements(c, ns, "deletes")
	if err != nil {
		return nil, err
	}
	ws := make([]Write, len(docs))
	for i, d := range docs {
		w := Write{NS: ns, Kind: KindDelete, List: "deletes", Index: i, FilterKey: "q"}
		f, err := fieldsOf(d, "q", "limit", "collation", "hint")
		if err == nil {
			w.Filter, err = requiredDoc(f[0], "q")
		}
		if err == nil {
			w.Multi, err = deleteLimit(f[1])
		}
		if err == nil {
			err = readOptions(&w, f[2], f[3], bsoncore.Value{})
		}
		if err != nil {
			return nil, refuse(ns, "deletes[%d]: %v", i, err)
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
	n, ok := integral(v)
	if !ok || (n != 0 && n != 1) {
		return false, fmt.Errorf("limit must be 0 or 1, got %v", v)
	}
	return n == 0, nil
}

func classifyFindAndModify(c *wire.Command) ([]Write, error) {
	ns, err := collectionNS(c)
	if err != nil {
		return nil, err
	}
	w := Write{NS: ns, Kind: KindFindAndModify, List: ListFindAndModify, FilterKey: "query"}
	f, err := fieldsOf(c.Body, "query", "update", "remove", "upsert", "collation", "hint", "sort", "upsertSupplied")
	if err == nil {
		err = noUpsertSupplied(f[7])
	}
	if err == nil {
		if f[0].Type == 0 {
			w.Filter = emptyDoc
		} else {
			w.Filter, err = requiredDoc(f[0], "query")
		}
	}
	if err == nil {
		w.Remove, err = truthy(f[2], "remove")
	}
	if err == nil {
		w.Upsert, err = truthy(f[3], "upsert")
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
			w.Update, err = updateValue(f[1], "update")
		}
	}
	if err != nil {
		return nil, refuse(ns, "%s: %v", c.Name, err)
	}
	return []Write{w}, nil
}

// emptyDoc is {}: the filter of a findAndModify without query.
var emptyDoc = bsoncore.Document{5, 0, 0, 0, 0}

func classifyBulkWrite(c *wire.Command) ([]Write, error) {
	infos, err := statements(c, NSAll, "nsInfo")
	if err != nil {
		return nil, err
	}
	nss := make([]string, len(infos))
	for i, d := range infos {
		f, err := fieldsOf(d, "ns")
		if err != nil {
			return nil, refuse(NSAll, "bulkWrite nsInfo[%d]: %v", i, err)
		}
		s, ok := f[0].StringValueOK()
		if !ok {
			return nil, refuse(NSAll, "bulkWrite nsInfo[%d]: ns is a %v, not a string", i, f[0].Type)
		}
		db, coll, ok := strings.Cut(s, ".")
		if !ok || db == "" || coll == "" {
			return nil, refuse(NSAll, "bulkWrite nsInfo[%d]: ns %q is not <db>.<collection>", i, s)
		}
		nss[i] = s
	}
	ops, err := statements(c, NSAll, "ops")
	if err != nil {
		return nil, err
	}
	ws := make([]Write, len(ops))
	for i, op := range ops {
		w, err := bulkOp(op, i, nss)
		if err != nil {
			return nil, err
		}
		ws[i] = w
	}
	return ws, nil
}

// bulkOp reads one bulkWrite op. The server tells the op types apart by the
// first field name (insert, update or delete) whose value is the nsInfo
// index; a second op-type field is refused as ambiguous. Every refusal of a
// bulkWrite names "*": the command spans namespaces, and a refusal on one
// op's namespace would hide the ops on the others.
func bulkOp(op bsoncore.Document, i int, nss []string) (Write, error) {
	it := iterate(op)
	key, v, ok := it.next()
	if !ok {
		return Write{}, refuse(NSAll, "bulkWrite ops[%d] is empty or unreadable", i)
	}
	var w Write
	switch string(key) {
	case "insert":
		w.Kind = KindInsert
	case "update":
		w.Kind = KindUpdate
	case "delete":
		w.Kind = KindDelete
	default:
		return Write{}, refuse(NSAll, "bulkWrite ops[%d]: unknown op type %q", i, key)
	}
	n, ok := integral(v)
	if !ok || n < 0 || n >= int64(len(nss)) {
		return Write{}, refuse(NSAll, "bulkWrite ops[%d]: nsInfo index %v is not an index into the %d nsInfo entries", i, v, len(nss))
	}
	w.NS, w.List, w.Index = nss[n], "ops", i
	for {
		k, _, ok := it.next()
		if !ok {
			break
		}
		if s := string(k); s == "insert" || s == "update" || s == "delete" {
			return Write{}, refuse(NSAll, "bulkWrite ops[%d]: op types %q and %q in one op", i, key, k)
		}
	}
	if it.bad {
		return Write{}, refuse(NSAll, "bulkWrite ops[%d] is unreadable", i)
	}
	switch w.Kind {
	case KindInsert:
		f, err := fieldsOf(op, "document")
		if err == nil {
			w.Doc, err = requiredDoc(f[0], "document")
		}
		if err != nil {
			return Write{}, refuse(NSAll, "bulkWrite ops[%d]: %v", i, err)
		}
	case KindUpdate:
		w.FilterKey = "filter"
		if err := readUpdate(&w, op, "filter", "updateMods", "ops", NSAll); err != nil {
			return Write{}, err
		}
	case KindDelete:
		w.FilterKey = "filter"
		f, err := fieldsOf(op, "filter", "multi", "collation", "hint")
		if err == nil {
			w.Filter, err = requiredDoc(f[0], "filter")
		}
		if err == nil {
			w.Multi, err = truthy(f[1], "multi")
		}
		if err == nil {
			err = readOptions(&w, f[2], f[3], bsoncore.Value{})
		}
		if err != nil {
			return Write{}, refuse(NSAll, "bulkWrite ops[%d]: %v", i, err)
		}
	}
	return w, nil
}

func classifyCollectionCommand(c *wire.Command) ([]Write, error) {
	if c.Name == "cloneCollection" {
		// {cloneCollection: "db.coll", from: host}: a full namespace.
		if s, ok := firstValue(c.Body).StringValueOK(); ok && strings.Contains(s, ".") {
			return []Write{collWrite(s, WhatCloneCollection)}, nil
		}
		return nil, refuse(DBNamespace(c.DB), "cloneCollection: namespace is not <db>.<collection>")
	}
	ns, err := collectionNS(c)
	if err != nil {
		return nil, err
	}
	return []Write{collWrite(ns, c.Name)}, nil
}

// classifyRename: {renameCollection: "db.from", to: "db.to", dropTarget};
// both namespaces are written (the source loses its documents, the target
// is replaced when dropTarget is set, created otherwise).
func classifyRename(c *wire.Command) ([]Write, error) {
	fromKey, toKey := c.Name, "to"
	if c.Name == "internalRenameIfOptionsAndIndexesMatch" {
		fromKey = "from"
	}
	f, err := fieldsOf(c.Body, fromKey, toKey)
	if err != nil {
		return nil, refuse(NSAll, "%s: %v", c.Name, err)
	}
	var ws []Write
	for i, v := range f[:2] {
		s, ok := v.StringValueOK()
		db, coll, cut := strings.Cut(s, ".")
		if !ok || !cut || db == "" || coll == "" {
			return nil, refuse(NSAll, "%s: %s is not a <db>.<collection> string", c.Name, []string{fromKey, toKey}[i])
		}
		ws = append(ws, collWrite(s, WhatRenameCollection))
	}
	return ws, nil
}

func classifyCloneAsCapped(c *wire.Command) ([]Write, error) {
	f, err := fieldsOf(c.Body, "toCollection")
	if err != nil {
		return nil, refuse(DBNamespace(c.DB), "cloneCollectionAsCapped: %v", err)
	}
	s, ok := f[0].StringValueOK()
	if !ok || s == "" {
		return nil, refuse(DBNamespace(c.DB), "cloneCollectionAsCapped: toCollection is not a non-empty string")
	}
	return []Write{collWrite(c.DB+"."+s, WhatCloneCollectionAsCapped)}, nil
}

// classifyCollMod: collMod writes no document itself, except when it makes
// the server delete some: a TTL (expireAfterSeconds, top level for a
// clustered collection or under index) or a smaller capped collection.
func classifyCollMod(c *wire.Command) ([]Write, error) {
	ns := commandNS(c)
	f, err := fieldsOf(c.Body, "expireAfterSeconds", "cappedSize", "cappedMax", "index")
	if err != nil {
		return nil, refuse(ns, "collMod: %v", err)
	}
	deletes := f[0].Type != 0 || f[1].Type != 0 || f[2].Type != 0
	if f[3].Type != 0 {
		idx, ok := f[3].DocumentOK()
		if !ok {
			return nil, refuse(ns, "collMod: index is a %v, not a document", f[3].Type)
		}
		g, err := fieldsOf(idx, "expireAfterSeconds")
		if err != nil {
			return nil, refuse(ns, "collMod index: %v", err)
		}
		deletes = deletes || g[0].Type != 0
	}
	if !deletes {
		return nil, nil
	}
	return []Write{collWrite(ns, WhatCollMod)}, nil
}

// classifyCreateIndexes: a TTL index deletes documents.
func classifyCreateIndexes(c *wire.Command) ([]Write, error) {
	ns := commandNS(c)
	idx, err := c.Documents("indexes")
	if err != nil {
		return nil, refuse(ns, "createIndexes: %v", err)
	}
	for i, d := range idx {
		g, err := fieldsOf(d, "expireAfterSeconds")
		if err != nil {
			return nil, refuse(ns, "createIndexes indexes[%d]: %v", i, err)
		}
		if g[0].Type != 0 {
			return []Write{collWrite(ns, WhatCreateIndexes)}, nil
		}
	}
	return nil, nil
}

func classifyCopyDB(c *wire.Command) ([]Write, error) {
	f, err := fieldsOf(c.Body, "todb")
	if err != nil {
		return nil, refuse(NSAll, "copydb: %v", err)
	}
	s, ok := f[0].StringValueOK()
	if !ok || s == "" {
		return nil, refuse(NSAll, "copydb: todb is not a non-empty string")
	}
	return []Write{collWrite(DBNamespace(s), WhatCopyDB)}, nil
}

// classifyAggregate finds every $out and $merge anywhere in the pipeline:
// the server accepts them only as the last stage, but a sub-pipeline
// ($lookup, $facet, $unionWith) or a future server might read them
// elsewhere, so any document key "$out"/"$merge" at any depth counts.
func classifyAggregate(c *wire.Command) ([]Write, error) {
	// Documents reads the body array or a kind-1 section alike, and
	// refuses two pipelines.
	stages, err := c.Documents("pipeline")
	if err != nil {
		return nil, refuse(commandNS(c), "%v", err)
	}
	var ws []Write
	var walkErr error
	var walk func(d []byte)
	walk = func(d []byte) {
		it := iterate(d)
		for walkErr == nil {
			k, v, ok := it.next()
			if !ok {
				break
			}
			switch string(k) {
			case "$out":
				ns, err := outTarget(c.DB, v)
				if err != nil {
					walkErr = refuse(NSAll, "aggregate $out: %v", err)
					return
				}
				ws = append(ws, collWrite(ns, WhatOut))
			case "$merge":
				ns, err := mergeTarget(c.DB, v)
				if err != nil {
					walkErr = refuse(NSAll, "aggregate $merge: %v", err)
					return
				}
				ws = append(ws, collWrite(ns, WhatMerge))
			}
			if v.Type == bsontype.EmbeddedDocument || v.Type == bsontype.Array {
				walk(v.Data)
			}
		}
		if it.bad && walkErr == nil {
			walkErr = refuse(NSAll, "aggregate: unreadable pipeline")
		}
	}
	for _, st := range stages {
		walk(st)
	}
	if walkErr != nil {
		return nil, walkErr
	}
	return ws, nil
}

// outTarget: "$out": "coll" or {db, coll} (db defaults to the command's).
func outTarget(db string, v bsoncore.Value) (string, error) {
	if s, ok := v.StringValueOK(); ok {
		if s == "" {
			return "", fmt.Errorf("empty collection name")
		}
		return db + "." + s, nil
	}
	return dbCollTarget(db, v, "db", "coll")
}

// dbCollTarget reads {<dbKey>: "db", <collKey>: "coll"}.
func dbCollTarget(db string, v bsoncore.Value, dbKey, collKey string) (string, error) {
	d, ok := v.DocumentOK()
	if !ok {
		return "", fmt.Errorf("target is a %v, neither a string nor a document", v.Type)
	}
	f, err := fieldsOf(d, dbKey, collKey)
	if err != nil {
		return "", err
	}
	if f[0].Type != 0 {
		s, ok := f[0].StringValueOK()
		if !ok || s == "" {
			return "", fmt.Errorf("%s is not a non-empty string", dbKey)
		}
		db = s
	}
	s, ok := f[1].StringValueOK()
	if !ok || s == "" {
		return "", fmt.Errorf("%s is not a non-empty string", collKey)
	}
	return db + "." + s, nil
}

// mergeTarget: "$merge": "coll" or {into: "coll" | {db, coll}, ...}.
func mergeTarget(db string, v bsoncore.Value) (string, error) {
	if s, ok := v.StringValueOK(); ok {
		if s == "" {
			return "", fmt.Errorf("empty collection name")
		}
		return db + "." + s, nil
	}
	d, ok := v.DocumentOK()
	if !ok {
		return "", fmt.Errorf("$merge is a %v, neither a string nor a document", v.Type)
	}
	f, err := fieldsOf(d, "into")
	if err != nil {
		return "", err
	}
	if f[0].Type == 0 {
		return "", fmt.Errorf("no into")
	}
	return outTarget(db, f[0])
}

// classifyMapReduce: out is a collection name (replace), {inline: 1} (no
// write) or {replace|merge|reduce: coll, db: d}. Every output-mode key
// present is counted; inline alone is not a write.
func classifyMapReduce(c *wire.Command) ([]Write, error) {
	ns := commandNS(c)
	f, err := fieldsOf(c.Body, "out")
	if err != nil {
		return nil, refuse(ns, "%s: %v", c.Name, err)
	}
	v := f[0]
	if v.Type == 0 {
		return nil, refuse(ns, "%s without out", c.Name)
	}
	if s, ok := v.StringValueOK(); ok {
		if s == "" {
			return nil, refuse(ns, "%s: empty out collection", c.Name)
		}
		return []Write{collWrite(c.DB+"."+s, WhatMapReduce)}, nil
	}
	d, ok := v.DocumentOK()
	if !ok {
		return nil, refuse(ns, "%s: out is a %v, neither a string nor a document", c.Name, v.Type)
	}
	g, err := fieldsOf(d, "replace", "merge", "reduce", "db", "inline")
	if err != nil {
		return nil, refuse(NSAll, "%s out: %v", c.Name, err)
	}
	db := c.DB
	if g[3].Type != 0 {
		s, ok := g[3].StringValueOK()
		if !ok || s == "" {
			return nil, refuse(NSAll, "%s: out.db is not a non-empty string", c.Name)
		}
		db = s
	}
	var ws []Write
	for i, mode := range []string{"replace", "merge", "reduce"} {
		if g[i].Type == 0 {
			continue
		}
		s, ok := g[i].StringValueOK()
		if !ok || s == "" {
			return nil, refuse(DBNamespace(db), "%s: out.%s is not a non-empty string", c.Name, mode)
		}
		ws = append(ws, collWrite(db+"."+s, WhatMapReduce))
	}
	if ws == nil && g[4].Type == 0 {
		return nil, refuse(DBNamespace(db), "%s: out names no output mode", c.Name)
	}
	return ws, nil
}

// classifyApplyOps (and doTxn, its 4.0 transactional twin, What
// "applyOps"): a collection write on the ns of every CRUD op ("i",
// "u", "d") that names its collection by ns only; a no-op ("n") writes
// nothing; a command op ("c"), an op that carries a collection UUID (ui:
// the server resolves it, whatever ns says), or anything else is "*".
// Each namespace is reported once.
func classifyApplyOps(c *wire.Command) ([]Write, error) {
	ops, err := c.Documents(c.Name)
	if err != nil {
		return nil, refuse(NSAll, "%v", err)
	}
	if ops == nil {
		return nil, refuse(NSAll, "%s is not an array of documents", c.Name)
	}
	var ws []Write
	seen := map[string]bool{}
	add := func(ns string) {
		if !seen[ns] {
			seen[ns] = true
			ws = append(ws, collWrite(ns, WhatApplyOps))
		}
	}
	for _, op := range ops {
		f, err := fieldsOf(op, "op", "ns", "ui")
		if err != nil {
			add(NSAll)
			continue
		}
		kind, _ := f[0].StringValueOK()
		ns, nsOK := f[1].StringValueOK()
		db, coll, cut := strings.Cut(ns, ".")
		switch {
		case kind == "n" && f[2].Type == 0:
		case (kind == "i" || kind == "u" || kind == "d") && f[2].Type == 0 && nsOK && cut && db != "" && coll != "" && !strings.HasPrefix(coll, "$cmd"):
			add(ns)
		default:
			add(NSAll)
		}
	}
	return ws, nil
}
