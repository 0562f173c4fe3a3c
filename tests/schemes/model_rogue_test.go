package schemes

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
)

// The rogue's writes, drawn from a grammar: every update operator on the
// lock fields and on data fields, replacements, pipelines, upserts,
// findAndModify in every form, bulk writes ordered and unordered, inserts,
// deletes, values of every BSON type for the lock fields, filters with
// regexes and operators on the holder field; sent through the Go driver
// (document sequences), in the command body, fire-and-forget, or as the
// legacy OP_UPDATE and OP_DELETE.

// stmt is one statement of a write command.
type stmt struct {
	q      bson.D
	u      any // bson.D (operators or a replacement) or bson.A (a pipeline); nil for a delete
	upsert bool
	multi  bool
	doc    bson.D // an insert
	// findAndModify
	remove, new bool
	fields      bson.D
}

// rogueOp is one write command of the rogue.
type rogueOp struct {
	cmd       string // update, delete, insert, findAndModify
	coll      string
	stmts     []stmt
	ordered   bool
	transport string // driver, body, seq, unack, legacy
	proxy     int    // 0: proxyURI, 1: proxy2URI
}

// gen draws one step's choices.
type gen struct {
	r       *rand.Rand
	m       *model
	now     time.Time
	counter int
}

func (g *gen) pct(p int) bool { return g.r.IntN(100) < p }

func pick[T any](g *gen, xs ...T) T { return xs[g.r.IntN(len(xs))] }

func (g *gen) id() int32 { return g.m.ids[g.r.IntN(len(g.m.ids))] }

// rogueValue is a rogue's own holder value: never one a follower uses.
func (g *gen) rogueValue() string {
	g.counter++
	return fmt.Sprintf("R-%d-%d", g.m.step, g.counter)
}

func (g *gen) date(d time.Duration) primitive.DateTime {
	return primitive.NewDateTimeFromTime(g.now.Add(d))
}

// anyValue is a value of any BSON type, with the shapes that matter for
// lock fields: dates in the past, present and far future, a number where
// a date belongs, strings, arrays holding null, sub-documents, regexes.
func (g *gen) anyValue() any {
	var oid primitive.ObjectID
	for i := range oid {
		oid[i] = byte(g.r.IntN(256))
	}
	d128, _ := primitive.ParseDecimal128("1")
	vals := []any{
		nil, true, false, int32(7), int64(7), 3.5, g.rogueValue(), "",
		g.date(0), g.date(-time.Hour), g.date(time.Second), g.date(365 * 24 * time.Hour),
		g.now.UnixMilli(), g.now.Add(time.Hour).UnixMilli(), g.now.Format(time.RFC3339),
		bson.A{}, bson.A{g.rogueValue()}, bson.A{nil}, bson.D{}, bson.D{{"actor", g.rogueValue()}, {"expiresAt", g.date(time.Second)}},
		primitive.Regex{Pattern: ".", Options: ""}, primitive.Timestamp{T: uint32(g.now.Unix()), I: 1}, oid,
		primitive.Binary{Data: []byte("R")}, primitive.MinKey{}, primitive.MaxKey{}, d128,
	}
	return vals[g.r.IntN(len(vals))]
}

// holderValue is what the rogue puts in a holder field: mostly its own
// value, else anything.
func (g *gen) holderValue() any {
	if g.pct(55) {
		return g.rogueValue()
	}
	return g.anyValue()
}

// timeValue is what the rogue puts in a time field.
func (g *gen) timeValue() any {
	switch g.r.IntN(10) {
	case 0, 1, 2, 3:
		return g.date(0)
	case 4:
		return g.date(-2 * modelLease)
	case 5:
		return g.date(modelLease)
	default:
		return g.anyValue()
	}
}

func (g *gen) expiresValue() any {
	switch g.r.IntN(10) {
	case 0, 1, 2, 3, 4:
		return g.date(modelLease)
	case 5:
		return g.date(-time.Second)
	case 6:
		return g.date(100 * time.Millisecond)
	default:
		return g.anyValue()
	}
}

