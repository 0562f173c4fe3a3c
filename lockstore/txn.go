package lockstore

import (
	"context"
	"fmt"
	"time"

	"github.com/lockgate/lockgate/docid"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/bson/primitive"
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

// A transaction's record is a set of documents, one per statement allowed,
// each inserted once and never changed: an insert is atomic on every
// server (FerretDB's updates are not), so two proxies recording statements
// of one transaction at once cannot lose either's.
type txnDoc struct {
	Session primitive.Binary `bson:"s"`
	Txn     int64            `bson:"n"`
	At      time.Time        `bson:"at"`
	Needs   []txnNeedDoc     `bson:"needs"`
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
	err := s.rt(ctx, opTxn, func(ctx context.Context) error {
		_, err := s.txns.InsertOne(ctx, d)
		return err
	})
	return s.storeErr(ctx, opTxn, err)
}

// TxnNeeds returns everything recorded for transaction txn of session
// through any proxy; none means none of its statements needed anything.
func (s *Store) TxnNeeds(ctx context.Context, session []byte, txn int64) ([]TxnNeed, error) {
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	var docs []txnDoc
	err := s.rt(ctx, opTxn, func(ctx context.Context) error {
		cur, err := s.txns.Find(ctx, bson.D{{Key: "s", Value: primitive.Binary{Data: session}}, {Key: "n", Value: txn}})
		if err != nil {
			return err
		}
		return cur.All(ctx, &docs)
	})
	if err != nil {
		return nil, s.storeErr(ctx, opTxn, err)
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
// still commit it through another router.
func (s *Store) EndTxn(ctx context.Context, session []byte, txn int64) error {
	if err := s.ready(ctx); err != nil {
		return err
	}
	err := s.rt(ctx, opTxn, func(ctx context.Context) error {
		_, err := s.txns.DeleteMany(ctx, bson.D{{Key: "s", Value: primitive.Binary{Data: session}}, {Key: "n", Value: txn}})
		return err
	})
	return s.storeErr(ctx, opTxn, err)
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
