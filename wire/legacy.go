package wire

import "go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

// The legacy write and cursor opcodes were removed from MongoDB 6.0 but are
// decoded fully: a proxy that let them through unparsed would let an old
// client write past its policy.

// OpUpdate is a legacy OP_UPDATE.
type OpUpdate struct {
	frame
	FullCollectionName string
	Flags              int32
	Selector           bsoncore.Document
	Update             bsoncore.Document
}

// OpInsert is a legacy OP_INSERT.
type OpInsert struct {
	frame
	Flags              int32
	FullCollectionName string
	Documents          []bsoncore.Document
}

// OpDelete is a legacy OP_DELETE.
type OpDelete struct {
	frame
	FullCollectionName string
	Flags              int32
	Selector           bsoncore.Document
}

// OpGetMore is a legacy OP_GET_MORE.
type OpGetMore struct {
	frame
	FullCollectionName string
	NumberToReturn     int32
	CursorID           int64
}

// OpKillCursors is a legacy OP_KILL_CURSORS.
type OpKillCursors struct {
	frame
	CursorIDs []int64
}

func parseUpdate(f frame, lim Limits) (*OpUpdate, error) {
	c := f.cursor()
	m := &OpUpdate{frame: f}
	var err error
	if _, err = c.int32("ZERO"); err != nil {
		return nil, err
	}
	if m.FullCollectionName, err = c.cstring("fullCollectionName"); err != nil {
		return nil, err
	}
	if m.Flags, err = c.int32("flags"); err != nil {
		return nil, err
	}
	if m.Selector, err = c.document("selector", lim.maxDocument()); err != nil {
		return nil, err
	}
	if m.Update, err = c.document("update", lim.maxDocument()); err != nil {
		return nil, err
	}
	if err := c.done(); err != nil {
		return nil, err
	}
	return m, nil
}

func parseInsert(f frame, lim Limits) (*OpInsert, error) {
	c := f.cursor()
	m := &OpInsert{frame: f}
	var err error
	if m.Flags, err = c.int32("flags"); err != nil {
		return nil, err
	}
	if m.FullCollectionName, err = c.cstring("fullCollectionName"); err != nil {
		return nil, err
	}
	for c.left() > 0 {
		d, err := c.document("document", lim.maxDocument())
		if err != nil {
			return nil, err
		}
		m.Documents = append(m.Documents, d)
	}
	if len(m.Documents) == 0 {
		return nil, malformed("OP_INSERT: no documents")
	}
	return m, nil
}

func parseDelete(f frame, lim Limits) (*OpDelete, error) {
	c := f.cursor()
	m := &OpDelete{frame: f}
	var err error
	if _, err = c.int32("ZERO"); err != nil {
		return nil, err
	}
	if m.FullCollectionName, err = c.cstring("fullCollectionName"); err != nil {
		return nil, err
	}
	if m.Flags, err = c.int32("flags"); err != nil {
		return nil, err
	}
	if m.Selector, err = c.document("selector", lim.maxDocument()); err != nil {
		return nil, err
	}
	if err := c.done(); err != nil {
		return nil, err
	}
	return m, nil
}

func parseGetMore(f frame) (*OpGetMore, error) {
	c := f.cursor()
	m := &OpGetMore{frame: f}
	var err error
	if _, err = c.int32("ZERO"); err != nil {
		return nil, err
	}
	if m.FullCollectionName, err = c.cstring("fullCollectionName"); err != nil {
		return nil, err
	}
	if m.NumberToReturn, err = c.int32("numberToReturn"); err != nil {
		return nil, err
	}
	if m.CursorID, err = c.int64("cursorID"); err != nil {
		return nil, err
	}
	if err := c.done(); err != nil {
		return nil, err
	}
	return m, nil
}

func parseKillCursors(f frame) (*OpKillCursors, error) {
	c := f.cursor()
	m := &OpKillCursors{frame: f}
	if _, err := c.int32("ZERO"); err != nil {
		return nil, err
	}
	n, err := c.int32("numberOfCursorIDs")
	if err != nil {
		return nil, err
	}
	if n < 0 || int(n) != c.left()/8 || c.left()%8 != 0 {
		return nil, malformed("OP_KILL_CURSORS: numberOfCursorIDs %d does not match the %d bytes that follow", n, c.left())
	}
	m.CursorIDs = make([]int64, n)
	for i := range m.CursorIDs {
		if m.CursorIDs[i], err = c.int64("cursorID"); err != nil {
			return nil, err
		}
	}
	return m, nil
}
