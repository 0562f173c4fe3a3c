package policy

import (
	"testing"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// pipelineCases are aggregates whose stage specs the walk and the
// classifier's scan read together (pipeline.go): sub-pipelines in
// $lookup, $graphLookup, $unionWith and $facet, every form of $out and
// $merge, the fields the walk needs in every order, fields given twice,
// and $out and $merge keys where neither the server nor the walk expects
// one (the scan counts them anywhere), with refusals before, inside and
// after a sub-pipeline. planCorpus holds them, so that
// TestPlanOnePassMatchesTwo and FuzzPlanOnePass compare each with the
// two-pass oracle.
func pipelineCases(t testing.TB) map[string][]byte {
	sub := A{D{{"$match", D{{"x", 1}}}}, D{{"$merge", "subm"}}}
	stages := map[string][]D{
		// $lookup and $graphLookup: from before and after the
		// pipeline, as a string and as {db, coll}.
		"lookup from first":              {{{"$lookup", D{{"from", "o"}, {"pipeline", sub}, {"as", "x"}}}}},
		"lookup pipeline first":          {{{"$lookup", D{{"pipeline", sub}, {"from", "o"}, {"as", "x"}}}}},
		"lookup from db coll":            {{{"$lookup", D{{"from", D{{"db", "other"}, {"coll", "o"}}}, {"pipeline", A{D{{"$lookup", D{{"from", "deep"}, {"pipeline", A{D{{"$out", "z"}}}}}}}}}}}}},
		"lookup pipeline before db":      {{{"$lookup", D{{"pipeline", A{D{{"$unionWith", "u"}}, D{{"$out", "p"}}}}, {"from", D{{"coll", "o"}, {"db", "other"}}}}}}},
		"lookup from db merges":          {{{"$lookup", D{{"from", D{{"db", "other"}, {"coll", "o"}}}, {"pipeline", A{D{{"$merge", D{{"into", "m"}}}}, D{{"$merge", "m2"}}, D{{"$out", ""}}}}}}}},
		"lookup from twice":              {{{"$lookup", D{{"from", "a"}, {"pipeline", sub}, {"from", "b"}}}}},
		"lookup from doc twice":          {{{"$lookup", D{{"from", D{{"db", "d"}, {"coll", "c"}}}, {"pipeline", sub}, {"from", D{{"coll", D{{"$out", "f"}}}}}}}}},
		"lookup pipeline twice":          {{{"$lookup", D{{"from", "o"}, {"pipeline", sub}, {"pipeline", A{D{{"$out", "p2"}}}}}}}},
		"lookup from db twice":           {{{"$lookup", D{{"from", D{{"db", "d"}, {"db", "e"}, {"coll", "c"}}}, {"pipeline", sub}}}}},
		"lookup from doc scanned":        {{{"$lookup", D{{"from", D{{"coll", "c"}, {"x", D{{"$merge", "inside"}}}}}, {"pipeline", sub}}}}},
		"lookup let after pipeline":      {{{"$lookup", D{{"from", "o"}, {"pipeline", A{D{{"$out", "first"}}}}, {"let", D{{"$out", "second"}}}}}}},
		"lookup let before pipeline":     {{{"$lookup", D{{"from", "o"}, {"let", D{{"$out", "first"}}}, {"pipeline", A{D{{"$out", "second"}}}}}}}},
		"lookup refusal after pipeline":  {{{"$lookup", D{{"pipeline", A{D{{"$out", "ok"}}}}, {"let", D{{"$out", 5}}}, {"from", "o"}}}}},
		"lookup refusal in pipeline":     {{{"$lookup", D{{"pipeline", A{D{{"$out", 5}}}}, {"let", D{{"$merge", 6}}}, {"from", "o"}}}}},
		"lookup refusal before pipeline": {{{"$lookup", D{{"let", D{{"$merge", 6}}}, {"pipeline", A{D{{"$out", 5}}}}, {"from", "o"}}}}},
		"lookup refusals in both":        {{{"$lookup", D{{"pipeline", A{D{{"$out", 5}}}}, {"from", "o"}}}}, {{"$merge", 7}}},
		"lookup pipeline not an array":   {{{"$lookup", D{{"from", "o"}, {"pipeline", D{{"$out", "x"}}}}}}},
		"lookup pipeline of scalars":     {{{"$lookup", D{{"from", "o"}, {"pipeline", A{1, "s", A{D{{"$out", "inarr"}}}}}}}}},
		"lookup not a document":          {{{"$lookup", A{D{{"$out", "x"}}}}}},
		"graphLookup":                    {{{"$graphLookup", D{{"from", D{{"db", "g"}, {"coll", "h"}}}, {"startWith", "$a"}, {"connectFromField", "a"}, {"connectToField", "b"}, {"as", "c"}}}}},
		"nested lookups": {{{"$lookup", D{{"pipeline", A{
			D{{"$lookup", D{{"pipeline", A{D{{"$out", "deepest"}}}}, {"from", D{{"db", "two"}, {"coll", "t"}}}, {"let", D{{"$merge", "after"}}}}}},
			D{{"$merge", D{{"into", "mid"}}}}}}, {"from", "one"}, {"as", D{{"$out", "last"}}}}}}},

		// $unionWith: a string, {coll, db, pipeline} in any order.
		"unionWith string":          {{{"$unionWith", "u"}}},
		"unionWith coll pipeline":   {{{"$unionWith", D{{"coll", "u"}, {"pipeline", sub}}}}},
		"unionWith pipeline db":     {{{"$unionWith", D{{"pipeline", sub}, {"db", "udb"}, {"coll", "u"}}}}},
		"unionWith db twice":        {{{"$unionWith", D{{"db", "a"}, {"coll", "u"}, {"pipeline", sub}, {"db", "b"}}}}},
		"unionWith coll twice":      {{{"$unionWith", D{{"coll", "u"}, {"coll", "v"}, {"pipeline", sub}}}}},
		"unionWith pipeline twice":  {{{"$unionWith", D{{"coll", "u"}, {"pipeline", sub}, {"pipeline", A{D{{"$out", "p2"}}}}}}}},
		"unionWith coll a document": {{{"$unionWith", D{{"coll", D{{"$out", "c"}}}, {"pipeline", sub}}}}},
		"unionWith refusal after":   {{{"$unionWith", D{{"pipeline", A{D{{"$out", "ok"}}}}, {"coll", D{{"$merge", 1}}}}}}},
		"unionWith not a document":  {{{"$unionWith", 5}}},

		// $facet: sub-pipelines, a facet that is not an array, and
		// facets named $out and $merge.
		"facet":                {{{"$facet", D{{"a", sub}, {"b", A{D{{"$lookup", D{{"from", "fl"}, {"pipeline", A{D{{"$out", "fo"}}}}}}}}}}}}},
		"facet not an array":   {{{"$facet", D{{"a", D{{"$out", "x"}}}, {"b", 1}}}}},
		"facet named $out":     {{{"$facet", D{{"$out", A{D{{"$match", D{}}}}}, {"b", sub}}}}},
		"facet named $merge":   {{{"$facet", D{{"b", sub}, {"$merge", D{{"into", "fm"}}}}}}},
		"facet not a document": {{{"$facet", A{D{{"$out", "x"}}}}}},

		// $out: a string, {db, coll}, and what a spec can hide.
		"out string":                   {{{"$out", "o"}}},
		"out empty":                    {{{"$out", ""}}},
		"out db coll":                  {{{"$out", D{{"db", "x"}, {"coll", "y"}}}}},
		"out coll db":                  {{{"$out", D{{"coll", "y"}, {"db", "x"}}}}},
		"out coll only":                {{{"$out", D{{"coll", "y"}}}}},
		"out db twice":                 {{{"$out", D{{"db", "x"}, {"coll", "y"}, {"db", "z"}}}}},
		"out coll twice":               {{{"$out", D{{"coll", "y"}, {"db", "x"}, {"coll", "z"}}}}},
		"out db a number":              {{{"$out", D{{"db", 1}, {"coll", "y"}}}}},
		"out coll empty":               {{{"$out", D{{"coll", ""}}}}},
		"out no coll":                  {{{"$out", D{{"db", "x"}, {"extra", D{{"$merge", "hidden"}}}}}}},
		"out hides writes":             {{{"$out", D{{"coll", "y"}, {"extra", D{{"$merge", "hidden"}, {"$out", "hidden2"}}}}}}},
		"out hides refusal":            {{{"$out", D{{"extra", D{{"$merge", 3}}}, {"coll", "y"}}}}},
		"out bad target hides refusal": {{{"$out", D{{"extra", D{{"$merge", 3}}}}}}},
		"out a number":                 {{{"$out", 1}}},
		"out then merge bad":           {{{"$out", "a"}}, {{"$merge", 5}}},
		"out bad then merge":           {{{"$out", 5}}, {{"$merge", "a"}}},

		// $merge: a string, into as a string or {db, coll}, whenMatched
		// pipelines, and what a spec can hide.
		"merge string":                 {{{"$merge", "m"}}},
		"merge empty":                  {{{"$merge", ""}}},
		"merge into string":            {{{"$merge", D{{"into", "m"}, {"whenMatched", "replace"}}}}},
		"merge into db coll":           {{{"$merge", D{{"into", D{{"db", "x"}, {"coll", "y"}}}, {"on", "_id"}}}}},
		"merge into coll only":         {{{"$merge", D{{"on", "_id"}, {"into", D{{"coll", "y"}}}}}}},
		"merge into db twice":          {{{"$merge", D{{"into", D{{"db", "x"}, {"db", "w"}, {"coll", "y"}}}}}}},
		"merge into twice":             {{{"$merge", D{{"into", "a"}, {"into", "b"}}}}},
		"merge into doc twice":         {{{"$merge", D{{"into", D{{"coll", "a"}}}, {"into", D{{"coll", D{{"$out", "i2"}}}}}}}}},
		"merge no into":                {{{"$merge", D{{"on", "_id"}}}}},
		"merge into a number":          {{{"$merge", D{{"into", 3}}}}},
		"merge into empty":             {{{"$merge", D{{"into", ""}}}}},
		"merge into db empty":          {{{"$merge", D{{"into", D{{"db", ""}, {"coll", "y"}}}}}}},
		"merge bad into hides refusal": {{{"$merge", D{{"whenMatched", A{D{{"$out", 1}}}}, {"into", 5}}}}},
		"merge a number":               {{{"$merge", 3}}},
		"merge whenMatched":            {{{"$merge", D{{"into", "m"}, {"whenMatched", A{D{{"$set", D{{"a", 1}}}}, D{{"$out", "wm"}}}}}}}},
		"merge whenMatched first":      {{{"$merge", D{{"whenMatched", A{D{{"$merge", "wm"}}}}, {"into", D{{"db", "x"}, {"coll", "y"}}}}}}},
		"merge whenMatched refusal":    {{{"$merge", D{{"whenMatched", A{D{{"$merge", 9}}}}, {"into", "m"}}}}},
		"merge into hides writes":      {{{"$merge", D{{"into", D{{"x", D{{"$out", "h"}}}, {"coll", "y"}}}, {"let", D{{"$merge", "l"}}}}}}},
		"merge into hides refusal":     {{{"$merge", D{{"into", D{{"x", D{{"$out", 1}}}, {"coll", "y"}}}}}}},

		// $changeStream over the deployment or not, and what its spec
		// hides.
		"changeStream all":        {{{"$changeStream", D{{"allChangesForCluster", true}}}}},
		"changeStream not all":    {{{"$changeStream", D{{"allChangesForCluster", false}, {"x", D{{"$out", "cs"}}}}}}},
		"changeStream all twice":  {{{"$changeStream", D{{"allChangesForCluster", false}, {"allChangesForCluster", false}}}}},
		"changeStream all number": {{{"$changeStream", D{{"allChangesForCluster", 1}}}}},

		// A stage's later fields and other stages' specs.
		"later field":  {{{"$match", D{}}, {"$out", "later"}}},
		"match hides":  {{{"$match", D{{"a", D{{"$merge", "hid"}}}}}}, {{"$out", "o"}}},
		"many writers": {{{"$out", "a"}}, {{"$lookup", D{{"pipeline", A{D{{"$out", "b"}}}}, {"from", "f"}, {"as", D{{"$out", "c"}}}}}}, {{"$merge", D{{"into", "d"}, {"whenMatched", A{D{{"$out", "e"}}}}}}}},
	}
	c := map[string][]byte{}
	for name, st := range stages {
		pipe := A{}
		for _, s := range st {
			pipe = append(pipe, s)
		}
		c["pipeline/"+name] = clMsgRaw(t, 0, D{{"aggregate", "src"}, {"pipeline", pipe}, {"cursor", D{}}, {"$db", "db"}})
	}
	// An array whose keys are not indexes (the codec does not check
	// them): the scan reads the keys of nested arrays as any document's.
	keyed := func(d D) bson.RawValue {
		raw, err := bson.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		return bson.RawValue{Type: bson.TypeArray, Value: bsoncore.Document(raw)}
	}
	for name, st := range map[string]D{
		"keyed sub-pipeline":  {{"$lookup", D{{"from", "o"}, {"pipeline", keyed(D{{"$out", D{{"coll", "k"}}}, {"1", D{{"$match", D{}}}}})}}}},
		"keyed bad":           {{"$lookup", D{{"from", "o"}, {"pipeline", keyed(D{{"$merge", D{{"$match", D{}}}}})}}}},
		"keyed facet":         {{"$facet", D{{"f", keyed(D{{"$out", "kf"}})}}}},
		"keyed array element": {{"$facet", D{{"f", A{keyed(D{{"$out", "ka"}})}}}}},
	} {
		c["pipeline/"+name] = clMsgRaw(t, 0, D{{"aggregate", "src"}, {"pipeline", A{st}}, {"cursor", D{}}, {"$db", "db"}})
	}
	return c
}
