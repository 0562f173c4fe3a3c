package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
)

// Workload is the operation every client repeats.
type Workload string

// The workloads.
const (
	// FindOne is findOne({_id: id}) on a random seeded id; the returned
	// document must be id's.
	FindOne Workload = "findOne"
	// UpdateOne is updateOne({_id: id}, {$inc: {n: 1}}) on a random
	// seeded id; it must match and modify one document.
	UpdateOne Workload = "updateOne"
)

// AllWorkloads lists every workload.
var AllWorkloads = []Workload{FindOne, UpdateOne}

const dbName = "lockgate_bench"

// clientOptions are the same for every leg. Retryable writes are off
// because the driver adds txnNumber to writes only when it sees a router or
// a replica set: the proxy presents itself as a router and FerretDB as a
// standalone server, and the legs must send the same bytes.
func clientOptions(addr string, maxPool int) *options.ClientOptions {
	return options.Client().
		SetHosts([]string{addr}).
		SetDirect(true).
		SetRetryWrites(false).
		SetMaxPoolSize(uint64(maxPool)).
		SetServerSelectionTimeout(10 * time.Second).
		SetAppName("lockgate-bench")
}

// Client is one leg's driver client and the collection it works on.
type Client struct {
	Leg    Leg
	client *mongo.Client
	coll   *mongo.Collection
	// sessions, when set, are the explicit sessions of the clients of a
	// round: client i runs in sessions[i].
	sessions []mongo.Session
	// cpu, when set, is the CPU clock of a round in place of this
	// process's: with lockgate in a process of its own, both processes'.
	cpu func() time.Duration
}

// Connect returns a driver client for leg l of st, working on collection.
func Connect(ctx context.Context, st *Stack, l Leg, collection string, maxPool int) (*Client, error) {
	return connectTo(ctx, st.Addr(l), l, dbName, collection, maxPool)
}

// connectTo returns a driver client for leg l at addr, working on db.coll.
func connectTo(ctx context.Context, addr string, l Leg, db, coll string, maxPool int) (*Client, error) {
	c, err := mongo.Connect(ctx, clientOptions(addr, maxPool))
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", l, err)
	}
	if err := c.Ping(ctx, nil); err != nil {
		c.Disconnect(context.Background())
		return nil, fmt.Errorf("ping %s: %w", l, err)
	}
	return &Client{Leg: l, client: c, coll: c.Database(db).Collection(coll)}, nil
}

// StartSessions gives the client n explicit sessions: from now on, client i
// of a round runs in session i (as an application that locks and writes
// in one session does).
func (c *Client) StartSessions(n int) error {
	for range n {
		s, err := c.client.StartSession()
		if err != nil {
			return fmt.Errorf("%s: start session: %w", c.Leg, err)
		}
		c.sessions = append(c.sessions, s)
	}
	return nil
}

// Close ends the sessions and disconnects the client.
func (c *Client) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, s := range c.sessions {
		s.EndSession(ctx)
	}
	return c.client.Disconnect(ctx)
}

// docID is the _id of the k-th seeded document. Strings, because FerretDB
// v1.24 turns an _id filter into an indexed lookup only for string and
// ObjectId values; with integers it scans the whole collection.
func docID(k int) string { return fmt.Sprintf("%s%06d", idPrefix, k) }

const idPrefix = "doc-"

// docIDs lists the _ids of docs documents.
func docIDs(docs int) []string {
	ids := make([]string, docs)
	for k := range ids {
		ids[k] = docID(k)
	}
	return ids
}

// Seed replaces the collection with docs documents {_id: docID(k), n: 0,
// payload}.
func (c *Client) Seed(ctx context.Context, docs int) error {
	if err := c.coll.Drop(ctx); err != nil {
		return fmt.Errorf("seed: drop: %w", err)
	}
	const batch = 500
	for lo := 0; lo < docs; lo += batch {
		hi := min(lo+batch, docs)
		d := make([]any, 0, hi-lo)
		for i := lo; i < hi; i++ {
			d = append(d, bson.D{{"_id", docID(i)}, {"n", int64(0)}, {"payload", payload}})
		}
		if _, err := c.coll.InsertMany(ctx, d); err != nil {
			return fmt.Errorf("seed: insert: %w", err)
		}
	}
	return nil
}

