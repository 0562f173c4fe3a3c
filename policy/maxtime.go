package policy

import (
	"fmt"
	"time"

	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// CapMaxTime returns raw, a whole command message, with maxTimeMS set to
// ms unless the command already carries a positive maxTimeMS no greater
// (then it returns nil: send raw unchanged). It also returns the limit the
// command runs under. OP_COMPRESSED yields the inner message rewritten,
// uncompressed; an OP_QUERY keeps its wrapper.
func CapMaxTime(raw []byte, ms int64) ([]byte, time.Duration, error) {
	msg, err := wire.Parse(raw, wire.Limits{MaxMessageSize: max(len(raw), wire.DefaultMaxMessageSize)})
	if err != nil {
		return nil, 0, fmt.Errorf("policy: CapMaxTime: %w", err)
	}
	return CapMaxTimeOf(msg, nil, ms)
}

// CapMaxTimeOf is CapMaxTime for a message already parsed, with its
// command (nil: read from msg).
func CapMaxTimeOf(msg wire.Message, cmd *wire.Command, ms int64) ([]byte, time.Duration, error) {
	if c, ok := msg.(*wire.OpCompressed); ok {
		msg = c.Inner
		cmd = nil
	}
	if cmd == nil {
		var err error
		cmd, err = wire.CommandOf(msg)
		if err != nil || cmd == nil {
			return nil, 0, fmt.Errorf("policy: CapMaxTime: not a command (%v)", err)
		}
	}
	v, err := cmd.Body.LookupErr("maxTimeMS")
	if err == nil {
		if cur, ok := v.AsInt64OK(); ok && cur > 0 && cur <= ms {
			return nil, time.Duration(cur) * time.Millisecond, nil
		}
	}
	if m, ok := msg.(*wire.OpMsg); ok && err != nil && m.Body != nil && len(cmd.Body) == len(m.Body) {
		// The usual case, no maxTimeMS yet: the field is appended while
		// the message is re-encoded, one copy of its final size.
		var e [24]byte
		return wire.WithBodyElements(m, bsoncore.AppendInt64Element(e[:0], "maxTimeMS", ms)), time.Duration(ms) * time.Millisecond, nil
	}
	body, err := replaceField(cmd.Body, "maxTimeMS", bsoncore.Value{Type: bson.TypeInt64, Data: bsoncore.AppendInt64(nil, ms)}, true)
	if err != nil {
		return nil, 0, fmt.Errorf("policy: CapMaxTime: %w", err)
	}
	if q, ok := msg.(*wire.OpQuery); ok {
		query, err := rewrapQuery(q.Query, body)
		if err != nil {
			return nil, 0, fmt.Errorf("policy: CapMaxTime: OP_QUERY: %w", err)
		}
		b, err := wire.WithBody(q, query)
		return b, time.Duration(ms) * time.Millisecond, err
	}
	m, ok := msg.(*wire.OpMsg)
	if !ok {
		return nil, 0, fmt.Errorf("policy: CapMaxTime: %v", msg.Header().OpCode)
	}
	b, err := wire.WithBody(m, body)
	return b, time.Duration(ms) * time.Millisecond, err
}
