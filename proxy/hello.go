package proxy

import (
	"fmt"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// hiddenHelloFields are the reply fields that describe the deployment
// behind the proxy. A driver that saw them would discover the replica set
// members and connect to them directly, around the proxy; topologyVersion
// would invite streaming monitoring, which the proxy does not offer.
var hiddenHelloFields = map[string]bool{
	"setName":         true,
	"setVersion":      true,
	"hosts":           true,
	"passives":        true,
	"arbiters":        true,
	"primary":         true,
	"me":              true,
	"electionId":      true,
	"topologyVersion": true,
	"secondary":       true,
	"arbiterOnly":     true,
	"passive":         true,
	"hidden":          true,
	"tags":            true,
	"lastWrite":       true,
	"isreplicaset":    true,
	"msg":             true,
}

// rewriteHello turns the hello reply of a replica-set member or a router
// into the reply of a mongos-like router: the same wire versions, size
// limits, session timeout, authentication and compression fields, and
// nothing that points past the proxy. A standalone server's reply passes
// through unchanged: it names no other member a driver could discover, and
// masquerading would change what drivers do (a driver that believes it
// talks to mongos stops using exhaust cursors and runs router code paths).
// Error replies pass through unchanged too.
func rewriteHello(body bsoncore.Document) (bsoncore.Document, bool, error) {
	elems, err := body.Elements()
	if err != nil {
		return nil, false, fmt.Errorf("hello reply: %w", err)
	}
	if !isOK(body) || standalone(elems) {
		return nil, false, nil
	}
	idx, out := bsoncore.AppendDocumentStart(make([]byte, 0, len(body)+16))
	for _, e := range elems {
		if hiddenHelloFields[e.Key()] {
			continue
		}
		out = append(out, e...)
	}
	out = bsoncore.AppendStringElement(out, "msg", "isdbgrid")
	out, err = bsoncore.AppendDocumentEnd(out, idx)
	if err != nil {
		return nil, false, err
	}
	return out, true, nil
}

// standalone reports whether a hello reply comes from a standalone server:
// one that is neither a replica-set member (setName, or isreplicaset on a
// member not yet initiated, or a member list) nor a router (msg
// "isdbgrid"). Any of those marks means the reply is masqueraded, so an
// unknown topology errs on the side of hiding what is behind the proxy.
func standalone(elems []bsoncore.Element) bool {
	for _, e := range elems {
		switch e.Key() {
		case "setName", "isreplicaset", "hosts", "passives", "arbiters", "primary", "setVersion", "electionId":
			return false
		case "msg":
			if s, ok := e.Value().StringValueOK(); !ok || s == "isdbgrid" {
				return false
			}
		}
	}
	return true
}

// helloClient extracts the application and driver names from the client
// metadata a driver sends with its first hello.
func helloClient(cmd bsoncore.Document) (app, driver string) {
	meta, ok := cmd.Lookup("client").DocumentOK()
	if !ok {
		return "", ""
	}
	app, _ = meta.Lookup("application", "name").StringValueOK()
	name, _ := meta.Lookup("driver", "name").StringValueOK()
	version, _ := meta.Lookup("driver", "version").StringValueOK()
	driver = name
	if version != "" {
		driver += " " + version
	}
	return truncate(app, 128), truncate(driver, 128)
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// isOK reports whether a reply body says ok, in any of the numeric or
// boolean forms servers use.
func isOK(doc bsoncore.Document) bool {
	v, err := doc.LookupErr("ok")
	if err != nil {
		return false
	}
	switch v.Type {
	case bson.TypeDouble:
		return v.Double() != 0
	case bson.TypeInt32:
		return v.Int32() != 0
	case bson.TypeInt64:
		return v.Int64() != 0
	case bson.TypeBoolean:
		return v.Boolean()
	}
	return false
}
