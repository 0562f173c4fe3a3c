package policy

import (
	"fmt"
	"maps"
	"math/rand"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/lockgate/lockgate/wire"
)

// A connection reads every request's plan into the same Plan (Read). That
// plan must be exactly the one NewPlan makes of the request, whatever the
// connection sent before: a reference, a stage, a write, a refusal or a
// statement list left over from the last request would let the boundary
// or enforcement judge one request by another. The corpus is read in
// name order and in shuffled orders, so that large batches come before
// single writes, refusals before clean writes, collections change.
func TestPlanReadIsNewPlan(t *testing.T) {
	corpus := planCorpus(t)
	names := slices.Sorted(maps.Keys(corpus))
	type req struct {
		name string
		msg  wire.Message
		cmd  *wire.Command
	}
	var reqs []req
	for _, name := range names {
		m, err := wire.Parse(corpus[name], wire.Limits{})
		if err != nil {
			continue
		}
		cmd, err := wire.CommandOf(m)
		if err != nil {
			continue
		}
		reqs = append(reqs, req{name, m, cmd})
	}
	// A bulk insert larger than the room a plan keeps, between the rest.
	bulk := make([]any, 3*keptWrites)
	for i := range bulk {
		bulk[i] = D{{"_id", i}}
	}
	big := clParse(t, clMsgRaw(t, 0, D{{"insert", "orders"}, {"documents", A(bulk)}, {"$db", "shop"}}))
	bigCmd, err := wire.CommandOf(big)
	if err != nil {
		t.Fatal(err)
	}
	for seed := int64(0); seed < 4; seed++ {
		order := slices.Clone(reqs)
		if seed > 0 {
			r := rand.New(rand.NewSource(seed))
			r.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		}
		var p Plan
		for i, rq := range order {
			if i%50 == 25 {
				p.Read(big, bigCmd)
				samePlan(t, "bulk insert", &p, NewPlan(big, bigCmd))
			}
			p.Read(rq.msg, rq.cmd)
			samePlan(t, fmt.Sprintf("order %d, %s", seed, rq.name), &p, NewPlan(rq.msg, rq.cmd))
		}
	}
}

func samePlan(t *testing.T, name string, got, want *Plan) {
	t.Helper()
	gw, gerr := got.Writes()
	ww, werr := want.Writes()
	switch {
	case !reflect.DeepEqual(got.Refs(), want.Refs()):
		t.Fatalf("%s: refs %v, NewPlan's %v", name, got.Refs(), want.Refs())
	case !reflect.DeepEqual(got.Stages(), want.Stages()):
		t.Fatalf("%s: stages %v, NewPlan's %v", name, got.Stages(), want.Stages())
	case fmt.Sprint(gerr) != fmt.Sprint(werr):
		t.Fatalf("%s: error %v, NewPlan's %v", name, gerr, werr)
	case len(gw) != len(ww):
		t.Fatalf("%s: %d writes, NewPlan's %d", name, len(gw), len(ww))
	}
	for i := range gw {
		if !reflect.DeepEqual(gw[i], ww[i]) {
			t.Fatalf("%s: write %d is %+v, NewPlan's %+v", name, i, gw[i], ww[i])
		}
	}
}

// The plan of the enforced write, read again for each request as a
// connection reads it, allocates nothing: the namespace's text is the one
// the plan made for the last request on the same collection, and the
// statement list is the plan's own room. So does a single delete,
// findAndModify and a small bulkWrite.
func TestPlanReadAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's instrumentation allocates")
	}
	for _, tc := range []struct {
		name string
		raw  []byte
	}{
		{"update", clMsgRaw(t, 0, D{{"update", "orders"}, {"ordered", true}, {"lsid", lsid}, {"$db", "shop"}},
			clSeq(t, "updates", D{{"q", D{{"_id", 42}}}, {"u", setA}}))},
		{"delete", clMsgRaw(t, 0, D{{"delete", "orders"}, {"deletes", A{D{{"q", D{{"_id", 42}}}, {"limit", 1}}}}, {"$db", "shop"}})},
		{"findAndModify", clMsgRaw(t, 0, D{{"findAndModify", "orders"}, {"query", D{{"_id", 42}}}, {"update", setA}, {"$db", "shop"}})},
	} {
		m := clParse(t, tc.raw)
		cmd, err := wire.CommandOf(m)
		if err != nil {
			t.Fatal(err)
		}
		var p Plan
		p.Read(m, cmd)
		if ws, err := p.Writes(); len(ws) != 1 || err != nil {
			t.Fatalf("%s: %d writes, %v", tc.name, len(ws), err)
		}
		if n := testing.AllocsPerRun(100, func() { p.Read(m, cmd) }); n != 0 {
			t.Errorf("%s: Read allocates %v times", tc.name, n)
		}
	}
}

