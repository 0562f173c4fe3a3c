package namespace

import "strings"

// Any is the database and the collection of a reference that cannot be
// told (an applyOps operation naming its collection by UUID, a change
// stream over the whole deployment): whoever protects namespaces must
// read it as any of them.
const Any = "*"

// Namespace is a database and a collection in it. The collection is ""
// for a reference to a whole database. The zero value names nothing.
//
// It keeps the text it stands for, so that String, DB and Collection
// cost no allocation: a namespace is read on every enforced write (a rule
// lookup, a lock key, an audit line). Two namespaces are == exactly when
// their databases and collections are.
type Namespace struct {
	s   string // "db.coll"; "db" for a whole database
	dot int    // where the database ends in s
}

// New returns the namespace of collection coll in database db; coll ""
// stands for the whole database.
func New(db, coll string) Namespace {
	if coll == "" {
		return Database(db)
	}
	return Namespace{s: db + "." + coll, dot: len(db)}
}

// Database returns the namespace that stands for every collection of db.
func Database(db string) Namespace { return Namespace{s: db, dot: len(db)} }

// Unknown is the namespace of a reference that cannot be told (Any, Any).
func Unknown() Namespace { return Namespace{s: Any + "." + Any, dot: len(Any)} }

// Split splits s at its first dot, as strings.Cut does: ok reports that s
// has a dot, either side may be empty. Where a name is read leniently
// (a legacy opcode's fullCollectionName, a policy rule's pattern), this is
// the reading.
func Split(s string) (n Namespace, ok bool) {
	i := strings.IndexByte(s, '.')
	switch {
	case i < 0:
		return Database(s), false
	case i == len(s)-1:
		return Database(s[:i]), true
	}
	return Namespace{s: s, dot: i}, true
}

// Of is Split without its ok: the namespace s names, read leniently.
func Of(s string) Namespace {
	n, _ := Split(s)
	return n
}

// Parse reads "db.coll" as the server reads a full namespace: split at the
// first dot, both sides non-empty.
func Parse(s string) (Namespace, bool) {
	n, ok := Split(s)
	return n, ok && n.Valid()
}

// DB returns the database.
func (n Namespace) DB() string { return n.s[:n.dot] }

// Collection returns the collection, "" for a whole database.
func (n Namespace) Collection() string {
	if n.dot >= len(n.s) {
		return ""
	}
	return n.s[n.dot+1:]
}

// Parts returns the database and the collection, for the callers that
// pass them on separately (a command's $db and first value).
func (n Namespace) Parts() (db, coll string) { return n.DB(), n.Collection() }

// Valid reports whether both the database and the collection are named.
func (n Namespace) Valid() bool { return n.dot > 0 && n.dot < len(n.s)-1 }

// IsDatabase reports whether n stands for a whole database.
func (n Namespace) IsDatabase() bool { return n.dot > 0 && n.dot == len(n.s) }

// IsUnknown reports whether n may be any namespace (Unknown).
func (n Namespace) IsUnknown() bool { return n.DB() == Any }

// IsZero reports whether n names nothing.
func (n Namespace) IsZero() bool { return n.s == "" }

// IsCommand reports whether n is a database's command namespace,
// "db.$cmd", by which OP_QUERY and applyOps carry commands.
func (n Namespace) IsCommand() bool { return n.Collection() == "$cmd" }

// String returns "db.coll", "db" for a whole database and "*" for
// Unknown, without an allocation.
func (n Namespace) String() string {
	if n.IsUnknown() {
		return Any
	}
	return n.s
}

// maxDatabase is the server's bound on a database name's length (bytes).
const maxDatabase = 63

// ValidDatabase reports whether the server accepts db as a database name:
// non-empty, at most 63 bytes, none of / \ . space " $ and NUL. A name
// it refuses names no data, so a lock taken under it would cover no
// write.
func ValidDatabase(db string) bool {
	return db != "" && len(db) <= maxDatabase && !strings.ContainsAny(db, "/\\. \"$\x00")
}
