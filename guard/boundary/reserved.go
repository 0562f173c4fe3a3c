package boundary

import (
	"strings"
	"unicode/utf8"

	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/wire"
	"golang.org/x/text/unicode/norm"
)

// Reserved names the lock store's own namespaces, which no client request
// through the proxy may read or write in any form (docs/SECURITY.md): a
// reader would learn who holds what, a writer could erase or forge locks.
// Operators see locks through the admin endpoints instead.
type Reserved struct {
	// DB is the lock store's database.
	DB string
	// Collections are its collections in DB: the lock records and the
	// claims beside them.
	Collections []string
}

// ReservedFor returns the namespaces of a lock store configured with
// database db and lock collection coll.
func ReservedFor(db, coll string) Reserved {
	return Reserved{DB: db, Collections: []string{coll, coll + lockstore.ClaimsSuffix, coll + lockstore.TxnsSuffix, coll + lockstore.InstancesSuffix, coll + lockstore.WakeSuffix}}
}

// dbMatches compares database names as an upstream that folds case
// would: MongoDB refuses a second database that differs only by case, and
// FerretDB's SQLite backend folds table names, so "LockGate" must be
// treated as "lockgate".
func (r Reserved) dbMatches(db string) bool {
	return db == policy.UnknownNS || sameName(db, r.DB)
}

// touches reports whether (db, coll) is, or may be, a reserved namespace;
// coll "" is the whole database.
func (r Reserved) touches(db, coll, command string) bool {
	if r.DB == "" || !r.dbMatches(db) {
		return false
	}
	if coll == policy.UnknownNS {
		return true
	}
	if coll == "" {
		// Database-level commands that name no collection and reveal
		// nothing but collection names may run on the lock store's
		// database, which may hold application data too; everything else
		// that acts on the database as a whole is refused there.
		spec := wire.LookupCommand(command)
		return spec == nil || spec.Scope != wire.ScopeNoCollection
	}
	for _, c := range r.Collections {
		if sameName(coll, c) {
			return true
		}
	}
	return false
}

// sameName compares names case-insensitively and, for non-ASCII names,
// after compatibility normalization, so that neither "LOCKS" nor a
// full-width "ｌｏｃｋｓ" slips past an upstream that would map it to the
// same storage. ASCII names, nearly all traffic, take the fast path.
func sameName(a, b string) bool {
	if strings.EqualFold(a, b) {
		return true
	}
	if isASCII(a) {
		return false
	}
	return sameNormalized(a, b)
}

// sameNormalized is sameName's comparison of a name that is not ASCII.
// Apart and not inlined: every write's names are compared by sameName,
// inlined several times over (isSessionsCollection), and this rare
// branch's two normalizations, in each copy, spread the usual ASCII
// names' code over more cache lines.
//
//go:noinline
func sameNormalized(a, b string) bool {
	return strings.EqualFold(norm.NFKC.String(a), norm.NFKC.String(b))
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}