// filterValue is a condition on a holder field: a value, a regex, an
// operator.
func (g *gen) filterValue() any {
	switch g.r.IntN(14) {
	case 0, 1:
		return g.rogueValue()
	case 2:
		return nil
	case 3:
		return primitive.Regex{Pattern: ".", Options: ""}
	case 4:
		return primitive.Regex{Pattern: "^F", Options: "i"}
	case 5:
		return bson.D{{"$ne", nil}}
	case 6:
		return bson.D{{"$exists", true}}
	case 7:
		return bson.D{{"$regex", "."}}
	case 8:
		return bson.D{{"$in", bson.A{nil, g.rogueValue()}}}
	case 9:
		return bson.D{{"$type", "string"}}
	case 10:
		return bson.D{{"$gt", ""}}
	case 11:
		return bson.D{{"$not", bson.D{{"$eq", nil}}}}
	case 12:
		return bson.D{{"$eq", g.rogueValue()}}
	default:
		return g.anyValue()
	}
}

// idClause pins (or pretends to pin) one tracked _id.
func (g *gen) idClause(id int32) bson.D {
	switch g.r.IntN(20) {
	case 0:
		return bson.D{{"_id", bson.D{{"$in", bson.A{id}}}}}
	case 1:
		return bson.D{{"_id", float64(id)}}
	case 2:
		return bson.D{{"_id", int64(id)}}
	case 3:
		return bson.D{{"_id", bson.D{{"$eq", id}}}}
	case 4:
		return bson.D{{"n", bson.D{{"$exists", true}}}}
	default:
		return bson.D{{"_id", id}}
	}
}

// target says which collection a statement writes and which of its paths
// are lock fields.
func (g *gen) target() (coll string, lockSide bool) {
	if g.m.kind == "lockCollection" && g.pct(60) {
		return g.m.lockColl, true
	}
	return g.m.coll, false
}

func (g *gen) lockPaths(lockSide bool) []string {
	switch g.m.kind {
	case "holderFields":
		return []string{"LockId", "LockTime"}
	case "lockDocument":
		return []string{"Lock", "Lock.actor", "Lock.expiresAt", "Lock.error"}
	case "flag":
		return []string{"locked"}
	}
	if lockSide {
		return []string{"ts", "aid"}
	}
	return nil
}

var dataPaths = []string{"n", "m", "arr", "sub.x"}

// lockValue is a value for one lock path.
func (g *gen) lockValue(path string) any {
	switch path {
	case "LockId", "Lock.actor":
		return g.holderValue()
	case "LockTime", "ts":
		return g.timeValue()
	case "Lock.expiresAt":
		return g.expiresValue()
	case "Lock":
		if g.pct(25) {
			return g.anyValue()
		}
		d := bson.D{}
		if g.pct(90) {
			d = append(d, bson.E{"actor", g.holderValue()})
		}
		if g.pct(90) {
			d = append(d, bson.E{"expiresAt", g.expiresValue()})
		}
		if g.pct(50) {
			d = append(d, bson.E{"error", pick(g, any(nil), any("boom"))})
		}
		return d
	case "locked":
		switch g.r.IntN(10) {
		case 0, 1, 2, 3:
			return true
		case 4, 5:
			return false
		default:
			return g.anyValue()
		}
	case "aid":
		switch g.r.IntN(10) {
		case 0, 1, 2, 3:
			return "R"
		case 4, 5:
			return "F1"
		case 6:
			return "F2"
		default:
			return g.anyValue()
		}
	}
	return g.anyValue()
}

