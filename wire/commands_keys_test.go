package wire

import "testing"

// TestWriteFormsHaveTheirKeys: every command whose statements the editor
// and the classifier read by the table's keys has them, so that a command
// added with a write form but without its keys fails here, not as a
// refusal of every such write.
func TestWriteFormsHaveTheirKeys(t *testing.T) {
	for _, c := range Commands() {
		switch c.Writes {
		case WritesInsert:
			if c.Statements == "" {
				t.Errorf("%s: no statement list", c.Name)
			}
		case WritesUpdate, WritesDelete:
			if c.Statements == "" || c.Statement.Filter == "" {
				t.Errorf("%s: no statement list or filter key", c.Name)
			}
		case WritesFindAndModify:
			if c.Statement.Filter == "" || c.Statement.Update == "" || c.Statement.Remove == "" {
				t.Errorf("%s: no filter, update or remove key", c.Name)
			}
		case WritesBulk:
			if c.Statements == "" || c.Namespaces == "" || c.NamespaceKey == "" || len(c.Ops) == 0 {
				t.Errorf("%s: no ops, nsInfo or op kinds", c.Name)
			}
		case WritesRename:
			if len(c.FullNamespaces) != 2 {
				t.Errorf("%s: want its source and target fields, have %v", c.Name, c.FullNamespaces)
			}
		}
		if c.Role == RoleLock && (c.Lock == LockNone || len(c.Args) == 0) {
			t.Errorf("%s: a lock command without its operation or arguments", c.Name)
		}
		if c.Role == RoleAuth && c.Auth == AuthNone {
			t.Errorf("%s: an authentication command without its step", c.Name)
		}
	}
}
