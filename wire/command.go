package wire

import (
	"fmt"
	"slices"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/bsontype"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// Command is the view of a database command, however it arrived. Its
// documents are views into the message's bytes and share their lifetime;
// its strings are copies.
type Command struct {
	Name       string            // first key of the body, as sent (case preserved)
	DB         string            // $db (OP_MSG) or the db of "<db>.$cmd" (OP_QUERY)
	Collection string            // value of the first key when it is a string, else ""
	Body       bsoncore.Document // for OP_QUERY: the unwrapped command ($query/query wrapper removed)
	Sequences  []Sequence
	LSID       bsoncore.Document // the lsid sub-document, nil when absent
	Legacy     bool              // arrived as OP_QUERY
	MoreToCome bool
	// ExhaustAllowed is the OP_MSG flag; it is never set for OP_QUERY.
	ExhaustAllowed bool
	Compressed     bool // arrived inside OP_COMPRESSED

	spec *CommandSpec // the table's entry for Name, nil when unknown
	// scanned: scanBody walked Body and kept the first value of each key
	// in bodyKeys (zero when absent), which Lookup answers without
	// walking it again.
	scanned bool
	kept    [len(bodyKeys)]bsoncore.Value
}

// bodyKeys are the body's keys that enforcement reads on every write
// (the owner's binding, the transaction flag, the running-time cap), kept
// by the walk that reads the command anyway.
var bodyKeys = [...]string{"comment", "autocommit", "maxTimeMS"}

// Lookup returns the body's first value under key, as
// bsoncore.Document.LookupErr finds it; false when it has none.
func (c *Command) Lookup(key string) (bsoncore.Value, bool) {
	// A switch, not a loop over bodyKeys: the kept keys are found
	// without a walk.
	if i := bodyKey(key); i >= 0 && c.scanned {
		return c.kept[i], c.kept[i].Type != 0
	}
	return c.lookupBody(key)
}

// lookupBody is Lookup's walk of the body.
func (c *Command) lookupBody(key string) (bsoncore.Value, bool) {
	v, err := c.Body.LookupErr(key)
	return v, err == nil
}

// BodyKey names one of the body's keys that the walk of the command
// keeps (bodyKeys), for Kept.
type BodyKey uint8

// The kept keys, in bodyKeys' order.
const (
	KeyComment    BodyKey = iota // "comment": the owner's binding
	KeyAutocommit                // "autocommit": the transaction flag
	KeyMaxTimeMS                 // "maxTimeMS": the running-time cap
)

// Kept is Lookup of the key k names, the same answer (a value found
// always has a type), found by its index: enforcement reads these on
// every write, and Lookup's compare of the key (the switch of bodyKey)
// and its call cost more than the read. Written to stay within the
// compiler's inlining budget (cost 80 of 80: read the kept value before
// the flag, the walk out of line), so that a constant k reads the one
// field. TestCommandLookupIsBodyLookup and FuzzCommandOf hold it to the
// body's first value.
func (c *Command) Kept(k BodyKey) (bsoncore.Value, bool) {
	v := c.kept[k]
	if !c.scanned {
		v = c.lookupKept(k)
	}
	return v, v.Type != 0
}

// lookupKept is Kept for a command not made by CommandOf (a zero Value
// when the body has no such key).
func (c *Command) lookupKept(k BodyKey) bsoncore.Value {
	v, _ := c.lookupBody(bodyKeys[k])
	return v
}

// bodyKey is key's index in bodyKeys, -1 for any other key (a mismatch
// fails TestCommandLookupIsBodyLookup).
func bodyKey(key string) int {
	switch key {
	case "comment":
		return 0
	case "autocommit":
		return 1
	case "maxTimeMS":
		return 2
	}
	return -1
}

// Spec returns the command table's entry for the command (commands.go),
// nil for a command lockgate does not know.
func (c *Command) Spec() *CommandSpec {
	if c.spec != nil {
		return c.spec
	}
	return LookupCommand(c.Name)
}

// Role is the proxy's role for the command (commands.go); RoleRelay for a
// command lockgate does not know.
func (c *Command) Role() Role {
	if s := c.Spec(); s != nil {
		return s.Role
	}
	return RoleRelay
}

// CommandOf returns the command carried by an OP_MSG, an OP_QUERY on
// "<db>.$cmd", or an OP_COMPRESSED wrapping either; (nil, nil) for anything
// else. The server identifies a command by the first key of its body, so
// does this; a body that could be read two ways (a duplicate $db, lsid,
// command key or one of bodyKeys, in the body or as a document sequence), an empty body, a
// missing or non-string $db in OP_MSG, or an OP_QUERY whose $db disagrees
// with its namespace is ErrMalformed: the proxy must never judge a
// different command than the one the server runs.
func CommandOf(m Message) (*Command, error) {
	switch m := m.(type) {
	case *OpMsg:
		c := &Command{
			Body:           m.Body,
			Sequences:      m.Sequences,
			MoreToCome:     m.Flags&MoreToCome != 0,
			ExhaustAllowed: m.Flags&ExhaustAllowed != 0,
		}
		db, err := c.scanBody("OP_MSG")
		if err != nil {
			return nil, err
		}
		if db.Type == 0 {
			return nil, malformed("OP_MSG: command %q has no $db", c.Name)
		}
		s, ok := stringBytes(db)
		if !ok {
			return nil, malformed("OP_MSG: $db of command %q is a %v, not a string", c.Name, db.Type)
		}
		if len(s) == 0 {
			return nil, malformed("OP_MSG: $db of command %q is empty", c.Name)
		}
		c.DB = internName(s)
		for _, seq := range c.Sequences {
			// The server reads a sequence as a body field of its name:
			// FerretDB replaces the body's value with it, MongoDB
			// refuses the duplicate. Either way not the value judged.
			if seq.Identifier == "$db" || seq.Identifier == "lsid" || seq.Identifier == c.Name || slices.Contains(bodyKeys[:], seq.Identifier) {
				return nil, malformed("OP_MSG: %q is also a document sequence in command %q", seq.Identifier, c.Name)
			}
		}
		return c, nil
	case *OpQuery:
		nsDB, ok := m.commandDB()
		if !ok {
			return nil, nil
		}
		if nsDB == "" {
			return nil, malformed("OP_QUERY: namespace %q has no database", m.FullCollectionName)
		}
		c := &Command{Body: unwrapQuery(m.Query), Legacy: true, DB: nsDB}
		db, err := c.scanBody("OP_QUERY")
		if err != nil {
			return nil, err
		}
		if db.Type != 0 {
			if s, ok := stringBytes(db); !ok || string(s) != nsDB {
				return nil, malformed("OP_QUERY: $db %v disagrees with namespace %q", db, m.FullCollectionName)
			}
		}
		return c, nil
	case *OpCompressed:
		c, err := CommandOf(m.Inner)
		if c != nil {
			c.Compressed = true
		}
		return c, err
	default:
		return nil, nil
	}
}

// unwrapQuery removes the legacy {$query: {...}, $readPreference: ...} and
// {query: {...}} wrappers that mongos-era drivers put around a command.
func unwrapQuery(q bsoncore.Document) bsoncore.Document {
	e, err := q.IndexErr(0)
	if err != nil {
		return q
	}
	switch string(e.KeyBytes()) {
	case "$query", "query":
		if d, ok := e.Value().DocumentOK(); ok {
			return d
		}
	}
	return q
}

// scanBody walks the body once: the command name, its collection, lsid, and
// $db (returned raw, zero Value when absent), rejecting duplicates.
func (c *Command) scanBody(op string) (bsoncore.Value, error) {
	var db bsoncore.Value
	var name []byte
	sawDB, sawLSID := false, false
	rest := elements(c.Body)
	for i := 0; len(rest) > 0; i++ {
		e, r, ok := bsoncore.ReadElement(rest)
		if !ok {
			return db, malformed("%s: command body element %d is unreadable", op, i)
		}
		rest = r
		key := e.KeyBytes()
		if i == 0 {
			name = key
			if c.spec = LookupCommand(string(key)); c.spec != nil {
				c.Name = c.spec.Name
			} else {
				c.Name = string(key)
			}
			if s, ok := e.Value().StringValueOK(); ok {
				c.Collection = s
			}
		} else if string(key) == string(name) {
			return db, malformed("%s: command key %q appears twice", op, name)
		}
		switch string(key) {
		case "$db":
			if sawDB {
				return db, malformed("%s: $db appears twice in command %q", op, name)
			}
			sawDB, db = true, e.Value()
		case "lsid":
			if sawLSID {
				return db, malformed("%s: lsid appears twice in command %q", op, name)
			}
			sawLSID = true
			d, ok := e.Value().DocumentOK()
			if !ok {
				return db, malformed("%s: lsid of command %q is a %v, not a document", op, name, e.Value().Type)
			}
			c.LSID = d
		case bodyKeys[0], bodyKeys[1], bodyKeys[2]:
			for j, k := range bodyKeys {
				if k != string(key) {
					continue
				}
				if c.kept[j].Type != 0 {
					// Enforcement reads the first (the owner's binding,
					// the transaction flag, the cap it may keep); a server
					// that takes the last would run another command.
					return db, malformed("%s: %s appears twice in command %q", op, key, name)
				}
				c.kept[j] = e.Value()
			}
		}
	}
	if name == nil {
		return db, malformed("%s: empty command body", op)
	}
	c.scanned = true
	return db, nil
}

// SessionID returns the 16 bytes of lsid.id and true; false when the
// command has no lsid or one that is not a session id (SessionID).
func (c *Command) SessionID() ([]byte, bool) {
	if c.LSID == nil {
		return nil, false
	}
	return SessionID(c.LSID)
}

// SessionID reads a logical session id, {id: <UUID>, ...}, as the server
// does: id is binary subtype 4 of 16 bytes, once. Anything else (the legacy
// UUID subtype 3, a generic binary, another length, a second id) is no
// session id: the server refuses it, so lockgate never takes it for the
// session whose bytes it carries. The one parser of lsid, of endSessions'
// and of killSessions' ids.
func SessionID(lsid bsoncore.Document) ([]byte, bool) {
	if len(lsid) == len(driverLSID) && string(lsid[:13]) == driverLSID[:13] && lsid[29] == 0 {
		// What every driver sends, {id: <UUID>} alone, read without a
		// walk: the one element, at its one place (readSessionID reads
		// it the same, TestSessionIDAsTheWalkReadsIt).
		return lsid[13:29:29], true
	}
	return readSessionID(lsid)
}

// driverLSID is the layout of {id: <UUID>}: the document's length (30),
// a binary element "id" of 16 bytes, subtype 4, then the id (zeros here)
// and the document's end.
const driverLSID = "\x1e\x00\x00\x00\x05id\x00\x10\x00\x00\x00\x04" + "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00" + "\x00"

// readSessionID is SessionID for any document: a walk over its elements.
func readSessionID(lsid bsoncore.Document) ([]byte, bool) {
	var id []byte
	found := false
	rest := elements(lsid)
	for len(rest) > 0 {
		e, r, ok := bsoncore.ReadElement(rest)
		if !ok {
			return nil, false
		}
		rest = r
		if string(e.KeyBytes()) != "id" {
			continue
		}
		sub, data, ok := e.Value().BinaryOK()
		if found || !ok || sub != bsontype.BinaryUUID || len(data) != 16 {
			return nil, false
		}
		id, found = data, true
	}
	return id, found
}

// Documents returns the statements under field ("updates", "deletes",
// "documents", "ops", "nsInfo"), from the body's array or from the kind-1
// section of that name. Present in both places (or twice in the body) is
// ErrMalformed, as the server refuses it; absent is (nil, nil); a body
// field that is not an array of documents is ErrMalformed.
func (c *Command) Documents(field string) ([]bsoncore.Document, error) {
	var first bsoncore.Value
	n := 0
	rest := elements(c.Body)
	for len(rest) > 0 {
		e, r, ok := bsoncore.ReadElement(rest)
		if !ok {
			return nil, malformed("command %q: body element unreadable", c.Name)
		}
		rest = r
		if string(e.KeyBytes()) != field {
			continue
		}
		if n == 0 {
			first = e.Value()
		}
		n++
	}
	return c.DocumentsFound(nil, field, first, n)
}

// DocumentsFound is Documents for a caller that has read the body's
// fields already (policy.NewPlan's one walk): first is field's first value
// in the body, n the number of times the body names it (0 for none). The
// answer, errors included, is Documents'; the documents of a body array
// are appended to dst[:0], the caller's room.
func (c *Command) DocumentsFound(dst []bsoncore.Document, field string, first bsoncore.Value, n int) ([]bsoncore.Document, error) {
	var fromBody []bsoncore.Document
	inBody := n > 0
	if inBody {
		arr, ok := first.ArrayOK()
		if !ok {
			return nil, malformed("command %q: field %q is a %v, not an array", c.Name, field, first.Type)
		}
		docs, err := arrayDocuments(dst, arr)
		if err != nil {
			return nil, malformed("command %q: field %q: %v", c.Name, field, err)
		}
		if n > 1 {
			return nil, malformed("command %q: field %q appears twice", c.Name, field)
		}
		fromBody = docs
	}
	var fromSeq []bsoncore.Document
	inSeq := false
	for _, s := range c.Sequences {
		if s.Identifier != field {
			continue
		}
		if inSeq {
			return nil, malformed("command %q: two document sequences named %q", c.Name, field)
		}
		inSeq, fromSeq = true, s.Documents
	}
	switch {
	case inBody && inSeq:
		return nil, malformed("command %q: %q is both a body field and a document sequence", c.Name, field)
	case inSeq:
		return fromSeq, nil
	default:
		return fromBody, nil
	}
}

// arrayDocuments returns the elements of arr, each of which must be a
// document, appended to dst[:0]. An empty array yields an empty, non-nil
// slice.
func arrayDocuments(dst []bsoncore.Document, arr bsoncore.Array) ([]bsoncore.Document, error) {
	docs := dst[:0]
	if docs == nil {
		docs = []bsoncore.Document{}
	}
	rest := elements(arr)
	for i := 0; len(rest) > 0; i++ {
		e, r, ok := bsoncore.ReadElement(rest)
		if !ok {
			return nil, fmt.Errorf("element %d unreadable", i)
		}
		rest = r
		d, ok := e.Value().DocumentOK()
		if !ok {
			return nil, fmt.Errorf("element %d is a %v, not a document", i, e.Value().Type)
		}
		docs = append(docs, d)
	}
	return docs, nil
}

// elements returns the element bytes of a document or array, nil when it is
// too short to be one (a zero Command, a hand-made OpMsg).
func elements(d []byte) []byte {
	if len(d) < minDocSize {
		return nil
	}
	return d[4 : len(d)-1]
}

// stringBytes returns the bytes of a validated BSON string without copying.
func stringBytes(v bsoncore.Value) ([]byte, bool) {
	if v.Type != bson.TypeString || len(v.Data) < 5 {
		return nil, false
	}
	return v.Data[4 : len(v.Data)-1], true
}
