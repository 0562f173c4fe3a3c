package config

import "strings"

// RecordIDPlaceholder is where a lockCollection recordId template puts
// the document's _id.
const RecordIDPlaceholder = "{_id}"

// validateLockCollection checks lockCollection's own keys under key.
func (c *Config) validateLockCollection(v *validator, key string, s *Scheme) {
	if s.RecordID != "" {
		switch n := strings.Count(s.RecordID, RecordIDPlaceholder); {
		case n != 1:
			v.add(key+".recordId", "must contain %s exactly once, got %q", RecordIDPlaceholder, s.RecordID)
		case strings.ContainsAny(strings.Replace(s.RecordID, RecordIDPlaceholder, "", 1), "{}\x00"):
			v.add(key+".recordId", "must contain no braces or NUL besides %s, got %q", RecordIDPlaceholder, s.RecordID)
		}
	}
	if s.ExpiresField != "" {
		if s.TsField != "" {
			v.add(key+".tsField", "is not used with expiresField %q (a record carries its expiry, not its refresh time); remove one", s.ExpiresField)
		}
		if s.LeaseMS != 0 {
			v.add(key+".leaseMS", "is not used with expiresField %q: a record's lease ends at its expiry date; remove it", s.ExpiresField)
		}
	}
}
