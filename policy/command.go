package policy

import (
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// command is a command as the classifier's readers read it: the wire
// command, and what the plan's one walk already found of it (NewPlan), so
// that a reader neither walks the body again for its statement lists nor
// builds the command's namespace a second time. A command made without a
// walk (Classify, an explained command) finds both itself.
type command struct {
	*wire.Command
	// plan is the plan the command is read into, whose room the
	// classifier writes into; nil for a command read on its own.
	plan *Plan
	// own is the command's own collection when the walk made it; zero
	// otherwise.
	own namespace.Namespace
	// found are the body fields the form's reader reads as statement
	// lists (Documents), as the walk saw them; complete says that the
	// walk read the whole body, so that a field not seen is absent.
	found    [2]foundField
	nfound   int
	complete bool
	// agg is the classifier's scan of an aggregate's pipeline for $out
	// and $merge, made by the walk as it reads the stages (walkPipeline),
	// so that the pipeline is read once; classifyAggregate reads it
	// again itself whenever the walk's reading could differ from its own.
	agg aggScan
}

// foundField is a body field as the walk saw it: its first value and how
// many times the body names it.
type foundField struct {
	field string
	first bsoncore.Value
	n     int
}

// want registers the fields the reader of c's write form reads as
// statement lists, for the walk to find.
func (c *command) want() {
	spec := c.Spec()
	if spec == nil {
		return
	}
	add := func(f string) {
		if f != "" && c.nfound < len(c.found) {
			c.found[c.nfound] = foundField{field: f}
			c.nfound++
		}
	}
	switch spec.Writes {
	case wire.WritesAggregate:
		add("pipeline")
		c.agg.wanted = true
	case wire.WritesApplyOps:
		add(c.Name)
	default:
		add(spec.Statements)
		add(spec.Namespaces)
	}
}

// saw records one body field k with value v, read by the walk.
func (c *command) saw(k []byte, v bsoncore.Value) {
	for i := range c.found[:c.nfound] {
		f := &c.found[i]
		if f.field == string(k) {
			if f.n == 0 {
				f.first = v
			}
			f.n++
		}
	}
}

// Documents is wire.Command.Documents, from the walk's findings when it
// has them.
func (c *command) Documents(field string) ([]bsoncore.Document, error) {
	if c.complete {
		for i := range c.found[:c.nfound] {
			if f := &c.found[i]; f.field == field {
				return c.Command.DocumentsFound(c.docs(), field, f.first, f.n)
			}
		}
	}
	return c.Command.Documents(field)
}

// ownNS is the namespace of a command whose first value names a
// collection.
func (c *command) ownNS() namespace.Namespace {
	if !c.own.IsZero() {
		return c.own
	}
	if c.plan != nil {
		return c.plan.ns(c.DB, c.Collection)
	}
	return namespace.New(c.DB, c.Collection)
}

// docs is room for a statement list read from the body (Plan.docRoom).
func (c *command) docs() []bsoncore.Document {
	if c.plan != nil {
		return c.plan.docRoom()
	}
	return nil
}

// writes returns room for n writes, all zero (Plan.newWrites).
func (c *command) writes(n int) []Write {
	if c.plan != nil {
		return c.plan.newWrites(n)
	}
	return make([]Write, n)
}
