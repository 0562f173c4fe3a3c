package namespace

import "strings"

// Any is the database and the collection of a reference that cannot be
// told (an applyOps operation naming its collection by UUID, a change
// stream over the whole deployment): whoever protects namespaces must
// read it as any of them.
const Any = "*"

// Namespace is a database and a collection in it. The collection is ""
// for a reference to a whole database. The zero value names nothing.
type Namespace struct {
	db, coll string
}

// New returns the namespace of collection coll in database db; coll ""
// stands for the whole database.
func New(db, coll string) Namespace { return Namespace{db: db, coll: coll} }

// Database returns the namespace that stands for every collection of db.
func Database(db string) Namespace { return Namespace{db: db} }

// Unknown is the namespace of a reference that cannot be told (Any, Any).
func Unknown() Namespace { return Namespace{db: Any, coll: Any} }

// Split splits s at its first dot, as strings.Cut does: ok reports that s
// has a dot, either side may be empty. Where a name is read leniently
// (a legacy opcode's fullCollectionName, a policy rule's pattern), this is
// the reading.
func Split(s string) (n Namespace, ok bool) {
	db, coll, ok := strings.Cut(s, ".")
	return Namespace{db: db, coll: coll}, ok
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
func (n Namespace) DB() string { return n.db }

// Collection returns the collection, "" for a whole database.
func (n Namespace) Collection() string { return n.coll }

// Parts returns the database and the collection, for the callers that
// pass them on separately (a command's $db and first value).
func (n Namespace) Parts() (db, coll string) { return n.db, n.coll }

// Valid reports whether both the database and the collection are named.
func (n Namespace) Valid() bool { return n.db != "" && n.coll != "" }

// IsDatabase reports whether n stands for a whole database.
func (n Namespace) IsDatabase() bool { return n.db != "" && n.coll == "" }

// IsUnknown reports whether n may be any namespace (Unknown).
func (n Namespace) IsUnknown() bool { return n.db == Any }

// IsZero reports whether n names nothing.
func (n Namespace) IsZero() bool { return n.db == "" && n.coll == "" }

// IsCommand reports whether n is a database's command namespace,
// "db.$cmd", by which OP_QUERY and applyOps carry commands.
func (n Namespace) IsCommand() bool { return n.coll == "$cmd" }

// String returns "db.coll", "db" for a whole database and "*" for
// Unknown.
func (n Namespace) String() string {
	switch {
	case n.IsUnknown():
		return Any
	case n.coll == "":
		return n.db
	}
	return n.db + "." + n.coll
}
