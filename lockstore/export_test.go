package lockstore

import "context"

// EmbeddedURI is the embedded FerretDB of the package's tests, for the
// contract tests of package lockstore_test.
func EmbeddedURI() string { return upstreamURI }

// CleanupTxns runs the janitor's deletion of transaction records past
// TxnRetention.
func (s *Store) CleanupTxns(ctx context.Context) (int, error) { return s.cleanupTxns(ctx) }
