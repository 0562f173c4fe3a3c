// Package guardtest holds what the guard's fast tests need besides the
// in-memory lock store (lockstore/memstore): an in-memory Resolver, and
// the contract that it and guard.MongoResolver both pass.
//
// It does not import guard, so that guard's own tests can use it; it must
// never be linked into the proxy binary.
package guardtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// ErrUnsupported: the filter uses query language the in-memory resolver
// does not evaluate. The guard treats it like any resolution failure, so a
// test that hits it sees a refusal, never a wrong allow.
var ErrUnsupported = errors.New("guardtest: filter not supported by the in-memory resolver")

// Resolver is an in-memory guard.Resolver over documents the test inserts.
// It evaluates equality, $eq, $in, $ne, $gt, $gte, $lt, $lte on numbers
// and strings, $exists, $and, $or, and dotted paths; anything else is
// ErrUnsupported. Collations and hints are not evaluated: a non-empty
// collation other than simple is ErrUnsupported, a hint is ignored.
type Resolver struct {
	mu    sync.Mutex
	colls map[string]*collection
	fail  error
	// Calls counts Candidates calls, for tests that check that nothing
	// was resolved.
	calls int
}

type collection struct {
	docs   []bson.Raw
	capped bool
	// collation is the collection's default locale; "" is simple.
	collation string
}

// NewResolver returns a resolver with no collections.
func NewResolver() *Resolver { return &Resolver{colls: map[string]*collection{}} }

func (r *Resolver) coll(ns string) *collection {
	c := r.colls[ns]
	if c == nil {
		c = &collection{}
		r.colls[ns] = c
	}
	return c
}

// Insert adds documents (anything bson.Marshal takes; each needs an _id).
func (r *Resolver) Insert(ns string, docs ...any) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.coll(ns)
	for _, d := range docs {
		b, err := bson.Marshal(d)
		if err != nil {
			return err
		}
		if _, err := bson.Raw(b).LookupErr("_id"); err != nil {
			return fmt.Errorf("guardtest: a document without _id")
		}
		c.docs = append(c.docs, b)
	}
	return nil
}

// CreateCapped makes ns a capped collection.
func (r *Resolver) CreateCapped(ns string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.coll(ns).capped = true
}

// SetCollation gives ns a default collation of locale.
func (r *Resolver) SetCollation(ns string, locale string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.coll(ns).collation = locale
}

// SetUnavailable makes every later call fail with cause (nil heals).
func (r *Resolver) SetUnavailable(cause error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fail = cause
}

// Calls returns how many times Candidates ran.
func (r *Resolver) Calls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

// Candidates implements guard.Resolver.
func (r *Resolver) Candidates(ctx context.Context, ns namespace.Namespace, filter, collation bsoncore.Document, _ bsoncore.Value, limit int) ([]docid.ID, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if r.fail != nil {
		return nil, r.fail
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(collation) > 0 {
		if l, _ := collation.Lookup("locale").StringValueOK(); l != "simple" {
			return nil, fmt.Errorf("%w: collation", ErrUnsupported)
		}
	}
	var out []docid.ID
	c := r.colls[ns.String()]
	if c == nil {
		return nil, nil
	}
	for _, d := range c.docs {
		ok, err := matches(bsoncore.Document(d), filter)
		if err != nil {
			return nil, err
		}
		if ok {
			v := bson.Raw(d).Lookup("_id")
			id, err := docid.New(bson.RawValue{Type: v.Type, Value: bytes.Clone(v.Value)})
			if err != nil {
				return nil, err
			}
			out = append(out, id)
			if len(out) >= limit {
				break
			}
		}
	}
	return out, nil
}

// SimpleCollation implements guard.Resolver.
func (r *Resolver) SimpleCollation(_ context.Context, ns namespace.Namespace) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return false, r.fail
	}
	c := r.colls[ns.String()]
	return c == nil || c.collation == "" || c.collation == "simple", nil
}

// Capped implements guard.Resolver.
func (r *Resolver) Capped(_ context.Context, ns namespace.Namespace) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return false, r.fail
	}
	c := r.colls[ns.String()]
	return c != nil && c.capped, nil
}

// CollectionExists reports whether ns has been created (the guard uses it
// to warn about locks on a collection that does not exist).
func (r *Resolver) CollectionExists(_ context.Context, ns namespace.Namespace) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return false, r.fail
	}
	return r.colls[ns.String()] != nil, nil
}

