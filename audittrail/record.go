package audittrail

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strconv"
	"time"

	"github.com/lockgate/lockgate/docid"
)

// Kind is what a record is about.
type Kind string

const (
	// KindStart: the trail was opened (a lockgate started); Detail says
	// so when the previous segment ended with a torn line (a crash).
	KindStart Kind = "start"
	// KindStop: the trail was closed cleanly.
	KindStop Kind = "stop"
	// KindDecision: a write on an audited or enforced namespace and what
	// was decided (Verdict: allow, reject, wouldReject).
	KindDecision Kind = "decision"
	// KindLock: a lock operation (Op: acquire, renew, release,
	// releaseAll, releaseSession, forceRelease) and its outcome (Verdict:
	// ok or failed).
	KindLock Kind = "lock"
	// KindReload: a policy was applied; Policy is its version (hash).
	KindReload Kind = "reload"
	// KindDropped: Count records were dropped before this one because
	// the buffer was full (bestEffort mode).
	KindDropped Kind = "dropped"
	// KindCheckpoint: a signed checkpoint over every record before it.
	KindCheckpoint Kind = "checkpoint"
)

// Verdicts of decision records, as the decision log names them.
const (
	VerdictAllow       = "allow"
	VerdictReject      = "reject"
	VerdictWouldReject = "wouldReject"
	VerdictOK          = "ok"
	VerdictFailed      = "failed"
)

// Event is what a producer hands to the trail: the record without its
// place in the chain. It is passed by value and must not be changed
// after Append (the slices are read later, by the writer).
type Event struct {
	Kind Kind
	// Time is when it happened; zero means when it was appended.
	Time time.Time
	NS   string
	// IDs are the documents concerned; formatted by the writer, off the
	// caller's path.
	IDs []docid.ID
	// Op is the command (insert, update, findAndModify, ...) of a
	// decision, or the lock operation of a lock record.
	Op      string
	Mode    string
	Verdict string
	Reason  string
	App     string
	User    string
	Client  string
	// Holder is the holder tag: the first 4 bytes (hex) of the keyed
	// owner hash the lock store keeps for (user, session id), as the lock
	// view shows it; never the session id.
	Holder string
	// HolderTag, when Holder is empty, is the holder tag's bytes, which
	// the writer writes in hex: the request path then makes no string.
	HolderTag Tag
	// Tokens are the fencing tokens of the locks the write ran under, or
	// that a lock operation granted, where known (in IDs' order).
	Tokens []int64
	// Policy is the policy version in force (its hash).
	Policy string
	Detail string
	// Count is the number of records a KindDropped record stands for.
	Count uint64
}

// Tag is a holder tag's bytes: at most the first 4 of a keyed owner
// hash, kept by value.
type Tag struct {
	b [4]byte
	n uint8
}

// TagOf is the tag of an owner hash (lockstore.SessionPrefix's bytes).
func TagOf(owner []byte) Tag {
	var t Tag
	t.n = uint8(copy(t.b[:], owner))
	return t
}

// String is the tag in hex, as Record.Holder shows it.
func (t Tag) String() string { return hex.EncodeToString(t.b[:t.n]) }

// HolderString is the holder tag the event's record will carry.
func (ev *Event) HolderString() string {
	if ev.Holder != "" {
		return ev.Holder
	}
	return ev.HolderTag.String()
}

// Record is one line of the trail. Field order here is the JSON order;
// the hash is over canonical, not over the JSON.
type Record struct {
	Seq      uint64   `json:"seq"`
	Time     string   `json:"time"`
	Instance string   `json:"instance"`
	Prev     string   `json:"prev"`
	Kind     Kind     `json:"kind"`
	NS       string   `json:"ns,omitempty"`
	IDs      []string `json:"ids,omitempty"`
	Op       string   `json:"op,omitempty"`
	Mode     string   `json:"mode,omitempty"`
	Verdict  string   `json:"verdict,omitempty"`
	Reason   string   `json:"reason,omitempty"`
	App      string   `json:"app,omitempty"`
	User     string   `json:"user,omitempty"`
	Client   string   `json:"client,omitempty"`
	Holder   string   `json:"holder,omitempty"`
	Tokens   []int64  `json:"tokens,omitempty"`
	Policy   string   `json:"policy,omitempty"`
	Detail   string   `json:"detail,omitempty"`
	Count    uint64   `json:"count,omitempty"`
	KeyID    string   `json:"keyId,omitempty"`
	MAC      string   `json:"mac,omitempty"`
	Hash     string   `json:"hash"`
}

