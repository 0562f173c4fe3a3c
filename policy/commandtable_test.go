package policy

import (
	"errors"
	"testing"

	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
)

// TestEveryWriteFormHasAReader: a form added to the command table without
// a reader here would classify its commands as nothing at all.
func TestEveryWriteFormHasAReader(t *testing.T) {
	for f := 0; f < wire.NumWriteForms; f++ {
		if readerOf(wire.WriteForm(f)) == nil {
			t.Errorf("write form %d has no reader", f)
		}
	}
}

// TestCommandTableClassification: every command of the table that changes
// no document classifies as no write, whatever collection it names; every
// write command with nothing to read is refused on its namespace rather
// than read as harmless; a command not in the table is refused where it
// may reach.
func TestCommandTableClassification(t *testing.T) {
	for _, c := range wire.Commands() {
		raw := clMsgRaw(t, 0, bson.D{{Key: c.Name, Value: "orders"}, {Key: "$db", Value: "shop"}})
		ws, err := clClassify(t, raw)
		if c.Writes == wire.WritesNothing {
			if err != nil || len(ws) != 0 {
				t.Errorf("%s: %d writes, error %v; want none", c.Name, len(ws), err)
			}
			continue
		}
		if err == nil && len(ws) == 0 {
			switch c.Writes {
			case wire.WritesAggregate, wire.WritesMapReduce, wire.WritesCreate, wire.WritesValidate,
				wire.WritesCollMod, wire.WritesCreateIndexes, wire.WritesExplained:
				// They write only when asked to (a stage, an option).
			default:
				t.Errorf("%s: classified as writing nothing", c.Name)
			}
		}
	}
	for _, tc := range []struct {
		body bson.D
		ns   namespace.Namespace
	}{
		// The first value does not bound it: a field may name the target.
		{bson.D{{Key: "rewriteDocuments", Value: "scratch"}, {Key: "into", Value: "orders"}, {Key: "$db", Value: "shop"}}, DBNamespace("shop")},
		{bson.D{{Key: "rewriteDocuments", Value: 1}, {Key: "$db", Value: "shop"}}, DBNamespace("shop")},
		// On admin it may name any database.
		{bson.D{{Key: "rewriteDocuments", Value: 1}, {Key: "ns", Value: "shop.orders"}, {Key: "$db", Value: "admin"}}, namespace.Unknown()},
		{bson.D{{Key: "Delete", Value: "orders"}, {Key: "$db", Value: "shop"}}, namespace.Unknown()},
	} {
		_, err := clClassify(t, clMsgRaw(t, 0, tc.body))
		var ce *ClassifyError
		if !errors.As(err, &ce) || ce.NS != tc.ns {
			t.Errorf("%v: error %v, want a refusal on %s", tc.body, err, tc.ns)
		}
	}
	// Opcodes: the legacy cursor reads are reads; anything the codec does
	// not know is refused everywhere.
	for _, tc := range []struct {
		raw    []byte
		refuse bool
	}{
		{clFrame(wire.OpCodeGetMore, clI32(0), clCStr("shop.orders"), clI32(0), make([]byte, 8)), false},
		{clFrame(wire.OpCodeKillCursors, clI32(0), clI32(1), make([]byte, 8)), false},
		{clFrame(wire.OpCodeReserved, clI32(0), clCStr("shop.orders")), true},
		{clFrame(wire.OpCode(2099), clI32(0)), true},
	} {
		ws, err := Classify(clParse(t, tc.raw), nil)
		var ce *ClassifyError
		if got := errors.As(err, &ce) && ce.NS == namespace.Unknown(); got != tc.refuse || len(ws) != 0 {
			t.Errorf("opcode %v: writes %d, error %v; want refused %v", clParse(t, tc.raw).Header().OpCode, len(ws), err, tc.refuse)
		}
	}
}
