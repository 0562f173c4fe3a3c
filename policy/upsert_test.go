package policy

import (
	"testing"

	"go.mongodb.org/mongo-driver/bson/primitive"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

func TestUpsertID(t *testing.T) {
	re := primitive.Regex{Pattern: "x"}
	upsert := func(filter D, update any) Write {
		return Write{Kind: KindUpdate, Upsert: true, Filter: clDoc(t, filter), Update: clVal(t, update)}
	}
	cases := []struct {
		name    string
		w       Write
		id      any // nil: not found
		certain bool
	}{
		{name: "not an upsert", w: Write{Kind: KindUpdate, Filter: clDoc(t, D{{"x", 1}}), Update: clVal(t, setA)}, certain: true},
		{name: "delete", w: Write{Kind: KindDelete, Filter: clDoc(t, D{}), Upsert: true}, certain: true},
		{name: "findAndModify remove", w: Write{Kind: KindFindAndModify, Remove: true, Upsert: true, Filter: clDoc(t, byID1)}, certain: true},
		{name: "filter _id, modifier", w: upsert(byID1, setA), id: 1, certain: true},
		{name: "filter $eq", w: upsert(D{{"_id", D{{"$eq", "k"}}}}, setA), id: "k", certain: true},
		{name: "filter single $in", w: upsert(D{{"_id", D{{"$in", A{9}}}}}, setA), id: 9, certain: true},
		{name: "filter $and", w: upsert(D{{"x", 1}, {"$and", A{D{{"_id", 4}}}}}, setA), id: 4, certain: true},
		{name: "filter one-branch $or", w: upsert(D{{"$or", A{D{{"_id", 4}}}}}, setA), id: 4, certain: true},
		{name: "filter literal document", w: upsert(D{{"_id", D{{"a", 1}}}}, setA), id: D{{"a", 1}}, certain: true},
		{name: "filter multi $in: generated", w: upsert(D{{"_id", D{{"$in", A{1, 2}}}}}, setA), certain: true},
		{name: "filter DBRef literal", w: upsert(D{{"_id", D{{"$ref", "c"}, {"$id", 1}}}}, setA)},
		{name: "filter unknown operator", w: upsert(D{{"_id", D{{"$foo", 1}}}}, setA)},
		{name: "filter $all one value", w: upsert(D{{"_id", D{{"$all", A{6}}}}}, setA), id: 6, certain: true},
		{name: "filter $all two values", w: upsert(D{{"_id", D{{"$all", A{6, 7}}}}}, setA)},
		{name: "filter range and $ne: generated", w: upsert(D{{"_id", D{{"$gte", 1}, {"$ne", 3}, {"$exists", true}}}}, setA), certain: true},
		{name: "filter range: generated", w: upsert(D{{"_id", D{{"$gt", 1}}}}, setA), certain: true},
		{name: "filter no _id: generated", w: upsert(D{{"x", 1}}, setA), certain: true},
		{name: "filter empty, replacement without _id: generated", w: upsert(D{}, D{{"a", 1}}), certain: true},
		{name: "filter equal twice", w: upsert(D{{"_id", 1}, {"$and", A{D{{"_id", D{{"$eq", 1}}}}}}}, setA), id: 1, certain: true},
		{name: "filter two values", w: upsert(D{{"_id", 1}, {"$and", A{D{{"_id", 2}}}}}, setA)},
		{name: "filter null", w: upsert(D{{"_id", nil}}, setA)},
		{name: "filter regex", w: upsert(D{{"_id", re}}, setA)},
		{name: "filter array", w: upsert(D{{"_id", A{1}}}, setA)},
		{name: "filter $eq null", w: upsert(D{{"_id", D{{"$eq", nil}}}}, setA)},
		{name: "filter dotted _id", w: upsert(D{{"_id.a", 1}}, setA)},
		{name: "filter dotted _id in $and", w: upsert(D{{"$and", A{D{{"_id.a", 1}}}}}, setA)},
		{name: "filter $or of several _ids", w: upsert(D{{"$or", A{D{{"_id", 1}}, D{{"_id", 2}}}}}, setA)},
		{name: "filter $or of the same _id", w: upsert(D{{"$or", A{D{{"_id", 1}}, D{{"_id", 1}}}}}, setA), id: 1, certain: true},
		{name: "filter $or without _id", w: upsert(D{{"$or", A{D{{"a", 1}}, D{{"b", 2}}}}}, setA), certain: true},
		{name: "replacement _id", w: upsert(D{{"x", 1}}, D{{"_id", "r"}, {"a", 1}}), id: "r", certain: true},
		{name: "replacement _id equals filter", w: upsert(byID1, D{{"_id", 1}, {"a", 1}}), id: 1, certain: true},
		{name: "replacement _id differs from filter", w: upsert(byID1, D{{"_id", 2}})},
		{name: "replacement without _id takes filter's", w: upsert(byID1, D{{"a", 1}}), id: 1, certain: true},
		{name: "replacement empty takes filter's", w: upsert(byID1, D{}), id: 1, certain: true},
		{name: "replacement _id null", w: upsert(D{}, D{{"_id", nil}}), id: primitive.Null{}, certain: true},
		{name: "replacement _id array", w: upsert(D{}, D{{"_id", A{1}}})},
		{name: "replacement duplicate _id", w: upsert(D{}, D{{"_id", 1}, {"_id", 2}})},
		{name: "$setOnInsert _id", w: upsert(D{{"x", 1}}, D{{"$set", D{{"a", 1}}}, {"$setOnInsert", D{{"_id", 8}}}}), id: 8, certain: true},
		{name: "$set _id", w: upsert(D{{"x", 1}}, D{{"$set", D{{"_id", 8}}}}), id: 8, certain: true},
		{name: "$set _id equals filter", w: upsert(D{{"_id", 8}}, D{{"$set", D{{"_id", 8}}}}), id: 8, certain: true},
		{name: "$set _id differs from filter", w: upsert(D{{"_id", 8}}, D{{"$set", D{{"_id", 9}}}})},
		{name: "$set and $setOnInsert disagree", w: upsert(D{}, D{{"$set", D{{"_id", 1}}}, {"$setOnInsert", D{{"_id", 2}}}})},
		{name: "$set _id.a", w: upsert(D{}, D{{"$set", D{{"_id.a", 1}}}})},
		{name: "$inc _id", w: upsert(D{}, D{{"$inc", D{{"_id", 1}}}})},
		{name: "$max _id", w: upsert(D{}, D{{"$max", D{{"_id", 1}}}})},
		{name: "$currentDate _id", w: upsert(D{}, D{{"$currentDate", D{{"_id", true}}}})},
		{name: "$rename to _id", w: upsert(D{}, D{{"$rename", D{{"a", "_id"}}}})},
		{name: "$rename elsewhere", w: upsert(byID1, D{{"$rename", D{{"a", "b"}}}}), id: 1, certain: true},
		{name: "$set _id array", w: upsert(D{}, D{{"$set", D{{"_id", A{1}}}}})},
		{name: "modifier not a document", w: upsert(D{}, D{{"$set", 1}})},
		{name: "pipeline with pinned filter", w: upsert(byID1, A{D{{"$set", D{{"a", 1}}}}}), id: 1, certain: true},
		{name: "pipeline without pinned filter", w: upsert(D{{"x", 1}}, A{D{{"$set", D{{"a", 1}}}}})},
		{name: "pipeline with multi $in", w: upsert(D{{"_id", D{{"$in", A{1, 2}}}}}, A{})},
		{name: "update missing", w: Write{Kind: KindUpdate, Upsert: true, Filter: clDoc(t, byID1)}},
		{name: "findAndModify upsert", w: Write{Kind: KindFindAndModify, Upsert: true, Filter: clDoc(t, D{{"_id", "f"}}), Update: clVal(t, setA)}, id: "f", certain: true},
		{name: "legacy upsert", w: Write{Kind: KindUpdate, List: "legacy", Upsert: true, Filter: clDoc(t, D{{"k", 1}}), Update: clVal(t, D{{"_id", 3}})}, id: 3, certain: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id, found, certain := UpsertID(tc.w)
			if certain != tc.certain {
				t.Fatalf("certain %v, want %v (id %v, found %v)", certain, tc.certain, id, found)
			}
			if found != (tc.id != nil) {
				t.Fatalf("found %v (%v), want %v", found, id, tc.id)
			}
			if tc.id != nil {
				if w := clVal(t, tc.id); !clSameValues([]bsoncore.Value{id}, []bsoncore.Value{w}) {
					t.Fatalf("id %v, want %v", id, w)
				}
			}
		})
	}
}

func TestInsertID(t *testing.T) {
	ins := func(d D) Write { return Write{Kind: KindInsert, Doc: clDoc(t, d)} }
	cases := []struct {
		name    string
		w       Write
		id      any
		certain bool
	}{
		{name: "with _id", w: ins(D{{"a", 1}, {"_id", "x"}}), id: "x", certain: true},
		{name: "without _id", w: ins(D{{"a", 1}}), certain: true},
		{name: "duplicate _id", w: ins(D{{"_id", 1}, {"_id", 2}})},
		{name: "array _id", w: ins(D{{"_id", A{1}}})},
		{name: "not an insert", w: Write{Kind: KindDelete}, certain: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id, found, certain := InsertID(tc.w)
			if certain != tc.certain || found != (tc.id != nil) {
				t.Fatalf("found %v certain %v, want %v %v", found, certain, tc.id != nil, tc.certain)
			}
			if tc.id != nil && !clSameValues([]bsoncore.Value{id}, []bsoncore.Value{clVal(t, tc.id)}) {
				t.Fatalf("id %v, want %v", id, tc.id)
			}
		})
	}
}
