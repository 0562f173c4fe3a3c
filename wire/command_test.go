package wire

import (
	"bytes"
	"fmt"
	"testing"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

var sessionUUID = []byte("0123456789abcdef")

func lsidDoc(subtype byte, id []byte) bsoncore.Document {
	return doc(func(b *bsoncore.DocumentBuilder) { b.AppendBinary("id", subtype, id) })
}

func msgOf(body bsoncore.Document, flags MsgFlags, seqs ...Sequence) Message {
	return mustParseNoT(AppendMsg(nil, 5, 0, flags, body, seqs...))
}

func mustParseNoT(raw []byte) Message {
	m, err := Parse(raw, Limits{})
	if err != nil {
		panic(err)
	}
	return m
}

func queryOf(ns string, q bsoncore.Document) Message {
	return mustParseNoT(frameOf(OpCodeQuery, i32(0), cstr(ns), i32(0), i32(-1), q))
}

func TestCommandOf(t *testing.T) {
	lsid := lsidDoc(4, sessionUUID)
	upd := doc(func(b *bsoncore.DocumentBuilder) {
		b.AppendString("update", "items").AppendDocument("lsid", lsid).AppendString("$db", "app")
	})
	c, err := CommandOf(msgOf(upd, MoreToCome|ExhaustAllowed))
	if err != nil {
		t.Fatal(err)
	}
	if c.Name != "update" || c.DB != "app" || c.Collection != "items" || !bytes.Equal(c.LSID, lsid) ||
		!c.MoreToCome || !c.ExhaustAllowed || c.Legacy || c.Compressed || !bytes.Equal(c.Body, upd) {
		t.Errorf("OP_MSG command %+v", c)
	}
	if id, ok := c.SessionID(); !ok || !bytes.Equal(id, sessionUUID) {
		t.Errorf("SessionID = %x, %v", id, ok)
	}

	// Name case is preserved; a non-string first value leaves Collection empty.
	c, err = CommandOf(msgOf(doc(func(b *bsoncore.DocumentBuilder) {
		b.AppendInt32("isMaster", 1).AppendString("$db", "admin")
	}), 0))
	if err != nil || c.Name != "isMaster" || c.Collection != "" || c.LSID != nil {
		t.Errorf("isMaster: %+v, %v", c, err)
	}
	if _, ok := c.SessionID(); ok {
		t.Error("SessionID without lsid")
	}

	// OP_QUERY on $cmd with each wrapper.
	inner := doc(func(b *bsoncore.DocumentBuilder) { b.AppendString("delete", "items").AppendDocument("lsid", lsid) })
	for name, q := range map[string]bsoncore.Document{
		"plain": inner,
		"$query": doc(func(b *bsoncore.DocumentBuilder) {
			b.AppendDocument("$query", inner).AppendDocument("$readPreference", lsid)
		}),
		"query": doc(func(b *bsoncore.DocumentBuilder) { b.AppendDocument("query", inner) }),
	} {
		c, err := CommandOf(queryOf("app.$cmd", q))
		if err != nil || c.Name != "delete" || c.DB != "app" || c.Collection != "items" || !c.Legacy || !bytes.Equal(c.Body, inner) || c.LSID == nil {
			t.Errorf("%s: %+v, %v", name, c, err)
		}
	}
	// A wrapper key that is not a document is the command itself.
	c, err = CommandOf(queryOf("app.$cmd", doc(func(b *bsoncore.DocumentBuilder) { b.AppendString("query", "x") })))
	if err != nil || c.Name != "query" {
		t.Errorf("non-document query key: %+v, %v", c, err)
	}
	// $db agreeing with the namespace is fine.
	c, err = CommandOf(queryOf("app.$cmd", cmdDoc("find", "c", "app")))
	if err != nil || c.DB != "app" {
		t.Errorf("agreeing $db: %+v, %v", c, err)
	}

	// Not commands.
	for name, m := range map[string]Message{
		"query on a collection": queryOf("app.items", inner),
		"pseudo command":        queryOf("admin.$cmd.sys.inprog", inner),
		"dotted $cmd":           queryOf("lockgate.locks.$cmd", inner),
		"reply":                 mustParseNoT(AppendReply(nil, 1, 2, 0, 0, 0, inner)),
		"insert":                mustParseNoT(frameOf(OpCodeInsert, i32(0), cstr("db.c"), inner)),
		"unknown":               mustParseNoT(frameOf(1234)),
	} {
		if c, err := CommandOf(m); c != nil || err != nil {
			t.Errorf("%s: %+v, %v", name, c, err)
		}
	}
}

func TestCommandOfMalformed(t *testing.T) {
	lsid := lsidDoc(4, sessionUUID)
	tests := []struct {
		name   string
		m      Message
		reason string
	}{
		{"duplicate $db", msgOf(doc(func(b *bsoncore.DocumentBuilder) {
			b.AppendString("delete", "c").AppendString("$db", "app").AppendString("$db", "admin")
		}), 0), "$db appears twice"},
		{"duplicate lsid", msgOf(doc(func(b *bsoncore.DocumentBuilder) {
			b.AppendString("delete", "c").AppendDocument("lsid", lsid).AppendString("$db", "app").AppendDocument("lsid", lsid)
		}), 0), "lsid appears twice"},
		{"duplicate command key", msgOf(doc(func(b *bsoncore.DocumentBuilder) {
			b.AppendString("delete", "open").AppendString("$db", "app").AppendString("delete", "locked")
		}), 0), `command key "delete" appears twice`},
		{"missing $db", msgOf(doc(func(b *bsoncore.DocumentBuilder) { b.AppendString("delete", "c") }), 0), "has no $db"},
		{"non-string $db", msgOf(doc(func(b *bsoncore.DocumentBuilder) {
			b.AppendString("delete", "c").AppendInt32("$db", 1)
		}), 0), "not a string"},
		{"empty $db", msgOf(cmdDoc("delete", "c", ""), 0), "$db of command \"delete\" is empty"},
		{"empty body", msgOf(doc(func(b *bsoncore.DocumentBuilder) {}), 0), "empty command body"},
		{"lsid not a document", msgOf(doc(func(b *bsoncore.DocumentBuilder) {
			b.AppendString("delete", "c").AppendString("lsid", "x").AppendString("$db", "app")
		}), 0), "lsid of command"},
		{"query $db disagrees", queryOf("app.$cmd", cmdDoc("delete", "c", "admin")), "disagrees with namespace"},
		{"query $db not a string", queryOf("app.$cmd", doc(func(b *bsoncore.DocumentBuilder) {
			b.AppendString("delete", "c").AppendInt32("$db", 3)
		})), "disagrees"},
		{"query empty body", queryOf("app.$cmd", doc(func(b *bsoncore.DocumentBuilder) {})), "empty command body"},
		{"query empty wrapped body", queryOf("app.$cmd", doc(func(b *bsoncore.DocumentBuilder) {
			b.AppendDocument("$query", doc(func(b *bsoncore.DocumentBuilder) {}))
		})), "empty command body"},
		{"query duplicate command key", queryOf("app.$cmd", doc(func(b *bsoncore.DocumentBuilder) {
			b.AppendString("update", "a").AppendString("update", "b")
		})), "appears twice"},
		{"query no db", queryOf(".$cmd", cmdDoc("find", "c", "x")), "has no database"},
		{"hand-made OpMsg", &OpMsg{}, "empty command body"},
		// A document sequence is a body field to the server: FerretDB
		// sets the field to the sequence's documents (replacing $db or
		// the collection), MongoDB refuses the duplicate.
		{"$db as a sequence", msgOf(cmdDoc("delete", "c", "open"), 0,
			Sequence{Identifier: "$db", Documents: []bsoncore.Document{cmdDoc("x", "y", "locked")}}), `"$db" is also a document sequence`},
		{"command key as a sequence", msgOf(cmdDoc("delete", "open", "app"), 0,
			Sequence{Identifier: "delete", Documents: []bsoncore.Document{cmdDoc("x", "y", "app")}}), `"delete" is also a document sequence`},
		{"applyOps's operations as a sequence", msgOf(doc(func(b *bsoncore.DocumentBuilder) {
			b.AppendArray("applyOps", bsoncore.NewArrayBuilder().Build()).AppendString("$db", "admin")
		}), 0, Sequence{Identifier: "applyOps", Documents: []bsoncore.Document{cmdDoc("op", "d", "x")}}), `"applyOps" is also a document sequence`},
		{"lsid as a sequence", msgOf(cmdDoc("delete", "c", "app"), 0,
			Sequence{Identifier: "lsid", Documents: []bsoncore.Document{lsid}}), `"lsid" is also a document sequence`},
		// A server that takes the last value would run past the cap
		// lockgate kept, or outside the transaction it judged.
		{"duplicate maxTimeMS", msgOf(doc(func(b *bsoncore.DocumentBuilder) {
			b.AppendString("update", "c").AppendInt32("maxTimeMS", 1).AppendString("$db", "app").AppendInt64("maxTimeMS", 600000)
		}), 0), "maxTimeMS appears twice"},
		{"duplicate autocommit", msgOf(doc(func(b *bsoncore.DocumentBuilder) {
			b.AppendString("update", "c").AppendString("$db", "app").AppendBoolean("autocommit", true).AppendBoolean("autocommit", false)
		}), 0), "autocommit appears twice"},
		{"duplicate comment", msgOf(doc(func(b *bsoncore.DocumentBuilder) {
			b.AppendString("update", "c").AppendString("comment", "a").AppendString("$db", "app").AppendString("comment", "b")
		}), 0), "comment appears twice"},
		{"query duplicate maxTimeMS", queryOf("app.$cmd", doc(func(b *bsoncore.DocumentBuilder) {
			b.AppendString("update", "a").AppendInt32("maxTimeMS", 1).AppendInt32("maxTimeMS", 900000)
		})), "maxTimeMS appears twice"},
		{"maxTimeMS as a sequence", msgOf(cmdDoc("update", "c", "app"), 0,
			Sequence{Identifier: "maxTimeMS", Documents: []bsoncore.Document{lsid}}), `"maxTimeMS" is also a document sequence`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := CommandOf(tt.m)
			wantErr(t, err, ErrMalformed, tt.reason)
			if c != nil {
				t.Errorf("command returned with an error: %+v", c)
			}
		})
	}
}

