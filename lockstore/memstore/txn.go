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

// txnRecord is what a transaction's statements recorded, and whether its
// commit has begun.
type txnRecord struct {
	needs  []lockstore.TxnNeed
	sealed bool
}

// RecordTxn is lockstore.Store.RecordTxn.
func (s *Store) RecordTxn(_ context.Context, session []byte, txn int64, needs []lockstore.TxnNeed) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	if s.txns == nil {
		s.txns = map[txnKey]*txnRecord{}
	}
	k := txnKey{string(session), txn}
	r := s.txns[k]
	if r == nil {
		r = &txnRecord{}
		s.txns[k] = r
	}
	if r.sealed {
		return lockstore.ErrTxnCommitting
	}
	for _, n := range needs {
		n.Held, n.Unlocked = slices.Clone(n.Held), slices.Clone(n.Unlocked)
		r.needs = append(r.needs, n)
	}
	return nil
}

// BeginCommit is lockstore.Store.BeginCommit.
func (s *Store) BeginCommit(_ context.Context, session []byte, txn int64) ([]lockstore.TxnNeed, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return nil, s.fail
	}
	if s.txns == nil {
		s.txns = map[txnKey]*txnRecord{}
	}
	k := txnKey{string(session), txn}
	r := s.txns[k]
	if r == nil {
		r = &txnRecord{}
		s.txns[k] = r
	}
	r.sealed = true
	return slices.Clone(r.needs), nil
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
