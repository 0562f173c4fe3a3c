package policy

import (
	"strings"

	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// legacyNS checks the fullCollectionName of a legacy write.
func legacyNS(op, ns string) error {
	n, ok := namespace.Parse(ns)
	db, coll := n.Parts()
	if !ok {
		return refuse(NSAll, "%s on namespace %q that is not <db>.<collection>", op, ns)
	}
	if coll == "$cmd" || strings.HasPrefix(coll, "$cmd.") {
		return refuse(DBNamespace(db), "%s on command namespace %q", op, ns)
	}
	return nil
}

func classifyLegacyUpdate(m *wire.OpUpdate) ([]Write, error) {
	if err := legacyNS("OP_UPDATE", m.FullCollectionName); err != nil {
		return nil, err
	}
	return []Write{{
		NS:     namespace.Of(m.FullCollectionName),
		Kind:   KindUpdate,
		List:   ListLegacy,
		Filter: m.Selector,
		Update: bsoncore.Value{Type: bson.TypeEmbeddedDocument, Data: m.Update},
		Multi:  m.Flags&legacyMultiUpdate != 0,
		Upsert: m.Flags&legacyUpsert != 0,
	}}, nil
}

func classifyLegacyDelete(m *wire.OpDelete) ([]Write, error) {
	if err := legacyNS("OP_DELETE", m.FullCollectionName); err != nil {
		return nil, err
	}
	return []Write{{
		NS:     namespace.Of(m.FullCollectionName),
		Kind:   KindDelete,
		List:   ListLegacy,
		Filter: m.Selector,
		Multi:  m.Flags&legacySingleRemove == 0,
	}}, nil
}

func classifyLegacyInsert(m *wire.OpInsert) ([]Write, error) {
	if err := legacyNS("OP_INSERT", m.FullCollectionName); err != nil {
		return nil, err
	}
	ws := make([]Write, len(m.Documents))
	for i, d := range m.Documents {
		ws[i] = Write{NS: namespace.Of(m.FullCollectionName), Kind: KindInsert, List: ListLegacy, Index: i, Doc: d}
	}
	return withIndexInserts(ws, m.FullCollectionName), nil
}

// withIndexInserts adds a collection write on the whole db to inserts into
// "<db>.system.indexes": servers before 4.2 created the index described by
// the document (a TTL index deletes documents).
func withIndexInserts(ws []Write, ns string) []Write {
	db, coll := namespace.Of(ns).Parts()
	if coll != "system.indexes" || len(ws) == 0 {
		return ws
	}
	return append(ws, collWrite(DBNamespace(db), WhatCreateIndexes))
}