// matches evaluates filter against doc.
func matches(doc, filter bsoncore.Document) (bool, error) {
	elems, err := filter.Elements()
	if err != nil {
		return false, err
	}
	for _, e := range elems {
		ok, err := matchElement(doc, e.Key(), e.Value())
		if err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}

func matchElement(doc bsoncore.Document, key string, v bsoncore.Value) (bool, error) {
	switch key {
	case "$and", "$or":
		arr, ok := v.ArrayOK()
		if !ok {
			return false, fmt.Errorf("%w: %s needs an array", ErrUnsupported, key)
		}
		vals, err := arr.Values()
		if err != nil || len(vals) == 0 {
			return false, fmt.Errorf("%w: %s needs a non-empty array", ErrUnsupported, key)
		}
		for _, sv := range vals {
			sub, ok := sv.DocumentOK()
			if !ok {
				return false, fmt.Errorf("%w: %s needs documents", ErrUnsupported, key)
			}
			m, err := matches(doc, sub)
			if err != nil {
				return false, err
			}
			if key == "$and" && !m {
				return false, nil
			}
			if key == "$or" && m {
				return true, nil
			}
		}
		return key == "$and", nil
	}
	if strings.HasPrefix(key, "$") {
		return false, fmt.Errorf("%w: %s", ErrUnsupported, key)
	}
	field, found := lookup(doc, key)
	if d, ok := v.DocumentOK(); ok {
		if first, err := d.IndexErr(0); err == nil && strings.HasPrefix(first.Key(), "$") {
			return matchOperators(field, found, d)
		}
	}
	return found && equalOrContains(field, v), nil
}

func lookup(doc bsoncore.Document, path string) (bsoncore.Value, bool) {
	v, err := doc.LookupErr(strings.Split(path, ".")...)
	return v, err == nil
}

func matchOperators(field bsoncore.Value, found bool, ops bsoncore.Document) (bool, error) {
	elems, err := ops.Elements()
	if err != nil {
		return false, err
	}
	for _, op := range elems {
		arg := op.Value()
		var ok bool
		switch op.Key() {
		case "$eq":
			ok = found && equalOrContains(field, arg)
		case "$ne":
			ok = !found || !equalOrContains(field, arg)
		case "$in":
			arr, isArr := arg.ArrayOK()
			if !isArr {
				return false, fmt.Errorf("%w: $in needs an array", ErrUnsupported)
			}
			vals, _ := arr.Values()
			for _, a := range vals {
				if found && equalOrContains(field, a) {
					ok = true
					break
				}
			}
		case "$gt", "$gte", "$lt", "$lte":
			c, comparable := compare(field, arg)
			if !found || !comparable {
				break
			}
			switch op.Key() {
			case "$gt":
				ok = c > 0
			case "$gte":
				ok = c >= 0
			case "$lt":
				ok = c < 0
			case "$lte":
				ok = c <= 0
			}
		case "$exists":
			ok = found == arg.Boolean()
		default:
			return false, fmt.Errorf("%w: %s", ErrUnsupported, op.Key())
		}
		if !ok {
			return false, nil
		}
	}
	return true, nil
}

// equalOrContains is MongoDB's equality match: equal values (as the _id
// index compares them: 1 == 1.0), or an array field containing the value.
func equalOrContains(field, v bsoncore.Value) bool {
	if equal(field, v) {
		return true
	}
	if arr, ok := field.ArrayOK(); ok && v.Type != bson.TypeArray {
		vals, _ := arr.Values()
		for _, e := range vals {
			if equal(e, v) {
				return true
			}
		}
	}
	return false
}

func equal(a, b bsoncore.Value) bool {
	ka, err := docid.New(bson.RawValue{Type: a.Type, Value: a.Data})
	if err != nil {
		return a.Type == b.Type && bytes.Equal(a.Data, b.Data)
	}
	kb, err := docid.New(bson.RawValue{Type: b.Type, Value: b.Data})
	return err == nil && ka.Equal(kb)
}

// compare orders two numbers or two strings; other pairs do not compare,
// as MongoDB's range operators only match within a type bracket.
func compare(a, b bsoncore.Value) (int, bool) {
	if fa, ok := number(a); ok {
		if fb, ok := number(b); ok {
			switch {
			case fa < fb:
				return -1, true
			case fa > fb:
				return 1, true
			}
			return 0, true
		}
		return 0, false
	}
	sa, oka := a.StringValueOK()
	sb, okb := b.StringValueOK()
	if oka && okb {
		return strings.Compare(sa, sb), true
	}
	return 0, false
}

func number(v bsoncore.Value) (float64, bool) {
	switch v.Type {
	case bson.TypeInt32:
		return float64(v.Int32()), true
	case bson.TypeInt64:
		return float64(v.Int64()), true
	case bson.TypeDouble:
		return v.Double(), true
	}
	return 0, false
}
