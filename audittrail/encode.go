package audittrail

import (
	"strconv"
	"unicode/utf8"
)

// safeFields says which of a record's strings are known to hold only
// bytes encoding/json writes as they are (jsonSafe): appendJSON copies
// those without looking at each byte. The writer knows it of the times
// and hashes it makes, which are 160 of a decision record's some 400
// bytes; scanning them was a fifth of the line's cost.
type safeFields uint16

const (
	safeTime safeFields = 1 << iota
	safeInstance
	safePrev
	safeHash
	// The event's strings the writer found safe before: the same
	// string (same bytes in memory) recurs in record after record.
	safeKind
	safeNS
	safeOp
	safeMode
	safeVerdict
	safeApp
	safeUser
	safeClient
	safePolicy
)

// appendJSON appends r as encoding/json marshals it (the same bytes:
// TestEncoderMatchesEncodingJSON), without reflection or allocation: the
// writer encodes every record, and json.Marshal was half its time.
func appendJSON(b []byte, r *Record) []byte { return appendJSONSafe(b, r, 0) }

// appendJSONSafe is appendJSON for a record whose strings named in safe
// hold only jsonSafe bytes (TestAppendJSONSafe): the caller's promise.
func appendJSONSafe(b []byte, r *Record, safe safeFields) []byte {
	b = append(b, `{"seq":`...)
	b = strconv.AppendUint(b, r.Seq, 10)
	b = appendSafeField(b, `,"time":"`, r.Time, safe&safeTime != 0)
	b = appendSafeField(b, `,"instance":"`, r.Instance, safe&safeInstance != 0)
	b = appendSafeField(b, `,"prev":"`, r.Prev, safe&safePrev != 0)
	b = appendSafeOmitField(b, `,"kind":"`, string(r.Kind), false, safe&safeKind != 0)
	b = appendSafeOmitField(b, `,"ns":"`, r.NS, true, safe&safeNS != 0)
	if len(r.IDs) > 0 {
		b = append(b, `,"ids":[`...)
		for i, id := range r.IDs {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, id)
		}
		b = append(b, ']')
	}
	b = appendSafeOmitField(b, `,"op":"`, r.Op, true, safe&safeOp != 0)
	b = appendSafeOmitField(b, `,"mode":"`, r.Mode, true, safe&safeMode != 0)
	b = appendSafeOmitField(b, `,"verdict":"`, r.Verdict, true, safe&safeVerdict != 0)
	b = appendField(b, "reason", r.Reason, true)
	b = appendSafeOmitField(b, `,"app":"`, r.App, true, safe&safeApp != 0)
	b = appendSafeOmitField(b, `,"user":"`, r.User, true, safe&safeUser != 0)
	b = appendSafeOmitField(b, `,"client":"`, r.Client, true, safe&safeClient != 0)
	b = appendField(b, "holder", r.Holder, true)
	if len(r.Tokens) > 0 {
		b = append(b, `,"tokens":[`...)
		for i, t := range r.Tokens {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, t, 10)
		}
		b = append(b, ']')
	}
	b = appendSafeOmitField(b, `,"policy":"`, r.Policy, true, safe&safePolicy != 0)
	b = appendField(b, "detail", r.Detail, true)
	if r.Count != 0 {
		b = append(b, `,"count":`...)
		b = strconv.AppendUint(b, r.Count, 10)
	}
	b = appendField(b, "keyId", r.KeyID, true)
	b = appendField(b, "mac", r.MAC, true)
	b = appendSafeField(b, `,"hash":"`, r.Hash, safe&safeHash != 0)
	return append(b, '}')
}

// appendSafeField appends a field that is never omitted: head is its
// name, the colon and the opening quote; v is copied as it is when safe.
func appendSafeField(b []byte, head, v string, safe bool) []byte {
	if !safe {
		return appendString(append(b, head[:len(head)-1]...), v)
	}
	b = append(b, head...)
	b = append(b, v...)
	return append(b, '"')
}

// appendSafeOmitField is appendSafeField for a field that is left out
// when empty, if omitEmpty.
func appendSafeOmitField(b []byte, head, v string, omitEmpty, safe bool) []byte {
	if omitEmpty && v == "" {
		return b
	}
	return appendSafeField(b, head, v, safe)
}

// isSafe reports whether every byte of s is jsonSafe: appendString
// would copy s as it is.
func isSafe(s string) bool {
	for i := safePrefix(s); i < len(s); i++ {
		if c := s[i]; c >= utf8.RuneSelf || !jsonSafe[c] {
			return false
		}
	}
	return true
}

func appendField(b []byte, name, v string, omitEmpty bool) []byte {
	if omitEmpty && v == "" {
		return b
	}
	b = append(b, ',', '"')
	b = append(b, name...)
	b = append(b, '"', ':')
	return appendString(b, v)
}

const hexDigits = "0123456789abcdef"

// safePrefix is the length of a prefix of s, a multiple of 8, whose
// bytes are all jsonSafe, found 8 bytes at a time: most of a record's
// bytes need no escape, and the table's byte-by-byte loop was the
// largest part of the JSON's cost. A word has a byte to escape when one
// is below 0x20, at or above 0x80, or one of " \ < > & (the classic
// has-less and has-zero-byte tests, exact for "any byte").
func safePrefix(s string) int {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	zero := func(x uint64) uint64 { return (x - ones) & ^x & highs }
	i := 0
	for ; i+8 <= len(s); i += 8 {
		x := uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
			uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56
		bad := (x-0x20*ones)&^x&highs | x&highs |
			zero(x^('"'*ones)) | zero(x^('\\'*ones)) | zero(x^('<'*ones)) | zero(x^('>'*ones)) | zero(x^('&'*ones))
		if bad != 0 {
			break
		}
	}
	return i
}

// jsonSafe marks the ASCII bytes encoding/json writes as they are; one
// lookup per byte instead of six comparisons (most of a record's bytes
// are hex digits). Never written after initialisation.
var jsonSafe = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return t
}()

// appendString quotes s as encoding/json does with HTML escaping on (its
// default): <, > and & as \u00XX, control characters escaped, invalid
// UTF-8 as \ufffd, U+2028 and U+2029 escaped.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	i := safePrefix(s)
	for i < len(s) {
		if c := s[i]; c < utf8.RuneSelf {
			if jsonSafe[c] {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
