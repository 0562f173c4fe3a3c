package bench

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
	"go.mongodb.org/mongo-driver/mongo"

	"github.com/lockgate/lockgate/wire"
)

// The hostile benchmark's namespaces, both enforced.
const (
	hostileDB   = "bench"
	hostileGood = "orders" // the well-behaved clients' documents
	// The flooders' collection is in a database of its own: FerretDB's
	// SQLite backend keeps each database in one file whose operations
	// queue behind a running scan, which MongoDB does not do; on one
	// database the benchmark would measure that, not lockgate.
	hostileSlowDB = "benchslow"
	hostileSlow   = "slow"
)

// HostileConfig says what RunHostile runs: well-behaved clients doing
// lock-write-release through one gateway, first alone, then while attackers
// hold idle connections, flood slow filters and pipeline junk lock
// commands, then alone again.
type HostileConfig struct {
	// Phase is how long each of the three phases is measured.
	Phase time.Duration
	// Good well-behaved clients, each with its own document and session.
	Good int
	// Idle connections that complete a handshake and then say nothing.
	Idle int
	// Flooders send, back to back, updates whose filter names no _id and
	// scans the whole slow collection (Docs documents) to match one.
	Flooders int
	// Pipeliners each pipeline batches of junk lock commands and
	// endSessions on one raw connection, reading the replies as they come.
	Pipeliners int
	// Docs is the size of the slow collection.
	Docs int
	// MaxHeap, when positive, fails the run if the process's heap and
	// stacks grow beyond it during the attack (the short CI form).
	MaxHeap  uint64
	Progress io.Writer
}

// DefaultHostileConfig is the documented run: about a minute.
func DefaultHostileConfig() HostileConfig {
	return HostileConfig{Phase: 15 * time.Second, Good: 4, Idle: 2000, Flooders: 20, Pipeliners: 8, Docs: 20000}
}

// ShortHostileConfig is the CI form: the same attackers, fewer and shorter.
func ShortHostileConfig() HostileConfig {
	return HostileConfig{Phase: 5 * time.Second, Good: 2, Idle: 1000, Flooders: 10, Pipeliners: 4, Docs: 5000, MaxHeap: 1 << 30}
}

// HostilePhase is what the well-behaved clients did in one phase.
type HostilePhase struct {
	Name     string
	Cycles   int           // lock-write-release cycles completed
	Seconds  float64       // measured time
	P50, P99 time.Duration // per cycle
	Errors   int           // cycles that failed
}

// Rate is cycles per second.
func (p HostilePhase) Rate() float64 { return float64(p.Cycles) / p.Seconds }

// HostileReport is the outcome of RunHostile.
type HostileReport struct {
	Config     HostileConfig
	Started    time.Time
	Took       time.Duration
	GOMAXPROCS int
	LoadBefore string
	LoadAfter  string
	// Quiet merges the phases before and after the attack.
	Quiet, Before, Attack, After HostilePhase
	// Attackers' work during the attack phase.
	FloodWrites, FloodRefused, JunkSent, JunkReplies int64
	IdleOpen                                         int
	// HeapBase is HeapInuse+StackInuse of the whole process (gateway,
	// FerretDB, every client) before the attack; HeapPeak the highest
	// sample during it; HeapAfter once the attackers are gone.
	HeapBase, HeapPeak, HeapAfter uint64
	// Up: the gateway was still serving at the end.
	Up bool
}

// ThroughputKept is the attack phase's rate over the quiet one.
func (r *HostileReport) ThroughputKept() float64 { return r.Attack.Rate() / r.Quiet.Rate() }

// P99Factor is the attack phase's p99 over the quiet one.
func (r *HostileReport) P99Factor() float64 { return float64(r.Attack.P99) / float64(r.Quiet.P99) }

