package docid

import (
	"strconv"
	"strings"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// Format renders an _id for people, the one format of every message that
// names an id (refusals, lock command errors, audit lines, admin
// replies): as it would be typed in the shell where that is short (7,
// "abc", ObjectId("..."), 1.5), and as relaxed extended JSON otherwise.
// Numbers print by value whatever their BSON type, because that is how
// lock keys compare them (1, NumberLong(1) and 1.0 are one key). It takes
// any value, valid _id or not, so that a message can name what it
// refuses.
func Format(v bson.RawValue) string {
	switch v.Type {
	case bson.TypeInt32:
		if n, ok := v.Int32OK(); ok {
			return strconv.FormatInt(int64(n), 10)
		}
	case bson.TypeInt64:
		if n, ok := v.Int64OK(); ok {
			return strconv.FormatInt(n, 10)
		}
	case bson.TypeDouble:
		if f, ok := v.DoubleOK(); ok {
			return strconv.FormatFloat(f, 'g', -1, 64)
		}
	case bson.TypeString:
		if s, ok := v.StringValueOK(); ok {
			return strconv.Quote(s)
		}
	case bson.TypeObjectID:
		if oid, ok := v.ObjectIDOK(); ok {
			return `ObjectId("` + oid.Hex() + `")`
		}
	}
	if v.Validate() != nil {
		return "<invalid>"
	}
	doc := bsoncore.BuildDocumentFromElements(nil, bsoncore.AppendValueElement(nil, "v", bsoncore.Value{Type: v.Type, Data: v.Value}))
	out, err := bson.MarshalExtJSON(bson.Raw(doc), false, false)
	if err != nil {
		return v.String()
	}
	// {"v":<value>}
	return strings.TrimSuffix(strings.TrimPrefix(string(out), `{"v":`), "}")
}
