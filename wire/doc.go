// Package wire is the MongoDB wire protocol codec of lockgate: framing,
// opcodes, OP_MSG sections, OP_COMPRESSED, and zero-copy bsoncore views of
// the documents, plus the few builders the proxy needs for its own replies.
//
// It is pure: it knows frames, opcodes, sections and BSON, and nothing of
// policy, locks, namespaces that matter, connections or logging. It must
// never decide whether a message is allowed, never perform I/O beyond the
// io.Reader handed to ReadMessage, and never keep package-level mutable
// state. The driver's experimental x/ packages stay behind this package;
// bsoncore.Document is the one type of theirs in the API.
//
// Strictness. Every decoder checks each length before using it, allocates
// nothing a sender merely claims (message lengths are bounded by Limits
// before a buffer is taken, and a message above 1 MiB is read into a buffer
// that grows with the bytes that actually arrive; an uncompressed size the
// payload cannot reach at the format's maximum ratio is refused before it
// is allocated, and decompression never produces more than the declared
// size plus one byte), and accounts for every byte: trailing bytes, unknown
// required OP_MSG flags, unknown section kinds, nested compression, a
// checksum mismatch and invalid BSON are all errors wrapping ErrMalformed
// (sizes over a limit wrap ErrTooLarge) with a reason fit for a log line.
// Decoding never panics on any input.
//
// Buffer ownership. ReadMessage returns a RawMessage whose Bytes live in a
// BufferPool buffer until Release; Parse does not copy, so a parsed Message
// and every document, Sequence and Command view derived from it are valid
// only until that Release. Strings (command name, $db, namespaces) are
// copies and may be kept. OP_COMPRESSED is the exception: its Inner message
// lives in a buffer of its own, owned by the garbage collector.
//
// Concurrency. BufferPool is safe for concurrent use. Messages and Commands
// are immutable once returned and may be read from several goroutines; a
// RawMessage must be released exactly once, by its owner (a second Release
// panics rather than let two readers share a buffer).
package wire
