package policy

import (
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// Access says how a request touches a namespace. The bits combine.
type Access uint8

const (
	// Named: the request names the namespace where the server reads one
	// (its collection, a pipeline stage's, a full namespace field), to
	// read or to write it; the walk does not tell which.
	Named Access = 1 << iota
	// Written: the classifier found a write there (Plan.Writes).
	Written
)

// Ref is one namespace a request touches. A whole database is a
// namespace whose Collection is ""; a reference that cannot be told is
// namespace.Unknown (any namespace at all).
type Ref struct {
	NS     namespace.Namespace
	Access Access
}

// Plan is what one request does, read once and shared by every stage that
// judges it: the namespaces it touches and how, the aggregation stages it
// runs, and its writes with their statements (filters, updates, ids).
// The boundary reads Refs and Stages, enforcement reads Writes.
//
// Every namespace a write of Writes lands on is also in Refs (with
// Written), so a check over Refs covers every namespace enforcement sees:
// the two can never disagree on where a request goes.
//
// A Plan is built by NewPlan, or re-read for another request by Read,
// and not changed in between; it is safe for concurrent reads. Its
// documents are views into the request's message and share its lifetime.
type Plan struct {
	// The fields the usual request touches come first, so that it spans
	// as few cache lines as it can: a connection's plan is read once per
	// request and evicted in between by the other connections' work.
	refs   []Ref
	stages []string
	writes []Write
	err    error
	cmd    command // the request's command as the walk read it

	writeBuf      []Write // writes' room, kept by Read up to keptWrites
	writeBufTaken bool    // newWrites handed writeBuf out since Read
	docTaken      bool    // docRoom handed docBuf out since Read
	// lastNS is the last collection namespace the walk made, kept across
	// Reads: a connection writes to the same collection again and again,
	// and its text is then not built (and allocated) anew. Its string is
	// its own, never a view into a message.
	lastNS namespace.Namespace

	// Room for what nearly every request has, so that a plan is one
	// allocation, and none when it is read again (Read).
	refBuf   [4]Ref
	stageBuf [4]string
	// docBuf is the room of the statement list of a command that sends
	// its statements in its body (an array, not a document sequence),
	// handed out once per Read.
	docBuf [4]bsoncore.Document
}

// keptWrites is how many statements' room a plan keeps from one Read to
// the next: what the usual write and a small batch need, and not the
// room of a bulk insert of thousands, which would stay with an idle
// connection.
const keptWrites = 16

// NewPlan walks msg once into its plan. cmd is wire.CommandOf(msg), nil
// for a legacy opcode that is not a command (OP_INSERT, OP_QUERY on a
// collection, ...); for a command message with a nil cmd the plan reads
// the command itself.
func NewPlan(msg wire.Message, cmd *wire.Command) *Plan {
	p := &Plan{}
	p.Read(msg, cmd)
	return p
}

// Read makes p the plan of msg, as NewPlan does, reusing p's room: what
// p was before is gone, so only p's owner may call it, and only once
// nothing reads p's last plan any more (the proxy's connection, between
// two of its requests).
func (p *Plan) Read(msg wire.Message, cmd *wire.Command) {
	p.forget()
	p.refs, p.stages = p.refBuf[:0], p.stageBuf[:0]
	p.cmd = command{plan: p}
	if cmd == nil {
		if c, err := wire.CommandOf(msg); err == nil {
			cmd = c
		}
	}
	if cmd != nil {
		// One walk: the references walk reads every field of the body
		// and hands the classifier what it would read again (the
		// statement lists, the command's own namespace).
		p.cmd.Command = cmd
		p.cmd.want()
		walkReferences(p, cmd)
		p.writes, p.err = classify(msg, &p.cmd)
	} else {
		if s := legacyNamespace(msg); s != "" {
			// Read leniently, as a legacy opcode's server does: "db."
			// is the whole of db.
			if n, ok := namespace.Split(s); ok {
				p.add(n, Named)
			}
		}
		p.writes, p.err = classify(msg, nil)
	}
	for i := range p.writes {
		p.add(writeNamespace(p.writes[i].NS), Written)
	}
}

// Forget lets go of p's request: every view into its message goes (its
// command, statements, filters, documents), so that a plan kept for the
// connection's next request (proxy.Forgetter) does not keep a message of
// megabytes reachable meanwhile. Its room and the last namespace, whose
// text is its own, stay. p is empty until the next Read.
func (p *Plan) Forget() {
	p.forget()
	p.cmd = command{}
}

// forget is Forget but for the command, which Read sets whole at once.
// It clears only the room the last request used (the usual write takes
// no statement list from the body, and its line of docBuf is then not
// touched at all): the rest is zero already.
func (p *Plan) forget() {
	clear(p.refs)
	clear(p.stages)
	if len(p.refs) > len(p.refBuf) {
		// Grown past its room: the room holds the first few still.
		clear(p.refBuf[:])
	}
	if len(p.stages) > len(p.stageBuf) {
		clear(p.stageBuf[:])
	}
	if p.writeBufTaken {
		// All of it: a classifier that failed half way filled some of
		// its statements and returned none.
		clear(p.writeBuf[:cap(p.writeBuf)])
	}
	if p.docTaken {
		clear(p.docBuf[:])
	}
	p.refs, p.stages, p.writes, p.err, p.writeBufTaken, p.docTaken = nil, nil, nil, nil, false, false
}

// ns is namespace.New(db, coll) for a collection, without building its
// text again when it is the last one the plan made.
func (p *Plan) ns(db, coll string) namespace.Namespace {
	if coll == "" {
		return namespace.Database(db)
	}
	if n := p.lastNS; n.Collection() == coll && n.DB() == db && !n.IsZero() {
		return n
	}
	p.lastNS = namespace.New(db, coll)
	return p.lastNS
}

// docRoom is room for a statement list, the plan's own the first time
// after Read: a second list (bulkWrite's nsInfo, then its ops) must not
// overwrite the first while it may still be read.
func (p *Plan) docRoom() []bsoncore.Document {
	if p.docTaken {
		return nil
	}
	p.docTaken = true
	return p.docBuf[:0]
}

// newWrites returns room for n writes, all zero: the plan's own when it
// is large enough, kept for the next Read when n is small.
func (p *Plan) newWrites(n int) []Write {
	if n <= cap(p.writeBuf) && !p.writeBufTaken {
		// Once per Read: a second list would overwrite the first.
		p.writeBufTaken = true
		return p.writeBuf[:n]
	}
	ws := make([]Write, n)
	if n <= keptWrites && !p.writeBufTaken {
		p.writeBuf, p.writeBufTaken = ws, true
	}
	return ws
}

// Refs are the namespaces the request touches, each once or more (a
// namespace touched far apart in a long command may repeat).
func (p *Plan) Refs() []Ref { return p.refs }

// Stages are the names of the aggregation stages the request runs, at
// any depth, in order.
func (p *Plan) Stages() []string { return p.stages }

// Writes are the writes the request performs, in statement order, and the
// classifier's refusal: an error is a *ClassifyError, meaning the request
// is or may be a write that cannot be classified with certainty (see
// Classify).
func (p *Plan) Writes() ([]Write, error) { return p.writes, p.err }

// add records a reference. Repeats of a recent one merge: a bulk insert of
// a million documents into one namespace is one Ref, and no command is
// scanned quadratically.
func (p *Plan) add(n namespace.Namespace, a Access) {
	const recent = 8
	for i := len(p.refs) - 1; i >= 0 && i >= len(p.refs)-recent; i-- {
		if p.refs[i].NS == n {
			p.refs[i].Access |= a
			return
		}
	}
	p.refs = append(p.refs, Ref{NS: n, Access: a})
}

// writeNamespace reads Write.NS: "db.coll", "db.*" for a whole database,
// "*" for any namespace.
func writeNamespace(n namespace.Namespace) namespace.Namespace {
	if n.IsUnknown() {
		return namespace.Unknown()
	}
	if n.Collection() == "*" {
		return namespace.Database(n.DB())
	}
	return n
}

// legacyNamespace is the namespace of a legacy opcode that is not a
// command (OP_QUERY on a collection, OP_GET_MORE, OP_INSERT, OP_UPDATE,
// OP_DELETE), inside OP_COMPRESSED too.
func legacyNamespace(m wire.Message) string {
	switch m := m.(type) {
	case *wire.OpCompressed:
		if m.Inner != nil {
			return legacyNamespace(m.Inner)
		}
	case *wire.OpQuery:
		return m.FullCollectionName
	case *wire.OpGetMore:
		return m.FullCollectionName
	case *wire.OpInsert:
		return m.FullCollectionName
	case *wire.OpUpdate:
		return m.FullCollectionName
	case *wire.OpDelete:
		return m.FullCollectionName
	}
	return ""
}

// stageName is the name of a pipeline stage, k, as a string without an
// allocation for the stages most pipelines are made of.
func stageName(k []byte) string {
	switch string(k) {
	case "$match":
		return "$match"
	case "$project":
		return "$project"
	case "$group":
		return "$group"
	case "$sort":
		return "$sort"
	case "$limit":
		return "$limit"
	case "$skip":
		return "$skip"
	case "$unwind":
		return "$unwind"
	case "$addFields":
		return "$addFields"
	case "$set":
		return "$set"
	case "$unset":
		return "$unset"
	case "$count":
		return "$count"
	case "$replaceRoot":
		return "$replaceRoot"
	case "$replaceWith":
		return "$replaceWith"
	case "$lookup":
		return "$lookup"
	case "$graphLookup":
		return "$graphLookup"
	case "$unionWith":
		return "$unionWith"
	case "$facet":
		return "$facet"
	case "$out":
		return "$out"
	case "$merge":
		return "$merge"
	case "$changeStream":
		return "$changeStream"
	case "$currentOp":
		return "$currentOp"
	case "$listSessions":
		return "$listSessions"
	case "$listLocalSessions":
		return "$listLocalSessions"
	}
	return string(k)
}
