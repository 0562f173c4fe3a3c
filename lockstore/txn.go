package lockstore

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/namespace"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
	"go.mongodb.org/mongo-driver/mongo"
)

// TxnsSuffix names the collection of transaction records next to
// Config.Collection.
const TxnsSuffix = "_txns"

// TxnRetention is how long a transaction record is kept when neither its
// commit nor its abort was seen answered: far longer than MongoDB lets a
// transaction stay open (transactionLifetimeLimitSeconds, 60 s by
// default), after which the server has aborted it. A deployment that
// raises that limit above it must not rely on it (docs/ENFORCEMENT.md).
const TxnRetention = time.Hour

// TxnNeed is what a commitTransaction needs for the statements of its
// transaction that wrote to one enforced namespace, as one owner binding:
// the locks the committing session must still hold, and the inserted
// _ids no other session may hold.
type TxnNeed struct {
	NS       namespace.Namespace
	Bind     string
	Held     []docid.ID
	Unlocked []docid.ID
}

// A transaction's record is a run of documents in slots numbered from 0,
// _id "<session hex>:<txnNumber>:<slot>": one per statement allowed, and
// one, a seal, per commit begun. Each is inserted once and never changed:
// an insert with a unique _id is atomic on every server (FerretDB's
// updates are not), so two proxies writing to one record at once cannot
// lose either's; the one that finds its slot taken moves on. Every read
// and delete is by _id, the one filter FerretDB answers without scanning
// the collection.
//
// The seal orders a commit against statements recorded concurrently
// through other proxies: a statement goes into slot k only after reading
// slot k-1 and finding no seal there, and a commit reads every slot below
// its seal. So a statement either lands below the seal, and the commit
// sees it, or finds the seal, and is refused (ErrTxnCommitting).
type txnDoc struct {
	ID      string           `bson:"_id"`
	Session primitive.Binary `bson:"s"`
	Txn     int64            `bson:"n"`
	At      time.Time        `bson:"at"`
	Seal    bool             `bson:"seal,omitempty"`
	Needs   []txnNeedDoc     `bson:"needs,omitempty"`
}

// ErrTxnCommitting: a statement of a transaction whose commit has begun.
var ErrTxnCommitting = errors.New("the transaction's commit has begun")

// ErrTxnChanged: a transaction's record lost slots while a commit read it
// (its end, through another proxy, deleted them).
var ErrTxnChanged = errors.New("the transaction's record changed while its commit read it")

// maxTxnSlots bounds the statements recorded for one transaction.
const maxTxnSlots = 100000

var errTooManySlots = fmt.Errorf("lockstore: transaction records more than %d statements", maxTxnSlots)

func txnSlotID(session []byte, txn int64, slot int) string {
	return hex.EncodeToString(session) + ":" + strconv.FormatInt(txn, 10) + ":" + strconv.Itoa(slot)
}

// txnSlots remembers, per transaction recorded through this Store, the
// next slot that is probably free, so that a transaction of many
// statements does not try every taken slot again for each. Bounded by
// emptying it when full: a guess lost costs a few duplicate inserts.
type txnSlots struct {
	mu   sync.Mutex
	next map[string]int
}

const maxTxnGuesses = 1 << 14

func (t *txnSlots) guess(key string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.next[key]
}

func (t *txnSlots) set(key string, next int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.next == nil || len(t.next) >= maxTxnGuesses {
		t.next = map[string]int{}
	}
	if next < 0 {
		delete(t.next, key)
		return
	}
	t.next[key] = next
}

type txnNeedDoc struct {
	NS       string          `bson:"ns"`
	Bind     string          `bson:"bind,omitempty"`
	Held     []bson.RawValue `bson:"held,omitempty"`
	Unlocked []bson.RawValue `bson:"unlocked,omitempty"`
}

func rawIDs(ids []docid.ID) []bson.RawValue {
	out := make([]bson.RawValue, len(ids))
	for i, id := range ids {
		out[i] = id.Raw()
	}
	return out
}

func parseIDs(vs []bson.RawValue) ([]docid.ID, error) {
	out := make([]docid.ID, len(vs))
	for i, v := range vs {
		id, err := docid.New(v)
		if err != nil {
			return nil, err
		}
		out[i] = id
	}
	return out, nil
}

// slot reads one slot; nil when it is free.
func (s *Store) slot(ctx context.Context, session []byte, txn int64, k int) (*txnDoc, error) {
	var d txnDoc
	err := s.rt(ctx, opTxn, func(ctx context.Context) error {
		return s.txns.FindOne(ctx, bson.D{{Key: "_id", Value: txnSlotID(session, txn, k)}}).Decode(&d)
	})
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, nil
	}
	if err != nil {
		return nil, s.storeErr(ctx, opTxn, err)
	}
	return &d, nil
}

// put inserts d into slot k; false when the slot is taken.
func (s *Store) put(ctx context.Context, d *txnDoc, session []byte, txn int64, k int) (bool, error) {
	d.ID = txnSlotID(session, txn, k)
	err := s.rt(ctx, opTxn, func(ctx context.Context) error {
		_, err := s.txns.InsertOne(ctx, d)
		return err
	})
	if mongo.IsDuplicateKeyError(err) {
		return false, nil
	}
	return err == nil, s.storeErr(ctx, opTxn, err)
}

