package schemes

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// rawConn is one client connection through lockgate spoken by hand, for
// the forms a driver does not send: a write in the command body, a
// fire-and-forget OP_MSG, the legacy OP_UPDATE and OP_DELETE. It
// introduces itself with an application name, so that lockgate sees the
// same client identity as the driver clients of the same actor.
type rawConn struct {
	addr, app string
	c         net.Conn
	r         *bufio.Reader
	id        int32
}

func (rc *rawConn) close() {
	if rc.c != nil {
		rc.c.Close()
		rc.c = nil
	}
}

func (rc *rawConn) dial() error {
	c, err := net.DialTimeout("tcp", rc.addr, 5*time.Second)
	if err != nil {
		return err
	}
	rc.c, rc.r = c, bufio.NewReader(c)
	hello := bson.D{{"hello", 1}, {"client", bson.D{
		{"application", bson.D{{"name", rc.app}}},
		{"driver", bson.D{{"name", "lockgate-model"}, {"version", "1"}}},
		{"os", bson.D{{"type", "linux"}}},
	}}, {"$db", "admin"}}
	if _, closed, err := rc.roundTrip(rc.msg(0, mustMarshal(hello))); err != nil || closed {
		rc.close()
		return fmt.Errorf("handshake: closed=%v %v", closed, err)
	}
	return nil
}

func mustMarshal(v any) bsoncore.Document {
	b, err := bson.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func (rc *rawConn) msg(flags wire.MsgFlags, body bsoncore.Document, seqs ...wire.Sequence) []byte {
	rc.id++
	return wire.AppendMsg(nil, rc.id, 0, flags, body, seqs...)
}

// legacy builds OP_UPDATE (selector, update) or OP_DELETE (selector).
func (rc *rawConn) legacy(op wire.OpCode, ns string, flags uint32, docs ...bsoncore.Document) []byte {
	rc.id++
	b := wire.Header{RequestID: rc.id, OpCode: op}.Append(nil)
	b = binary.LittleEndian.AppendUint32(b, 0) // ZERO
	b = append(append(b, ns...), 0)
	b = binary.LittleEndian.AppendUint32(b, flags)
	for _, d := range docs {
		b = append(b, d...)
	}
	binary.LittleEndian.PutUint32(b, uint32(len(b)))
	return b
}

// roundTrip sends msg and reads its reply; closed reports that lockgate
// (or the server) closed the connection instead of answering.
func (rc *rawConn) roundTrip(msg []byte) (bsoncore.Document, bool, error) {
	if rc.c == nil {
		if err := rc.dial(); err != nil {
			return nil, false, err
		}
	}
	rc.c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := rc.c.Write(msg); err != nil {
		rc.close()
		return nil, true, nil
	}
	raw, err := wire.ReadMessage(rc.r, nil, wire.Limits{})
	if err != nil {
		rc.close()
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil, false, err
		}
		return nil, true, nil
	}
	m, err := wire.Parse(raw.Bytes, wire.Limits{})
	if err != nil {
		rc.close()
		return nil, false, err
	}
	switch r := m.(type) {
	case *wire.OpMsg:
		return bsoncore.Document(append([]byte(nil), r.Body...)), false, nil
	case *wire.OpReply:
		if len(r.Documents) > 0 {
			return bsoncore.Document(append([]byte(nil), r.Documents[0]...)), false, nil
		}
	}
	return nil, false, fmt.Errorf("unexpected reply %T", m)
}

// fireAndForget sends a message that has no reply, then a ping on the same
// connection: lockgate and the server handle one connection's messages in
// order, so the ping's answer means the write is done (or the connection
// was closed, which is how a refused unacknowledged write is answered).
func (rc *rawConn) fireAndForget(msg []byte) (closed bool, err error) {
	if rc.c == nil {
		if err := rc.dial(); err != nil {
			return false, err
		}
	}
	rc.c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := rc.c.Write(msg); err != nil {
		rc.close()
		return true, nil
	}
	_, closed, err = rc.roundTrip(rc.msg(0, mustMarshal(bson.D{{"ping", 1}, {"$db", "admin"}})))
	return closed, err
}

// replySummary is a short form of a reply for the model's history.
func replySummary(d bsoncore.Document) string {
	if d == nil {
		return "no reply"
	}
	var parts []string
	for _, k := range []string{"ok", "n", "nModified", "code", "codeName"} {
		if v, err := d.LookupErr(k); err == nil {
			parts = append(parts, k+"="+strings.Trim(v.String(), "\""))
		}
	}
	if v, err := d.LookupErr("upserted"); err == nil {
		parts = append(parts, "upserted="+v.String())
	}
	if v, err := d.LookupErr("lastErrorObject"); err == nil {
		parts = append(parts, "leo="+v.String())
	}
	if v, err := d.LookupErr("value"); err == nil {
		parts = append(parts, "value="+v.String())
	}
	if v, err := d.LookupErr("writeErrors"); err == nil {
		s := v.String()
		if len(s) > 160 {
			s = s[:160] + "..."
		}
		parts = append(parts, "writeErrors="+s)
	}
	if v, err := d.LookupErr("errmsg"); err == nil {
		s := v.String()
		if len(s) > 160 {
			s = s[:160] + "..."
		}
		parts = append(parts, "errmsg="+s)
	}
	return strings.Join(parts, " ")
}