// SumN returns the sum of n over the seeded documents, read one findOne at
// a time so that it works on the instant upstream too.
func (c *Client) SumN(ctx context.Context, docs int) (int64, error) {
	var sum int64
	for k := range docs {
		raw, err := c.coll.FindOne(ctx, bson.D{{"_id", docID(k)}}).Raw()
		if err != nil {
			return 0, fmt.Errorf("document %d: %w", k, err)
		}
		n, ok := raw.Lookup("n").AsInt64OK()
		if !ok {
			return 0, fmt.Errorf("document %d: n is %v", k, raw.Lookup("n"))
		}
		sum += n
	}
	return sum, nil
}

// op runs one operation on the document whose _id is id and checks its
// answer.
func (c *Client) op(ctx context.Context, w Workload, id string) error {
	switch w {
	case FindOne:
		raw, err := c.coll.FindOne(ctx, bson.D{{"_id", id}}).Raw()
		if err != nil {
			return err
		}
		if got, ok := raw.Lookup("_id").StringValueOK(); !ok || got != id {
			return fmt.Errorf("findOne(_id: %q) returned _id %v", id, raw.Lookup("_id"))
		}
		if _, ok := raw.Lookup("n").AsInt64OK(); !ok {
			return fmt.Errorf("findOne(_id: %q) returned no n: %v", id, raw)
		}
		return nil
	case UpdateOne:
		res, err := c.coll.UpdateOne(ctx, bson.D{{"_id", id}}, bson.D{{"$inc", bson.D{{"n", int32(1)}}}})
		if err != nil {
			return err
		}
		if res.MatchedCount != 1 || res.ModifiedCount != 1 {
			return fmt.Errorf("updateOne(_id: %q) matched %d, modified %d", id, res.MatchedCount, res.ModifiedCount)
		}
		return nil
	}
	return fmt.Errorf("unknown workload %q", w)
}

// Recorder holds the per-operation latencies of one round: a preallocated
// ring per client, so that recording never allocates. When a ring is full
// it keeps the newest samples.
type Recorder struct {
	rings  [][]int64
	counts []int
	merged []int64
}

// NewRecorder preallocates room for perClient samples for each of clients.
func NewRecorder(clients, perClient int) *Recorder {
	r := &Recorder{rings: make([][]int64, clients), counts: make([]int, clients), merged: make([]int64, 0, clients*perClient)}
	for i := range r.rings {
		r.rings[i] = make([]int64, perClient)
	}
	return r
}

// Round is what one leg did in one round.
type Round struct {
	Ops     int64
	Elapsed time.Duration
	P50     time.Duration
	P99     time.Duration
	// CPU is the user+system CPU time the whole process used during the
	// round: clients, relay or proxy, and the upstream when in-process;
	// with lockgate in a process of its own, that process's as well.
	// Unlike throughput it hardly moves when other processes take the
	// machine's cores.
	CPU time.Duration
	// Updates is how many updates were applied (UpdateOne only).
	Updates int64
}

// Throughput is operations per second.
func (r Round) Throughput() float64 { return float64(r.Ops) / r.Elapsed.Seconds() }

// CPUPerOp is the process CPU time per operation.
func (r Round) CPUPerOp() time.Duration { return r.CPU / time.Duration(max(r.Ops, 1)) }

