package policy

import (
	"fmt"

	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/wire"
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

// Namespace conventions of Write.NS and ClassifyError.NS, beside a
// collection:
//
//   - DBNamespace(db), collection "*" ("db.*"), means every namespace of
//     database db (dropDatabase, an applyOps command op, an $out whose
//     collection is unknown but whose db is);
//   - namespace.Unknown() ("*") means any namespace of any database (an
//     applyOps op that names its collection by UUID, a bulkWrite that
//     cannot be read).
//
// The engine must treat "db.*" as touching every protected namespace of db,
// and "*" as touching every protected namespace.

// DBNamespace returns "db.*", the namespace that stands for the whole db.
func DBNamespace(db string) namespace.Namespace { return namespace.New(db, "*") }

// anyNS is namespace.Unknown(), any namespace of any database.
func anyNS() namespace.Namespace { return namespace.Unknown() }

// Statement lists, the values of Write.List besides the command fields.
const (
	ListFindAndModify = ""        // the findAndModify body itself
	ListLegacy        = "legacy"  // OP_UPDATE, OP_DELETE, OP_INSERT
	ListCommand       = "command" // collection writes
)

// Values of Write.What for KindCollectionWrite. Each names the command (or
// stage) that performs the write. Not classified, because they write no
// document: create (a view or an empty collection; it fails when the
// namespace exists) unless the collection evicts or expires documents,
// collMod and createIndexes unless they make the server delete documents
// (below), dropIndexes, validate without repair.
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
	// Commands that rewrite a collection in place and may lose documents
	// doing so: compact (trims a capped collection to its max on some
	// servers, FerretDB among them), reIndex, validate with repair
	// (removes what it finds corrupt), cleanupOrphaned (deletes documents
	// a shard does not own).
	WhatCompact         = "compact"
	WhatReIndex         = "reIndex"
	WhatValidateRepair  = "validate"
	WhatCleanupOrphaned = "cleanupOrphaned"
	// WhatRepairDatabase: repairDatabase (servers before 4.2) drops what
	// it cannot read, in every collection of the database (NS "db.*").
	WhatRepairDatabase = "repairDatabase"
	// WhatCreate: create of a collection that the server will empty on
	// its own: capped (an insert evicts the oldest documents) or with
	// expireAfterSeconds (clustered or time-series TTL). Made where a
	// protected namespace does not exist yet, it would let later inserts
	// evict documents that are locked by then.
	WhatCreate = "create"
	// Test commands (enableTestCommands): godinsert inserts a document
	// past every check, captrunc removes a capped collection's newest
	// documents.
	WhatGodInsert = "godinsert"
	WhatCapTrunc  = "captrunc"
)

// Write is one write a message performs. Its documents and values are views
// into the message's bytes and share their lifetime; strings are copies.
type Write struct {
	// NS is the namespace it writes to; for collection writes that reach
	// further, DBNamespace (its String is "db.*") or namespace.Unknown()
	// (its String is "*").
	NS   namespace.Namespace
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

	bulk bool // an op of a bulkWrite command
}

// InBulkWrite reports whether w is an op of a bulkWrite command (rather
// than a statement of insert, update, delete or findAndModify).
func (w Write) InBulkWrite() bool { return w.bulk }

// ClassifyError says that a message is, or may be, a write that cannot be
// classified with certainty. NS is the best known namespace: the
// collection, DBNamespace ("db.*") when only the database is known,
// namespace.Unknown() ("*") when not even that is.
type ClassifyError struct {
	NS     namespace.Namespace
	Reason string
}

func (e *ClassifyError) Error() string {
	return "cannot classify write on " + e.NS.String() + ": " + e.Reason
}

func refuse(ns namespace.Namespace, format string, args ...any) error {
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
	var c *command
	if cmd != nil {
		c = &command{Command: cmd}
	}
	return classify(msg, c)
}

// classify is Classify of a command the plan's walk may have read
// already (c nil: not read yet).
func classify(msg wire.Message, c *command) ([]Write, error) {
	switch m := msg.(type) {
	case *wire.OpCompressed:
		if m.Inner == nil {
			return nil, refuse(anyNS(), "OP_COMPRESSED without an inner message")
		}
		return classify(m.Inner, c)
	case *wire.OpUpdate:
		return classifyLegacyUpdate(m)
	case *wire.OpDelete:
		return classifyLegacyDelete(m)
	case *wire.OpInsert:
		return classifyLegacyInsert(m)
	case *wire.OpMsg, *wire.OpQuery:
		if c == nil {
			cmd, err := wire.CommandOf(msg)
			if err != nil {
				return nil, refuse(anyNS(), "unreadable command: %v", err)
			}
			if cmd == nil {
				return nil, nil // a plain OP_QUERY: a read
			}
			c = &command{Command: cmd}
		}
		return classifyCommand(c)
	case *wire.OpGetMore, *wire.OpKillCursors:
		return nil, nil // legacy cursor reads
	default:
		// OP_REPLY, OP_RESERVED and opcodes the codec does not know: none
		// is a request the proxy can judge, whatever the connection layer
		// does with it.
		return nil, refuse(anyNS(), "opcode %v is not a request lockgate can read", msg.Header().OpCode)
	}
}