// TestSessionID: a session id is what the server takes for one (its
// LogicalSessionId parser: id of binary subtype 4, 16 bytes, once), and
// nothing else.
func TestSessionID(t *testing.T) {
	withID := func(f func(b *bsoncore.DocumentBuilder)) bsoncore.Document { return doc(f) }
	for name, tt := range map[string]struct {
		lsid bsoncore.Document
		ok   bool
	}{
		"uuid subtype 4": {lsidDoc(4, sessionUUID), true},
		"uuid and uid": {withID(func(b *bsoncore.DocumentBuilder) {
			b.AppendBinary("id", 4, sessionUUID).AppendBinary("uid", 0, make([]byte, 32))
		}), true},
		"uid first": {withID(func(b *bsoncore.DocumentBuilder) {
			b.AppendBinary("uid", 0, make([]byte, 32)).AppendBinary("id", 4, sessionUUID)
		}), true},
		"legacy subtype 3": {lsidDoc(3, sessionUUID), false},
		"generic subtype":  {lsidDoc(0, sessionUUID), false},
		"md5 subtype":      {lsidDoc(5, sessionUUID), false},
		"short id":         {lsidDoc(4, sessionUUID[:15]), false},
		"long id":          {lsidDoc(4, append(append([]byte{}, sessionUUID...), 0)), false},
		"two ids": {withID(func(b *bsoncore.DocumentBuilder) {
			b.AppendBinary("id", 4, sessionUUID).AppendBinary("id", 4, sessionUUID)
		}), false},
		"no id":     {doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("x", 1) }), false},
		"string id": {doc(func(b *bsoncore.DocumentBuilder) { b.AppendString("id", "0123456789abcdef") }), false},
		"empty":     {doc(func(b *bsoncore.DocumentBuilder) {}), false},
	} {
		id, ok := SessionID(tt.lsid)
		if ok != tt.ok || (ok && !bytes.Equal(id, sessionUUID)) {
			t.Errorf("%s: %x, %v", name, id, ok)
		}
		c := &Command{LSID: tt.lsid}
		if cid, cok := c.SessionID(); cok != ok || !bytes.Equal(cid, id) {
			t.Errorf("%s: Command.SessionID %x, %v; SessionID %x, %v", name, cid, cok, id, ok)
		}
	}
}

