package policy

import (
	"strings"

	"github.com/lockgate/lockgate/namespace"
)

// Collection writes: commands that replace, rename, drop or fill whole
// collections or databases.

func classifyCollectionCommand(c *command) ([]Write, error) {
	ns, err := collectionNS(c)
	if err != nil {
		return nil, err
	}
	return []Write{collWrite(ns, c.Name)}, nil
}

// classifyFullNamespaceCommand: {cloneCollection: "db.coll", from: host}
// and {cleanupOrphaned: "db.coll"} (run on admin) name a full namespace.
func classifyFullNamespaceCommand(c *command) ([]Write, error) {
	if s, ok := firstValue(c.Body).StringValueOK(); ok {
		if n, ok := namespace.Split(s); ok {
			return []Write{collWrite(n, c.Name)}, nil
		}
	}
	return nil, refuse(DBNamespace(c.DB), "%s: namespace is not <db>.<collection>", c.Name)
}

// classifyValidate: validate only reads, unless it repairs: {repair: true}
// removes documents and index entries it finds corrupt. A repair value of
// the wrong type is refused, as the server might read it as true.
func classifyValidate(c *command) ([]Write, error) {
	ns, err := collectionNS(c)
	if err != nil {
		return nil, err
	}
	f, err := fieldsOf(c.Body, "repair")
	if err != nil {
		return nil, refuse(ns, "validate: %v", err)
	}
	repair, err := truthy(f[0], "repair")
	if err != nil {
		return nil, refuse(ns, "validate: %v", err)
	}
	if !repair {
		return nil, nil
	}
	return []Write{collWrite(ns, WhatValidateRepair)}, nil
}

// classifyCreate: a view or an ordinary collection holds no document when
// it is made (create fails on an existing namespace), but a capped
// collection evicts its oldest documents on insert and one with
// expireAfterSeconds deletes them on a timer: on a protected namespace
// that does not exist yet, either would let documents locked later
// disappear without a write that names them. A flag of the wrong type is
// counted as set.
func classifyCreate(c *command) ([]Write, error) {
	ns, err := collectionNS(c)
	if err != nil {
		return nil, err
	}
	f, err := fieldsOf(c.Body, "capped", "expireAfterSeconds")
	if err != nil {
		return nil, refuse(ns, "create: %v", err)
	}
	capped, err := truthy(f[0], "capped")
	if err != nil || capped || f[1].Type != 0 {
		return []Write{collWrite(ns, WhatCreate)}, nil
	}
	return nil, nil
}

// classifyRename: {renameCollection: "db.from", to: "db.to", dropTarget}
// (internalRenameIfOptionsAndIndexesMatch names its source in from: the
// command table lists each one's fields); both namespaces are written (the source loses its documents, the target
// is replaced when dropTarget is set, created otherwise).
func classifyRename(c *command) ([]Write, error) {
	keys := c.Spec().FullNamespaces // source, target
	f, err := fieldsOf(c.Body, keys...)
	if err != nil {
		return nil, refuse(anyNS(), "%s: %v", c.Name, err)
	}
	var ws []Write
	for i, v := range f[:2] {
		s, ok := v.StringValueOK()
		n, valid := namespace.Parse(s)
		if !ok || !valid {
			return nil, refuse(anyNS(), "%s: %s is not a <db>.<collection> string", c.Name, keys[i])
		}
		ws = append(ws, collWrite(n, WhatRenameCollection))
	}
	return ws, nil
}

func classifyCloneAsCapped(c *command) ([]Write, error) {
	f, err := fieldsOf(c.Body, "toCollection")
	if err != nil {
		return nil, refuse(DBNamespace(c.DB), "cloneCollectionAsCapped: %v", err)
	}
	s, ok := f[0].StringValueOK()
	if !ok || s == "" {
		return nil, refuse(DBNamespace(c.DB), "cloneCollectionAsCapped: toCollection is not a non-empty string")
	}
	return []Write{collWrite(namespace.New(c.DB, s), WhatCloneCollectionAsCapped)}, nil
}

// classifyCollMod: collMod writes no document itself, except when it makes
// the server delete some: a TTL (expireAfterSeconds, top level for a
// clustered collection or under index) or a smaller capped collection.
func classifyCollMod(c *command) ([]Write, error) {
	ns := commandNS(c)
	f, err := fieldsOf(c.Body, "expireAfterSeconds", "cappedSize", "cappedMax", "index")
	if err != nil {
		return nil, refuse(ns, "collMod: %v", err)
	}
	deletes := f[0].Type != 0 || f[1].Type != 0 || f[2].Type != 0
	if f[3].Type != 0 {
		idx, ok := f[3].DocumentOK()
		if !ok {
			return nil, refuse(ns, "collMod: index is a %v, not a document", f[3].Type)
		}
		g, err := fieldsOf(idx, "expireAfterSeconds")
		if err != nil {
			return nil, refuse(ns, "collMod index: %v", err)
		}
		deletes = deletes || g[0].Type != 0
	}
	if !deletes {
		return nil, nil
	}
	return []Write{collWrite(ns, WhatCollMod)}, nil
}