// filter is a filter on one tracked _id with, sometimes, a condition on
// the lock fields.
func (g *gen) filter(lockSide bool) bson.D {
	id := g.id()
	q := g.idClause(id)
	if g.pct(50) {
		switch g.m.kind {
		case "holderFields":
			switch g.r.IntN(6) {
			case 0:
				q = append(q, bson.E{"$or", bson.A{bson.D{{"LockId", nil}}, bson.D{{"LockTime", bson.D{{"$lt", g.date(-modelLease)}}}}}})
			case 1:
				q = append(q, bson.E{"$and", bson.A{bson.D{{"LockId", g.filterValue()}}}})
			case 2:
				q = append(q, bson.E{"LockTime", bson.D{{pick(g, "$lt", "$gt"), g.date(0)}}})
			default:
				q = append(q, bson.E{"LockId", g.filterValue()})
			}
		case "lockDocument":
			switch g.r.IntN(6) {
			case 0:
				q = append(q, bson.E{"$or", bson.A{bson.D{{"Lock.actor", nil}}, bson.D{{"Lock.expiresAt", bson.D{{"$lt", g.date(0)}}}}}})
			case 1:
				q = append(q, bson.E{"Lock", pick[any](g, nil, bson.D{{"$ne", nil}}, bson.D{{"actor", g.rogueValue()}}, bson.D{{"$type", "object"}})})
			case 2:
				q = append(q, bson.E{"$and", bson.A{bson.D{{"Lock.actor", g.filterValue()}}}})
			default:
				q = append(q, bson.E{"Lock.actor", g.filterValue()})
			}
		case "flag":
			q = append(q, bson.E{"locked", pick[any](g, false, true, bson.D{{"$ne", true}}, bson.D{{"$in", bson.A{false, nil}}}, bson.D{{"$exists", true}}, nil)})
		case "lockCollection":
			if lockSide {
				switch g.r.IntN(3) {
				case 0:
					q = bson.D{{"aid", pick[any](g, "F1", "F2", "R", primitive.Regex{Pattern: ".", Options: ""}, bson.D{{"$ne", nil}})}}
				case 1:
					q = append(q, bson.E{"ts", bson.D{{"$lt", g.date(-modelLease)}}})
				default:
					q = append(q, bson.E{"aid", pick[any](g, "F1", "F2", "R")})
				}
			}
		}
	}
	return q
}

// update is an update document: operators on lock and data fields, a
// replacement, or a pipeline.
func (g *gen) update(lockSide bool) any {
	lp := g.lockPaths(lockSide)
	switch {
	case g.pct(8):
		set := bson.D{{"n", g.r.IntN(1000)}}
		if len(lp) > 0 && g.pct(50) {
			set = bson.D{{lp[0], g.holderValue()}}
		}
		return bson.A{bson.D{{"$set", set}}}
	case g.pct(25):
		repl := bson.D{}
		for _, p := range lp {
			if !strings.Contains(p, ".") && g.pct(60) {
				repl = append(repl, bson.E{p, g.lockValue(p)})
			}
		}
		if g.pct(70) {
			repl = append(repl, bson.E{"n", 7000 + g.r.IntN(1000)})
		}
		return repl
	case len(lp) > 0 && g.pct(20):
		// The scheme's own acquire, in the rogue's hand, often with a
		// data write riding on it.
		acq := g.acquireShape(lockSide)
		if g.pct(60) {
			acq = append(acq, bson.E{"$inc", bson.D{{"n", 1000}}})
		}
		return acq
	}
	ops := bson.D{}
	used := map[string]bool{}
	conflicts := func(p string) bool {
		for u := range used {
			if u == p || strings.HasPrefix(u, p+".") || strings.HasPrefix(p, u+".") {
				return true
			}
		}
		return false
	}
	add := func(op, path string, v any) {
		if conflicts(path) {
			return
		}
		used[path] = true
		for i := range ops {
			if ops[i].Key == op {
				ops[i].Value = append(ops[i].Value.(bson.D), bson.E{path, v})
				return
			}
		}
		ops = append(ops, bson.E{op, bson.D{{path, v}}})
	}
	for n := 1 + g.r.IntN(3); n > 0; n-- {
		path := pick(g, dataPaths...)
		lock := len(lp) > 0 && g.pct(55)
		if lock {
			path = pick(g, lp...)
		}
		op := pick(g, "$set", "$set", "$setOnInsert", "$unset", "$inc", "$rename", "$currentDate", "$min", "$max", "$mul", "$push", "$addToSet", "$pop", "$pull")
		var v any
		switch op {
		case "$set", "$setOnInsert":
			if lock {
				v = g.lockValue(path)
			} else {
				v = 7000 + g.r.IntN(1000)
			}
		case "$unset":
			v = ""
		case "$inc", "$mul":
			v = pick[any](g, int32(2), int64(-1), 1.5)
		case "$rename":
			// Onto or off a lock field.
			to := pick(g, "renamed", "n2")
			if lock && g.pct(50) {
				path, to = pick(g, dataPaths[:3]...), path
				if conflicts(to) {
					continue
				}
				used[to] = true
			}
			v = to
		case "$currentDate":
			v = pick[any](g, true, bson.D{{"$type", "date"}}, bson.D{{"$type", "timestamp"}})
		case "$min", "$max":
			v = pick[any](g, g.date(0), g.date(time.Hour), g.date(-time.Hour), int64(5), "z")
		case "$push", "$addToSet", "$pull":
			v = g.anyValue()
		case "$pop":
			v = 1
		}
		add(op, path, v)
	}
	return ops
}