func TestDocuments(t *testing.T) {
	a := doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("q", 1) })
	bb := doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("q", 2) })
	arr := bsoncore.NewArrayBuilder().AppendDocument(a).AppendDocument(bb).Build()
	inBody := doc(func(b *bsoncore.DocumentBuilder) {
		b.AppendString("update", "c").AppendArray("updates", arr).AppendString("$db", "d")
	})
	seq := Sequence{Identifier: "updates", Documents: []bsoncore.Document{a, bb}}
	plain := cmdDoc("update", "c", "d")

	check := func(name string, body bsoncore.Document, seqs []Sequence, field string, want []bsoncore.Document, reason string) {
		t.Helper()
		c, err := CommandOf(msgOf(body, 0, seqs...))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, err := c.Documents(field)
		if reason != "" {
			wantErr(t, err, ErrMalformed, reason)
			return
		}
		if err != nil || len(got) != len(want) {
			t.Fatalf("%s: %d documents, %v", name, len(got), err)
		}
		for i := range want {
			if !bytes.Equal(got[i], want[i]) {
				t.Errorf("%s: document %d differs", name, i)
			}
		}
		if want == nil && got != nil {
			t.Errorf("%s: absent field gave %v", name, got)
		}
	}
	check("body array", inBody, nil, "updates", []bsoncore.Document{a, bb}, "")
	check("sequence", plain, []Sequence{seq}, "updates", []bsoncore.Document{a, bb}, "")
	check("absent", plain, []Sequence{seq}, "deletes", nil, "")
	check("both", inBody, []Sequence{seq}, "updates", nil, "both a body field and a document sequence")
	check("not an array", doc(func(b *bsoncore.DocumentBuilder) {
		b.AppendString("update", "c").AppendDocument("updates", a).AppendString("$db", "d")
	}), nil, "updates", nil, "not an array")
	check("array of non-documents", doc(func(b *bsoncore.DocumentBuilder) {
		b.AppendString("update", "c").AppendArray("updates", bsoncore.NewArrayBuilder().AppendDocument(a).AppendInt32(3).Build()).AppendString("$db", "d")
	}), nil, "updates", nil, "element 1 is a")
	check("twice in body", doc(func(b *bsoncore.DocumentBuilder) {
		b.AppendString("update", "c").AppendArray("updates", arr).AppendArray("updates", arr).AppendString("$db", "d")
	}), nil, "updates", nil, "appears twice")
	// An empty array is present and empty, not absent.
	c, _ := CommandOf(msgOf(doc(func(b *bsoncore.DocumentBuilder) {
		b.AppendString("delete", "c").AppendArray("deletes", bsoncore.NewArrayBuilder().Build()).AppendString("$db", "d")
	}), 0))
	if got, err := c.Documents("deletes"); err != nil || got == nil || len(got) != 0 {
		t.Errorf("empty array: %v, %v", got, err)
	}
	// Two sequences with one name can only come from a hand-made Command.
	c = &Command{Name: "x", Body: plain, Sequences: []Sequence{seq, seq}}
	_, err := c.Documents("updates")
	wantErr(t, err, ErrMalformed, "two document sequences")
}

