package guard

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/lockstore/memstore"
	"github.com/lockgate/lockgate/testserver/scripted"
	"github.com/lockgate/lockgate/wire"
)

// The attacks of issue 27 item 2: a session writes _id 1 in a transaction
// under its lock, the lock passes to another session, and the first
// session's commitTransaction must not reach the database, whatever path
// it takes. A scripted router plays the server (FerretDB has no
// transactions); the lock store is the in-memory one, shared by every
// proxy of a test as a lock database is: what is decided here is the
// guard's, and the real store's transaction records keep the same contract
// (lockstoretest, run against both; lockstore TestTxnRecordsAcrossInstances
// for two real Stores).

// txnRig is proxies sharing one lock collection in front of one scripted
// router.
type txnRig struct {
	up      *txnUpstream
	proxies []*stack
}

func startTxnRig(t *testing.T, proxies int) *txnRig {
	t.Helper()
	u := &txnUpstream{}
	up, err := scripted.Start(u.handle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	r := &txnRig{up: u}
	store := memstore.New(memstore.Config{DefaultLease: 5 * time.Second, MaxLease: time.Minute})
	for range proxies {
		r.proxies = append(r.proxies, startStackWith(t, stackOptions{upstreamAddr: up.Addr(), memStore: store, policy: config.Policy{
			Default: config.ModeOff, LeaseMarginMS: 100,
			Namespaces: []config.NamespaceRule{{Match: "shop.orders", Mode: config.ModeEnforce}},
		}}))
	}
	return r
}

// txnSession is a logical session spoken over raw connections, as any
// client (or a driver spreading a session over several routers) can.
type txnSession struct{ lsid bson.D }

func newTxnSession(b byte) txnSession {
	return txnSession{lsid: bson.D{{"id", primitive.Binary{Subtype: 4, Data: bytes.Repeat([]byte{b}, 16)}}}}
}

func (s txnSession) cmd(t *testing.T, p *stack, cmd bson.D) bson.M {
	t.Helper()
	return rawCommand(t, p.addr, append(cmd, bson.E{"lsid", s.lsid}))
}

func (s txnSession) lock(t *testing.T, p *stack, id int) {
	t.Helper()
	if r := s.cmd(t, p, bson.D{{"acquireLock", "orders"}, {"ids", bson.A{id}}, {"leaseMS", 30000}, {"$db", "shop"}}); !okReply(r) {
		t.Fatalf("acquireLock %d: %v", id, r)
	}
}

func (s txnSession) release(t *testing.T, p *stack, id int) {
	t.Helper()
	if r := s.cmd(t, p, bson.D{{"releaseLock", "orders"}, {"ids", bson.A{id}}, {"$db", "shop"}}); !okReply(r) {
		t.Fatalf("releaseLock %d: %v", id, r)
	}
}

// txnUpdate is the first statement of transaction n: an update of _id
// id in coll.
func txnUpdate(coll string, id int, n int64) bson.D {
	return bson.D{{"update", coll}, {"updates", bson.A{bson.D{{"q", bson.D{{"_id", id}}}, {"u", bson.D{{"$set", bson.D{{"a", n}}}}}}}},
		{"txnNumber", n}, {"autocommit", false}, {"startTransaction", true}, {"$db", "shop"}}
}

func txnInsert(id int, n int64) bson.D {
	return bson.D{{"insert", "orders"}, {"documents", bson.A{bson.D{{"_id", id}}}},
		{"txnNumber", n}, {"autocommit", false}, {"startTransaction", true}, {"$db", "shop"}}
}

func endCmd(name string, n int64) bson.D {
	return bson.D{{name, 1}, {"txnNumber", n}, {"autocommit", false}, {"$db", "admin"}}
}

func okReply(r bson.M) bool {
	switch v := r["ok"].(type) {
	case float64:
		return v == 1
	case int32:
		return v == 1
	}
	return false
}

// rawReply is rawCommand for a goroutine: errors are returned.
func rawReply(addr string, cmd bson.D) (bson.M, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	body, err := bson.Marshal(cmd)
	if err != nil {
		return nil, err
	}
	if _, err := c.Write(wire.AppendMsg(nil, 7, 0, 0, body)); err != nil {
		return nil, err
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	raw, err := wire.ReadMessage(bufio.NewReader(c), wire.NewBufferPool(), wire.Limits{})
	if err != nil {
		return nil, err
	}
	defer raw.Release()
	m, err := wire.Parse(raw.Bytes, wire.Limits{})
	if err != nil {
		return nil, err
	}
	var out bson.M
	return out, bson.Unmarshal(m.(*wire.OpMsg).Body, &out)
}

// wantCommitRefused: the commit of transaction n was answered LockBusy
// and the upstream executed abortTransaction in its place, never the
// commit.
func wantCommitRefused(t *testing.T, u *txnUpstream, r bson.M, n int64) {
	t.Helper()
	if msg, _ := r["errmsg"].(string); okReply(r) || r["code"] != int32(46) || !strings.Contains(msg, "commitTransaction refused") {
		t.Errorf("commit of transaction %d: %v, want LockBusy, commitTransaction refused", n, r)
	}
	num := strconv.FormatInt(n, 10)
	if u.executed("commitTransaction " + num) {
		t.Errorf("the upstream executed the commit of transaction %d", n)
	}
	if got := u.last(); got != "abortTransaction "+num {
		t.Errorf("upstream executed %q last, want abortTransaction %d in the commit's place", got, n)
	}
}

// wantCommitted: the commit of transaction n was forwarded and executed.
func wantCommitted(t *testing.T, u *txnUpstream, r bson.M, n int64) {
	t.Helper()
	if !okReply(r) {
		t.Errorf("commit of transaction %d: %v, want ok", n, r)
	}
	if !u.executed("commitTransaction " + strconv.FormatInt(n, 10)) {
		t.Errorf("the upstream did not execute the commit of transaction %d", n)
	}
}

// wantOK fails unless r is a success.
func wantOK(t *testing.T, what string, r bson.M) {
	t.Helper()
	if !okReply(r) {
		t.Fatalf("%s: %v", what, r)
	}
}

// TestCommitAfterARefusedAbortIsChecked (a): an abortTransaction without
// autocommit: false is refused by the server, so the transaction stays
// open; lockgate must not forget it on the request alone.
func TestCommitAfterARefusedAbortIsChecked(t *testing.T) {
	rig := startTxnRig(t, 1)
	p := rig.proxies[0]
	s, b := newTxnSession(0xa1), newTxnSession(0xa2)
	s.lock(t, p, 1)
	wantOK(t, "update in the transaction", s.cmd(t, p, txnUpdate("orders", 1, 1)))
	abort := s.cmd(t, p, bson.D{{"abortTransaction", 1}, {"txnNumber", int64(1)}, {"$db", "admin"}})
	if okReply(abort) {
		t.Fatalf("the scripted server accepted an abort without autocommit: false: %v", abort)
	}
	s.release(t, p, 1)
	b.lock(t, p, 1)
	wantCommitRefused(t, rig.up, s.cmd(t, p, endCmd("commitTransaction", 1)), 1)
}

// TestCommitThroughAnotherProxyIsChecked (b): drivers spread a session's
// operations over every router in the connection string; a commit sent
// to a proxy that never saw the transaction's writes is checked all the
// same. Covered commits and transactions that wrote nothing enforced
// commit through any proxy.
func TestCommitThroughAnotherProxyIsChecked(t *testing.T) {
	rig := startTxnRig(t, 2)
	pa, pb := rig.proxies[0], rig.proxies[1]
	s, b := newTxnSession(0xb1), newTxnSession(0xb2)
	s.lock(t, pa, 1)
	wantOK(t, "update in the transaction", s.cmd(t, pa, txnUpdate("orders", 1, 1)))
	s.release(t, pa, 1)
	b.lock(t, pb, 1)
	wantCommitRefused(t, rig.up, s.cmd(t, pb, endCmd("commitTransaction", 1)), 1)

	// Covered: still held, committed through the other proxy.
	s.lock(t, pa, 2)
	wantOK(t, "update in the transaction", s.cmd(t, pa, txnUpdate("orders", 2, 2)))
	wantCommitted(t, rig.up, s.cmd(t, pb, endCmd("commitTransaction", 2)), 2)

	// Nothing enforced written: no lock needed, through either proxy.
	wantOK(t, "update of an unprotected collection", s.cmd(t, pa, txnUpdate("other", 1, 3)))
	wantCommitted(t, rig.up, s.cmd(t, pb, endCmd("commitTransaction", 3)), 3)
}

// TestCommitAfterManyTransactionsIsChecked (c): any client opening 10,000
// transactions must not make lockgate forget another's.
func TestCommitAfterManyTransactionsIsChecked(t *testing.T) {
	rig := startTxnRig(t, 1)
	p := rig.proxies[0]
	s, b, e := newTxnSession(0xc1), newTxnSession(0xc2), newTxnSession(0xc3)
	s.lock(t, p, 1)
	wantOK(t, "update in the transaction", s.cmd(t, p, txnUpdate("orders", 1, 1)))

	// 10,000 transactions of another session, each writing under its
	// lock, pipelined on one connection.
	e.lock(t, p, 2)
	const flood = 10000
	c, err := net.DialTimeout("tcp", p.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var wg sync.WaitGroup
	var failed []bson.M
	// The flood takes far longer under the race detector than a lease:
	// its session keeps renewing, as a holder does.
	done := make(chan struct{})
	var renewErr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(5 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if r, err := rawReply(p.addr, bson.D{{"renewLock", "orders"}, {"ids", bson.A{2}}, {"leaseMS", 30000}, {"lsid", e.lsid}, {"$db", "shop"}}); err != nil || !okReply(r) {
					renewErr = fmt.Errorf("renewLock: %v %v", r, err)
					return
				}
			}
		}
	}()
	go func() {
		defer wg.Done()
		defer close(done)
		r := bufio.NewReader(c)
		pool := wire.NewBufferPool()
		for range flood {
			c.SetReadDeadline(time.Now().Add(time.Minute))
			raw, err := wire.ReadMessage(r, pool, wire.Limits{})
			if err != nil {
				failed = append(failed, bson.M{"read": err.Error()})
				return
			}
			m, err := wire.Parse(raw.Bytes, wire.Limits{})
			var out bson.M
			if err == nil {
				err = bson.Unmarshal(m.(*wire.OpMsg).Body, &out)
			}
			raw.Release()
			if err != nil || !okReply(out) {
				failed = append(failed, out)
			}
		}
	}()
	c.SetWriteDeadline(time.Now().Add(10 * time.Minute))
	w := bufio.NewWriter(c)
	for i := range flood {
		body, err := bson.Marshal(append(txnUpdate("orders", 2, int64(i+1)), bson.E{"lsid", e.lsid}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(wire.AppendMsg(nil, int32(i+1), 0, 0, body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if renewErr != nil {
		t.Fatal(renewErr)
	}
	if len(failed) > 0 {
		t.Fatalf("%d of the flood's writes failed, the first: %v", len(failed), failed[0])
	}

	s.release(t, p, 1)
	b.lock(t, p, 1)
	wantCommitRefused(t, rig.up, s.cmd(t, p, endCmd("commitTransaction", 1)), 1)
}

// TestCommitOfAnInsertOfANowLockedIDIsChecked (d): a transaction that
// inserted an _id another session locked before the commit would create
// what a plain insert of it may not (inserts: requireUnlocked).
func TestCommitOfAnInsertOfANowLockedIDIsChecked(t *testing.T) {
	rig := startTxnRig(t, 1)
	p := rig.proxies[0]
	s, b := newTxnSession(0xd1), newTxnSession(0xd2)
	wantOK(t, "insert in the transaction", s.cmd(t, p, txnInsert(7, 1)))
	b.lock(t, p, 7)
	wantCommitRefused(t, rig.up, s.cmd(t, p, endCmd("commitTransaction", 1)), 1)

	// An _id nobody locked: the commit goes through.
	wantOK(t, "insert in the transaction", s.cmd(t, p, txnInsert(8, 2)))
	wantCommitted(t, rig.up, s.cmd(t, p, endCmd("commitTransaction", 2)), 2)
}

// TestStatementDuringACommitIsRefused: a statement of a transaction sent
// through one proxy while its commit, sent through another, is on its way
// to the database would be committed without the commit's check having
// seen it. The commit seals the record first; the statement is refused.
func TestStatementDuringACommitIsRefused(t *testing.T) {
	rig := startTxnRig(t, 2)
	pa, pb := rig.proxies[0], rig.proxies[1]
	s := newTxnSession(0xe1)
	s.lock(t, pa, 1)
	s.lock(t, pa, 2)
	wantOK(t, "update in the transaction", s.cmd(t, pa, txnUpdate("orders", 1, 1)))

	arrived, hold := make(chan struct{}), make(chan struct{})
	rig.up.mu.Lock()
	rig.up.commitArrived, rig.up.holdCommit = arrived, hold
	rig.up.mu.Unlock()
	type result struct {
		r   bson.M
		err error
	}
	committed := make(chan result, 1)
	go func() {
		r, err := rawReply(pb.addr, append(endCmd("commitTransaction", 1), bson.E{"lsid", s.lsid}))
		committed <- result{r, err}
	}()
	select {
	case <-arrived:
	case c := <-committed:
		close(hold)
		t.Fatalf("the commit was answered without reaching the upstream: %v %v", c.r, c.err)
	}

	second := txnUpdate("orders", 2, 1)
	second = slices.DeleteFunc(second, func(e bson.E) bool { return e.Key == "startTransaction" })
	r := s.cmd(t, pa, second)
	close(hold)
	if msg, _ := r["errmsg"].(string); okReply(r) || r["code"] != int32(46) || !strings.Contains(msg, "commit has already begun") {
		t.Errorf("a statement sent while its transaction's commit was on its way: %v, want refused", r)
	}
	if c := <-committed; c.err != nil || !okReply(c.r) {
		t.Errorf("the commit: %v %v, want ok", c.r, c.err)
	}
}