// TimeFormat is the layout of Record.Time (UTC, nanoseconds).
const TimeFormat = "2006-01-02T15:04:05.000000000Z"

// formatTime is t in TimeFormat.
func formatTime(t time.Time) string {
	var b [len(TimeFormat)]byte
	return string(appendTime(b[:0], t))
}

// appendTime appends t in TimeFormat, written digit by digit: the writer
// formats every record's time, and the layout interpreter of
// time.Format was a tenth of its work (TestFormatTime holds the two
// equal). Years outside 0-9999 take time.Format.
func appendTime(dst []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.AppendFormat(dst, TimeFormat)
	}
	hour, min, sec := t.Clock()
	var b [len(TimeFormat)]byte
	put := func(at, width, v int) {
		for i := at + width - 1; i >= at; i-- {
			b[i] = byte('0' + v%10)
			v /= 10
		}
	}
	put(0, 4, year)
	b[4] = '-'
	put(5, 2, int(month))
	b[7] = '-'
	put(8, 2, day)
	b[10] = 'T'
	put(11, 2, hour)
	b[13] = ':'
	put(14, 2, min)
	b[16] = ':'
	put(17, 2, sec)
	b[19] = '.'
	put(20, 9, t.Nanosecond())
	b[29] = 'Z'
	return append(dst, b[:]...)
}

// canonTag starts every canonical encoding; a new encoding gets a new tag.
const canonTag = "lockgate-audit/1"

// canonical is the encoding a record's hash and a checkpoint's mac are
// computed over: canonTag, then every field below in this order, each a
// 4-byte big-endian length and its bytes; a list is its element count
// (4 bytes) and then each element so. Numbers are decimal strings. Hash
// is never included; MAC is included only when withMAC (the hash covers
// the mac, the mac does not cover itself).
func (r *Record) canonical(buf []byte, withMAC bool) []byte {
	str := func(s string) {
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(s)))
		buf = append(buf, s...)
	}
	num := func(n uint64) {
		var d [20]byte
		str(string(strconv.AppendUint(d[:0], n, 10)))
	}
	str(canonTag)
	num(r.Seq)
	str(r.Time)
	str(r.Instance)
	str(r.Prev)
	str(string(r.Kind))
	str(r.NS)
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(r.IDs)))
	for _, id := range r.IDs {
		str(id)
	}
	str(r.Op)
	str(r.Mode)
	str(r.Verdict)
	str(r.Reason)
	str(r.App)
	str(r.User)
	str(r.Client)
	str(r.Holder)
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(r.Tokens)))
	for _, t := range r.Tokens {
		var d [20]byte
		str(string(strconv.AppendInt(d[:0], t, 10)))
	}
	str(r.Policy)
	str(r.Detail)
	num(r.Count)
	str(r.KeyID)
	if withMAC {
		str(r.MAC)
	} else {
		str("")
	}
	return buf
}

// computeHash is the record's hash: hex SHA-256 of its canonical encoding.
func (r *Record) computeHash(scratch []byte) (string, []byte) {
	var h [2 * sha256.Size]byte
	scratch = r.hashInto(&h, scratch)
	return string(h[:]), scratch
}

// hashInto writes the record's hash into h, using scratch for the
// encoding, and returns scratch.
func (r *Record) hashInto(h *[2 * sha256.Size]byte, scratch []byte) []byte {
	scratch = r.canonical(scratch[:0], true)
	sum := sha256.Sum256(scratch)
	hex.Encode(h[:], sum[:])
	return scratch
}

// marshalLine is a record's line: its JSON (as encoding/json writes it)
// and a newline. Verify holds every line to exactly this form.
func marshalLine(buf []byte, r *Record) ([]byte, error) {
	return append(appendJSON(buf, r), '\n'), nil
}