// A plan hands its room for a statement list and for writes out once per
// Read: a classifier that read a second list (bulkWrite reads nsInfo,
// then ops) must not get the room the first one is still in.
func TestPlanRoomIsHandedOutOnce(t *testing.T) {
	var p Plan
	m := clParse(t, clMsgRaw(t, 0, D{{"find", "orders"}, {"$db", "shop"}}))
	cmd, err := wire.CommandOf(m)
	if err != nil {
		t.Fatal(err)
	}
	p.Read(m, cmd) // no statement list: the room is still free
	a, b := append(p.docRoom(), nil), append(p.docRoom(), nil)
	if &a[0] == &b[0] {
		t.Error("docRoom handed out the same room twice after one Read")
	}
	w1, w2 := p.newWrites(1), p.newWrites(1)
	if &w1[0] == &w2[0] {
		t.Error("newWrites handed out the same room twice after one Read")
	}
	p.Read(m, cmd)
	if c := append(p.docRoom(), nil); &c[0] != &a[0] {
		t.Error("the statement list room was not handed out again after Read")
	}
}

// A plan kept for a connection's next request keeps nothing of its last
// one once forgotten (proxy.Forgetter): a message over the buffer pool's
// largest class is the garbage collector's as soon as it is handled, and
// an idle connection must not keep one reachable through its plan. Also
// when the classifier refused the message half way, after it had filled
// some statements into the plan's room.
func TestForgottenPlanKeepsNoMessage(t *testing.T) {
	pad := strings.Repeat("x", 64<<10)
	bulk := make([]any, 3*keptWrites)
	for i := range bulk {
		bulk[i] = D{{"_id", i}, {"pad", pad}}
	}
	stmt := func(i int) D { return D{{"q", D{{"_id", i}, {"pad", pad}}}, {"u", setA}} }
	// Within the room the plan keeps, so that the refused statements'
	// room is the plan's.
	updates := A{stmt(1), stmt(2), D{{"q", "not a document"}, {"u", setA}}}
	for _, tc := range []struct {
		name   string
		body   D
		writes int
	}{
		{"a bulk insert", D{{"insert", "orders"}, {"documents", A(bulk)}, {"$db", "shop"}}, len(bulk)},
		{"an update refused at its last statement", D{{"update", "orders"}, {"updates", updates}, {"$db", "shop"}}, 0},
	} {
		var p Plan
		// The plan has room for a few statements already.
		warm := clParse(t, clMsgRaw(t, 0, D{{"update", "orders"}, {"updates", A{stmt(1), stmt(2), stmt(3)}}, {"$db", "shop"}}))
		p.Read(warm, nil)
		freed := make(chan struct{})
		func() {
			raw := clMsgRaw(t, 0, tc.body)
			buf := append(make([]byte, 0, len(raw)), raw...)
			runtime.SetFinalizer(&buf[0], func(*byte) { close(freed) })
			m := clParse(t, buf)
			cmd, err := wire.CommandOf(m)
			if err != nil {
				t.Fatal(err)
			}
			p.Read(m, cmd)
			if ws, err := p.Writes(); len(ws) != tc.writes || (err != nil) != (tc.writes == 0) {
				t.Fatalf("%s: %d writes, %v", tc.name, len(ws), err)
			}
		}()
		p.Forget()
		gone := false
		for i := 0; i < 20 && !gone; i++ {
			runtime.GC()
			select {
			case <-freed:
				gone = true
			case <-time.After(50 * time.Millisecond):
			}
		}
		runtime.KeepAlive(&p) // the plan lives on, as a connection's does
		if !gone {
			t.Errorf("%s: the forgotten plan still keeps its message reachable", tc.name)
		}
	}
}

