package policy

import (
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/wire"
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
// A Plan is built by NewPlan and not changed after; it is safe for
// concurrent reads. Its documents are views into the request's message
// and share its lifetime.
type Plan struct {
	refs   []Ref
	stages []string
	writes []Write
	err    error
	cmd    command // the request's command as the walk read it

	// Room for what nearly every request has, so that a plan is one
	// allocation.
	refBuf   [4]Ref
	stageBuf [4]string
}

// NewPlan walks msg once into its plan. cmd is wire.CommandOf(msg), nil
// for a legacy opcode that is not a command (OP_INSERT, OP_QUERY on a
// collection, ...); for a command message with a nil cmd the plan reads
// the command itself.
func NewPlan(msg wire.Message, cmd *wire.Command) *Plan {
	p := &Plan{}
	p.refs, p.stages = p.refBuf[:0], p.stageBuf[:0]
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
	return p
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