// classifyCommand reads a command by the write form its entry in the
// command table gives (wire/commands.go). A command that is not in the
// table is refused on every namespace of its database (every namespace at
// all on admin): lockgate cannot tell whether or where it writes, and
// guessing that it only reads would let a write command it has never
// heard of through.
func classifyCommand(c *command) ([]Write, error) {
	spec := c.Spec()
	if spec == nil {
		// The server matches names exactly and answers CommandNotFound to
		// "UPDATE"; an upstream that folds case would run it, on any
		// namespace the body names.
		if k := wire.WriteCommandFolding(c.Name); k != nil {
			return nil, refuse(anyNS(), "command %q differs from the write command %q only by case", c.Name, k.Name)
		}
		// Where it writes is as unknown as whether it does: a collection
		// may be named in any field, not only as the first value, and a
		// command on admin may name any database (as bulkWrite does).
		ns := DBNamespace(c.DB)
		if c.DB == "admin" {
			ns = anyNS()
		}
		return nil, refuse(ns, "command %q is not one lockgate knows (wire/commands.go), so it cannot tell whether or where it writes", c.Name)
	}
	read := readerOf(spec.Writes)
	if read == nil {
		// A form added to the table without a reader: fail closed.
		return nil, refuse(commandNS(c), "command %q has write form %d, which the classifier cannot read", c.Name, spec.Writes)
	}
	return read(c)
}

// readerOf returns the classifier's reader of a write form; every form of
// the command table has one (TestEveryWriteFormHasAReader).
func readerOf(f wire.WriteForm) func(*command) ([]Write, error) {
	switch f {
	case wire.WritesNothing:
		return readsOnly
	case wire.WritesInsert:
		return classifyInsert
	case wire.WritesUpdate:
		return classifyUpdate
	case wire.WritesDelete:
		return classifyDelete
	case wire.WritesFindAndModify:
		return classifyFindAndModify
	case wire.WritesBulk:
		return classifyBulkWrite
	case wire.WritesAggregate:
		return classifyAggregate
	case wire.WritesMapReduce:
		return classifyMapReduce
	case wire.WritesApplyOps:
		return classifyApplyOps
	case wire.WritesCollection:
		return classifyCollectionCommand
	case wire.WritesFullNamespace:
		return classifyFullNamespaceCommand
	case wire.WritesDatabase:
		return classifyDatabaseCommand
	case wire.WritesCreate:
		return classifyCreate
	case wire.WritesValidate:
		return classifyValidate
	case wire.WritesRename:
		return classifyRename
	case wire.WritesCloneAsCapped:
		return classifyCloneAsCapped
	case wire.WritesCollMod:
		return classifyCollMod
	case wire.WritesCreateIndexes:
		return classifyCreateIndexes
	case wire.WritesAnything:
		return classifyEval
	case wire.WritesCopyDB:
		return classifyCopyDB
	case wire.WritesExplained:
		return classifyExplain
	}
	return nil
}

func readsOnly(*command) ([]Write, error) { return nil, nil }

// classifyDatabaseCommand: dropDatabase, repairDatabase (before 4.2 it
// drops what it cannot read) and clone write every collection of $db.
func classifyDatabaseCommand(c *command) ([]Write, error) {
	return []Write{collWrite(DBNamespace(c.DB), c.Name)}, nil
}

// classifyEval: eval and $eval ran JavaScript that could write anywhere.
func classifyEval(*command) ([]Write, error) {
	return []Write{collWrite(anyNS(), WhatEval)}, nil
}

// classifyExplain: explain never executes an update, delete, insert,
// findAndModify or bulkWrite. It did execute $out (and so mapReduce output)
// at executionStats verbosity before MongoDB 4.2 (SERVER-38063), so an
// explained aggregate or mapReduce is classified as if it ran.
func classifyExplain(c *command) ([]Write, error) {
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
	if spec := wire.LookupCommand(name); spec == nil || !spec.ExplainRuns {
		if spec == nil {
			if w := wire.WriteCommandFolding(name); w != nil && w.ExplainRuns {
				return nil, refuse(anyNS(), "explained command %q differs from a write command only by case", name)
			}
		}
		return nil, nil
	}
	ic := &wire.Command{Name: name, DB: c.DB, Body: inner}
	ic.Collection, _ = v.StringValueOK()
	return classifyCommand(&command{Command: ic})
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

func collWrite(ns namespace.Namespace, what string) Write {
	return Write{NS: ns, Kind: KindCollectionWrite, List: ListCommand, What: what}
}

// commandNS is the best known namespace of a command: db.coll when the
// first value is a non-empty string, db.* otherwise.
func commandNS(c *command) namespace.Namespace {
	if c.Collection != "" {
		return c.ownNS()
	}
	return DBNamespace(c.DB)
}

// collectionNS returns db.coll for commands whose first value must name a
// collection.
func collectionNS(c *command) (namespace.Namespace, error) {
	if c.Collection == "" {
		v := firstValue(c.Body)
		return namespace.Namespace{}, refuse(DBNamespace(c.DB), "%s: the collection is a %v, not a non-empty string", c.Name, v.Type)
	}
	return c.ownNS(), nil
}

func firstValue(d bsoncore.Document) bsoncore.Value {
	it := iterate(d)
	_, v, _ := it.next()
	return v
}
