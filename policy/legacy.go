package policy

import (
	"strings"

	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// legacyNS reads the fullCollectionName of a legacy write.
func legacyNS(op, ns string) (namespace.Namespace, error) {
	n, ok := namespace.Parse(ns)
	if !ok {
		return n, refuse(anyNS(), "%s on namespace %q that is not <db>.<collection>", op, ns)
	}
	if coll := n.Collection(); coll == "$cmd" || strings.HasPrefix(coll, "$cmd.") {
		return n, refuse(DBNamespace(n.DB()), "%s on command namespace %q", op, ns)
	}
	return n, nil
}

func classifyLegacyUpdate(m *wire.OpUpdate) ([]Write, error) {
	n, err := legacyNS("OP_UPDATE", m.FullCollectionName)
	if err != nil {
		return nil, err
	}
	return []Write{{
		NS:     n,
		Kind:   KindUpdate,
		List:   ListLegacy,
		Filter: m.Selector,
		Update: bsoncore.Value{Type: bson.TypeEmbeddedDocument, Data: m.Update},
		Multi:  m.Flags&legacyMultiUpdate != 0,
		Upsert: m.Flags&legacyUpsert != 0,
	}}, nil
}

func classifyLegacyDelete(m *wire.OpDelete) ([]Write, error) {
	n, err := legacyNS("OP_DELETE", m.FullCollectionName)
	if err != nil {
		return nil, err
	}
	return []Write{{
		NS:     n,
		Kind:   KindDelete,
		List:   ListLegacy,
		Filter: m.Selector,
		Multi:  m.Flags&legacySingleRemove == 0,
	}}, nil
}

func classifyLegacyInsert(m *wire.OpInsert) ([]Write, error) {
	n, err := legacyNS("OP_INSERT", m.FullCollectionName)
	if err != nil {
		return nil, err
	}
	ws := make([]Write, len(m.Documents))
	for i, d := range m.Documents {
		ws[i] = Write{NS: n, Kind: KindInsert, List: ListLegacy, Index: i, Doc: d}
	}
	return withIndexInserts(ws, n), nil
}

// withIndexInserts adds a collection write on the whole db to inserts into
// "<db>.system.indexes": servers before 4.2 created the index described by
// the document (a TTL index deletes documents).
func withIndexInserts(ws []Write, n namespace.Namespace) []Write {
	if n.Collection() != "system.indexes" || len(ws) == 0 {
		return ws
	}
	return append(ws, collWrite(DBNamespace(n.DB()), WhatCreateIndexes))
}