// acquireShape is the scheme's own acquire update with the rogue's values.
func (g *gen) acquireShape(lockSide bool) bson.D {
	op := pick(g, "$set", "$set", "$setOnInsert")
	switch g.m.kind {
	case "holderFields":
		return bson.D{{op, bson.D{{"LockId", g.holderValue()}, {"LockTime", g.timeValue()}}}}
	case "lockDocument":
		if g.pct(30) {
			return bson.D{{op, bson.D{{"Lock.actor", g.holderValue()}, {"Lock.expiresAt", g.expiresValue()}}}}
		}
		return bson.D{{op, bson.D{{"Lock", g.lockValue("Lock")}}}}
	case "flag":
		return bson.D{{op, bson.D{{"locked", g.lockValue("locked")}}}}
	}
	return bson.D{{op, bson.D{{"ts", g.timeValue()}, {"aid", g.lockValue("aid")}}}}
}

// insertDoc is a document or lock record to insert on a tracked _id.
func (g *gen) insertDoc(lockSide bool) bson.D {
	d := bson.D{{"_id", g.id()}}
	for _, p := range g.lockPaths(lockSide) {
		if !strings.Contains(p, ".") && g.pct(70) {
			d = append(d, bson.E{p, g.lockValue(p)})
		}
	}
	if !lockSide {
		d = append(d, bson.E{"n", 7000 + g.r.IntN(1000)})
	}
	return d
}

// rogueOp draws one write command.
func (g *gen) rogueOp() rogueOp {
	coll, lockSide := g.target()
	op := rogueOp{coll: coll, ordered: g.pct(50), proxy: g.r.IntN(2),
		transport: pick(g, "driver", "driver", "driver", "body", "seq", "seq", "unack", "legacy")}
	nStmts := 1
	if g.pct(15) {
		nStmts = 2 + g.r.IntN(2)
	}
	switch k := g.r.IntN(100); {
	case k < 48:
		op.cmd = "update"
		for i := 0; i < nStmts; i++ {
			op.stmts = append(op.stmts, stmt{q: g.filter(lockSide), u: g.update(lockSide), upsert: g.pct(25), multi: g.pct(5)})
		}
	case k < 70:
		op.cmd = "findAndModify"
		s := stmt{q: g.filter(lockSide), upsert: g.pct(30), new: g.pct(50)}
		if g.pct(20) {
			s.remove, s.upsert, s.new = true, false, false
		} else {
			s.u = g.update(lockSide)
		}
		if g.pct(30) {
			s.fields = bson.D{{pick(g, "n", "LockId", "Lock", "locked", "aid"), 1}}
		}
		op.stmts = []stmt{s}
		if op.transport != "driver" {
			op.transport = "body"
		}
	case k < 82:
		op.cmd = "delete"
		for i := 0; i < nStmts; i++ {
			op.stmts = append(op.stmts, stmt{q: g.filter(lockSide), multi: g.pct(20)})
		}
	default:
		op.cmd = "insert"
		for i := 0; i < nStmts; i++ {
			op.stmts = append(op.stmts, stmt{doc: g.insertDoc(lockSide)})
		}
	}
	if op.transport == "legacy" && (op.cmd == "insert" || op.cmd == "findAndModify" || len(op.stmts) > 1) {
		op.transport = "seq"
	}
	return op
}