// classifyCreateIndexes: a TTL index deletes documents.
func classifyCreateIndexes(c *command) ([]Write, error) {
	ns := commandNS(c)
	idx, err := c.Documents("indexes")
	if err != nil {
		return nil, refuse(ns, "createIndexes: %v", err)
	}
	for i, d := range idx {
		g, err := fieldsOf(d, "expireAfterSeconds")
		if err != nil {
			return nil, refuse(ns, "createIndexes indexes[%d]: %v", i, err)
		}
		if g[0].Type != 0 {
			return []Write{collWrite(ns, WhatCreateIndexes)}, nil
		}
	}
	return nil, nil
}

func classifyCopyDB(c *command) ([]Write, error) {
	f, err := fieldsOf(c.Body, "todb")
	if err != nil {
		return nil, refuse(anyNS(), "copydb: %v", err)
	}
	s, ok := f[0].StringValueOK()
	if !ok || s == "" {
		return nil, refuse(anyNS(), "copydb: todb is not a non-empty string")
	}
	return []Write{collWrite(DBNamespace(s), WhatCopyDB)}, nil
}

// classifyAggregate finds every $out and $merge anywhere in the pipeline:
// the server accepts them only as the last stage, but a sub-pipeline
// ($lookup, $facet, $unionWith) or a future server might read them
// elsewhere, so any document key "$out"/"$merge" at any depth counts.
func classifyAggregate(c *command) ([]Write, error) {
	if c.agg.usable(c) {
		if c.agg.err != nil {
			// A refusal stands alone, as below: the writes found
			// before it are not all the request's.
			return nil, c.agg.err
		}
		return c.agg.ws, nil
	}
	// Documents reads the body array or a kind-1 section alike, and
	// refuses two pipelines.
	stages, err := c.Documents("pipeline")
	if err != nil {
		return nil, refuse(commandNS(c), "%v", err)
	}
	a := aggScan{db: c.DB}
	for _, st := range stages {
		a.doc(st)
	}
	if a.err != nil {
		return nil, a.err
	}
	return a.ws, nil
}

// classifyMapReduce: out is a collection name (replace), {inline: 1} (no
// write) or {replace|merge|reduce: coll, db: d}. Every output-mode key
// present is counted; inline alone is not a write.
func classifyMapReduce(c *command) ([]Write, error) {
	ns := commandNS(c)
	f, err := fieldsOf(c.Body, "out")
	if err != nil {
		return nil, refuse(ns, "%s: %v", c.Name, err)
	}
	v := f[0]
	if v.Type == 0 {
		return nil, refuse(ns, "%s without out", c.Name)
	}
	if s, ok := v.StringValueOK(); ok {
		if s == "" {
			return nil, refuse(ns, "%s: empty out collection", c.Name)
		}
		return []Write{collWrite(namespace.New(c.DB, s), WhatMapReduce)}, nil
	}
	d, ok := v.DocumentOK()
	if !ok {
		return nil, refuse(ns, "%s: out is a %v, neither a string nor a document", c.Name, v.Type)
	}
	g, err := fieldsOf(d, "replace", "merge", "reduce", "db", "inline")
	if err != nil {
		return nil, refuse(anyNS(), "%s out: %v", c.Name, err)
	}
	db := c.DB
	if g[3].Type != 0 {
		s, ok := g[3].StringValueOK()
		if !ok || s == "" {
			return nil, refuse(anyNS(), "%s: out.db is not a non-empty string", c.Name)
		}
		db = s
	}
	var ws []Write
	for i, mode := range []string{"replace", "merge", "reduce"} {
		if g[i].Type == 0 {
			continue
		}
		s, ok := g[i].StringValueOK()
		if !ok || s == "" {
			return nil, refuse(DBNamespace(db), "%s: out.%s is not a non-empty string", c.Name, mode)
		}
		ws = append(ws, collWrite(namespace.New(db, s), WhatMapReduce))
	}
	if ws == nil && g[4].Type == 0 {
		return nil, refuse(DBNamespace(db), "%s: out names no output mode", c.Name)
	}
	return ws, nil
}

// classifyApplyOps (and doTxn, its 4.0 transactional twin, What
// "applyOps"): a collection write on the ns of every CRUD op ("i",
// "u", "d") that names its collection by ns only; a no-op ("n") writes
// nothing; a command op ("c"), an op that carries a collection UUID (ui:
// the server resolves it, whatever ns says), or anything else is "*".
// Each namespace is reported once.
func classifyApplyOps(c *command) ([]Write, error) {
	ops, err := c.Documents(c.Name)
	if err != nil {
		return nil, refuse(anyNS(), "%v", err)
	}
	if ops == nil {
		return nil, refuse(anyNS(), "%s is not an array of documents", c.Name)
	}
	var ws []Write
	seen := map[namespace.Namespace]bool{}
	add := func(n namespace.Namespace) {
		if !seen[n] {
			seen[n] = true
			ws = append(ws, collWrite(n, WhatApplyOps))
		}
	}
	for _, op := range ops {
		f, err := fieldsOf(op, "op", "ns", "ui")
		if err != nil {
			add(anyNS())
			continue
		}
		kind, _ := f[0].StringValueOK()
		s, nsOK := f[1].StringValueOK()
		n, valid := namespace.Parse(s)
		switch {
		case kind == "n" && f[2].Type == 0:
		case (kind == "i" || kind == "u" || kind == "d") && f[2].Type == 0 && nsOK && valid && !strings.HasPrefix(n.Collection(), "$cmd"):
			add(n)
		default:
			add(anyNS())
		}
	}
	return ws, nil
}
