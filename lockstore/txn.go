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
	NS       string
	Bind     string
	Held     []docid.ID
	Unlocked []docid.ID
}

// A transaction's record is a run of documents, one per statement
// allowed, in slots numbered from 0: _id "<session hex>:<txnNumber>:<slot>".
// Each is inserted once and never changed: an insert with a unique _id is
// atomic on every server (FerretDB's updates are not), so two proxies
// recording statements of one transaction at once cannot lose either's;
// the one that finds its slot taken takes the next. Every read and delete
// is by _id, the one filter FerretDB answers without scanning the
// collection: a commit costs one round trip per statement recorded, plus
// one, however many other transactions are recorded.
type txnDoc struct {
	ID      string           `bson:"_id"`
	Session primitive.Binary `bson:"s"`
	Txn     int64            `bson:"n"`
	At      time.Time        `bson:"at"`
	Needs   []txnNeedDoc     `bson:"needs"`
}

// maxTxnSlots bounds the statements recorded for one transaction.
const maxTxnSlots = 100000

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

// RecordTxn adds needs to the record of transaction txn of session, where
// every proxy's commit of it will find them. It returns once the record is
// stored, so a statement recorded before it is forwarded cannot be
// committed by a proxy that does not know of it.
func (s *Store) RecordTxn(ctx context.Context, session []byte, txn int64, needs []TxnNeed) error {
	if err := s.ready(ctx); err != nil {
		return err
	}
	d := txnDoc{Session: primitive.Binary{Data: session}, Txn: txn, At: time.Now()}
	for _, n := range needs {
		d.Needs = append(d.Needs, txnNeedDoc{NS: n.NS, Bind: n.Bind, Held: rawIDs(n.Held), Unlocked: rawIDs(n.Unlocked)})
	}
	key := txnSlotID(session, txn, 0)
	start := s.txnSlots.guess(key)
	if start > 0 {
		// The guess holds only while the run below it does: another
		// proxy's EndTxn may have deleted it, and a slot past a hole is
		// found by no reader.
		err := s.rt(ctx, opTxn, func(ctx context.Context) error {
			return s.txns.FindOne(ctx, bson.D{{Key: "_id", Value: txnSlotID(session, txn, start-1)}}).Err()
		})
		switch {
		case errors.Is(err, mongo.ErrNoDocuments):
			start = 0
		case err != nil:
			return s.storeErr(ctx, opTxn, err)
		}
	}
	for slot := start; slot < maxTxnSlots; slot++ {
		d.ID = txnSlotID(session, txn, slot)
		err := s.rt(ctx, opTxn, func(ctx context.Context) error {
			_, err := s.txns.InsertOne(ctx, d)
			return err
		})
		if mongo.IsDuplicateKeyError(err) {
			continue
		}
		if err != nil {
			return s.storeErr(ctx, opTxn, err)
		}
		s.txnSlots.set(key, slot+1)
		return nil
	}
	return fmt.Errorf("lockstore: transaction records more than %d statements", maxTxnSlots)
}

// txnDocs reads the slots of transaction txn of session, from 0 to the
// first free one.
func (s *Store) txnDocs(ctx context.Context, session []byte, txn int64) ([]txnDoc, error) {
	var docs []txnDoc
	for slot := 0; slot < maxTxnSlots; slot++ {
		var d txnDoc
		err := s.rt(ctx, opTxn, func(ctx context.Context) error {
			return s.txns.FindOne(ctx, bson.D{{Key: "_id", Value: txnSlotID(session, txn, slot)}}).Decode(&d)
		})
		if errors.Is(err, mongo.ErrNoDocuments) {
			return docs, nil
		}
		if err != nil {
			return nil, s.storeErr(ctx, opTxn, err)
		}
		docs = append(docs, d)
	}
	return nil, fmt.Errorf("lockstore: transaction records more than %d statements", maxTxnSlots)
}

// TxnNeeds returns everything recorded for transaction txn of session
// through any proxy; none means none of its statements needed anything.
func (s *Store) TxnNeeds(ctx context.Context, session []byte, txn int64) ([]TxnNeed, error) {
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	docs, err := s.txnDocs(ctx, session, txn)
	if err != nil {
		return nil, err
	}
	var out []TxnNeed
	for _, d := range docs {
		for _, n := range d.Needs {
			held, err := parseIDs(n.Held)
			if err != nil {
				return nil, fmt.Errorf("lockstore: transaction record: %w", err)
			}
			unlocked, err := parseIDs(n.Unlocked)
			if err != nil {
				return nil, fmt.Errorf("lockstore: transaction record: %w", err)
			}
			out = append(out, TxnNeed{NS: n.NS, Bind: n.Bind, Held: held, Unlocked: unlocked})
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
	docs, err := s.txnDocs(ctx, session, txn)
	if err != nil {
		return err
	}
	for i := len(docs) - 1; i >= 0; i-- {
		err := s.rt(ctx, opTxn, func(ctx context.Context) error {
			_, err := s.txns.DeleteOne(ctx, bson.D{{Key: "_id", Value: docs[i].ID}})
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
	err := s.rt(ctx, opCleanup, func(ctx context.Context) error {
		res, err := s.txns.DeleteMany(ctx, bson.D{{Key: "at", Value: bson.D{{Key: "$lt", Value: time.Now().Add(-TxnRetention)}}}})
		if res != nil {
			n = res.DeletedCount
		}
		return err
	})
	return int(n), s.storeErr(ctx, opCleanup, err)
}
