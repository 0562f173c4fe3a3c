package enforce

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/guard/authority"
	"github.com/lockgate/lockgate/guard/inflight"
	"github.com/lockgate/lockgate/guard/refuse"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/mongoerr"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
)

// The forms a write takes, as the plan reads them, and a model of what
// enforcement must decide for each: a command is allowed iff, in every
// enforced namespace, its session holds the lock on every document each
// statement can touch (the _ids its filter pins, else the documents it
// matches, within the rule's maxCandidates, plus the _id its upsert
// would insert, which must be knowable), and no _id it inserts is locked
// by another session. The model computes the targets from the form's
// own parameters and the fixture's documents, never from the code under
// test. Beside the forms: commands without a session (no lock held,
// no_session), capped collections (inserts and upserts may evict),
// string _ids under a case-insensitive collation (resolved: "a" matches
// "A"), what a refusal may show and to whom (MayDisclose), what the
// fence is told, and what a transaction's statement leaves for its
// commit. docs/TESTING.md lists the mutations each was seen failing
// under.

// The fixture: three namespaces of the same documents: six numbered ones,
// {_id: i, k: i % 3} for i in 1..6, so a filter {k: c} matches two of
// them, three with string _ids "a", "A" and "b" (idLowA, idUpA, idB, k
// -1), one under a case-insensitive collation, and one whose _id is the
// document {a: 1} (idDoc, k -1). A lock state is kept for each.
const (
	nsOrders   = "shop.orders"
	nsInvoices = "shop.invoices"
	nsNotes    = "shop.notes"
	formDocs   = 6
	formMaxCan = 3 // the rules' maxCandidates
	idLowA     = 7
	idUpA      = 8
	idB        = 9
	idDoc      = 10
)

// formIDs are the fixture's _ids, by the numbers the model names them.
var formIDs = []int{1, 2, 3, 4, 5, 6, idLowA, idUpA, idB, idDoc}

// stringID is the string _id i, if it is one.
func stringID(i int) (string, bool) {
	switch i {
	case idLowA:
		return "a", true
	case idUpA:
		return "A", true
	case idB:
		return "b", true
	}
	return "", false
}

// kOf is the k field of the fixture's document i.
func kOf(i int) int {
	if i <= formDocs {
		return i % 3
	}
	return -1
}

// sameID reports whether a filter's _id x matches the document whose _id
// is d: one number in any type, a string with or without regard to case.
func sameID(d, x int, ci bool) bool {
	ds, dok := stringID(d)
	xs, xok := stringID(x)
	if dok && xok && ci {
		return strings.EqualFold(ds, xs)
	}
	return d == x
}

// A numbered _id is written as an int32, an int64 or a double, all one
// document's _id (docs/SECURITY.md: 1, NumberLong(1) and 1.0 are one key).
const (
	asInt32 = iota
	asInt64
	asDouble
)

// idValue is _id i written in form.
func idValue(i, form int) any {
	if s, ok := stringID(i); ok {
		return s
	}
	switch {
	case i == idDoc:
		return bson.D{{Key: "a", Value: 1}}
	case form == asInt64:
		return int64(i)
	case form == asDouble:
		return float64(i)
	}
	return int32(i)
}

var formNamespaces = []string{nsOrders, nsInvoices, nsNotes}

type formCmd int

const (
	cmdUpdate formCmd = iota
	cmdDelete
	cmdFindAndModify
	cmdBulkWrite
	cmdInsert
)

func (c formCmd) String() string {
	return [...]string{"update", "delete", "findAndModify", "bulkWrite", "insert"}[c]
}

type formOp int

const (
	opModify   formOp = iota // an update with operators
	opReplace                // a replacement document
	opPipeline               // an aggregation pipeline update
	opDelete                 // delete, findAndModify's remove
	opInsert
)

type formFilter int

const (
	byID       formFilter = iota // {_id: X}
	byEq                         // {_id: {$eq: X}}
	byIn                         // {_id: {$in: [...]}}
	byMatch                      // {k: c}: resolved, two documents
	byMatchAll                   // {k: {$gte: 0}}: resolved, over the bound
	byAnd                        // {$and: [{_id: X}, {k: c}]}: pins X
	byOr                         // {$or: [{_id: X}, {_id: {$in: [Y]}}]}: pins X and Y
	byOrMatch                    // {$or: [{_id: X}, {k: c}]}: resolved
	byDotted                     // {"_id.a": 1}: resolved, idDoc
	byExprLet                    // {$expr: {$eq: ["$_id", "$$x"]}} with let {x: X}
	formFilters
)

// pins reports whether the filter pins its _ids without a lookup.
func (f formFilter) pins() bool {
	switch f {
	case byID, byEq, byIn, byAnd, byOr:
		return true
	}
	return false
}

// formStmt is one statement of a generated command.
type formStmt struct {
	ns     string
	op     formOp
	filter formFilter
	ids    []int // the _ids byID, byEq, byIn, byAnd and byOr pin, byOrMatch's and byExprLet's X; the inserted _id
	// forms are how ids are written (asInt32 when nil), byIn's with
	// duplicates and mixed types.
	forms  []int
	match  int // byMatch's, byAnd's and byOrMatch's c
	multi  bool
	upsert bool
	// Options that change no target: arrayFilters (on an update with
	// operators) and a hint.
	arrayFilters, hint bool
	// collation is the statement's: none, simple, or case-insensitive.
	collation int
	// upsertID, when not 0, is the _id the upsert would insert, given in
	// the update ($setOnInsert) or the replacement document.
	upsertID int
}

type formCase struct {
	cmd     formCmd
	ordered bool
	// sessionless: the command carries no lsid, so it holds no lock
	// (docs/SECURITY.md, Identity): every lock is another's to it.
	sessionless bool
	// capped namespaces are capped collections, whose inserts (and
	// upserts) may evict locked documents; allowCapped is the rules'
	// allowCappedInserts.
	capped      map[string]bool
	allowCapped bool
	stmts       []formStmt
	// txnNumber: a retryable write, which is no transaction; inTxn: a
	// statement of a transaction (autocommit: false), whose allowed
	// statements leave what their commit needs (Walk.Txn).
	txnNumber, inTxn bool
	// ci are the collections whose default collation is
	// case-insensitive.
	ci map[string]bool
	// disclose: the caller may read the namespaces (MayDisclose), so a
	// refusal may name another session's lock and its holder.
	disclose bool
	modes    map[string]policy.Mode
	locks    map[string]map[int]int // ns -> _id -> 0 free, 1 held by the caller, 2 by another session
}

func (c formCase) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s ordered=%v sessionless=%v txnNumber=%v inTxn=%v capped=%v allowCapped=%v ci=%v disclose=%v", c.cmd, c.ordered, c.sessionless, c.txnNumber, c.inTxn, c.capped, c.allowCapped, c.ci, c.disclose)
	for _, ns := range formNamespaces {
		fmt.Fprintf(&b, " %s:%s%v", ns, c.modes[ns], c.locks[ns])
	}
	for _, s := range c.stmts {
		fmt.Fprintf(&b, " [%+v]", s)
	}
	return b.String()
}

// value is the statement's j-th pinned _id as written.
func (s formStmt) value(j int) any {
	form := asInt32
	if j < len(s.forms) {
		form = s.forms[j]
	}
	return idValue(s.ids[j], form)
}

