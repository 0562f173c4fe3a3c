package wire

import (
	"testing"

	"go.mongodb.org/mongo-driver/bson"
)

// TestCommandTable checks what the rest of lockgate relies on: the forms
// that carry statements name their field, no other entry does, and lock
// commands are never relayed.
func TestCommandTable(t *testing.T) {
	statements := map[WriteForm]string{WritesInsert: "documents", WritesUpdate: "updates", WritesDelete: "deletes", WritesBulk: "ops"}
	for _, c := range Commands() {
		if want := statements[c.Writes]; c.Statements != want {
			t.Errorf("%s: statements %q, want %q", c.Name, c.Statements, want)
		}
		if c.Writes >= numWriteForms {
			t.Errorf("%s: write form %d out of range", c.Name, c.Writes)
		}
		if c.Role == RoleLock && c.Writes != WritesNothing {
			t.Errorf("%s: a proxy-answered command cannot be a write the upstream runs", c.Name)
		}
		if got := LookupCommand(c.Name); got == nil || got.Name != c.Name {
			t.Errorf("LookupCommand(%q) = %v", c.Name, got)
		}
	}
	if LookupCommand("UPDATE") != nil || LookupCommand("") != nil {
		t.Error("lookups must match names exactly, as the server does")
	}
}

// TestCommandSpecFromTheWire: the parser attaches the table's entry, and
// the entry's name is the string the parser hands out: a known name costs
// no allocation, an unknown one its copy.
func TestCommandSpecFromTheWire(t *testing.T) {
	parse := func(name string) (Message, *Command) {
		body, err := bson.Marshal(bson.D{{Key: name, Value: 1}, {Key: "$db", Value: "admin"}})
		if err != nil {
			t.Fatal(err)
		}
		m, err := Parse(AppendMsg(nil, 1, 0, 0, body), Limits{})
		if err != nil {
			t.Fatal(err)
		}
		c, err := CommandOf(m)
		if err != nil {
			t.Fatal(err)
		}
		return m, c
	}
	allocs := func(m Message) float64 {
		return testing.AllocsPerRun(100, func() { _, _ = CommandOf(m) })
	}
	unknownMsg, unknown := parse("frobnicateDocuments")
	if unknown.Spec() != nil || unknown.Role() != RoleRelay {
		t.Fatalf("unknown command got entry %+v", unknown.Spec())
	}
	base := allocs(unknownMsg)
	for _, name := range []string{"update", "findandmodify", "hello", "acquireLock", "getMore"} {
		m, c := parse(name)
		spec := c.Spec()
		if spec == nil || spec.Name != name || c.Name != name {
			t.Fatalf("%s: entry %+v, name %q", name, spec, c.Name)
		}
		if got := allocs(m); got != base-1 {
			t.Errorf("%s: CommandOf allocates %v times, want %v (one fewer than for an unknown name)", name, got, base-1)
		}
	}
}
