package guard

import (
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/policy"
)

// TestLockOf: the lock a document shows, and why one cannot be mirrored.
func TestLockOf(t *testing.T) {
	scheme := func(s *config.Scheme) policy.Scheme {
		p, err := policy.CompileWithLease(config.Policy{Default: config.ModeOff, Namespaces: []config.NamespaceRule{{Match: "a.b", Mode: config.ModeEnforce, Scheme: s}}}, 30000)
		if err != nil {
			t.Fatal(err)
		}
		return p.Lookup("a.b").Scheme
	}
	hf := scheme(&config.Scheme{Type: config.SchemeHolderFields, LeaseMS: 60000})
	hfDotted := scheme(&config.Scheme{Type: config.SchemeHolderFields, LeaseMS: 60000, Field: "lock.id", TimeField: "lock.at"})
	ld := scheme(&config.Scheme{Type: config.SchemeLockDocument})
	fl := scheme(&config.Scheme{Type: config.SchemeFlag})
	now := time.Now()
	date := func(d time.Duration) primitive.DateTime { return primitive.NewDateTimeFromTime(now.Add(d)) }
	for _, c := range []struct {
		name       string
		s          policy.Scheme
		doc        bson.D
		held, live bool
		bad        string
	}{
		{"hf free", hf, bson.D{{"LockId", nil}, {"LockTime", date(0)}}, false, false, ""},
		{"hf live", hf, bson.D{{"LockId", "g"}, {"LockTime", date(-time.Second)}}, true, true, ""},
		{"hf expired", hf, bson.D{{"LockId", "g"}, {"LockTime", date(-2 * time.Minute)}}, true, false, ""},
		{"hf time a string", hf, bson.D{{"LockId", "g"}, {"LockTime", "now"}}, true, true, "LockTime is of type string"},
		{"hf no time", hf, bson.D{{"LockId", "g"}}, true, true, "LockTime is missing"},
		{"hf holder an array", hf, bson.D{{"LockId", bson.A{"g"}}, {"LockTime", date(0)}}, true, true, "is of type array"},
		{"hf dotted under an array", hfDotted, bson.D{{"lock", bson.A{bson.D{{"id", "g"}}}}}, true, true, "lock is an array"},
		{"ld live", ld, bson.D{{"Lock", bson.D{{"actor", "a"}, {"expiresAt", date(time.Minute)}}}}, true, true, ""},
		{"ld released leaving an error", ld, bson.D{{"Lock", bson.D{{"actor", nil}, {"expiresAt", date(time.Minute)}, {"error", "x"}}}}, false, false, ""},
		{"ld expiry a number", ld, bson.D{{"Lock", bson.D{{"actor", "a"}, {"expiresAt", now.UnixMilli()}}}}, true, true, "expiresAt is of type 64-bit integer"},
		{"ld lock no document", ld, bson.D{{"Lock", 5}}, true, true, "Lock is of type 32-bit integer"},
		{"flag set", fl, bson.D{{"locked", true}}, true, true, ""},
		{"flag 1", fl, bson.D{{"locked", 1}}, false, false, ""},
	} {
		raw, err := bson.Marshal(c.doc)
		if err != nil {
			t.Fatal(err)
		}
		d := lockOf(c.s, bsoncore.Document(raw))
		if (d.holder.Type != 0) != c.held || d.live(now) != c.live || (c.bad == "") != (d.bad == "") || !strings.Contains(d.bad, c.bad) {
			t.Errorf("%s: lockOf = holder %v, live %v, bad %q; want held %v, live %v, bad %q", c.name, d.holder, d.live(now), d.bad, c.held, c.live, c.bad)
		}
	}
}