// filterDoc is the statement's filter; the j-th statement's let
// variable is xj.
func (s formStmt) filterDoc(j int) bson.D {
	id := func(v any) bson.D { return bson.D{{Key: "_id", Value: v}} }
	k := bson.D{{Key: "k", Value: s.match}}
	switch s.filter {
	case byID:
		return id(s.value(0))
	case byEq:
		return id(bson.D{{Key: "$eq", Value: s.value(0)}})
	case byIn:
		var in bson.A
		for j := range s.ids {
			in = append(in, s.value(j))
		}
		return id(bson.D{{Key: "$in", Value: in}})
	case byMatch:
		return k
	case byAnd:
		return bson.D{{Key: "$and", Value: bson.A{id(s.value(0)), k}}}
	case byOr:
		return bson.D{{Key: "$or", Value: bson.A{id(s.value(0)), id(bson.D{{Key: "$in", Value: bson.A{s.value(1)}}})}}}
	case byOrMatch:
		return bson.D{{Key: "$or", Value: bson.A{id(s.value(0)), k}}}
	case byDotted:
		return bson.D{{Key: "_id.a", Value: 1}}
	case byExprLet:
		return bson.D{{Key: "$expr", Value: bson.D{{Key: "$eq", Value: bson.A{"$_id", fmt.Sprintf("$$x%d", j)}}}}}
	default:
		return bson.D{{Key: "k", Value: bson.D{{Key: "$gte", Value: 0}}}}
	}
}

// let is the command's let: the variables of its byExprLet statements.
func (c formCase) let() (bson.E, bool) {
	var vars bson.D
	for j, s := range c.stmts {
		if s.filter == byExprLet {
			vars = append(vars, bson.E{Key: fmt.Sprintf("x%d", j), Value: s.value(0)})
		}
	}
	return bson.E{Key: "let", Value: vars}, vars != nil
}

// Statement collations.
const (
	collNone = iota
	collSimple
	collCI
)

// options are the statement's arrayFilters, hint and collation, as the
// statement's (or findAndModify's) fields.
func (s formStmt) options() bson.D {
	var o bson.D
	switch s.collation {
	case collSimple:
		o = append(o, bson.E{Key: "collation", Value: bson.D{{Key: "locale", Value: "simple"}}})
	case collCI:
		o = append(o, bson.E{Key: "collation", Value: ciCollation})
	}
	if s.arrayFilters && s.op == opModify {
		o = append(o, bson.E{Key: "arrayFilters", Value: bson.A{bson.D{{Key: "e.x", Value: 1}}}})
	}
	if s.hint {
		o = append(o, bson.E{Key: "hint", Value: bson.D{{Key: "_id", Value: 1}}})
	}
	return o
}

// updateDoc is the statement's update: operators, a replacement or a
// pipeline.
func (s formStmt) updateDoc() any {
	switch s.op {
	case opReplace:
		if s.upsertID != 0 {
			return bson.D{{Key: "_id", Value: idValue(s.upsertID, asInt32)}, {Key: "n", Value: 1}}
		}
		return bson.D{{Key: "n", Value: 1}}
	case opPipeline:
		return bson.A{bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: 1}}}}}
	default:
		u := bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: 1}}}}
		if s.upsertID != 0 {
			u = append(u, bson.E{Key: "$setOnInsert", Value: bson.D{{Key: "_id", Value: idValue(s.upsertID, asInt32)}}})
		}
		return u
	}
}

func coll(ns string) string { return ns[strings.IndexByte(ns, '.')+1:] }

// formLSID is the session every command but a sessionless one carries.
var formLSID = bson.E{Key: "lsid", Value: bson.D{{Key: "id", Value: primitive.Binary{Subtype: 4, Data: bytes.Repeat([]byte{7}, 16)}}}}

// body is the command as a driver sends it.
func (c formCase) body() bson.D {
	b := c.command()
	if let, ok := c.let(); ok {
		b = append(b, let)
	}
	if !c.sessionless {
		b = append(b, formLSID)
		switch {
		case c.inTxn:
			b = append(b, bson.E{Key: "txnNumber", Value: int64(3)}, bson.E{Key: "startTransaction", Value: true}, bson.E{Key: "autocommit", Value: false})
		case c.txnNumber:
			b = append(b, bson.E{Key: "txnNumber", Value: int64(3)})
		}
	}
	return b
}

func (c formCase) command() bson.D {
	ordered := bson.E{Key: "ordered", Value: c.ordered}
	switch c.cmd {
	case cmdUpdate:
		var us bson.A
		for j, s := range c.stmts {
			us = append(us, append(bson.D{{Key: "q", Value: s.filterDoc(j)}, {Key: "u", Value: s.updateDoc()},
				{Key: "multi", Value: s.multi}, {Key: "upsert", Value: s.upsert}}, s.options()...))
		}
		return bson.D{{Key: "update", Value: coll(c.stmts[0].ns)}, {Key: "updates", Value: us}, ordered, {Key: "$db", Value: "shop"}}
	case cmdDelete:
		var ds bson.A
		for j, s := range c.stmts {
			limit := 1
			if s.multi {
				limit = 0
			}
			ds = append(ds, append(bson.D{{Key: "q", Value: s.filterDoc(j)}, {Key: "limit", Value: limit}}, s.options()...))
		}
		return bson.D{{Key: "delete", Value: coll(c.stmts[0].ns)}, {Key: "deletes", Value: ds}, ordered, {Key: "$db", Value: "shop"}}
	case cmdFindAndModify:
		s := c.stmts[0]
		b := bson.D{{Key: "findAndModify", Value: coll(s.ns)}, {Key: "query", Value: s.filterDoc(0)}}
		if s.op == opDelete {
			b = append(b, bson.E{Key: "remove", Value: true})
		} else {
			b = append(b, bson.E{Key: "update", Value: s.updateDoc()}, bson.E{Key: "upsert", Value: s.upsert})
		}
		b = append(b, s.options()...)
		return append(b, bson.E{Key: "$db", Value: "shop"})
	case cmdInsert:
		var docs bson.A
		for _, s := range c.stmts {
			docs = append(docs, bson.D{{Key: "_id", Value: s.value(0)}, {Key: "n", Value: 1}})
		}
		return bson.D{{Key: "insert", Value: coll(c.stmts[0].ns)}, {Key: "documents", Value: docs}, ordered, {Key: "$db", Value: "shop"}}
	}
	var ops, nsInfo bson.A
	index := map[string]int{}
	for j, s := range c.stmts {
		i, ok := index[s.ns]
		if !ok {
			i = len(nsInfo)
			index[s.ns] = i
			nsInfo = append(nsInfo, bson.D{{Key: "ns", Value: s.ns}})
		}
		switch s.op {
		case opInsert:
			ops = append(ops, bson.D{{Key: "insert", Value: i}, {Key: "document", Value: bson.D{{Key: "_id", Value: s.value(0)}, {Key: "n", Value: 1}}}})
		case opDelete:
			ops = append(ops, append(bson.D{{Key: "delete", Value: i}, {Key: "filter", Value: s.filterDoc(j)}, {Key: "multi", Value: s.multi}}, s.options()...))
		default:
			ops = append(ops, append(bson.D{{Key: "update", Value: i}, {Key: "filter", Value: s.filterDoc(j)}, {Key: "updateMods", Value: s.updateDoc()},
				{Key: "multi", Value: s.multi}, {Key: "upsert", Value: s.upsert}}, s.options()...))
		}
	}
	return bson.D{{Key: "bulkWrite", Value: 1}, {Key: "ops", Value: ops}, {Key: "nsInfo", Value: nsInfo}, ordered, {Key: "$db", Value: "admin"}}
}

// expectation is what the model says of a case.
type expectation struct {
	allowed bool
	reasons []string         // the enforced causes, any of which may refuse it
	checked map[string][]int // enforced namespace -> the _ids its lock check must verify, when allowed
	audited bool             // an audited statement has a cause of its own
	// resolves: a statement of a protected namespace has a filter that
	// pins no _id; none else is looked up.
	resolves bool
	// named are the _ids the request names, by namespace: its pins, the
	// _ids it upserts and inserts. A refusal shows no other.
	named map[string][]int
	// fenced are, by statement, the _ids the fence is told an allowed
	// statement of an enforced namespace may touch.
	fenced [][]int
	// txn: an allowed statement of a transaction that writes where
	// something is protected leaves its commit's needs; txnInserts are
	// the _ids it inserts there, to be checked again at the commit.
	txn        bool
	txnInserts map[string][]int
}

