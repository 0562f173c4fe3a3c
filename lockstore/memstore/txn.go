package memstore

import (
	"context"
	"slices"

	"github.com/lockgate/lockgate/lockstore"
)

// txnKey names a transaction: its owner session and txnNumber.
type txnKey struct {
	session string
	txn     int64
}

// RecordTxn is lockstore.Store.RecordTxn.
func (s *Store) RecordTxn(_ context.Context, session []byte, txn int64, needs []lockstore.TxnNeed) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	if s.txns == nil {
		s.txns = map[txnKey][]lockstore.TxnNeed{}
	}
	k := txnKey{string(session), txn}
	for _, n := range needs {
		n.Held, n.Unlocked = slices.Clone(n.Held), slices.Clone(n.Unlocked)
		s.txns[k] = append(s.txns[k], n)
	}
	return nil
}

// TxnNeeds is lockstore.Store.TxnNeeds.
func (s *Store) TxnNeeds(_ context.Context, session []byte, txn int64) ([]lockstore.TxnNeed, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return nil, s.fail
	}
	return slices.Clone(s.txns[txnKey{string(session), txn}]), nil
}

// EndTxn is lockstore.Store.EndTxn.
func (s *Store) EndTxn(_ context.Context, session []byte, txn int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	delete(s.txns, txnKey{string(session), txn})
	return nil
}
