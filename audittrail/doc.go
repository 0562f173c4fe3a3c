// Package audittrail keeps lockgate's tamper-evident audit trail: one
// record per decision on an audited or enforced namespace, per lock
// command and per lifecycle event (start, stop, policy reload), chained
// by SHA-256 and sealed by signed checkpoints, so that a verifier holding
// the checkpoint key can tell whether any record was deleted, altered,
// inserted or reordered (docs/AUDIT.md).
//
// # Records and the chain
//
// Records are numbered from 1 per trail (one directory, one lockgate
// instance; a lock file keeps a second writer out). Each carries its
// sequence number, its time, the instance id and the hash of the record
// before it; its own hash is SHA-256 over its canonical encoding
// (canonical, in record.go): a fixed version tag, then every field in a
// fixed order, each as a 4-byte big-endian length and its bytes. The
// encoding is not the JSON: any language can recompute it from the
// parsed fields, and the JSON line must in addition be exactly the one
// the writer produced (Marshal of the parsed record), so that no byte of
// a line can change unnoticed.
//
// A checkpoint is a record too (kind "checkpoint"), in the chain, whose
// mac is the signature, under the key named by its keyId (HMAC-SHA-256,
// or Ed25519, which a holder of the public key alone can check), of its
// own canonical encoding (mac and hash empty). As its prev is the hash of the
// record before it, a valid checkpoint vouches for every record up to
// it. One follows every CheckpointEvery records or CheckpointInterval,
// whichever comes first, and one ends every segment and every clean
// stop. The latest checkpoint is also written, atomically, to the file
// head.json: the verifier checks that the trail reaches it, which is how
// a deleted last segment is found.
//
// # What the package must never do
//
// Append never blocks and never fails the caller: in bestEffort mode a
// record that finds the buffer full is dropped, counted, and the trail
// itself says so (a "dropped" record with the count) at the next write.
// The buffer is a ring of fixed slots allocated at Open (ring.go): the
// caller's part is copying its event into a slot, with no allocation,
// encoding or hashing; the writer goroutine does the rest, in batches,
// without an allocation per record (arena.go).
// Commit is the only call that waits for durability (mode required). The
// package never rewrites or deletes a record once written: rotation
// starts a new segment, recovery after a crash starts a new segment
// linked to the last complete record of the old one. (What it removes is
// only what a failed batch left behind, which never entered the chain: a
// segment cut back to its size before, the documents of a failed
// insertMany.) It holds no
// package-level state: clock, logger and metrics are passed in.
//
// # Files
//
// A trail directory holds segments named trail-<first seq, 20 digits>.jsonl
// (JSON lines), head.json (the latest checkpoint) and LOCK. Durability:
// each batch is written with one write; segments are fsynced at every
// checkpoint, at rotation and at stop (bestEffort: a machine crash may
// lose the records since the last checkpoint, a process crash loses only
// what was still in the buffer); in required mode every batch that holds
// a committed record is fsynced before Commit returns.
//
// # The collection
//
// Options.Collection adds (or, without Dir, is) a sink of one document
// per record in a MongoDB collection (collection.go, bson.go): the same
// records and chain, a unique index on (instance, seq), each instance's
// latest checkpoint in the collection named with HeadSuffix. A batch is
// one ordered insertMany, acknowledged by a majority and journaled when it
// holds a checkpoint or a committed record. With both sinks a batch goes
// to the files first, and Open levels a sink left a batch behind by a
// crash from the other.
package audittrail