// TestCommandLookupIsBodyLookup: the values the walk keeps are the ones a
// lookup in the body finds, absent keys are absent, and a command built
// without the walk still answers from its body; Kept answers as Lookup
// of the key it names. (A kept key repeated is malformed:
// TestCommandOfMalformed.)
func TestCommandLookupIsBodyLookup(t *testing.T) {
	body := doc(func(b *bsoncore.DocumentBuilder) {
		b.AppendString("update", "items").AppendString("comment", "lockgate:first").
			AppendBoolean("autocommit", false).AppendInt32("other", 1).AppendInt32("other", 2).
			AppendInt64("maxTimeMS", 5).AppendString("$db", "app")
	})
	noKeys := doc(func(b *bsoncore.DocumentBuilder) { b.AppendString("update", "items").AppendString("$db", "app") })
	for _, body := range []bsoncore.Document{body, noKeys} {
		c, err := CommandOf(msgOf(body, 0))
		if err != nil {
			t.Fatal(err)
		}
		unscanned := &Command{Name: c.Name, DB: c.DB, Body: body}
		for _, key := range []string{"comment", "autocommit", "maxTimeMS", "other", "absent"} {
			want, werr := body.LookupErr(key)
			for _, c := range []*Command{c, unscanned} {
				got, ok := c.Lookup(key)
				if ok != (werr == nil) || !got.Equal(want) {
					t.Errorf("%s (scanned %v): Lookup = %v, %v; body has %v, %v", key, c.scanned, got, ok, want, werr)
				}
			}
		}
		for k, key := range map[BodyKey]string{KeyComment: "comment", KeyAutocommit: "autocommit", KeyMaxTimeMS: "maxTimeMS"} {
			want, werr := body.LookupErr(key)
			for _, c := range []*Command{c, unscanned} {
				if got, ok := c.Kept(k); ok != (werr == nil) || !got.Equal(want) {
					t.Errorf("Kept(%d), %s (scanned %v) = %v, %v; body has %v, %v", k, key, c.scanned, got, ok, want, werr)
				}
			}
		}
	}
}

