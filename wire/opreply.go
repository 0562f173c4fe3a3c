package wire

import "go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

// OpReply is the legacy reply to OP_QUERY and OP_GET_MORE. Servers still
// answer an OP_QUERY handshake with it, which the proxy rewrites.
type OpReply struct {
	frame
	Flags          int32
	CursorID       int64
	StartingFrom   int32
	NumberReturned int32
	Documents      []bsoncore.Document
}

func parseReply(f frame, lim Limits) (*OpReply, error) {
	c := f.cursor()
	r := &OpReply{frame: f}
	var err error
	if r.Flags, err = c.int32("responseFlags"); err != nil {
		return nil, err
	}
	if r.CursorID, err = c.int64("cursorID"); err != nil {
		return nil, err
	}
	if r.StartingFrom, err = c.int32("startingFrom"); err != nil {
		return nil, err
	}
	if r.NumberReturned, err = c.int32("numberReturned"); err != nil {
		return nil, err
	}
	if r.NumberReturned < 0 {
		return nil, malformed("OP_REPLY: numberReturned %d is negative", r.NumberReturned)
	}
	// The count is the sender's claim: bound the allocation by the bytes.
	if n := int(r.NumberReturned); n <= c.left()/minDocSize {
		r.Documents = make([]bsoncore.Document, 0, n)
	} else {
		return nil, malformed("OP_REPLY: numberReturned %d cannot fit in %d bytes", n, c.left())
	}
	for c.left() > 0 {
		d, err := c.document("document", lim.maxDocument())
		if err != nil {
			return nil, err
		}
		r.Documents = append(r.Documents, d)
	}
	if len(r.Documents) != int(r.NumberReturned) {
		return nil, malformed("OP_REPLY: numberReturned is %d but %d documents follow", r.NumberReturned, len(r.Documents))
	}
	return r, nil
}