// pinned are the _ids the statement's filter pins, each once, and how
// many values it names as written (distinct by type and value).
func (s formStmt) pinned() (ids []int, written int) {
	if !s.filter.pins() || s.op == opInsert {
		return nil, 0
	}
	type w struct{ id, form int }
	seen := map[w]bool{}
	for j, id := range s.ids {
		form := asInt32
		if j < len(s.forms) && id <= formDocs {
			form = s.forms[j]
		}
		seen[w{id, form}] = true
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids, len(seen)
}

// matches are the fixture's documents the statement's filter matches,
// with or without regard to the case of strings.
func (s formStmt) matches(ci bool) []int {
	var out []int
	for _, d := range formIDs {
		id := func(j int) bool { return sameID(d, s.ids[j], ci) }
		var m bool
		switch s.filter {
		case byID, byEq, byExprLet:
			m = id(0)
		case byIn:
			for j := range s.ids {
				m = m || id(j)
			}
		case byMatch:
			m = kOf(d) == s.match
		case byMatchAll:
			m = kOf(d) >= 0
		case byAnd:
			m = id(0) && kOf(d) == s.match
		case byOr:
			m = id(0) || id(1)
		case byOrMatch:
			m = id(0) || kOf(d) == s.match
		case byDotted:
			m = d == idDoc
		}
		if m {
			out = append(out, d)
		}
	}
	return out
}

// pins reports whether s is read under a case-insensitive collation
// (its own, else its collection's default), and whether its filter pins
// its _ids: a string _id pins under the simple collation only, as under
// another "a" matches "A" too, so such a filter is resolved.
func (c formCase) pins(s formStmt) (ci, pins bool) {
	ci = s.collation == collCI || (s.collation == collNone && c.ci[s.ns])
	pinned, _ := s.pinned()
	return ci, s.filter.pins() && !(ci && slices.ContainsFunc(pinned, func(i int) bool { _, ok := stringID(i); return ok }))
}

// names reports whether the statement names _id i itself: as a pin of a
// filter that pins (pins), as the _id it upserts, as the _id it inserts.
func (s formStmt) names(i int, pins bool) bool {
	switch {
	case s.op == opInsert:
		return s.ids[0] == i
	case s.upsert && s.upsertID == i:
		return true
	case s.upsert && (s.filter == byID || s.filter == byEq || s.filter == byAnd) && s.ids[0] == i:
		return true
	case pins:
		return slices.Contains(s.ids, i)
	}
	return false
}

// inserted is the _id the statement inserts: an insert's, or the one an
// upsert inserts when nothing matches (its filter's equality, else its
// update's).
func (s formStmt) inserted() (int, bool) {
	switch {
	case s.op == opInsert:
		return s.ids[0], true
	case !s.upsert:
		return 0, false
	case s.upsertID != 0:
		return s.upsertID, true
	case s.filter == byID || s.filter == byEq || s.filter == byAnd:
		return s.ids[0], true
	}
	return 0, false
}

// expect is the model.
func (c formCase) expect() expectation {
	e := expectation{allowed: true, checked: map[string][]int{}, named: map[string][]int{}}
	// held: the command's session holds the lock on _id i of ns; taken:
	// someone other than the command's session does.
	held := func(ns string, i int) bool { return !c.sessionless && c.locks[ns][i] == 1 }
	taken := func(ns string, i int) bool { return c.locks[ns][i] == 2 || (c.sessionless && c.locks[ns][i] == 1) }
	e.fenced = make([][]int, len(c.stmts))
	e.txnInserts = map[string][]int{}
	for j, s := range c.stmts {
		mode := c.modes[s.ns]
		if mode == policy.Off {
			continue
		}
		e.txn = c.inTxn && !c.sessionless
		if s.op == opInsert && !(c.capped[s.ns] && !c.allowCapped) {
			e.txnInserts[s.ns] = append(e.txnInserts[s.ns], s.ids[0])
		}
		// causes are what may refuse the statement; the walk reports one.
		var causes []string
		var targets []int
		// An insert, or an upsert that may insert, into a capped
		// collection may evict any document, locked ones included.
		evicts := c.capped[s.ns] && !c.allowCapped && (s.op == opInsert || s.upsert)
		ci, pins := c.pins(s)
		pinned, written := s.pinned()
		if s.op != opInsert && !c.sessionless && !evicts && !pins {
			e.resolves = true
		}
		resolved := s.matches(ci)
		switch {
		case evicts && (s.op == opInsert || !c.sessionless):
			causes = append(causes, ReasonCappedInsert)
		case s.op == opInsert:
			if taken(s.ns, s.ids[0]) {
				causes = append(causes, ReasonInsertLocked)
			}
		case c.sessionless:
			// Without a session it can hold no lock: refused before
			// anything is looked up.
			causes = append(causes, refuse.ReasonNoSession)
		case written > formMaxCan || (!pins && s.filter != byExprLet && len(resolved) > formMaxCan):
			// A filter naming more _id values than maxCandidates (as
			// written: 1 and 1.0 are two values of one _id), or matching
			// more documents.
			causes = append(causes, ReasonTooManyCandidates)
		case s.filter == byExprLet:
			// The resolver is not given the command's let, so the lookup
			// fails (the server's "undefined variable"): refused, fail
			// closed, though the write names one _id.
			causes = append(causes, ReasonResolveFailed)
		case s.upsert && (s.filter == byDotted || (s.op == opPipeline && !s.filter.pins())):
			// The _id it inserts cannot be known: "_id.a" makes one the
			// server builds, a pipeline may compute any.
			causes = append(causes, ReasonUnverifiableUpsert)
		default:
			targets = pinned
			if !pins {
				targets = resolved
			}
			// An upsert inserts the _id its filter's equality names, else
			// the one its update sets, when no document matches: its lock
			// is needed either way.
			if s.upsert && (s.filter == byID || s.filter == byEq || s.filter == byAnd) {
				targets = append(targets, s.ids[0])
			}
			if s.upsert && s.upsertID != 0 {
				targets = append(targets, s.upsertID)
			}
			for _, id := range targets {
				if !held(s.ns, id) {
					causes = append(causes, ReasonNotLocked)
					break
				}
			}
			// Told to a caller who may read the namespace: a named _id
			// another session holds.
			for _, id := range targets {
				if c.disclose && taken(s.ns, id) && s.names(id, pins) {
					causes = append(causes, ReasonHeldByOther)
					break
				}
			}
		}
		// Under a default collation that is not simple the _id index may
		// take a string _id for another ("a" for "A"), whatever the
		// statement's own collation: an insert, or an upsert, of a string
		// _id is refused while another session holds a lock on any string
		// _id there, as lockgate cannot evaluate the collation
		// (collation.go). A sessionless upsert is refused before.
		if ins, ok := s.inserted(); ok && c.ci[s.ns] && (s.op == opInsert || !c.sessionless) {
			if _, str := stringID(ins); str && slices.ContainsFunc(formIDs, func(i int) bool { _, si := stringID(i); return si && taken(s.ns, i) }) {
				causes = append(causes, ReasonInsertLocked)
			}
		}
		for _, id := range formIDs {
			if s.names(id, pins) {
				e.named[s.ns] = append(e.named[s.ns], id)
			}
		}
		switch {
		case len(causes) > 0 && mode == policy.Enforce:
			e.allowed = false
			for _, cause := range causes {
				if !slices.Contains(e.reasons, cause) {
					e.reasons = append(e.reasons, cause)
				}
			}
		case len(causes) > 0:
			e.audited = true
		case mode == policy.Enforce:
			e.checked[s.ns] = append(e.checked[s.ns], targets...)
			e.fenced[j] = slices.Clone(targets)
		}
	}
	e.txn = e.txn && e.allowed
	for ns, ids := range e.checked {
		slices.Sort(ids)
		e.checked[ns] = slices.Compact(ids)
		if len(e.checked[ns]) == 0 {
			delete(e.checked, ns)
		}
	}
	return e
}

// formSeen is what the fakes saw of a decision, and what the fence was
// told.
type formSeen struct {
	decision
	fenced []fenceNote
	// txn: Walk.Txn was called, with the locks checked and the inserts
	// the commit must check again.
	txn        bool
	txnChecked inflight.Locks
	txnInserts Needs
}

// fenceNote is what the fence was told of one statement.
type fenceNote struct {
	ns    string
	index int
	ids   []docid.ID
}

// otherHolder is the other session, as a refusal may describe it.
var otherHolder = lockstore.Owner{Session: bytes.Repeat([]byte{2}, 16), App: "billing-batch", Client: "10.9.9.9:4000"}

// decideCase runs enforcement's walk, lock check and decision over c's
// command as the plan reads it, on a lock store in memory in c's lock
// states and the in-memory resolver over the fixture.
func decideCase(t *testing.T, c formCase) (_ proxy.Decision, _ formSeen, resolutions int) {
	t.Helper()
	s := memstore.New(memstore.Config{})
	a, b := ownerOf(1), otherHolder
	for ns, m := range c.locks {
		for i, st := range m {
			switch st {
			case 1:
				acquire(t, s, a, ns, id(t, idValue(i, asInt32)))
			case 2:
				acquire(t, s, b, ns, id(t, idValue(i, asInt32)))
			}
		}
	}
	res := newCollatingResolver()
	for _, ns := range formNamespaces {
		if c.capped[ns] {
			res.CreateCapped(ns)
		}
		if c.ci[ns] {
			res.SetCaseInsensitive(ns)
		}
		for _, i := range formIDs {
			if err := res.Insert(ns, bson.D{{Key: "_id", Value: idValue(i, asInt32)}, {Key: "k", Value: kOf(i)}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	targets := NewTargets(TargetsConfig{Resolver: res, ResolveTimeout: time.Minute, Authority: authority.New(nil),
		Throttle: &fakeThrottle{slots: make(chan struct{}, 1)},
		Resolves: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "resolves"}, []string{"outcome"}),
		Seconds:  prometheus.NewHistogram(prometheus.HistogramOpts{Name: "seconds"})})
	req := request(t, c.body())
	writes, err := policy.NewPlan(req.Message, req.Command).Writes()
	if err != nil {
		t.Fatalf("the plan cannot read %s: %v", c, err)
	}
	if len(writes) != len(c.stmts) {
		t.Fatalf("the plan reads %d writes of %s, want %d", len(writes), c, len(c.stmts))
	}
	var seen formSeen
	d := &Decider[*Verdict]{
		Record: func(_ *proxy.Request, _ *policy.Policy, v *Verdict, enforced *Violation, _ time.Duration, _ time.Time) *Violation {
			seen.recorded, seen.enforced, seen.violations = true, enforced, v.Violations
			seen.checked = map[string][]docid.ID{}
			for _, x := range v.Checked {
				seen.checked[x.NS.String()] = append(seen.checked[x.NS.String()], x.IDs...)
			}
			return nil
		},
		Launch: func(*proxy.Request, *policy.Policy, *Verdict, time.Time, *proxy.Decision) {
			seen.launched = true
		},
	}
	// Shown as the guard shows a refusal: without its holder to a caller
	// who may not read the namespace.
	d.Shown = func(_ *proxy.Request, x Violation) Violation {
		if c.disclose {
			return x
		}
		return Undisclosed(x)
	}
	mayDisclose := func(context.Context, *proxy.Request, namespace.Namespace) bool { return c.disclose }
	k := &Walk[*Verdict]{Targets: targets, Checker: &Checker[*Verdict]{Locks: NewLocks(s), MayDisclose: mayDisclose},
		Rules: func(_ *policy.Policy, _ *proxy.Request, ns namespace.Namespace) []policy.Rule {
			return []policy.Rule{{Mode: c.modes[ns.String()], MaxCandidates: formMaxCan, Inserts: policy.InsertsRequireUnlocked, AllowCappedInserts: c.allowCapped}}
		},
		New: func(req *proxy.Request, start time.Time) (*Verdict, *Verdict) {
			v := &Verdict{Req: req, Now: start}
			return v, v
		},
		// The fence is told each statement's documents (the guard keeps
		// them where the rule fences).
		Fence: func(_ *Verdict, r *policy.Rule, w policy.Write, ids []docid.ID) {
			if r.Mode == policy.Enforce && w.Kind != policy.KindInsert {
				seen.fenced = append(seen.fenced, fenceNote{w.NS.String(), w.Index, slices.Clone(ids)})
			}
		},
		// A transaction's allowed statement leaves what its commit needs.
		Txn: func(_ context.Context, _ *proxy.Request, v *Verdict, _ *lockstore.Owner, inserts Needs) {
			seen.txn, seen.txnChecked, seen.txnInserts = true, v.Checked, inserts
		},
		// The owner as the guard reads it: the request's session, else
		// none.
		Owner: func(req *proxy.Request, _ *Verdict) (*lockstore.Owner, bool) {
			if _, ok := req.Command.SessionID(); !ok {
				return nil, false
			}
			return &a, true
		},
		Decider: d}
	dec := k.Run(context.Background(), req, &policy.Policy{}, writes, time.Now())
	return dec, seen, res.Calls()
}

// checkCase decides c and holds the decision to the model.
func checkCase(t *testing.T, c formCase) (reason string) {
	t.Helper()
	want := c.expect()
	dec, seen, resolutions := decideCase(t, c)
	if resolutions > 0 && !want.resolves {
		t.Fatalf("%s\n%d lookups of the documents a filter matches, where every filter pins its _ids", c, resolutions)
	}
	if want.allowed {
		if dec.Action != proxy.Forward || (!seen.launched && seen.recorded) {
			t.Fatalf("%s\nrefused (%+v), want allowed: every target of its enforced statements is held", c, seen.enforced)
		}
		if !seen.recorded {
			return // nothing enforced or audited: forwarded untouched
		}
		if !seen.launched || seen.enforced != nil {
			t.Fatalf("%s\nlaunched %v, enforced %+v; want launched with nothing enforced", c, seen.launched, seen.enforced)
		}
		for _, ns := range formNamespaces {
			var got []int
			for _, x := range seen.checked[ns] {
				got = append(got, intOf(t, x))
			}
			slices.Sort(got)
			got = slices.Compact(got)
			if c.modes[ns] == policy.Enforce && !slices.Equal(got, want.checked[ns]) {
				t.Fatalf("%s\nchecked in %s the _ids %v, want %v", c, ns, got, want.checked[ns])
			}
		}
		for _, n := range seen.fenced {
			var got []int
			for _, x := range n.ids {
				got = append(got, intOf(t, x))
			}
			slices.Sort(got)
			w := slices.Clone(want.fenced[n.index])
			slices.Sort(w)
			if !slices.Equal(slices.Compact(got), slices.Compact(w)) || c.stmts[n.index].ns != n.ns {
				t.Fatalf("%s\nthe fence was told statement %d of %s touches %v, want %v in %s", c, n.index, n.ns, got, w, c.stmts[n.index].ns)
			}
		}
		if seen.txn != want.txn {
			t.Fatalf("%s\nthe transaction's record made %v, want %v", c, seen.txn, want.txn)
		}
		if want.txn {
			for _, ns := range formNamespaces {
				got, w := []int{}, slices.Clone(want.txnInserts[ns])
				for _, n := range seen.txnInserts {
					if n.NS.String() == ns {
						for _, x := range n.IDs {
							got = append(got, intOf(t, x))
						}
					}
				}
				slices.Sort(got)
				slices.Sort(w)
				if !slices.Equal(slices.Compact(got), slices.Compact(w)) {
					t.Fatalf("%s\nthe transaction's record has the inserts %v in %s, want %v", c, got, ns, w)
				}
			}
		}
		if got := len(seen.violations) > 0; got != want.audited {
			t.Fatalf("%s\nviolations recorded %+v, want some: %v (an audited statement's cause)", c, seen.violations, want.audited)
		}
		return
	}
	if dec.Action != proxy.Reply || seen.launched || seen.txn {
		t.Fatalf("%s\naction %v, launched %v, transaction's record made %v; want refused (%v), nothing launched or recorded", c, dec.Action, seen.launched, seen.txn, want.reasons)
	}
	if code := refusalCode(t, dec); code != mongoerr.LockBusy {
		t.Fatalf("%s\ncode %d, want LockBusy (docs/ERRORS.md)", c, code)
	}
	if seen.enforced == nil || !slices.Contains(want.reasons, seen.enforced.Reason) {
		t.Fatalf("%s\nrefused with %+v, want one of %v", c, seen.enforced, want.reasons)
	}
	reason, _ = dec.Reply.Lookup("lockgate", "reason").StringValueOK()
	msg, _ := dec.Reply.Lookup("errmsg").StringValueOK()
	prefix := fmt.Sprintf("lockgate: %s on %s refused: ", c.body()[0].Key, seen.enforced.Write.NS)
	if reason != seen.enforced.Reason || !strings.HasPrefix(msg, prefix) {
		t.Fatalf("%s\nreply reason %q, errmsg %q; want %q and a message starting %q", c, reason, msg, seen.enforced.Reason, prefix)
	}
	if seen.enforced.Reason == ReasonNotLocked && seen.enforced.Holder != nil {
		t.Fatalf("%s\na not_locked refusal names the holder %+v", c, seen.enforced.Holder)
	}
	// What the refusal shows: only _ids the request named, and another
	// session's lock and its holder only to a caller who may read the
	// namespace.
	ns := seen.enforced.Write.NS.String()
	var shown []int
	if ids, ok := dec.Reply.Lookup("lockgate", "ids").ArrayOK(); ok {
		vals, _ := ids.Values()
		for _, v := range vals {
			x, err := docid.New(bson.RawValue{Type: v.Type, Value: v.Data})
			if err != nil {
				t.Fatal(err)
			}
			i := intOf(t, x)
			if !slices.Contains(want.named[ns], i) {
				t.Fatalf("%s\nthe refusal shows _id %v, which the request does not name (it names %v in %s)", c, x, want.named[ns], ns)
			}
			shown = append(shown, i)
		}
	}
	_, hasHolder := dec.Reply.Lookup("lockgate", "holder").DocumentOK()
	switch {
	case !c.disclose && seen.enforced.Reason == ReasonHeldByOther:
		// The lock check's own refusal, before the guard's last gate:
		// held by another and not locked read the same to such a caller.
		t.Fatalf("%s\nthe lock check refused %s, with holder %+v, a caller who may not read %s", c, seen.enforced.Reason, seen.enforced.Holder, ns)
	case !c.disclose && (hasHolder || reason == ReasonHeldByOther || strings.Contains(msg, otherHolder.App) || strings.Contains(msg, otherHolder.Client)):
		t.Fatalf("%s\nrefused %s, holder shown %v, errmsg %q, to a caller who may not read %s", c, reason, hasHolder, msg, ns)
	case reason == ReasonHeldByOther && (!hasHolder || len(shown) == 0 || c.locks[ns][shown[0]] != 2):
		t.Fatalf("%s\nrefused %s showing _ids %v, holder shown %v: want the named _id another session holds, and its holder", c, reason, shown, hasHolder)
	case reason == ReasonInsertLocked && c.disclose && !hasHolder:
		t.Fatalf("%s\nrefused %s to a caller who may read %s, without the holder", c, reason, ns)
	case reason == ReasonNotLocked && c.disclose && len(shown) > 0 && c.locks[ns][shown[0]] == 2 && !c.sessionless:
		t.Fatalf("%s\nrefused %s showing _ids %v, the first held by another session, to a caller who may read %s: want %s and its holder", c, reason, shown, ns, ReasonHeldByOther)
	}
	if c.modes[seen.enforced.Write.NS.String()] != policy.Enforce {
		t.Fatalf("%s\nrefused for %s, which is not enforced", c, seen.enforced.Write.NS)
	}
	return reason
}

func intOf(t *testing.T, x docid.ID) int {
	t.Helper()
	for _, i := range formIDs {
		if x.Equal(id(t, idValue(i, asInt32))) {
			return i
		}
	}
	t.Fatalf("checked _id %v, which no statement names", x)
	return 0
}

// genCase draws a command: its form, its statements, the modes of the
// namespaces and the lock states of their documents.
func genCase(r *rand.Rand) formCase {
	c := formCase{cmd: formCmd(r.IntN(5)), ordered: r.IntN(2) == 0, sessionless: r.IntN(8) == 0,
		modes: map[string]policy.Mode{}, locks: map[string]map[int]int{}, capped: map[string]bool{}, allowCapped: r.IntN(3) == 0}
	for _, ns := range formNamespaces {
		c.capped[ns] = r.IntN(4) == 0
		c.modes[ns] = []policy.Mode{policy.Enforce, policy.Enforce, policy.Audit, policy.Off}[r.IntN(4)]
		c.locks[ns] = map[int]int{}
		for _, i := range formIDs {
			// Mostly the caller's, so that allowed commands are common.
			c.locks[ns][i] = []int{1, 1, 1, 1, 0, 2}[r.IntN(6)]
		}
	}
	ns := formNamespaces[r.IntN(len(formNamespaces))]
	n := 1 + r.IntN(3)
	if c.cmd == cmdFindAndModify {
		n = 1
	}
	c.txnNumber = r.IntN(4) == 0
	c.inTxn = r.IntN(5) == 0
	c.disclose = r.IntN(2) == 0
	c.ci = map[string]bool{}
	for _, ns := range formNamespaces {
		c.ci[ns] = r.IntN(3) == 0
	}
	for range n {
		if c.cmd == cmdBulkWrite {
			ns = formNamespaces[r.IntN(len(formNamespaces))]
		}
		c.stmts = append(c.stmts, genStmt(r, c.cmd, ns))
	}
	return c
}

func genStmt(r *rand.Rand, cmd formCmd, ns string) formStmt {
	s := formStmt{ns: ns, filter: formFilter(r.IntN(int(formFilters))), match: r.IntN(3), multi: r.IntN(2) == 0,
		arrayFilters: r.IntN(4) == 0, hint: r.IntN(4) == 0}
	id := func() int {
		switch r.IntN(8) {
		case 0:
			return idDoc
		case 1, 2:
			return []int{idLowA, idUpA, idB}[r.IntN(3)]
		}
		return 1 + r.IntN(formDocs)
	}
	if r.IntN(3) == 0 {
		s.collation = []int{collSimple, collCI}[r.IntN(2)]
	}
	switch cmd {
	case cmdInsert:
		s.op = opInsert
	case cmdDelete:
		s.op = opDelete
	case cmdBulkWrite:
		s.op = []formOp{opModify, opReplace, opPipeline, opDelete, opInsert}[r.IntN(5)]
	case cmdFindAndModify:
		s.op = []formOp{opModify, opReplace, opPipeline, opDelete}[r.IntN(4)]
	default:
		s.op = []formOp{opModify, opReplace, opPipeline}[r.IntN(3)]
	}
	switch s.filter {
	case byID, byEq, byAnd, byOrMatch, byExprLet:
		s.ids = []int{id()}
	case byOr:
		s.ids = []int{id(), id()}
	case byIn:
		// Duplicates, and one _id in several types, now and then.
		for range 1 + r.IntN(formMaxCan+1) {
			if n := len(s.ids); n > 0 && r.IntN(4) == 0 {
				s.ids, s.forms = append(s.ids, s.ids[n-1]), append(s.forms, s.forms[n-1])
				continue
			}
			s.ids = append(s.ids, id())
			s.forms = append(s.forms, []int{asInt32, asInt32, asInt64, asDouble}[r.IntN(4)])
		}
	}
	if s.op == opInsert {
		s.ids = []int{id()}
		s.filter = byID
	}
	if s.op == opReplace || cmd == cmdFindAndModify {
		s.multi = false // a replacement, and findAndModify, write one document
	}
	if s.op != opDelete && s.op != opInsert && r.IntN(3) == 0 {
		s.upsert = true
		switch s.filter {
		case byIn, byMatchAll, byOr, byOrMatch:
			s.filter = byMatch // an upsert's _id is the filter's equality or none
		}
		if s.filter == byMatch && s.op != opPipeline && r.IntN(2) == 0 {
			s.upsertID = id()
		}
	}
	return s
}

// TestAllowEveryForm: every form a write takes, generated with its lock
// states from fixed seeds, decided as the model says: allowed with the
// targets checked iff every target in an enforced namespace is held (and
// no inserted _id is another's), else refused with LockBusy, a reason
// docs/ERRORS.md lists, only what the caller may be shown and nothing
// launched.
//
// LOCKGATE_FORMS_SEED=<n> draws from another seed (the default is 25),
// LOCKGATE_FORMS_CASES=<n> draws more commands: a failure names the case.
func TestAllowEveryForm(t *testing.T) {
	// Under the race detector a fifth of the draw: what it adds is the
	// decisions' goroutines checked for races, which the first cases
	// exercise as well as the last; the full draw, and the check below
	// that it covers every outcome, run without the detector.
	defCases := 3000
	if raceEnabled {
		defCases = 600
	}
	seed, cases := envInt(t, "LOCKGATE_FORMS_SEED", 25), envInt(t, "LOCKGATE_FORMS_CASES", defCases)
	t.Logf("seed %d, %d cases", seed, cases)
	r := rand.New(rand.NewPCG(uint64(seed), 2026))
	tally := map[string]int{}
	for i := range cases {
		c := genCase(r)
		e := c.expect()
		key := c.cmd.String() + map[bool]string{true: " allowed", false: " refused"}[e.allowed]
		tally[key]++
		for _, r := range e.reasons {
			tally[r]++
		}
		if e.txn {
			tally["transaction recorded"]++
		}
		// Each filter form of a protected namespace, by outcome.
		for _, s := range c.stmts {
			if s.op != opInsert && c.modes[s.ns] == policy.Enforce {
				tally[fmt.Sprintf("filter %d%s", s.filter, map[bool]string{true: " allowed", false: " refused"}[e.allowed])]++
			}
		}
		t.Run(fmt.Sprint(i), func(t *testing.T) { checkCase(t, c) })
		if t.Failed() {
			return
		}
	}
	t.Logf("%d cases: %v", cases, tally)
	// The generator must reach both outcomes of every command.
	if cases < 3000 {
		return
	}
	for _, cmd := range []formCmd{cmdUpdate, cmdDelete, cmdFindAndModify, cmdBulkWrite, cmdInsert} {
		for _, o := range []string{" allowed", " refused"} {
			if tally[cmd.String()+o] < 20 {
				t.Errorf("only %d cases of %s%s: the generator no longer covers it", tally[cmd.String()+o], cmd, o)
			}
		}
	}
	if tally["transaction recorded"] < 20 {
		t.Errorf("only %d allowed statements of transactions", tally["transaction recorded"])
	}
	for f := range formFilters {
		for _, o := range []string{" allowed", " refused"} {
			if f != byMatchAll && f != byExprLet && tally[fmt.Sprintf("filter %d%s", f, o)] < 10 {
				t.Errorf("only %d cases of filter form %d%s: the generator no longer covers it", tally[fmt.Sprintf("filter %d%s", f, o)], f, o)
			}
		}
	}
	for _, r := range []string{ReasonNotLocked, ReasonHeldByOther, ReasonInsertLocked, ReasonTooManyCandidates, ReasonUnverifiableUpsert, refuse.ReasonNoSession, ReasonCappedInsert, ReasonResolveFailed} {
		if tally[r] < 20 {
			t.Errorf("only %d refusals may give %s: the generator no longer covers it", tally[r], r)
		}
	}
}

// TestAllowNamedForms: the forms whose decision is easiest to get wrong,
// each named, its outcome stated here as well as by the model (so that a
// wrong model cannot pass them) and checked as TestAllowEveryForm checks.
func TestAllowNamedForms(t *testing.T) {
	enforceAll := map[string]policy.Mode{nsOrders: policy.Enforce, nsInvoices: policy.Enforce, nsNotes: policy.Off}
	// The caller holds 1-4, {a: 1}, "a" and "b" in each namespace, another
	// session 5 and "A", and 6 is free.
	locks := map[string]map[int]int{}
	for _, ns := range formNamespaces {
		locks[ns] = map[int]int{1: 1, 2: 1, 3: 1, 4: 1, 5: 2, 6: 0, idDoc: 1, idLowA: 1, idUpA: 2, idB: 1}
	}
	sessionless := func(c *formCase) { c.sessionless = true }
	// capped makes shop.orders a capped collection, under the rules'
	// allowCappedInserts allow.
	capped := func(allow bool) func(*formCase) {
		return func(c *formCase) { c.capped, c.allowCapped = map[string]bool{nsOrders: true}, allow }
	}
	// disclose lets the caller read every namespace.
	disclose := func(c *formCase) { c.disclose = true }
	// ciDefault gives shop.orders a case-insensitive default collation.
	ciDefault := func(c *formCase) { c.ci = map[string]bool{nsOrders: true} }
	// freeUpA frees "A" in shop.orders, on a copy of the lock states.
	freeUpA := func(c *formCase) {
		l := map[string]map[int]int{}
		for ns, m := range c.locks {
			l[ns] = maps.Clone(m)
		}
		l[nsOrders][idUpA] = 0
		c.locks = l
	}
	upd := func(ns string, f formFilter, ids ...int) formStmt {
		return formStmt{ns: ns, op: opModify, filter: f, ids: ids}
	}
	for _, c := range []struct {
		name   string
		cmd    formCmd
		stmts  []formStmt
		reason string // "" allowed
		// tweak sets what else the case needs (nil: nothing)
		tweak func(*formCase)
	}{
		{"update by _id held", cmdUpdate, []formStmt{upd(nsOrders, byID, 1)}, "", nil},
		{"update multi by $in, one not held", cmdUpdate, []formStmt{{ns: nsOrders, op: opModify, filter: byIn, ids: []int{1, 2, 6}, multi: true}}, ReasonNotLocked, nil},
		{"update by $in over maxCandidates, all held", cmdUpdate, []formStmt{upd(nsOrders, byIn, 1, 2, 3, 4)}, ReasonTooManyCandidates, nil},
		{"upsert by _id held", cmdUpdate, []formStmt{{ns: nsOrders, op: opModify, filter: byID, ids: []int{2}, upsert: true}}, "", nil},
		{"upsert by a filter matching held documents, inserting an _id another holds", cmdUpdate,
			[]formStmt{{ns: nsOrders, op: opModify, filter: byMatch, match: 1, upsert: true, upsertID: 5}}, ReasonNotLocked, nil},
		{"upsert by a filter matching held documents, inserting an _id held", cmdUpdate,
			[]formStmt{{ns: nsOrders, op: opReplace, filter: byMatch, match: 1, upsert: true, upsertID: 3}}, "", nil},
		{"pipeline upsert without _id in the filter", cmdUpdate,
			[]formStmt{{ns: nsOrders, op: opPipeline, filter: byMatch, match: 1, upsert: true}}, ReasonUnverifiableUpsert, nil},
		{"second statement of three not held", cmdUpdate, []formStmt{upd(nsOrders, byID, 1), upd(nsOrders, byEq, 5), upd(nsOrders, byID, 2)}, ReasonNotLocked, nil},
		{"delete many by a filter matching held documents", cmdDelete, []formStmt{{ns: nsOrders, op: opDelete, filter: byMatch, match: 1, multi: true}}, "", nil},
		{"delete many by a filter matching one not held", cmdDelete, []formStmt{{ns: nsOrders, op: opDelete, filter: byMatch, match: 2, multi: true}}, ReasonNotLocked, nil},
		{"delete by a filter matching more than maxCandidates", cmdDelete, []formStmt{{ns: nsOrders, op: opDelete, filter: byMatchAll, multi: true}}, ReasonTooManyCandidates, nil},
		{"findAndModify remove by $eq held by another", cmdFindAndModify, []formStmt{{ns: nsOrders, op: opDelete, filter: byEq, ids: []int{5}}}, ReasonNotLocked, nil},
		{"findAndModify upsert by _id held", cmdFindAndModify, []formStmt{{ns: nsOrders, op: opModify, filter: byID, ids: []int{4}, upsert: true}}, "", nil},
		{"insert of an _id another session locked", cmdInsert, []formStmt{{ns: nsOrders, op: opInsert, ids: []int{5}}}, ReasonInsertLocked, nil},
		{"insert of a free _id", cmdInsert, []formStmt{{ns: nsOrders, op: opInsert, ids: []int{6}}}, "", nil},
		{"bulkWrite: held in one namespace, anything in an unprotected one", cmdBulkWrite,
			[]formStmt{upd(nsOrders, byID, 1), {ns: nsNotes, op: opDelete, filter: byMatchAll, multi: true}, upd(nsNotes, byID, 5)}, "", nil},
		{"bulkWrite: the unprotected namespace first, then one not held", cmdBulkWrite,
			[]formStmt{upd(nsNotes, byID, 5), upd(nsInvoices, byID, 1), {ns: nsOrders, op: opDelete, filter: byID, ids: []int{6}}}, ReasonNotLocked, nil},
		{"bulkWrite: an insert of a locked _id among held updates", cmdBulkWrite,
			[]formStmt{upd(nsOrders, byID, 1), {ns: nsInvoices, op: opInsert, ids: []int{5}}}, ReasonInsertLocked, nil},
		{"without a session, an update of a free _id", cmdUpdate, []formStmt{upd(nsOrders, byID, 6)}, refuse.ReasonNoSession, sessionless},
		{"without a session, a delete by a filter", cmdDelete, []formStmt{{ns: nsOrders, op: opDelete, filter: byMatch, match: 1}}, refuse.ReasonNoSession, sessionless},
		{"without a session, findAndModify upsert", cmdFindAndModify, []formStmt{{ns: nsOrders, op: opModify, filter: byID, ids: []int{6}, upsert: true}}, refuse.ReasonNoSession, sessionless},
		{"without a session, bulkWrite: unprotected, then protected", cmdBulkWrite,
			[]formStmt{upd(nsNotes, byID, 6), {ns: nsInvoices, op: opDelete, filter: byID, ids: []int{6}}}, refuse.ReasonNoSession, sessionless},
		{"without a session, an insert of a free _id", cmdInsert, []formStmt{{ns: nsOrders, op: opInsert, ids: []int{6}}}, "", sessionless},
		{"without a session, an insert of an _id some session locked", cmdInsert, []formStmt{{ns: nsOrders, op: opInsert, ids: []int{1}}}, ReasonInsertLocked, sessionless},
		{"without a session, anything where nothing is protected", cmdBulkWrite,
			[]formStmt{upd(nsNotes, byID, 5), {ns: nsNotes, op: opDelete, filter: byMatchAll, multi: true}}, "", sessionless},
		{"insert into a capped collection", cmdInsert, []formStmt{{ns: nsOrders, op: opInsert, ids: []int{6}}}, ReasonCappedInsert, capped(false)},
		{"insert into a capped collection under allowCappedInserts", cmdInsert, []formStmt{{ns: nsOrders, op: opInsert, ids: []int{6}}}, "", capped(true)},
		{"upsert of a held _id into a capped collection", cmdUpdate, []formStmt{{ns: nsOrders, op: opModify, filter: byID, ids: []int{1}, upsert: true}}, ReasonCappedInsert, capped(false)},
		{"upsert of a held _id into a capped collection under allowCappedInserts", cmdFindAndModify,
			[]formStmt{{ns: nsOrders, op: opReplace, filter: byID, ids: []int{1}, upsert: true}}, "", capped(true)},
		{"update, not upsert, of a held _id in a capped collection", cmdUpdate, []formStmt{upd(nsOrders, byID, 1)}, "", capped(false)},
		{"delete of a held _id in a capped collection", cmdDelete, []formStmt{{ns: nsOrders, op: opDelete, filter: byID, ids: []int{2}}}, "", capped(false)},
		{"bulkWrite: held updates, then an insert into a capped collection", cmdBulkWrite,
			[]formStmt{upd(nsInvoices, byID, 1), {ns: nsOrders, op: opInsert, ids: []int{6}}}, ReasonCappedInsert, capped(false)},
		{"$in naming held _ids with duplicates, one in two types", cmdUpdate,
			[]formStmt{{ns: nsOrders, op: opModify, filter: byIn, ids: []int{1, 1, 1, 2}, forms: []int{asInt32, asInt32, asInt64, asInt32}, multi: true}}, "", nil},
		{"$in naming one _id in three types and another: four values, over maxCandidates", cmdUpdate,
			[]formStmt{{ns: nsOrders, op: opModify, filter: byIn, ids: []int{1, 1, 1, 2}, forms: []int{asInt32, asInt64, asDouble, asInt32}, multi: true}}, ReasonTooManyCandidates, nil},
		{"$in mixing a number and a document _id, both held", cmdDelete, []formStmt{{ns: nsOrders, op: opDelete, filter: byIn, ids: []int{3, idDoc}, multi: true}}, "", nil},
		{"$in naming 5.0, another session's 5", cmdDelete,
			[]formStmt{{ns: nsOrders, op: opDelete, filter: byIn, ids: []int{1, 5}, forms: []int{asInt32, asDouble}, multi: true}}, ReasonNotLocked, nil},
		{"$and pins its _id whatever else it says: held, though k does not match", cmdUpdate, []formStmt{{ns: nsOrders, op: opModify, filter: byAnd, ids: []int{1}, match: 2}}, "", nil},
		{"$and pinning another session's _id", cmdFindAndModify, []formStmt{{ns: nsOrders, op: opDelete, filter: byAnd, ids: []int{5}, match: 2}}, ReasonNotLocked, nil},
		{"upsert by $and pinning a free _id", cmdUpdate, []formStmt{{ns: nsOrders, op: opModify, filter: byAnd, ids: []int{6}, match: 0, upsert: true}}, ReasonNotLocked, nil},
		{"$or of _ids, both held", cmdUpdate, []formStmt{{ns: nsOrders, op: opModify, filter: byOr, ids: []int{1, idDoc}, multi: true}}, "", nil},
		{"$or of _ids, one free", cmdUpdate, []formStmt{{ns: nsOrders, op: opModify, filter: byOr, ids: []int{1, 6}, multi: true}}, ReasonNotLocked, nil},
		{"$or of an _id and a filter matching held documents", cmdDelete, []formStmt{{ns: nsOrders, op: opDelete, filter: byOrMatch, ids: []int{3}, match: 1, multi: true}}, "", nil},
		{"$or of a held _id and a filter matching another session's document", cmdDelete,
			[]formStmt{{ns: nsOrders, op: opDelete, filter: byOrMatch, ids: []int{1}, match: 2, multi: true}}, ReasonNotLocked, nil},
		{"$eq with a document value, held", cmdUpdate, []formStmt{{ns: nsOrders, op: opModify, filter: byEq, ids: []int{idDoc}}}, "", nil},
		{"_id equal to a document, held, upsert", cmdFindAndModify, []formStmt{{ns: nsOrders, op: opReplace, filter: byID, ids: []int{idDoc}, upsert: true}}, "", nil},
		{"\"_id.a\": resolved to the document _id, held", cmdUpdate, []formStmt{{ns: nsOrders, op: opModify, filter: byDotted, multi: true}}, "", nil},
		{"\"_id.a\" upsert: the inserted _id is the server's to build", cmdUpdate, []formStmt{{ns: nsOrders, op: opModify, filter: byDotted, upsert: true}}, ReasonUnverifiableUpsert, nil},
		{"$expr with the command's let, naming a held _id", cmdDelete, []formStmt{{ns: nsOrders, op: opDelete, filter: byExprLet, ids: []int{1}}}, ReasonResolveFailed, nil},
		{"arrayFilters, a hint and a txnNumber, held", cmdUpdate,
			[]formStmt{{ns: nsOrders, op: opModify, filter: byID, ids: []int{1}, arrayFilters: true, hint: true}}, "", func(c *formCase) { c.txnNumber = true }},
		{"arrayFilters and a hint, not held", cmdBulkWrite,
			[]formStmt{{ns: nsOrders, op: opModify, filter: byID, ids: []int{6}, arrayFilters: true, hint: true}}, ReasonNotLocked, func(c *formCase) { c.txnNumber = true }},
		{"string _id under a case-insensitive collation: \"a\" matches another session's \"A\"", cmdUpdate,
			[]formStmt{{ns: nsOrders, op: opModify, filter: byID, ids: []int{idLowA}, collation: collCI}}, ReasonNotLocked, nil},
		{"string _id under the simple collation: \"a\" is \"a\" alone", cmdUpdate,
			[]formStmt{{ns: nsOrders, op: opModify, filter: byID, ids: []int{idLowA}, collation: collSimple}}, "", ciDefault},
		{"string _id in a collection whose default collation is case-insensitive", cmdFindAndModify,
			[]formStmt{{ns: nsOrders, op: opDelete, filter: byEq, ids: []int{idLowA}}}, ReasonNotLocked, ciDefault},
		{"string _id under a case-insensitive collation, no other case held", cmdDelete,
			[]formStmt{{ns: nsOrders, op: opDelete, filter: byID, ids: []int{idB}, collation: collCI}}, "", nil},
		{"$in of a number and a string under a case-insensitive collation", cmdDelete,
			[]formStmt{{ns: nsOrders, op: opDelete, filter: byIn, ids: []int{1, idLowA}, multi: true}}, ReasonNotLocked, ciDefault},
		{"$and of a string _id and k under a case-insensitive collation: matches nothing", cmdUpdate,
			[]formStmt{{ns: nsOrders, op: opModify, filter: byAnd, ids: []int{idUpA}, match: 1, collation: collCI}}, "", nil},
		{"upsert of \"b\", held, under a case-insensitive default collation, while another session holds \"A\"", cmdUpdate,
			[]formStmt{{ns: nsOrders, op: opModify, filter: byID, ids: []int{idB}, upsert: true}}, ReasonInsertLocked, ciDefault},
		{"upsert of \"b\" under a case-insensitive default collation, no other session's string _id locked", cmdUpdate,
			[]formStmt{{ns: nsOrders, op: opModify, filter: byID, ids: []int{idB}, upsert: true}}, "", func(c *formCase) { ciDefault(c); freeUpA(c) }},
		{"insert of \"b\", held, under a case-insensitive default collation, while another session holds \"A\"", cmdBulkWrite,
			[]formStmt{{ns: nsOrders, op: opInsert, ids: []int{idB}}}, ReasonInsertLocked, ciDefault},
		{"upsert of \"b\" by $setOnInsert under a case-insensitive default collation, while another session holds \"A\"", cmdUpdate,
			[]formStmt{{ns: nsOrders, op: opModify, filter: byMatch, match: 1, upsert: true, upsertID: idB}}, ReasonInsertLocked, ciDefault},
		{"upsert of \"b\" under a case-insensitive statement collation, simple default, while another session holds \"A\"", cmdFindAndModify,
			[]formStmt{{ns: nsOrders, op: opModify, filter: byID, ids: []int{idB}, upsert: true, collation: collCI}}, "", nil},
		{"insert of \"b\" under the simple default collation, while another session holds \"A\"", cmdInsert,
			[]formStmt{{ns: nsOrders, op: opInsert, ids: []int{idB}}}, "", nil},
		{"without a session, an insert of the free 6 under a case-insensitive default collation", cmdInsert,
			[]formStmt{{ns: nsOrders, op: opInsert, ids: []int{6}}}, "", func(c *formCase) { ciDefault(c); sessionless(c) }},
		{"upsert of \"A\" under a case-insensitive collation, held by another", cmdBulkWrite,
			[]formStmt{{ns: nsOrders, op: opReplace, filter: byID, ids: []int{idUpA}, upsert: true, collation: collCI}}, ReasonNotLocked, nil},
		{"update of another session's _id, to a caller who may read it", cmdUpdate, []formStmt{upd(nsOrders, byID, 5)}, ReasonHeldByOther, disclose},
		{"update of a free _id and another session's, to a caller who may read them: the first missing is free", cmdUpdate,
			[]formStmt{upd(nsOrders, byIn, 6, 5)}, ReasonNotLocked, disclose},
		{"delete by a filter matching another session's document, to a caller who may read it: not named, no holder", cmdDelete,
			[]formStmt{{ns: nsOrders, op: opDelete, filter: byMatch, match: 2, multi: true}}, ReasonNotLocked, disclose},
		{"insert of an _id another session locked, to a caller who may read it", cmdInsert, []formStmt{{ns: nsOrders, op: opInsert, ids: []int{5}}}, ReasonInsertLocked, disclose},
		{"bulkWrite: held, then another session's, to a caller who may read it", cmdBulkWrite,
			[]formStmt{upd(nsInvoices, byID, 1), {ns: nsOrders, op: opDelete, filter: byEq, ids: []int{5}}}, ReasonHeldByOther, disclose},
	} {
		for _, ordered := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/ordered=%v", c.name, ordered), func(t *testing.T) {
				fc := formCase{cmd: c.cmd, ordered: ordered, stmts: c.stmts, modes: enforceAll, locks: locks}
				if c.tweak != nil {
					c.tweak(&fc)
				}
				e := fc.expect()
				if e.allowed != (c.reason == "") || (c.reason != "" && !slices.Contains(e.reasons, c.reason)) {
					t.Fatalf("the model says allowed %v (%v), the case %q", e.allowed, e.reasons, c.reason)
				}
				if got := checkCase(t, fc); got != c.reason {
					t.Fatalf("%s\nrefused %q, want %q", fc, got, c.reason)
				}
			})
		}
	}
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a whole number", name, v)
	}
	return n
}
