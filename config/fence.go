package config

import (
	"strings"
	"unicode/utf8"
)

// validateFence checks a rule's fence and fenceField keys.
func validateFence(v *validator, key string, r NamespaceRule) {
	if r.Fence != "" && !r.Fence.Valid() {
		v.add(key+".fence", "must be one of %s, got %q", list(FenceModes()), r.Fence)
	}
	if r.FenceField == "" {
		return
	}
	if r.Fence != FenceDocument {
		v.add(key+".fenceField", "is only used with fence: document")
	}
	// A top-level field the server stores as is: no path, no operator,
	// not the _id the fence is keyed by.
	f := r.FenceField
	if f == "_id" || strings.HasPrefix(f, "$") || strings.ContainsAny(f, ".\x00") || !utf8.ValidString(f) || len(f) > 128 {
		v.add(key+".fenceField", "must be a top-level field name (not _id, no '.', not starting with '$', at most 128 bytes), got %q", f)
	}
}
