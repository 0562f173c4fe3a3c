package lockstore

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.uber.org/zap"
)

// Cross-instance wake-up without change streams (docs/LOCKS.md, "Waking
// waiters on other lockgates"). Each Store with Config.WakeListen set
// listens for datagrams and advertises its address in the _wake
// collection next to the lock records. A waiter that finds a key held
// tells every other advertised Store "I wait for key K" (again at each
// retry of its poll, so a lost datagram is repaired by the next); a Store
// that frees K tells the Stores that said so "K is free", and there the
// head waiter of K tries at once, as after a local release. Nothing but
// latency depends on a datagram arriving: the waiters poll exactly as
// without it. A forged datagram can only make a waiter try once more
// (one read), which its poll does anyway.

// WakeSuffix names the collection of wake addresses next to
// Config.Collection.
const WakeSuffix = "_wake"

const (
	// wakeHeartbeat is how often a Store re-advertises itself and re-reads
	// the others' addresses; an address not renewed for wakeStale is
	// ignored (its Store is gone).
	wakeHeartbeat = time.Second
	wakeStale     = 10 * time.Second
	// wakeInterest is how long a remote waiter's "waiting" is remembered
	// without being repeated; a waiter repeats it at each poll (at most
	// MaxPoll apart).
	wakeInterest = 2 * time.Second
	// wakeMaxKeys bounds the remembered interests, so that datagrams
	// cannot grow this Store's memory without bound.
	wakeMaxKeys     = 100000
	wakeMaxDatagram = 2048
)

// wakeDoc is one Store's advertised address.
type wakeDoc struct {
	ID   string    `bson:"_id"` // the Store's via
	Addr string    `bson:"addr"`
	At   time.Time `bson:"at"`
}

// waker is a Store's end of the wake-up datagrams.
type waker struct {
	s    *Store
	conn *net.UDPConn
	addr string
	coll *mongo.Collection

	mu    sync.Mutex
	peers []*net.UDPAddr
	// interest: record id -> address of a remote Store with a waiter of
	// it -> until when that is believed.
	interest map[string]map[string]time.Time
	// testHookFree, when set, sees each "free" datagram handled.
	testHookFree func(rid string)
}

// startWaker listens on Config.WakeListen and runs the advertising loop;
// an address that cannot be listened on is logged, and waiters poll.
func (s *Store) startWaker(coll *mongo.Collection) {
	la, err := net.ResolveUDPAddr("udp", s.cfg.WakeListen)
	if err != nil {
		s.log.Warn("lockstore.wakeListen: not a UDP address; waiters on other lockgates poll", zap.Error(err))
		return
	}
	conn, err := net.ListenUDP("udp", la)
	if err != nil {
		s.log.Warn("lockstore.wakeListen: cannot listen; waiters on other lockgates poll", zap.Error(err))
		return
	}
	addr := conn.LocalAddr().(*net.UDPAddr)
	if addr.IP.IsUnspecified() {
		s.log.Warn("lockstore.wakeListen: listening on every address, which cannot be advertised; name the address other lockgates reach this one at", zap.Stringer("addr", addr))
		conn.Close()
		return
	}
	w := &waker{s: s, conn: conn, addr: addr.String(), coll: coll, interest: map[string]map[string]time.Time{}}
	s.wake.Store(w)
	s.wg.Add(2)
	go w.read()
	go w.advertise()
	s.log.Info("waiters on other lockgates are woken by datagrams", zap.String("addr", w.addr))
}

// advertise keeps this Store's address in the _wake collection and the
// others' in memory, until the Store closes.
func (w *waker) advertise() {
	defer w.s.wg.Done()
	t := time.NewTicker(wakeHeartbeat)
	defer t.Stop()
	for {
		w.refresh()
		select {
		case <-t.C:
		case <-w.s.ctx.Done():
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, _ = w.coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: w.s.via}})
			cancel()
			w.conn.Close()
			return
		}
	}
}

// refresh writes this Store's heartbeat and reads the others' addresses.
func (w *waker) refresh() {
	ctx, cancel := context.WithTimeout(w.s.ctx, w.s.cfg.OpTimeout)
	defer cancel()
	now := time.Now()
	if _, err := w.coll.ReplaceOne(ctx, bson.D{{Key: "_id", Value: w.s.via}}, wakeDoc{ID: w.s.via, Addr: w.addr, At: now},
		options.Replace().SetUpsert(true)); err != nil {
		if w.s.ctx.Err() == nil {
			w.s.log.Debug("wake: heartbeat failed", zap.Error(err))
		}
		return
	}
	cur, err := w.coll.Find(ctx, bson.D{{Key: "at", Value: bson.D{{Key: "$gt", Value: now.Add(-wakeStale)}}}})
	if err != nil {
		return
	}
	var docs []wakeDoc
	if err := cur.All(ctx, &docs); err != nil {
		return
	}
	var peers []*net.UDPAddr
	for _, d := range docs {
		if d.ID == w.s.via {
			continue
		}
		if a, err := net.ResolveUDPAddr("udp", d.Addr); err == nil {
			peers = append(peers, a)
		}
	}
	w.mu.Lock()
	w.peers = peers
	for rid, m := range w.interest {
		for a, until := range m {
			if now.After(until) {
				delete(m, a)
			}
		}
		if len(m) == 0 {
			delete(w.interest, rid)
		}
	}
	w.mu.Unlock()
}

// waiting tells the other Stores that a waiter here waits for rid.
func (w *waker) waiting(rid string) {
	w.mu.Lock()
	peers := w.peers
	w.mu.Unlock()
	if len(peers) == 0 {
		return
	}
	msg := []byte("W " + w.addr + " " + rid)
	for _, p := range peers {
		_, _ = w.conn.WriteToUDP(msg, p)
	}
}

// freed tells the Stores with a waiter of rid that it is free.
func (w *waker) freed(rid string) {
	w.mu.Lock()
	m := w.interest[rid]
	delete(w.interest, rid)
	w.mu.Unlock()
	if len(m) == 0 {
		return
	}
	msg := []byte("F " + rid)
	now := time.Now()
	for a, until := range m {
		if now.After(until) {
			continue
		}
		if ua, err := net.ResolveUDPAddr("udp", a); err == nil {
			_, _ = w.conn.WriteToUDP(msg, ua)
		}
	}
}

// read handles datagrams until the connection closes.
func (w *waker) read() {
	defer w.s.wg.Done()
	buf := make([]byte, wakeMaxDatagram)
	for {
		n, _, err := w.conn.ReadFromUDP(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		w.handle(string(buf[:n]))
	}
}

func (w *waker) handle(msg string) {
	switch {
	case strings.HasPrefix(msg, "W "):
		addr, rid, ok := strings.Cut(msg[2:], " ")
		if !ok || rid == "" {
			return
		}
		w.mu.Lock()
		m := w.interest[rid]
		if m == nil {
			if len(w.interest) >= wakeMaxKeys {
				w.mu.Unlock()
				return
			}
			m = map[string]time.Time{}
			w.interest[rid] = m
		}
		if len(m) < 64 { // a Store per lockgate: a few
			m[addr] = time.Now().Add(wakeInterest)
		}
		w.mu.Unlock()
	case strings.HasPrefix(msg, "F "):
		rid := msg[2:]
		// The cached head is the held one: the try must read the key.
		w.s.cache.remove(rid)
		w.s.wq.notify(rid)
		if w.testHookFree != nil {
			w.testHookFree(rid)
		}
	}
}
