package upstream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/wire"
)

// RequiresAuth reports whether the primary refuses an unauthenticated
// client: it sends listDatabases on a fresh connection that never
// authenticates, as a client through the proxy would, and reads the
// verdict (Unauthorized, 13, means authentication is enforced). lockgate
// uses it to refuse lock commands from connections that have not
// authenticated, since they carry no authority of their own.
func (u *Upstream) RequiresAuth(ctx context.Context) (bool, error) {
	c, err := u.Dial(ctx)
	if err != nil {
		return false, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	} else {
		c.SetDeadline(time.Now().Add(10 * time.Second))
	}
	body := bsoncore.NewDocumentBuilder().AppendInt32("listDatabases", 1).AppendBoolean("nameOnly", true).AppendString("$db", "admin").Build()
	if _, err := c.Write(wire.AppendMsg(nil, 1, 0, 0, body)); err != nil {
		return false, err
	}
	raw, err := wire.ReadMessage(c, wire.NewBufferPool(), wire.Limits{})
	if err != nil {
		return false, err
	}
	defer raw.Release()
	m, err := wire.Parse(raw.Bytes, wire.Limits{})
	if err != nil {
		return false, err
	}
	msg, ok := m.(*wire.OpMsg)
	if !ok {
		return false, fmt.Errorf("auth probe: reply is a %T", m)
	}
	if ok, _ := msg.Body.Lookup("ok").AsInt64OK(); ok == 1 {
		return false, nil
	}
	if code, _ := msg.Body.Lookup("code").AsInt64OK(); code == int64(mongoerr.Unauthorized) || code == int64(mongoerr.AuthenticationFailed) {
		return true, nil
	}
	return false, errors.New("auth probe: unexpected reply " + msg.Body.String())
}