// RunHostile runs the hostile load test against one gateway in front of
// the embedded FerretDB.
func RunHostile(ctx context.Context, cfg HostileConfig) (*HostileReport, error) {
	say := func(format string, a ...any) {
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, format+"\n", a...)
		}
	}
	rep := &HostileReport{Config: cfg, Started: time.Now(), GOMAXPROCS: runtime.GOMAXPROCS(0), LoadBefore: loadAvg()}
	fdb, err := startFerret()
	if err != nil {
		return nil, err
	}
	defer fdb.Close()
	gw, err := StartGateway(fdb.URI(), "", hostileDB+"."+hostileGood, hostileSlowDB+"."+hostileSlow)
	if err != nil {
		return nil, err
	}
	defer gw.Close()
	addr := gw.Addr()

	say("hostile: seeding %d documents", cfg.Docs)
	if err := seedHostile(ctx, fdb.Addr(), cfg); err != nil {
		return nil, err
	}
	good, err := newGoodClients(ctx, addr, cfg.Good)
	if err != nil {
		return nil, err
	}
	defer good.close()

	say("hostile: quiet phase (%v)", cfg.Phase)
	if rep.Before, err = good.run(ctx, "quiet, before", cfg.Phase); err != nil {
		return nil, err
	}

	// The attack.
	rep.HeapBase = heapNow()
	say("hostile: opening %d idle connections", cfg.Idle)
	idle, err := openIdle(addr, cfg.Idle)
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	if err != nil {
		return nil, err
	}
	rep.IdleOpen = len(idle)
	actx, stopAttack := context.WithCancel(ctx)
	var attackers sync.WaitGroup
	var floodWrites, floodRefused, junkSent, junkReplies atomic.Int64
	for i := range cfg.Flooders {
		attackers.Go(func() { flood(actx, addr, i, cfg.Docs, &floodWrites, &floodRefused) })
	}
	for i := range cfg.Pipeliners {
		attackers.Go(func() { pipelineJunk(actx, addr, i, &junkSent, &junkReplies) })
	}
	var peak atomic.Uint64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			if h := heapNow(); h > peak.Load() {
				peak.Store(h)
			}
			select {
			case <-actx.Done():
				return
			case <-t.C:
			}
		}
	}()
	time.Sleep(time.Second) // let the attack reach its pace
	say("hostile: attack phase (%v): %d idle, %d flooding slow filters, %d pipelining junk lock commands", cfg.Phase, len(idle), cfg.Flooders, cfg.Pipeliners)
	f0, r0, s0, j0 := floodWrites.Load(), floodRefused.Load(), junkSent.Load(), junkReplies.Load()
	rep.Attack, err = good.run(ctx, "under attack", cfg.Phase)
	rep.FloodWrites, rep.FloodRefused = floodWrites.Load()-f0, floodRefused.Load()-r0
	rep.JunkSent, rep.JunkReplies = junkSent.Load()-s0, junkReplies.Load()-j0
	stopAttack()
	attackers.Wait()
	<-sampled
	rep.HeapPeak = peak.Load()
	for _, c := range idle {
		c.Close()
	}
	idle = nil
	if err != nil {
		return nil, err
	}

	say("hostile: quiet phase again (%v)", cfg.Phase)
	if rep.After, err = good.run(ctx, "quiet, after", cfg.Phase); err != nil {
		return nil, err
	}
	rep.HeapAfter = heapNow()
	select {
	case <-gw.gw.Done():
	default:
		rep.Up = true
	}
	rep.Quiet = mergePhases("quiet", rep.Before, rep.After, good.quietSamples)
	rep.Took, rep.LoadAfter = time.Since(rep.Started), loadAvg()
	if !rep.Up {
		return rep, errors.New("hostile: the gateway stopped serving during the attack")
	}
	if rep.Attack.Cycles == 0 {
		return rep, errors.New("hostile: the well-behaved clients completed nothing during the attack")
	}
	if cfg.MaxHeap > 0 && rep.HeapPeak > rep.HeapBase+cfg.MaxHeap {
		return rep, fmt.Errorf("hostile: the process grew by %d MiB during the attack, over the bound of %d MiB",
			(rep.HeapPeak-rep.HeapBase)>>20, cfg.MaxHeap>>20)
	}
	return rep, nil
}

// heapNow is HeapInuse+StackInuse of the process, without forcing a GC.
func heapNow() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse + ms.StackInuse
}

// seedHostile fills the slow collection directly (not through the proxy):
// Docs documents, of which only the last matches the flooders' filter, and
// one document per well-behaved client in the good one.
func seedHostile(ctx context.Context, addr string, cfg HostileConfig) error {
	c, err := mongo.Connect(ctx, clientOptions(addr, 4))
	if err != nil {
		return err
	}
	defer c.Disconnect(context.Background())
	db := c.Database(hostileDB)
	slow := c.Database(hostileSlowDB).Collection(hostileSlow)
	for lo := 0; lo < cfg.Docs; lo += 500 {
		docs := make([]any, 0, 500)
		for i := lo; i < min(lo+500, cfg.Docs); i++ {
			docs = append(docs, bson.D{{"_id", docID(i)}, {"n", int64(i)}, {"payload", payload}})
		}
		if _, err := slow.InsertMany(ctx, docs); err != nil {
			return fmt.Errorf("seed: %w", err)
		}
	}
	docs := make([]any, cfg.Good)
	for i := range docs {
		docs[i] = bson.D{{"_id", docID(i)}, {"n", int64(0)}}
	}
	if _, err := db.Collection(hostileGood).InsertMany(ctx, docs); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	return nil
}

