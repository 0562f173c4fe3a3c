package audittrail

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.mongodb.org/mongo-driver/mongo/writeconcern"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// HeadSuffix names the collection beside a trail collection that holds
// each instance's latest checkpoint (the collection's head.json): a
// document per instance, _id the instance name.
const HeadSuffix = "_head"

// IndexName is the unique index on (instance, seq) of a trail collection:
// an insert that repeats a seq of an instance (a forged record, or a
// second writer under the same instance name) fails.
const IndexName = "instance_1_seq_1"

// collOpTimeout bounds one round trip of the collection sink, so that a
// stalled deployment fails a batch (retried) instead of stopping the
// writer.
const collOpTimeout = 10 * time.Second

// collSink stores records in a MongoDB collection, one document each.
// Only the writer goroutine uses it.
type collSink struct {
	coll, durable, heads *mongo.Collection
	instance             string
	// cutTo, when nonzero, is the last seq of the chain: a failed batch
	// may have left documents after it (an ordered insertMany stops at
	// its first error, keeping those before), which are deleted before
	// the next insert, as the file sink cuts a failed write back.
	cutTo uint64
	docs  []any
	buf   []byte
}

func newCollSink(coll *mongo.Collection, instance string) *collSink {
	// Checkpoints and committed records wait for a majority, journaled;
	// bestEffort batches for the deployment's acknowledgment.
	wc := options.Collection().SetWriteConcern(&writeconcern.WriteConcern{W: "majority", Journal: ptr(true)})
	durable := coll.Database().Collection(coll.Name(), wc)
	heads := coll.Database().Collection(coll.Name()+HeadSuffix, wc)
	return &collSink{coll: coll, durable: durable, heads: heads, instance: instance}
}

func ptr[T any](v T) *T { return &v }

func (s *collSink) name() string { return s.coll.Database().Name() + "." + s.coll.Name() }

// ensureIndex creates the unique (instance, seq) index when missing.
func (s *collSink) ensureIndex(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, collOpTimeout)
	defer cancel()
	_, err := s.coll.Indexes().CreateOne(ctx, mongo.IndexModel{
		Keys:    bson.D{{Key: "instance", Value: 1}, {Key: "seq", Value: 1}},
		Options: options.Index().SetUnique(true).SetName(IndexName),
	})
	if err != nil {
		return fmt.Errorf("audit.collection: creating the unique index on (instance, seq) of %s: %w", s.name(), err)
	}
	return nil
}

// tail is the instance's last two records, newest first.
func (s *collSink) tail(ctx context.Context) ([]Record, error) {
	ctx, cancel := context.WithTimeout(ctx, collOpTimeout)
	defer cancel()
	cur, err := s.coll.Find(ctx, bson.D{{Key: "instance", Value: s.instance}},
		options.Find().SetSort(bson.D{{Key: "seq", Value: -1}}).SetLimit(2))
	if err != nil {
		return nil, fmt.Errorf("audit.collection: reading the end of %s: %w", s.name(), err)
	}
	defer cur.Close(ctx)
	var out []Record
	for cur.Next(ctx) {
		r, err := decodeDoc(cur.Current)
		if err != nil {
			return nil, fmt.Errorf("audit.collection: the last records of instance %q in %s do not parse (%v): the trail is damaged; run `lockgate audit verify`", s.instance, s.name(), err)
		}
		out = append(out, r)
	}
	return out, cur.Err()
}

// after calls fn with the instance's records after seq, in order.
func (s *collSink) after(ctx context.Context, seq uint64, fn func(*Record) error) error {
	return readColl(ctx, s.coll, bson.D{{Key: "instance", Value: s.instance}, {Key: "seq", Value: bson.D{{Key: "$gt", Value: int64(seq)}}}}, fn)
}

// insert stores recs with one ordered insertMany; sync waits for a
// majority, journaled.
func (s *collSink) insert(ctx context.Context, recs []Record, sync bool) error {
	if len(recs) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, collOpTimeout)
	defer cancel()
	if s.cutTo != 0 {
		if err := s.cut(ctx); err != nil {
			return err
		}
	}
	s.buf = s.buf[:0]
	s.docs = s.docs[:0]
	for i := range recs {
		start := len(s.buf)
		s.buf = appendDoc(s.buf, &recs[i])
		s.docs = append(s.docs, bson.Raw(s.buf[start:len(s.buf):len(s.buf)]))
	}
	c := s.coll
	if sync {
		c = s.durable
	}
	_, err := c.InsertMany(ctx, s.docs, options.InsertMany().SetOrdered(true))
	clear(s.docs)
	if err != nil {
		s.cutTo = recs[0].Seq - 1
		if s.cutTo == 0 {
			s.cutTo = ^uint64(0) // nothing stored yet: cut everything
		}
		if cerr := s.cut(ctx); cerr != nil {
			err = errors.Join(err, cerr)
		}
		return fmt.Errorf("audit.collection: insert into %s: %w", s.name(), err)
	}
	return nil
}

