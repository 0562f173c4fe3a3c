// Package mongoerr is the one list of the MongoDB error codes lockgate
// answers with or reads in a server's replies, and the command error that
// every reply lockgate builds itself is made from.
//
// It imports nothing of lockgate, so every package can use it: wire builds
// error replies from an *Error, the guard's refusals carry a Code, and
// docs/ERRORS.md has a row for every code in Answered (a test checks). It
// must never hold a code that drivers retry on their own among the
// refusals: a refused write would be sent again behind the caller's back.
package mongoerr

import (
	"fmt"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
)

// Code is a MongoDB error code, with its codeName from Name.
type Code int32

// The codes, numbered as the server numbers them
// (src/mongo/base/error_codes.yml), plus lockgate's LockBusy and
// LockFailed, which reuse the server's numbers for the same meaning.
const (
	BadValue             Code = 2
	HostUnreachable      Code = 6
	FailedToParse        Code = 9
	Unauthorized         Code = 13
	TypeMismatch         Code = 14
	AuthenticationFailed Code = 18
	LockTimeout          Code = 24
	NamespaceNotFound    Code = 26
	IndexNotFound        Code = 27
	LockBusy             Code = 46
	MaxTimeMSExpired     Code = 50
	CommandNotFound      Code = 59
	InvalidNamespace     Code = 73
	IndexOptionsConflict Code = 85
	LockFailed           Code = 107
	DuplicateKey         Code = 11000
	IDLUnknownField      Code = 40415
)

// Name is the codeName the server sends with c, "" for a code not listed
// here.
func (c Code) Name() string {
	switch c {
	case BadValue:
		return "BadValue"
	case HostUnreachable:
		return "HostUnreachable"
	case FailedToParse:
		return "FailedToParse"
	case Unauthorized:
		return "Unauthorized"
	case TypeMismatch:
		return "TypeMismatch"
	case AuthenticationFailed:
		return "AuthenticationFailed"
	case LockTimeout:
		return "LockTimeout"
	case NamespaceNotFound:
		return "NamespaceNotFound"
	case IndexNotFound:
		return "IndexNotFound"
	case LockBusy:
		return "LockBusy"
	case MaxTimeMSExpired:
		return "MaxTimeMSExpired"
	case CommandNotFound:
		return "CommandNotFound"
	case InvalidNamespace:
		return "InvalidNamespace"
	case IndexOptionsConflict:
		return "IndexOptionsConflict"
	case LockFailed:
		return "LockFailed"
	case DuplicateKey:
		return "DuplicateKey"
	case IDLUnknownField:
		return "IDLUnknownField"
	}
	return ""
}

func (c Code) String() string { return fmt.Sprintf("%d %s", int32(c), c.Name()) }

// Retryable reports whether drivers retry a command that failed with c on
// their own (the retryable reads and writes specifications' lists).
func (c Code) Retryable() bool {
	switch c {
	case HostUnreachable, 7, 89, 91, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436:
		return true
	}
	return false
}

// Answered lists the codes lockgate answers with itself, each with a row
// in docs/ERRORS.md. The others (AuthenticationFailed, IndexNotFound,
// MaxTimeMSExpired, CommandNotFound, IndexOptionsConflict) are only read
// in a server's replies.
func Answered() []Code {
	return []Code{BadValue, HostUnreachable, FailedToParse, Unauthorized, TypeMismatch, LockTimeout,
		NamespaceNotFound, InvalidNamespace, LockBusy, LockFailed, DuplicateKey, IDLUnknownField}
}

// Error is a command error: what the server answers a failed command with,
// {ok: 0, errmsg, code, codeName}.
type Error struct {
	Code Code
	Msg  string
}

// New is the command error code with the message format makes.
func New(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

func (e *Error) Error() string { return e.Msg }

// Document renders e as a command reply body: {ok: 0.0, errmsg, code,
// codeName} followed by extra.
func (e *Error) Document(extra ...bsoncore.Element) bsoncore.Document {
	idx, doc := bsoncore.AppendDocumentStart(nil)
	doc = bsoncore.AppendDoubleElement(doc, "ok", 0)
	doc = bsoncore.AppendStringElement(doc, "errmsg", e.Msg)
	doc = e.AppendCode(doc)
	for _, x := range extra {
		doc = append(doc, x...)
	}
	doc, _ = bsoncore.AppendDocumentEnd(doc, idx)
	return doc
}

// WriteError renders e as the write error of the statement at index in a
// write command's writeErrors array: {index, code, codeName, errmsg}
// followed by extra. A write lockgate refuses or answers itself in part
// reports its statements the way the server reports a statement that
// failed, so drivers raise the same exception for both.
func (e *Error) WriteError(index int, extra ...bsoncore.Element) bsoncore.Document {
	idx, doc := bsoncore.AppendDocumentStart(nil)
	doc = bsoncore.AppendInt32Element(doc, "index", int32(index))
	doc = e.AppendCode(doc)
	doc = bsoncore.AppendStringElement(doc, "errmsg", e.Msg)
	for _, x := range extra {
		doc = append(doc, x...)
	}
	doc, _ = bsoncore.AppendDocumentEnd(doc, idx)
	return doc
}

// AppendCode appends e's code and codeName elements to dst: the part of
// every form of error (a command reply, an OP_REPLY query failure, a write
// error) that names it.
func (e *Error) AppendCode(dst []byte) []byte {
	dst = bsoncore.AppendInt32Element(dst, "code", int32(e.Code))
	return bsoncore.AppendStringElement(dst, "codeName", e.Code.Name())
}