// TestSessionIDAsTheWalkReadsIt: SessionID's reading of the driver's
// {id: <UUID>} in place answers as the walk over the elements does, for
// that document and for every one a byte away from it (another type,
// key, length, subtype, a byte past the end): the shortcut takes nothing
// the walk would refuse and refuses nothing it would take.
func TestSessionIDAsTheWalkReadsIt(t *testing.T) {
	id := []byte("0123456789abcdef")
	doc := bsoncore.NewDocumentBuilder().AppendBinary("id", 4, id).Build()
	if len(doc) != len(driverLSID) {
		t.Fatalf("the driver's lsid is %d bytes, the shortcut reads %d", len(doc), len(driverLSID))
	}
	check := func(what string, d []byte) {
		t.Helper()
		got, ok := SessionID(d)
		want, wantOK := readSessionID(d)
		if ok != wantOK || !bytes.Equal(got, want) {
			t.Fatalf("%s %x: %x %v, the walk reads %x %v", what, d, got, ok, want, wantOK)
		}
	}
	check("the driver's", doc)
	if got, ok := SessionID(doc); !ok || !bytes.Equal(got, id) {
		t.Fatalf("the driver's lsid reads %x %v", got, ok)
	}
	for i := range doc {
		for _, b := range []byte{0, 1, 3, 4, 5, 0x0f, 0x10, 0x11, 0x1d, 0x1e, 0x1f, 'i', 'd', 0xff, doc[i] ^ 1} {
			d := bytes.Clone(doc)
			d[i] = b
			check(fmt.Sprintf("byte %d as %#x", i, b), d)
		}
	}
	check("one byte longer", append(bytes.Clone(doc), 0))
	check("one byte shorter", doc[:len(doc)-1])
	// {id: <UUID>, uid: ...}: the walk's, and taken.
	long := bsoncore.NewDocumentBuilder().AppendBinary("id", 4, id).AppendBinary("uid", 0, make([]byte, 32)).Build()
	check("with a uid", long)
}