// RecordTxn adds needs to the record of transaction txn of session, where
// every proxy's commit of it will find them. It returns once the record is
// stored, so a statement recorded before it is forwarded cannot be
// committed by a proxy that does not know of it; ErrTxnCommitting when the
// transaction's commit has begun (the statement must not be forwarded).
func (s *Store) RecordTxn(ctx context.Context, session []byte, txn int64, needs []TxnNeed) error {
	if err := s.ready(ctx); err != nil {
		return err
	}
	now, _ := s.clock.Now()
	d := txnDoc{Session: primitive.Binary{Data: session}, Txn: txn, At: now}
	for _, n := range needs {
		d.Needs = append(d.Needs, txnNeedDoc{NS: n.NS.String(), Bind: n.Bind, Held: rawIDs(n.Held), Unlocked: rawIDs(n.Unlocked)})
	}
	key := txnSlotID(session, txn, 0)
	for k := s.txnSlots.guess(key); k < maxTxnSlots; k++ {
		if k > 0 {
			below, err := s.slot(ctx, session, txn, k-1)
			switch {
			case err != nil:
				return err
			case below == nil:
				// A hole: the run was ended (deleted) since the guess;
				// a slot past it would be found by no reader.
				k = -1
				continue
			case below.Seal:
				return ErrTxnCommitting
			}
		}
		ok, err := s.put(ctx, &d, session, txn, k)
		if err != nil {
			return err
		}
		if ok {
			s.txnSlots.set(key, k+1)
			return nil
		}
	}
	return errTooManySlots
}

// BeginCommit seals the record of transaction txn of session, so that no
// statement of it is recorded, and so forwarded, from now on, and returns
// everything recorded before, through any proxy; none means none of its
// statements needed anything.
func (s *Store) BeginCommit(ctx context.Context, session []byte, txn int64) ([]TxnNeed, error) {
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	now, _ := s.clock.Now()
	seal := txnDoc{Session: primitive.Binary{Data: session}, Txn: txn, At: now, Seal: true}
	key := txnSlotID(session, txn, 0)
	k := s.txnSlots.guess(key)
	var below *txnDoc // slot k-1, read before the seal went into k
	for ; ; k++ {
		if k >= maxTxnSlots {
			return nil, errTooManySlots
		}
		if k > 0 {
			var err error
			if below, err = s.slot(ctx, session, txn, k-1); err != nil {
				return nil, err
			}
			if below == nil {
				// The guess is past a run ended (deleted) since.
				k = -1
				continue
			}
		}
		ok, err := s.put(ctx, &seal, session, txn, k)
		if err != nil {
			return nil, err
		}
		if ok {
			break
		}
	}
	s.txnSlots.set(key, k+1)
	var out []TxnNeed
	for i := range k {
		d := below
		if i < k-1 {
			var err error
			if d, err = s.slot(ctx, session, txn, i); err != nil {
				return nil, err
			}
		}
		if d == nil {
			return nil, ErrTxnChanged
		}
		for _, n := range d.Needs {
			held, err := parseIDs(n.Held)
			if err != nil {
				return nil, fmt.Errorf("lockstore: transaction record: %w", err)
			}
			unlocked, err := parseIDs(n.Unlocked)
			if err != nil {
				return nil, fmt.Errorf("lockstore: transaction record: %w", err)
			}
			out = append(out, TxnNeed{NS: namespace.Of(n.NS), Bind: n.Bind, Held: held, Unlocked: unlocked})
		}
	}
	return out, nil
}

// EndTxn forgets transaction txn of session: the server answered its
// commit or abort. Only that one: on a sharded cluster a shard that took
// part in an earlier transaction of the session, and in none since, may
// still commit it through another router. The slots go from the last to
// the first, so that an EndTxn cut short leaves a run that readers still
// find from slot 0, not slots past a hole that no reader reaches.
func (s *Store) EndTxn(ctx context.Context, session []byte, txn int64) error {
	if err := s.ready(ctx); err != nil {
		return err
	}
	n := 0
	for ; n < maxTxnSlots; n++ {
		d, err := s.slot(ctx, session, txn, n)
		if err != nil {
			return err
		}
		if d == nil {
			break
		}
	}
	for k := n - 1; k >= 0; k-- {
		err := s.rt(ctx, opTxn, func(ctx context.Context) error {
			_, err := s.txns.DeleteOne(ctx, bson.D{{Key: "_id", Value: txnSlotID(session, txn, k)}})
			return err
		})
		if err != nil {
			return s.storeErr(ctx, opTxn, err)
		}
	}
	s.txnSlots.set(txnSlotID(session, txn, 0), -1)
	return nil
}

// cleanupTxns deletes the records of transactions older than
// TxnRetention.
func (s *Store) cleanupTxns(ctx context.Context) (int, error) {
	var n int64
	now, _ := s.clock.Now()
	err := s.rt(ctx, opCleanup, func(ctx context.Context) error {
		res, err := s.txns.DeleteMany(ctx, bson.D{{Key: "at", Value: bson.D{{Key: "$lt", Value: now.Add(-TxnRetention)}}}})
		if res != nil {
			n = res.DeletedCount
		}
		return err
	})
	return int(n), s.storeErr(ctx, opCleanup, err)
}