// cut deletes what a failed batch may have left after cutTo.
func (s *collSink) cut(ctx context.Context) error {
	after := int64(s.cutTo)
	if s.cutTo == ^uint64(0) {
		after = 0
	}
	_, err := s.durable.DeleteMany(ctx, bson.D{{Key: "instance", Value: s.instance}, {Key: "seq", Value: bson.D{{Key: "$gt", Value: after}}}})
	if err != nil {
		return fmt.Errorf("audit.collection: removing the records of a failed batch from %s: %w", s.name(), err)
	}
	s.cutTo = 0
	return nil
}

// writeHead replaces the instance's head document with cp.
func (s *collSink) writeHead(ctx context.Context, cp *Record) error {
	ctx, cancel := context.WithTimeout(ctx, collOpTimeout)
	defer cancel()
	doc := bsonWithID(s.instance, cp)
	_, err := s.heads.ReplaceOne(ctx, bson.D{{Key: "_id", Value: s.instance}}, doc, options.Replace().SetUpsert(true))
	return err
}

// bsonWithID is cp's document with _id first.
func bsonWithID(id string, cp *Record) bson.Raw {
	body := appendDoc(nil, cp)
	idx, b := bsoncore.AppendDocumentStart(nil)
	b = bsoncore.AppendStringElement(b, "_id", id)
	b = append(b, body[4:len(body)-1]...) // cp's elements
	b, _ = bsoncore.AppendDocumentEnd(b, idx)
	return b
}

// readColl calls fn with each record filter selects, sorted by instance
// and seq (and _id, so that forged duplicates come in a fixed order).
func readColl(ctx context.Context, coll *mongo.Collection, filter bson.D, fn func(*Record) error) error {
	cur, err := coll.Find(ctx, filter, options.Find().SetSort(bson.D{{Key: "instance", Value: 1}, {Key: "seq", Value: 1}, {Key: "_id", Value: 1}}))
	if err != nil {
		return err
	}
	defer cur.Close(ctx)
	for cur.Next(ctx) {
		r, err := decodeDoc(cur.Current)
		if err != nil {
			return fmt.Errorf("document %s: not a record: %w (run verify)", docID(cur.Current), err)
		}
		if err := fn(&r); err != nil {
			return err
		}
	}
	return cur.Err()
}

// docID is a document's _id as the verdicts print it.
func docID(raw bson.Raw) string {
	v, err := raw.LookupErr("_id")
	if err != nil {
		return "(no _id)"
	}
	if oid, ok := v.ObjectIDOK(); ok {
		return `ObjectId("` + oid.Hex() + `")`
	}
	return v.String()
}

// Instances lists the instances with records in a trail collection.
func Instances(ctx context.Context, coll *mongo.Collection) ([]string, error) {
	vals, err := coll.Distinct(ctx, "instance", bson.D{})
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(vals))
	for _, v := range vals {
		if s, ok := v.(string); ok {
			out = append(out, s)
		}
	}
	return out, nil
}

// QueryCollection is Query over a trail collection: the decision and lock
// records f matches, of one instance or (instance "") of every instance,
// in (instance, seq) order.
func QueryCollection(ctx context.Context, coll *mongo.Collection, instance string, f Filter, fn func(*Record) error) error {
	filter := bson.D{{Key: "kind", Value: bson.D{{Key: "$in", Value: bson.A{string(KindDecision), string(KindLock)}}}}}
	for _, kv := range []struct{ k, v string }{{"instance", instance}, {"ns", f.NS}, {"holder", f.Holder}, {"user", f.User}, {"app", f.App}} {
		if kv.v != "" {
			filter = append(filter, bson.E{Key: kv.k, Value: kv.v})
		}
	}
	return readColl(ctx, coll, filter, func(r *Record) error {
		if f.match(r) {
			return fn(r)
		}
		return nil
	})
}

// ReadCollection calls fn with every record of instance in a trail
// collection, in seq order, without verifying them.
func ReadCollection(ctx context.Context, coll *mongo.Collection, instance string, fn func(*Record) error) error {
	return readColl(ctx, coll, bson.D{{Key: "instance", Value: instance}}, fn)
}