// goodClients are the well-behaved clients: each its own driver client,
// explicit session and document, doing acquireLock, an _id update and
// releaseLock, back to back.
type goodClients struct {
	clients      []*mongo.Client
	sessions     []mongo.Session
	quietSamples []int64
}

func newGoodClients(ctx context.Context, addr string, n int) (*goodClients, error) {
	g := &goodClients{}
	for range n {
		c, err := mongo.Connect(ctx, clientOptions(addr, 2))
		if err != nil {
			g.close()
			return nil, err
		}
		g.clients = append(g.clients, c)
		s, err := c.StartSession()
		if err != nil {
			g.close()
			return nil, err
		}
		g.sessions = append(g.sessions, s)
	}
	return g, nil
}

func (g *goodClients) close() {
	for _, s := range g.sessions {
		s.EndSession(context.Background())
	}
	for _, c := range g.clients {
		c.Disconnect(context.Background())
	}
}

// run measures cycles for d.
func (g *goodClients) run(ctx context.Context, name string, d time.Duration) (HostilePhase, error) {
	var mu sync.Mutex
	var samples []int64
	var errs atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(d)
	for i, c := range g.clients {
		wg.Go(func() {
			db := c.Database(hostileDB)
			s := g.sessions[i]
			id := docID(i)
			var mine []int64
			for time.Now().Before(end) && ctx.Err() == nil {
				t0 := time.Now()
				err := goodCycle(ctx, db, s, id)
				if err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				mine = append(mine, int64(time.Since(t0)))
			}
			mu.Lock()
			samples = append(samples, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	p := HostilePhase{Name: name, Cycles: len(samples), Seconds: time.Since(start).Seconds(), Errors: int(errs.Load()),
		P50: percentile(samples, 50), P99: percentile(samples, 99)}
	if name != "under attack" {
		g.quietSamples = append(g.quietSamples, samples...)
	}
	if p.Cycles == 0 && name != "under attack" {
		err, _ := firstErr.Load().(error)
		return p, fmt.Errorf("hostile: %s: no cycle completed: %v", name, err)
	}
	return p, nil
}

// goodCycle is one lock-write-release.
func goodCycle(ctx context.Context, db *mongo.Database, s mongo.Session, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := acquireLock(ctx, db, s, hostileGood, bson.A{id}, time.Minute, 0); err != nil {
		return fmt.Errorf("acquireLock: %w", err)
	}
	res, err := db.Collection(hostileGood).UpdateOne(mongo.NewSessionContext(ctx, s), bson.D{{"_id", id}}, bson.D{{"$inc", bson.D{{"n", 1}}}})
	if err != nil {
		return fmt.Errorf("update: %w", err)
	}
	if res.MatchedCount != 1 {
		return fmt.Errorf("update matched %d documents", res.MatchedCount)
	}
	if _, err := releaseLock(ctx, db, s, hostileGood, bson.A{id}); err != nil {
		return fmt.Errorf("releaseLock: %w", err)
	}
	return nil
}

func mergePhases(name string, a, b HostilePhase, samples []int64) HostilePhase {
	return HostilePhase{Name: name, Cycles: a.Cycles + b.Cycles, Seconds: a.Seconds + b.Seconds, Errors: a.Errors + b.Errors,
		P50: percentile(samples, 50), P99: percentile(samples, 99)}
}

// openIdle opens n connections that each complete a hello, then idle.
func openIdle(addr string, n int) ([]net.Conn, error) {
	hello := helloMessage()
	buf := make([]byte, 64<<10)
	conns := make([]net.Conn, 0, n)
	for range n {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return conns, err
		}
		conns = append(conns, c)
		if err := roundTrip(c, hello, buf); err != nil {
			return conns, fmt.Errorf("idle connection %d: %w", len(conns), err)
		}
	}
	return conns, nil
}

// flood sends updates whose filter names no _id and matches only the last
// document of the slow collection, so that every one makes the proxy
// resolve it by scanning; each is refused, since the flooder holds no lock.
func flood(ctx context.Context, addr string, i, docs int, writes, refused *atomic.Int64) {
	c, err := mongo.Connect(ctx, clientOptions(addr, 1).SetAppName(fmt.Sprintf("flooder-%d", i)))
	if err != nil {
		return
	}
	defer c.Disconnect(context.Background())
	coll := c.Database(hostileSlowDB).Collection(hostileSlow)
	for ctx.Err() == nil {
		_, err := coll.UpdateMany(ctx, bson.D{{"n", int64(docs - 1)}, {"payload", bson.D{{"$exists", true}}}}, bson.D{{"$set", bson.D{{"hit", true}}}})
		writes.Add(1)
		if err != nil && ctx.Err() == nil {
			refused.Add(1)
		}
	}
}

// pipelineJunk pipelines batches of junk lock commands (wrong types,
// status of many ids, renewals of locks never held, acquires of too many
// ids) and endSessions of random sessions, reading replies as they come
// and never waiting for them.
func pipelineJunk(ctx context.Context, addr string, i int, sent, replies *atomic.Int64) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	go func() {
		r := wire.NewBufferPool()
		br := bufio.NewReader(c)
		for {
			raw, err := wire.ReadMessage(br, r, wire.Limits{})
			if err != nil {
				return
			}
			raw.Release()
			replies.Add(1)
		}
	}()
	lsid := func() bson.D {
		id := make([]byte, 16)
		rand.Read(id)
		return bson.D{{"id", primitive.Binary{Subtype: 4, Data: id}}}
	}
	many := make(bson.A, 1000)
	for k := range many {
		many[k] = fmt.Sprintf("junk-%d-%d", i, k)
	}
	tooMany := append(bson.A{}, many...)
	tooMany = append(tooMany, many...)
	cmds := []bson.D{
		{{"acquireLock", hostileGood}, {"ids", "not an array"}, {"$db", hostileDB}, {"lsid", lsid()}},
		{{"acquireLock", hostileGood}, {"ids", tooMany}, {"$db", hostileDB}, {"lsid", lsid()}},
		{{"lockStatus", hostileGood}, {"ids", many}, {"$db", hostileDB}, {"lsid", lsid()}},
		{{"renewLock", hostileGood}, {"ids", bson.A{"never-held"}}, {"$db", hostileDB}, {"lsid", lsid()}},
		{{"acquireLock", 1}, {"$db", hostileDB}},
		{{"endSessions", bson.A{lsid(), lsid(), lsid()}}, {"$db", "admin"}},
		{{"endSessions", 1}, {"$db", "admin"}},
	}
	var batch []byte
	for k, cmd := range cmds {
		b, err := bson.Marshal(cmd)
		if err != nil {
			return
		}
		batch = wire.AppendMsg(batch, int32(k+1), 0, 0, b)
	}
	for ctx.Err() == nil {
		if _, err := c.Write(batch); err != nil {
			return
		}
		sent.Add(int64(len(cmds)))
	}
}

// WriteMarkdown prints the report.
func (r *HostileReport) WriteMarkdown(w io.Writer) {
	c := r.Config
	fmt.Fprintf(w, "### Hostile clients (%s, GOMAXPROCS %d, load %s -> %s, %v)\n\n", r.Started.UTC().Format(time.RFC3339), r.GOMAXPROCS, r.LoadBefore, r.LoadAfter, r.Took.Round(time.Second))
	fmt.Fprintf(w, "%d well-behaved clients (acquireLock, _id update, releaseLock in an explicit session, enforced namespace); attack: %d idle connections, %d clients flooding a slow filter over %d documents, %d connections pipelining junk lock commands and endSessions. Phases of %v: quiet, attack, quiet.\n\n",
		c.Good, r.IdleOpen, c.Flooders, c.Docs, c.Pipeliners, c.Phase)
	fmt.Fprintln(w, "| phase | cycles/s | p50 | p99 | failed cycles |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, p := range []HostilePhase{r.Before, r.Attack, r.After, r.Quiet} {
		fmt.Fprintf(w, "| %s | %.1f | %v | %v | %d |\n", p.Name, p.Rate(), p.P50.Round(10*time.Microsecond), p.P99.Round(10*time.Microsecond), p.Errors)
	}
	kept, factor := r.ThroughputKept(), r.P99Factor()
	fmt.Fprintf(w, "\n**Well-behaved clients under attack: %.0f%% of their quiet throughput (target >= 80%%: %s), p99 %.1fx its quiet value (target < 10x: %s).**\n\n",
		100*kept, pass(kept >= 0.8), factor, pass(factor < 10))
	fmt.Fprintf(w, "Attackers during the attack phase: %d slow-filter writes (%d refused), %d junk commands sent, %d answered. ", r.FloodWrites, r.FloodRefused, r.JunkSent, r.JunkReplies)
	fmt.Fprintf(w, "Process heap+stacks (gateway, FerretDB and every client in one process): %d MiB before, %d MiB peak during, %d MiB after. Gateway serving at the end: %v.\n",
		r.HeapBase>>20, r.HeapPeak>>20, r.HeapAfter>>20, r.Up)
}

func pass(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}
