package audittrail

import (
	"errors"
	"fmt"
	"strconv"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/bsontype"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// appendDoc appends r as the document the collection sink stores: the
// JSON line's fields, names and order, empty ones left out the same way,
// numbers as int64. No _id: the driver adds an ObjectId on insert. The
// hash is over the canonical encoding, so the document's bytes need not
// be reproducible; decodeDoc is strict about what it accepts instead.
func appendDoc(dst []byte, r *Record) []byte {
	idx, dst := bsoncore.AppendDocumentStart(dst)
	dst = bsoncore.AppendInt64Element(dst, "seq", int64(r.Seq))
	dst = bsoncore.AppendStringElement(dst, "time", r.Time)
	dst = bsoncore.AppendStringElement(dst, "instance", r.Instance)
	dst = bsoncore.AppendStringElement(dst, "prev", r.Prev)
	dst = bsoncore.AppendStringElement(dst, "kind", string(r.Kind))
	dst = appendStr(dst, "ns", r.NS)
	if len(r.IDs) > 0 {
		var a int32
		a, dst = bsoncore.AppendArrayElementStart(dst, "ids")
		for i, id := range r.IDs {
			dst = bsoncore.AppendStringElement(dst, strconv.Itoa(i), id)
		}
		dst, _ = bsoncore.AppendArrayEnd(dst, a)
	}
	dst = appendStr(dst, "op", r.Op)
	dst = appendStr(dst, "mode", r.Mode)
	dst = appendStr(dst, "verdict", r.Verdict)
	dst = appendStr(dst, "reason", r.Reason)
	dst = appendStr(dst, "app", r.App)
	dst = appendStr(dst, "user", r.User)
	dst = appendStr(dst, "client", r.Client)
	dst = appendStr(dst, "holder", r.Holder)
	if len(r.Tokens) > 0 {
		var a int32
		a, dst = bsoncore.AppendArrayElementStart(dst, "tokens")
		for i, t := range r.Tokens {
			dst = bsoncore.AppendInt64Element(dst, strconv.Itoa(i), t)
		}
		dst, _ = bsoncore.AppendArrayEnd(dst, a)
	}
	dst = appendStr(dst, "policy", r.Policy)
	dst = appendStr(dst, "detail", r.Detail)
	if r.Count != 0 {
		dst = bsoncore.AppendInt64Element(dst, "count", int64(r.Count))
	}
	dst = appendStr(dst, "keyId", r.KeyID)
	dst = appendStr(dst, "mac", r.MAC)
	dst = bsoncore.AppendStringElement(dst, "hash", r.Hash)
	dst, _ = bsoncore.AppendDocumentEnd(dst, idx)
	return dst
}

func appendStr(dst []byte, key, v string) []byte {
	if v == "" {
		return dst
	}
	return bsoncore.AppendStringElement(dst, key, v)
}

// decodeDoc parses a stored record. It is strict: every field of a known
// name and type, none twice, none unknown but _id, and the fields the
// chain needs present; anything else is not a record (altered or
// inserted by hand).
func decodeDoc(raw bson.Raw) (Record, error) {
	var r Record
	elems, err := raw.Elements()
	if err != nil {
		return r, err
	}
	seen := map[string]bool{}
	for _, e := range elems {
		k := e.Key()
		if seen[k] {
			return r, fmt.Errorf("field %q twice", k)
		}
		seen[k] = true
		v := e.Value()
		str := func(dst *string) error {
			s, ok := v.StringValueOK()
			if !ok {
				return fmt.Errorf("field %q is a %s, not a string", k, v.Type)
			}
			*dst = s
			return nil
		}
		switch k {
		case "_id":
		case "seq", "count":
			n, ok := v.Int64OK()
			if !ok || n < 0 {
				return r, fmt.Errorf("field %q is not a non-negative int64", k)
			}
			if k == "seq" {
				r.Seq = uint64(n)
			} else {
				r.Count = uint64(n)
			}
		case "ids", "tokens":
			arr, ok := v.ArrayOK()
			if !ok {
				return r, fmt.Errorf("field %q is not an array", k)
			}
			vals, err := arr.Values()
			if err != nil {
				return r, err
			}
			for _, x := range vals {
				if k == "ids" {
					s, ok := x.StringValueOK()
					if !ok {
						return r, errors.New("an id is not a string")
					}
					r.IDs = append(r.IDs, s)
				} else {
					if x.Type != bsontype.Int64 {
						return r, errors.New("a token is not an int64")
					}
					r.Tokens = append(r.Tokens, x.Int64())
				}
			}
		case "kind":
			var s string
			if err := str(&s); err != nil {
				return r, err
			}
			r.Kind = Kind(s)
		default:
			dst := r.stringField(k)
			if dst == nil {
				return r, fmt.Errorf("unknown field %q", k)
			}
			if err := str(dst); err != nil {
				return r, err
			}
		}
	}
	for _, k := range []string{"seq", "time", "instance", "prev", "kind", "hash"} {
		if !seen[k] {
			return r, fmt.Errorf("no field %q", k)
		}
	}
	return r, nil
}

// stringField is the string field of r named k in the stored form.
func (r *Record) stringField(k string) *string {
	switch k {
	case "time":
		return &r.Time
	case "instance":
		return &r.Instance
	case "prev":
		return &r.Prev
	case "ns":
		return &r.NS
	case "op":
		return &r.Op
	case "mode":
		return &r.Mode
	case "verdict":
		return &r.Verdict
	case "reason":
		return &r.Reason
	case "app":
		return &r.App
	case "user":
		return &r.User
	case "client":
		return &r.Client
	case "holder":
		return &r.Holder
	case "policy":
		return &r.Policy
	case "detail":
		return &r.Detail
	case "keyId":
		return &r.KeyID
	case "mac":
		return &r.MAC
	case "hash":
		return &r.Hash
	}
	return nil
}
