package wire

import (
	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// QueryFailure is the OP_REPLY flag that marks a failed OP_QUERY or
// OP_GET_MORE; the single returned document is {$err, code}.
const QueryFailure int32 = 1 << 1

// OpQuery is a legacy OP_QUERY. Drivers still send their first handshake
// (isMaster/hello) this way, and old drivers send every command on
// "<db>.$cmd".
type OpQuery struct {
	frame
	Flags                int32
	FullCollectionName   string
	NumberToSkip         int32
	NumberToReturn       int32
	Query                bsoncore.Document
	ReturnFieldsSelector bsoncore.Document // nil when absent
}

func parseQuery(f frame, lim Limits) (*OpQuery, error) {
	c := f.cursor()
	q := &OpQuery{frame: f}
	var err error
	if q.Flags, err = c.int32("flags"); err != nil {
		return nil, err
	}
	if q.FullCollectionName, err = c.cstring("fullCollectionName"); err != nil {
		return nil, err
	}
	if q.NumberToSkip, err = c.int32("numberToSkip"); err != nil {
		return nil, err
	}
	if q.NumberToReturn, err = c.int32("numberToReturn"); err != nil {
		return nil, err
	}
	if q.Query, err = c.document("query", lim.maxDocument()); err != nil {
		return nil, err
	}
	if c.left() > 0 {
		if q.ReturnFieldsSelector, err = c.document("returnFieldsSelector", lim.maxDocument()); err != nil {
			return nil, err
		}
	}
	if err := c.done(); err != nil {
		return nil, err
	}
	return q, nil
}

// commandDB returns the database of a "<db>.$cmd" namespace and whether the
// query is a command. The namespace splits at its first dot, as the
// server splits it, and only a collection of exactly "$cmd" is a command:
// "a.b.$cmd" is a query on collection "b.$cmd" of a (which the server
// refuses), not a command on a database "a.b", and the pre-3.6
// pseudo-commands ("<db>.$cmd.sys.inprog") are not commands either; the
// server no longer accepts them.
func (q *OpQuery) commandDB() (string, bool) {
	n, ok := namespace.Split(q.FullCollectionName)
	return n.DB(), ok && n.IsCommand()
}

// IsCommand reports whether q is a command, i.e. a query on "<db>.$cmd".
func (q *OpQuery) IsCommand() bool {
	_, ok := q.commandDB()
	return ok
}

func (q *OpQuery) encode(dst []byte, query bsoncore.Document) []byte {
	start := len(dst)
	dst = Header{RequestID: q.hdr.RequestID, ResponseTo: q.hdr.ResponseTo, OpCode: OpCodeQuery}.Append(dst)
	dst = appendInt32(dst, q.Flags)
	dst = appendCString(dst, q.FullCollectionName)
	dst = appendInt32(dst, q.NumberToSkip)
	dst = appendInt32(dst, q.NumberToReturn)
	dst = append(dst, query...)
	dst = append(dst, q.ReturnFieldsSelector...)
	return setLength(dst, start)
}
