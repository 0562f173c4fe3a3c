// Package authority is how the guard learns what a caller may do: whether
// the upstream requires authentication at all, and whether a caller may
// read or write a namespace, asked of the upstream on the caller's own
// connection. It is its own unit because several stages ask (the lock
// commands: you may lock only what you may write; enforcement: refusal
// detail names other holders only to a caller who may read the namespace;
// resolution carries the caller's own authority), and none of them should
// borrow it from another's files.
package authority

import (
	"context"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/proxy"
)

// Privilege is what the upstream is asked about: the command it runs.
type Privilege string

// Privileges the upstream is asked about, on the caller's own connection.
const (
	Write Privilege = "update"
	Read  Privilege = "find"
)

// Authority answers for one upstream. The zero value's upstream requires
// no authentication.
type Authority struct {
	required func() bool
}

// New returns the authority of an upstream that requires authentication
// when required says so (nil: never).
func New(required func() bool) *Authority { return &Authority{required: required} }

// Required reports whether the upstream requires authentication, and so
// decides what each caller may do.
func (a *Authority) Required() bool {
	return a.required != nil && a.required()
}

// Allows asks the upstream whether req's caller may write (Write) or read
// (Read) ns: on the caller's own connection, so with the caller's own
// authentication, it sends an update or a find that provably matches
// nothing ({_id: {$in: []}}) and reads the verdict. The answer is
// remembered per connection and namespace until the connection's user
// changes. This is the one place where lockgate learns a caller's
// privileges: locking, lock status, resolution and refusal detail all
// ask here.
func (a *Authority) Allows(ctx context.Context, req *proxy.Request, priv Privilege, ns namespace.Namespace) (bool, error) {
	key := string(priv) + " " + ns.String()
	if allowed, known := req.Client.Verdict(key); known {
		return allowed, nil
	}
	db, coll := ns.Parts()
	none := bsoncore.NewDocumentBuilder().AppendDocument("_id",
		bsoncore.NewDocumentBuilder().AppendArray("$in", bsoncore.NewArrayBuilder().Build()).Build()).Build()
	b := bsoncore.NewDocumentBuilder()
	if priv == Write {
		b.AppendString("update", coll).
			AppendArray("updates", bsoncore.NewArrayBuilder().AppendDocument(bsoncore.NewDocumentBuilder().
				AppendDocument("q", none).
				AppendDocument("u", bsoncore.NewDocumentBuilder().AppendDocument("$set",
					bsoncore.NewDocumentBuilder().AppendInt32("lockgateAuthorizationProbe", 1).Build()).Build()).
				Build()).Build())
	} else {
		b.AppendString("find", coll).AppendDocument("filter", none).
			AppendInt32("limit", 1).AppendBoolean("singleBatch", true)
	}
	reply, err := req.Ask(ctx, b.AppendString("$db", db).Build())
	if err != nil {
		return false, err
	}
	code, _ := reply.Lookup("code").AsInt64OK()
	allowed := code != int64(mongoerr.Unauthorized) && code != int64(mongoerr.AuthenticationFailed)
	req.Client.SetVerdict(key, allowed)
	return allowed, nil
}

// MayDisclose reports whether refusals to req's caller may name the other
// holders of ns's locks and tell "held by another" from "not locked": on a
// deployment without authentication, always (anyone may read anything);
// where the upstream requires it, only to an authenticated caller who may
// read ns, the gate of lockStatus. A verdict the upstream could not give
// counts as no: the minimal refusal is still a correct one.
func (a *Authority) MayDisclose(ctx context.Context, req *proxy.Request, ns namespace.Namespace) bool {
	if !a.Required() {
		return true
	}
	if req == nil || req.Client == nil || req.Client.User() == "" {
		return false
	}
	allowed, err := a.Allows(ctx, req, Read, ns)
	return err == nil && allowed
}
