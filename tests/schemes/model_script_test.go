package schemes

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/lockgate/lockgate/wire"
	"go.mongodb.org/mongo-driver/bson"
)

// A script replays a hand-shrunk sequence of steps through the model, with
// the same checks as a random run (LOCKGATE_MODEL_SCRIPT=<file>, with
// -run 'TestSchemeModel/<scheme>$'). One step a line:
//
//	F1 acquire 2          F1 or F2: acquire, acquire-upsert, recover <id>;
//	F1 write              write, renew, release, release-variant, abandon
//	                      on the lock the follower holds
//	R seq {"update": "COLL", "updates": [...]}
//	                      the rogue's command in extended JSON, sent in
//	                      the body (body), as a document sequence (seq),
//	                      fire-and-forget (unack) or as OP_UPDATE/OP_DELETE
//	                      of its first statement (legacy); COLL and LCOLL
//	                      stand for the collection and its lock collection
//	wait 1600             let time pass (ms)
//	# a comment
//
// Documents 1, 2 and 3 start unlocked, as in a random run.
func (m *model) runScript(path string) {
	fh, err := os.Open(path)
	if err != nil {
		m.t.Fatalf("LOCKGATE_MODEL_SCRIPT: %v", err)
	}
	defer fh.Close()
	for _, id := range m.ids {
		m.seedDoc(id)
	}
	m.pre = m.snapshot()
	m.t.Logf("start: %s", m.describe(m.pre))
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	failed := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		m.step++
		e := entry{step: m.step, desc: line}
		var after func(snap) []violation
		fields := strings.SplitN(line, " ", 3)
		switch {
		case fields[0] == "wait" && len(fields) == 2:
			ms, err := strconv.Atoi(fields[1])
			if err != nil {
				m.t.Fatalf("script line %q: %v", line, err)
			}
			// The script's clock step: time passing is the step.
			time.Sleep(time.Duration(ms) * time.Millisecond)
		case (fields[0] == "F1" || fields[0] == "F2") && len(fields) >= 2:
			f := m.f[fields[0][1]-'1']
			id := f.id
			if len(fields) == 3 {
				n, err := strconv.Atoi(fields[2])
				if err != nil {
					m.t.Fatalf("script line %q: %v", line, err)
				}
				id = int32(n)
			}
			after = m.followerAct(f, fields[1], id, &e)
		case fields[0] == "R" && len(fields) == 3:
			js := strings.ReplaceAll(strings.ReplaceAll(fields[2], "LCOLL", m.lockColl), "COLL", m.coll)
			var cmd bson.D
			if err := bson.UnmarshalExtJSON([]byte(js), false, &cmd); err != nil || len(cmd) == 0 {
				m.t.Fatalf("script line %q: %v", line, err)
			}
			e.actor = "R"
			e.acked = fields[1] != "unack" && fields[1] != "legacy"
			e.result = m.rogue.runRaw(m.db, cmd, fields[1])
		default:
			m.t.Fatalf("script line %q: not a step", line)
		}
		post := m.snapshot()
		var vs []violation
		if after != nil {
			vs = after(post)
		}
		vs = append(vs, m.check(&e, m.pre, post)...)
		e.state = m.describe(post)
		var b strings.Builder
		fmt.Fprintf(&b, "#%d %s %s\n    -> %s\n    after: %s", e.step, e.actor, e.desc, e.result, e.state)
		for _, v := range vs {
			fmt.Fprintf(&b, "\n    VIOLATION [%s] _id %d: %s", v.cat, v.id, v.msg)
			failed = true
		}
		m.t.Log(b.String())
		m.reconcile(post)
		m.pre = post
	}
	if err := sc.Err(); err != nil {
		m.t.Fatal(err)
	}
	if failed {
		m.t.Error("the script broke the model's invariants (above)")
	}
}

// runRaw sends a command as the script writes it, through the first
// lockgate.
func (r *rogue) runRaw(db string, cmd bson.D, how string) string {
	rc := r.raw[0]
	name := cmd[0].Key
	list := listOf[name]
	body := bson.D{}
	seq := wire.Sequence{Identifier: list}
	var stmts bson.A
	for _, e := range cmd {
		if e.Key == list && how != "body" {
			stmts, _ = e.Value.(bson.A)
			for _, s := range stmts {
				seq.Documents = append(seq.Documents, mustMarshal(s))
			}
			continue
		}
		body = append(body, e)
	}
	body = append(body, bson.E{"$db", db})
	switch how {
	case "body":
		d, closed, err := rc.roundTrip(rc.msg(0, mustMarshal(body)))
		if closed || err != nil {
			return fmt.Sprintf("closed=%v %v", closed, err)
		}
		return replySummary(d)
	case "seq":
		d, closed, err := rc.roundTrip(rc.msg(0, mustMarshal(body), seq))
		if closed || err != nil {
			return fmt.Sprintf("closed=%v %v", closed, err)
		}
		return replySummary(d)
	case "unack":
		body = append(body, bson.E{"writeConcern", bson.D{{"w", 0}}})
		closed, err := rc.fireAndForget(rc.msg(wire.MoreToCome, mustMarshal(body), seq))
		return fmt.Sprintf("unacknowledged: closed=%v err=%v", closed, err)
	case "legacy":
		if len(stmts) == 0 {
			return "legacy: no statement"
		}
		st, _ := stmts[0].(bson.D)
		var q, u bson.D
		var upsert, multi bool
		limit := int32(1)
		for _, e := range st {
			switch e.Key {
			case "q":
				q, _ = e.Value.(bson.D)
			case "u":
				u, _ = e.Value.(bson.D)
			case "upsert":
				upsert, _ = e.Value.(bool)
			case "multi":
				multi, _ = e.Value.(bool)
			case "limit":
				if n, ok := e.Value.(int32); ok {
					limit = n
				}
			}
		}
		ns := db + "." + cmd[0].Value.(string)
		var msg []byte
		if name == "update" {
			var flags uint32
			if upsert {
				flags |= 1
			}
			if multi {
				flags |= 2
			}
			msg = rc.legacy(wire.OpCodeUpdate, ns, flags, mustMarshal(q), mustMarshal(u))
		} else {
			var flags uint32
			if limit != 0 {
				flags = 1
			}
			msg = rc.legacy(wire.OpCodeDelete, ns, flags, mustMarshal(q))
		}
		closed, err := rc.fireAndForget(msg)
		return fmt.Sprintf("legacy: closed=%v err=%v", closed, err)
	}
	return "unknown form " + how
}
