package lockstore

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/namespace"
)

// maxPlainKey is the longest canonical key kept readable (hex) in a record
// _id; longer keys are replaced by their SHA-256.
const maxPlainKey = 256

const (
	keySeparator  = "/"
	hashKeyPrefix = "#"
)

// recordID is the _id of the lock record of (ns, canonical key). The hex part
// never contains the separator, so the last "/" splits the two parts
// unambiguously and the mapping is injective.
func recordID(n namespace.Namespace, key string) string {
	ns := n.String()
	if len(key) > maxPlainKey {
		sum := sha256.Sum256([]byte(key))
		return ns + keySeparator + hashKeyPrefix + hex.EncodeToString(sum[:])
	}
	// One allocation: every enforced write makes one per id.
	var b strings.Builder
	b.Grow(len(ns) + len(keySeparator) + hex.EncodedLen(len(key)))
	b.WriteString(ns)
	b.WriteString(keySeparator)
	const digits = "0123456789abcdef"
	for i := 0; i < len(key); i++ {
		b.WriteByte(digits[key[i]>>4])
		b.WriteByte(digits[key[i]&0x0f])
	}
	return b.String()
}

// keysIndexed is keys (the distinct keys of ids in request order, ns
// validated) plus, when index is set and there are several ids, the index
// of each id's key (nil: id i is key i); each distinct id's record id is
// made once.
func keysIndexed(ns namespace.Namespace, ids []docid.ID, index bool) ([]lockKey, []int, error) {
	if ns.IsZero() || strings.IndexByte(ns.String(), 0) >= 0 {
		return nil, nil, fmt.Errorf("%w: bad namespace %q", ErrInvalidArgument, ns)
	}
	if len(ids) == 0 {
		return nil, nil, fmt.Errorf("%w: no ids", ErrInvalidArgument)
	}
	out := make([]lockKey, 0, len(ids))
	var idx []int
	if index && len(ids) > 1 {
		idx = make([]int, len(ids))
	}
	// A scan finds the duplicates of a few ids faster than a map.
	var seen map[string]int
	if len(ids) > 8 {
		seen = make(map[string]int, len(ids))
	}
	for i, id := range ids {
		if id.IsZero() {
			return nil, nil, fmt.Errorf("%w: missing _id value", ErrInvalidID)
		}
		at := -1
		if seen != nil {
			if j, dup := seen[id.Key()]; dup {
				at = j
			} else {
				seen[id.Key()] = len(out)
			}
		} else {
			for j := range out {
				if out[j].id.Equal(id) {
					at = j
					break
				}
			}
		}
		if at < 0 {
			at = len(out)
			out = append(out, lockKey{rid: recordID(ns, id.Key()), id: id})
		}
		if idx != nil {
			idx[i] = at
		}
	}
	return out, idx, nil
}