// statement is the statement as the write command carries it.
func (s stmt) statement(cmd string) bson.D {
	switch cmd {
	case "update":
		return bson.D{{"q", s.q}, {"u", s.u}, {"upsert", s.upsert}, {"multi", s.multi}}
	case "delete":
		limit := 1
		if s.multi {
			limit = 0
		}
		return bson.D{{"q", s.q}, {"limit", limit}}
	case "insert":
		return s.doc
	}
	d := bson.D{{"query", s.q}}
	if s.remove {
		d = append(d, bson.E{"remove", true})
	} else {
		d = append(d, bson.E{"update", s.u}, bson.E{"new", s.new}, bson.E{"upsert", s.upsert})
	}
	if s.fields != nil {
		d = append(d, bson.E{"fields", s.fields})
	}
	return d
}

var listOf = map[string]string{"update": "updates", "delete": "deletes", "insert": "documents"}

// command is the write command in its body form.
func (op rogueOp) command(db string) bson.D {
	if op.cmd == "findAndModify" {
		return append(bson.D{{"findAndModify", op.coll}}, append(op.stmts[0].statement(op.cmd), bson.E{"$db", db})...)
	}
	arr := bson.A{}
	for _, s := range op.stmts {
		arr = append(arr, s.statement(op.cmd))
	}
	return bson.D{{op.cmd, op.coll}, {listOf[op.cmd], arr}, {"ordered", op.ordered}, {"$db", db}}
}

func (op rogueOp) String() string {
	b, err := bson.MarshalExtJSON(op.command("db"), false, false)
	s := string(b)
	if err != nil {
		s = fmt.Sprintf("%v", op.command("db"))
	}
	s = strings.Replace(s, `,"$db":"db"`, "", 1)
	return fmt.Sprintf("%s via %s on proxy %d: %s", op.cmd, op.transport, op.proxy+1, s)
}

// run sends the command and sums up the answer.
func (r *rogue) run(ctx context.Context, db string, op rogueOp) string {
	switch op.transport {
	case "driver":
		return r.runDriver(ctx, db, op)
	case "body":
		d, closed, err := r.raw[op.proxy].roundTrip(r.raw[op.proxy].msg(0, mustMarshal(op.command(db))))
		if closed || err != nil {
			return fmt.Sprintf("closed=%v %v", closed, err)
		}
		return replySummary(d)
	case "seq", "unack":
		body := bson.D{{op.cmd, op.coll}, {"ordered", op.ordered}, {"$db", db}}
		var flags wire.MsgFlags
		if op.transport == "unack" {
			body = append(body, bson.E{"writeConcern", bson.D{{"w", 0}}})
			flags = wire.MoreToCome
		}
		seq := wire.Sequence{Identifier: listOf[op.cmd]}
		for _, s := range op.stmts {
			seq.Documents = append(seq.Documents, mustMarshal(s.statement(op.cmd)))
		}
		rc := r.raw[op.proxy]
		if op.transport == "unack" {
			closed, err := rc.fireAndForget(rc.msg(flags, mustMarshal(body), seq))
			return fmt.Sprintf("unacknowledged: closed=%v err=%v", closed, err)
		}
		d, closed, err := rc.roundTrip(rc.msg(0, mustMarshal(body), seq))
		if closed || err != nil {
			return fmt.Sprintf("closed=%v %v", closed, err)
		}
		return replySummary(d)
	case "legacy":
		rc := r.raw[op.proxy]
		s := op.stmts[0]
		ns := db + "." + op.coll
		var msg []byte
		if op.cmd == "update" {
			var flags uint32
			if s.upsert {
				flags |= 1
			}
			if s.multi {
				flags |= 2
			}
			u, ok := s.u.(bson.D)
			if !ok {
				u = bson.D{{"$set", bson.D{{"n", 1}}}}
			}
			msg = rc.legacy(wire.OpCodeUpdate, ns, flags, mustMarshal(s.q), mustMarshal(u))
		} else {
			var flags uint32
			if !s.multi {
				flags = 1
			}
			msg = rc.legacy(wire.OpCodeDelete, ns, flags, mustMarshal(s.q))
		}
		closed, err := rc.fireAndForget(msg)
		return fmt.Sprintf("legacy: closed=%v err=%v", closed, err)
	}
	return "unknown transport"
}