// A forgotten plan holds nothing of its request: every field is zero but
// the room it keeps (writeBuf, whose statements are all zero) and the
// last namespace, whose text is its own. Forget clears only what the
// request used; this holds it to having cleared all of it, after every
// request of the corpus and a bulk insert whose references, statements
// and body list outgrow the plan's room.
func TestForgottenPlanIsEmpty(t *testing.T) {
	corpus := planCorpus(t)
	names := slices.Sorted(maps.Keys(corpus))
	bulk := make([]any, 3*keptWrites)
	for i := range bulk {
		bulk[i] = D{{"_id", i}}
	}
	big := clMsgRaw(t, 0, D{{"insert", "orders"}, {"documents", A(bulk)}, {"$db", "shop"}})
	var p Plan
	for i, name := range names {
		for _, raw := range [][]byte{corpus[name], big} {
			if i%10 != 0 && &raw[0] == &big[0] {
				continue
			}
			m, err := wire.Parse(raw, wire.Limits{})
			if err != nil {
				continue
			}
			cmd, _ := wire.CommandOf(m)
			p.Read(m, cmd)
			p.Forget()
			emptyPlan(t, name, &p)
		}
	}
}

// TestForgetClearsEveryField fills every field of a plan, by reflection
// so that a field added later is filled too, and forgets it: what
// survives is only what Forget keeps on purpose.
func TestForgetClearsEveryField(t *testing.T) {
	var p Plan
	fill(reflect.ValueOf(&p).Elem())
	p.refs, p.stages = p.refBuf[:], p.stageBuf[:]
	p.Forget()
	emptyPlan(t, "filled", &p)
	// Grown past its room, as a long command's references do.
	fill(reflect.ValueOf(&p).Elem())
	p.refs = append(p.refBuf[:], p.refBuf[:]...)
	p.stages = append(p.stageBuf[:], "$match")
	p.Forget()
	emptyPlan(t, "grown", &p)
}

// emptyPlan fails unless p is the zero Plan but for its kept room.
func emptyPlan(t *testing.T, name string, p *Plan) {
	t.Helper()
	for i := range p.writeBuf[:cap(p.writeBuf)] {
		if !reflect.ValueOf(p.writeBuf[:cap(p.writeBuf)][i]).IsZero() {
			t.Fatalf("%s: the forgotten plan's statement room %d holds %+v", name, i, p.writeBuf[:cap(p.writeBuf)][i])
		}
	}
	v := reflect.ValueOf(p).Elem()
	for i := 0; i < v.NumField(); i++ {
		f := v.Type().Field(i)
		if f.Name == "writeBuf" || f.Name == "lastNS" {
			continue
		}
		if !v.Field(i).IsZero() {
			t.Fatalf("%s: the forgotten plan's %s is %+v", name, f.Name, v.Field(i))
		}
	}
}

// fill sets every field of v, at any depth, to something not zero.
func fill(v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			fill(reflectSettable(v.Field(i)))
		}
	case reflect.Array:
		for i := 0; i < v.Len(); i++ {
			fill(v.Index(i))
		}
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := 0; i < 2; i++ {
			fill(s.Index(i))
		}
		v.Set(s)
	case reflect.Pointer:
		if v.Type().Elem().Kind() == reflect.Struct && v.Type().Elem().Name() == "Plan" {
			v.Set(reflect.New(v.Type().Elem()))
			return
		}
		p := reflect.New(v.Type().Elem())
		fill(p.Elem())
		v.Set(p)
	case reflect.Interface:
		v.Set(reflect.ValueOf(fmt.Errorf("filled")))
	case reflect.String:
		v.SetString("filled")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		v.SetUint(7)
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
	}
}

// reflectSettable makes an unexported field settable: the test fills the
// package's own types.
func reflectSettable(v reflect.Value) reflect.Value {
	return reflect.NewAt(v.Type(), unsafe.Pointer(v.UnsafeAddr())).Elem()
}