// RunRound runs w from clients goroutines, each on its own share of the
// docs documents, until d has passed (d > 0) or until budget operations
// have run in all (budget > 0), whichever is first, and returns the round's
// figures. rec must have room for clients. The first failed or wrong
// answer ends the round with an error, and so does ctx ending. With
// sessions (see StartSessions), client i runs in session i.
func (c *Client) RunRound(ctx context.Context, w Workload, clients int, d time.Duration, budget int64, docs int, rec *Recorder, seed uint64) (Round, error) {
	if docs < clients {
		return Round{}, fmt.Errorf("%d documents cannot be split among %d clients", docs, clients)
	}
	if c.sessions != nil && clients > len(c.sessions) {
		return Round{}, fmt.Errorf("%s has %d sessions, not %d", c.Leg, len(c.sessions), clients)
	}
	ids := docIDs(docs)
	cpu := c.cpu
	if cpu == nil {
		cpu = processCPU
	}
	r, err := runLoop(ctx, clients, d, budget, rec, seed, cpu, func(ctx context.Context, i int, rng *rand.Rand) error {
		// Client i works on the documents whose _id ≡ i (mod clients):
		// no two clients ever update the same document at once, since
		// FerretDB v1.24 loses concurrent $inc on one document (a
		// read-modify-write), even without any proxy.
		mine := (docs - i + clients - 1) / clients
		id := ids[i+clients*rng.IntN(mine)]
		if c.sessions != nil {
			ctx = mongo.NewSessionContext(ctx, c.sessions[i])
		}
		if err := c.op(ctx, w, id); err != nil {
			return fmt.Errorf("%s %s: %w", c.Leg, w, err)
		}
		return nil
	})
	if err == nil && w == UpdateOne {
		r.Updates = r.Ops
	}
	return r, err
}

// runLoop is the timing loop of every benchmark: clients goroutines, each
// repeating op(ctx, i, rng) (i is the client's number, rng its own
// generator) and timing every call into its ring of rec, until d has passed
// (d > 0) or until budget calls have run in all (budget > 0), whichever is
// first. The first error ends the round (errors after ctx ends are not
// reported, except ctx's own).
func runLoop(ctx context.Context, clients int, d time.Duration, budget int64, rec *Recorder, seed uint64, cpuClock func() time.Duration, op func(ctx context.Context, i int, rng *rand.Rand) error) (Round, error) {
	if clients > len(rec.rings) {
		return Round{}, fmt.Errorf("recorder has room for %d clients, not %d", len(rec.rings), clients)
	}
	if d <= 0 && budget <= 0 {
		return Round{}, errors.New("round needs a duration or an operation budget")
	}
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		started  sync.WaitGroup
		finished sync.WaitGroup
		gate     = make(chan struct{})
		issued   atomic.Int64
		ops      atomic.Int64
		errOnce  sync.Once
		firstErr error
		deadline time.Time
	)
	for i := range clients {
		rec.counts[i] = 0
		started.Add(1)
		finished.Add(1)
		go func(i int) {
			defer finished.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			ring := rec.rings[i]
			n := 0
			started.Done()
			<-gate
			for ctx.Err() == nil {
				if budget > 0 && issued.Add(1) > budget {
					break
				}
				t0 := time.Now()
				err := op(ctx, i, rng)
				t1 := time.Now()
				if err != nil {
					if ctx.Err() == nil {
						errOnce.Do(func() { firstErr = err })
					}
					cancel()
					break
				}
				ring[n%len(ring)] = int64(t1.Sub(t0))
				n++
				if d > 0 && t1.After(deadline) {
					break
				}
			}
			rec.counts[i] = n
			ops.Add(int64(n))
		}(i)
	}
	started.Wait()
	cpu0 := cpuClock()
	start := time.Now()
	deadline = start.Add(d)
	close(gate)
	finished.Wait()
	elapsed := time.Since(start)
	cpu := cpuClock() - cpu0
	if firstErr != nil {
		return Round{}, firstErr
	}
	if err := parent.Err(); err != nil {
		return Round{}, err
	}
	r := Round{Ops: ops.Load(), Elapsed: elapsed, CPU: cpu}
	r.P50, r.P99 = rec.percentiles(clients)
	return r, nil
}

// percentiles merges the first clients rings and returns p50 and p99.
func (r *Recorder) percentiles(clients int) (p50, p99 time.Duration) {
	m := r.merged[:0]
	for i := range clients {
		m = append(m, r.rings[i][:min(r.counts[i], len(r.rings[i]))]...)
	}
	r.merged = m
	return percentile(m, 50), percentile(m, 99)
}