func (r *rogue) runDriver(ctx context.Context, db string, op rogueOp) string {
	c := r.clients[op.proxy].Database(db).Collection(op.coll)
	if op.cmd == "findAndModify" {
		s := op.stmts[0]
		var res *mongo.SingleResult
		after := options.Before
		if s.new {
			after = options.After
		}
		switch {
		case s.remove:
			o := options.FindOneAndDelete()
			if s.fields != nil {
				o.SetProjection(s.fields)
			}
			res = c.FindOneAndDelete(ctx, s.q, o)
		case isReplacement(s.u):
			o := options.FindOneAndReplace().SetUpsert(s.upsert).SetReturnDocument(after)
			if s.fields != nil {
				o.SetProjection(s.fields)
			}
			res = c.FindOneAndReplace(ctx, s.q, s.u, o)
		default:
			o := options.FindOneAndUpdate().SetUpsert(s.upsert).SetReturnDocument(after)
			if s.fields != nil {
				o.SetProjection(s.fields)
			}
			res = c.FindOneAndUpdate(ctx, s.q, s.u, o)
		}
		raw, err := res.Raw()
		if err != nil {
			return "error: " + errSummary(err)
		}
		return "value=" + raw.String()
	}
	var models []mongo.WriteModel
	for _, s := range op.stmts {
		switch op.cmd {
		case "update":
			switch {
			case isReplacement(s.u):
				models = append(models, mongo.NewReplaceOneModel().SetFilter(s.q).SetReplacement(s.u).SetUpsert(s.upsert))
			case s.multi:
				models = append(models, mongo.NewUpdateManyModel().SetFilter(s.q).SetUpdate(s.u).SetUpsert(s.upsert))
			default:
				models = append(models, mongo.NewUpdateOneModel().SetFilter(s.q).SetUpdate(s.u).SetUpsert(s.upsert))
			}
		case "delete":
			if s.multi {
				models = append(models, mongo.NewDeleteManyModel().SetFilter(s.q))
			} else {
				models = append(models, mongo.NewDeleteOneModel().SetFilter(s.q))
			}
		case "insert":
			models = append(models, mongo.NewInsertOneModel().SetDocument(s.doc))
		}
	}
	res, err := c.BulkWrite(ctx, models, options.BulkWrite().SetOrdered(op.ordered))
	if err != nil {
		return "error: " + errSummary(err)
	}
	return fmt.Sprintf("inserted=%d matched=%d modified=%d deleted=%d upserted=%d", res.InsertedCount, res.MatchedCount, res.ModifiedCount, res.DeletedCount, res.UpsertedCount)
}

func isReplacement(u any) bool {
	d, ok := u.(bson.D)
	return ok && (len(d) == 0 || !strings.HasPrefix(d[0].Key, "$"))
}

func errSummary(err error) string {
	s := err.Error()
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

// rogue is the writer that follows no scheme: driver clients and raw
// connections through both proxies, all with one application name.
type rogue struct {
	clients [2]*mongo.Client
	raw     [2]*rawConn
}
