package guard

import (
	"context"
	"fmt"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/enforce"
	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.mongodb.org/mongo-driver/mongo/readpref"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"golang.org/x/sync/singleflight"
)

// Resolver finds which documents a filter matches (enforce.Resolver).
type Resolver = enforce.Resolver

// MongoResolver is the Resolver over a driver client to the upstream
// deployment. Reads go to the primary, which the writes go to as well.
type MongoResolver struct {
	client     *mongo.Client
	collations collationCache
	now        func() time.Time
	// reads are the listCollections in flight, one per namespace: when an
	// entry runs out, every connection writing the collection needs it at
	// once, and each sent its own (42 at one expiry in a profiled run).
	reads singleflight.Group
	// testHookRead, when set, is called by each caller about to join or
	// start a read, so that a test knows they all wait on one.
	testHookRead func()
}

type collationEntry struct {
	simple bool
	exists bool
	capped bool
	at     time.Time
}

// collationTTL bounds how long a collection's collation is trusted.
const collationTTL = 30 * time.Second

// NewResolver returns a resolver over client. Collection collations are
// cached for a short while: a collection's default collation can only be
// set when it is created, so a stale answer only matters across a drop and
// re-create, and the cache is short.
func NewResolver(client *mongo.Client) *MongoResolver {
	return &MongoResolver{client: client, now: time.Now}
}

// Candidates implements Resolver.
func (r *MongoResolver) Candidates(ctx context.Context, ns namespace.Namespace, filter, collation bsoncore.Document, hint bsoncore.Value, limit int) ([]docid.ID, error) {
	db, coll := ns.Parts()
	cmd := bson.D{
		{Key: "find", Value: coll},
		{Key: "filter", Value: bson.Raw(filter)},
		{Key: "projection", Value: bson.D{{Key: "_id", Value: 1}}},
		{Key: "limit", Value: int64(limit)},
		{Key: "batchSize", Value: int64(limit)},
	}
	if len(collation) > 0 {
		cmd = append(cmd, bson.E{Key: "collation", Value: bson.Raw(collation)})
	}
	if hint.Type != 0 {
		cmd = append(cmd, bson.E{Key: "hint", Value: bson.RawValue{Type: hint.Type, Value: hint.Data}})
	}
	// The server stops the query at the caller's deadline too, so a slow
	// filter costs the database no more than it costs the proxy.
	if dl, ok := ctx.Deadline(); ok {
		cmd = append(cmd, bson.E{Key: "maxTimeMS", Value: max(int64(1), time.Until(dl).Milliseconds())})
	}
	cur, err := r.client.Database(db).RunCommandCursor(ctx, cmd, options.RunCmd().SetReadPreference(readpref.Primary()))
	if err != nil {
		return nil, fmt.Errorf("resolving the documents a write can touch: %w", err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	var ids []docid.ID
	for cur.Next(ctx) {
		v, err := cur.Current.LookupErr("_id")
		if err != nil {
			return nil, fmt.Errorf("resolving the documents a write can touch: a document without _id")
		}
		id, err := docid.New(bson.RawValue{Type: v.Type, Value: append([]byte(nil), v.Value...)})
		if err != nil {
			return nil, fmt.Errorf("resolving the documents a write can touch: a document's _id: %w", err)
		}
		ids = append(ids, id)
		if len(ids) >= limit {
			break
		}
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("resolving the documents a write can touch: %w", err)
	}
	return ids, nil
}

// SimpleCollation implements Resolver.
func (r *MongoResolver) SimpleCollation(ctx context.Context, ns namespace.Namespace) (bool, error) {
	if e, ok := r.collations.get(ns.String()); ok && r.now().Sub(e.at) < collationTTL {
		return e.simple, nil
	}
	e, err := r.readCollection(ctx, ns)
	return e.simple, err
}

// collectionReadTimeout bounds a shared listCollections.
const collectionReadTimeout = 5 * time.Second

// readCollection returns ns's listCollections entry, read once for every
// caller that needs it at the same time, and caches it. Each caller waits
// for it no longer than its own ctx. The read itself is bounded by
// collectionReadTimeout, not by its first caller's context, so that no
// client, by hanging up or by the deadline its request carries, can fail
// the read that other clients' writes wait on.
func (r *MongoResolver) readCollection(ctx context.Context, ns namespace.Namespace) (collationEntry, error) {
	if r.testHookRead != nil {
		r.testHookRead()
	}
	key := ns.String()
	ch := r.reads.DoChan(key, func() (any, error) {
		// A caller that found the entry stale may come just after a read
		// it could have shared has cached a fresh one.
		if e, ok := r.collations.get(key); ok && r.now().Sub(e.at) < collationTTL {
			return e, nil
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), collectionReadTimeout)
		defer cancel()
		return r.listCollection(rctx, ns)
	})
	select {
	case res := <-ch:
		if res.Err != nil {
			return collationEntry{}, res.Err
		}
		return res.Val.(collationEntry), nil
	case <-ctx.Done():
		return collationEntry{}, fmt.Errorf("reading the collation of %s: %w", ns, ctx.Err())
	}
}

// listCollection reads ns's listCollections entry and caches it.
func (r *MongoResolver) listCollection(ctx context.Context, ns namespace.Namespace) (collationEntry, error) {
	db, coll := ns.Parts()
	specs, err := r.client.Database(db).ListCollectionSpecifications(ctx, bson.D{{Key: "name", Value: coll}})
	if err != nil {
		return collationEntry{}, fmt.Errorf("reading the collation of %s: %w", ns, err)
	}
	simple := true
	exists := len(specs) > 0
	capped := false
	for _, s := range specs {
		if s.Options == nil {
			continue
		}
		if c, ok := s.Options.Lookup("capped").BooleanOK(); ok && c {
			capped = true
		}
		if locale, err := s.Options.LookupErr("collation", "locale"); err == nil {
			simple = locale.StringValue() == "simple"
		}
	}
	e := collationEntry{simple: simple, exists: exists, capped: capped, at: r.now()}
	r.collations.put(ns.String(), e)
	return e, nil
}

// CollectionExists reports whether ns exists. A cached "exists" is
// trusted like a cached collation; a cached absence is not, and is read
// again: a collection appears with its first insert, typically just
// before its first lock, and a stale absence would warn about a
// collection that is there. That read is the caller's own, sent after it
// asked: a shared one may have been sent before the insert.
func (r *MongoResolver) CollectionExists(ctx context.Context, ns namespace.Namespace) (bool, error) {
	if e, ok := r.collations.get(ns.String()); ok && e.exists && r.now().Sub(e.at) < collationTTL {
		return true, nil
	}
	e, err := r.listCollection(ctx, ns)
	if err != nil {
		return false, err
	}
	return e.exists, nil
}

// Capped reports whether ns is a capped collection, from the same cached
// listCollections. A collection converted to capped is seen within the
// cache's 30 s.
func (r *MongoResolver) Capped(ctx context.Context, ns namespace.Namespace) (bool, error) {
	if _, err := r.SimpleCollation(ctx, ns); err != nil {
		return false, err
	}
	e, ok := r.collations.get(ns.String())
	if !ok {
		// Evicted in between: ask again rather than guess.
		if _, err := r.SimpleCollation(ctx, ns); err != nil {
			return false, err
		}
		e, _ = r.collations.get(ns.String())
	}
	return e.capped, nil
}
