package lockstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
)

// TestUpstreamOperators checks, against the real upstream, the update
// semantics the store relies on: a conditional upsert with $set, $inc and
// $setOnInsert returning the document before, a duplicate-key error when
// the filter does not match an existing _id, and majority write concern.
func TestUpstreamOperators(t *testing.T) {
	s := openStore(t, testConfig(t))
	ctx := context.Background()
	now := time.Now().Truncate(time.Millisecond)
	upd := func(base int64) bson.D {
		return bson.D{
			{Key: "$set", Value: bson.D{{Key: "owner", Value: sessionBinary([]byte("a"))}, {Key: "expiresAt", Value: now.Add(time.Minute)}}},
			{Key: "$inc", Value: bson.D{{Key: "tokenSeq", Value: int64(1)}}},
			{Key: "$setOnInsert", Value: bson.D{{Key: "tokenBase", Value: base}}},
		}
	}
	free := bson.D{{Key: "_id", Value: "k"}, {Key: "expiresAt", Value: bson.D{{Key: "$lte", Value: now}}}}
	opts := options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.Before)

	// Insert: no document before.
	err := s.coll.FindOneAndUpdate(ctx, free, upd(1000), opts).Err()
	if !errors.Is(err, mongo.ErrNoDocuments) {
		t.Fatalf("first upsert: %v, want ErrNoDocuments (inserted)", err)
	}
	var r record
	if err := s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: "k"}}).Decode(&r); err != nil {
		t.Fatal(err)
	}
	if r.TokenBase != 1000 || r.TokenSeq != 1 {
		t.Fatalf("inserted base=%d seq=%d, want 1000 and 1", r.TokenBase, r.TokenSeq)
	}
	// Held (expiresAt in the future): the upsert must fail with a duplicate key.
	err = s.coll.FindOneAndUpdate(ctx, free, upd(2000), opts).Err()
	if !mongo.IsDuplicateKeyError(err) {
		t.Fatalf("upsert on a held record: %v, want duplicate key", err)
	}
	// Expired: the update matches, returns the old document, keeps the base.
	later := bson.D{{Key: "_id", Value: "k"}, {Key: "expiresAt", Value: bson.D{{Key: "$lte", Value: now.Add(time.Hour)}}}}
	var before record
	if err := s.coll.FindOneAndUpdate(ctx, later, upd(3000), opts).Decode(&before); err != nil {
		t.Fatal(err)
	}
	if before.TokenSeq != 1 {
		t.Fatalf("before seq=%d, want 1", before.TokenSeq)
	}
	if err := s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: "k"}}).Decode(&r); err != nil {
		t.Fatal(err)
	}
	if r.TokenBase != 1000 || r.TokenSeq != 2 {
		t.Fatalf("after update base=%d seq=%d, want 1000 and 2", r.TokenBase, r.TokenSeq)
	}
}
