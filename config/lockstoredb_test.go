package config

import (
	"strings"
	"testing"
)

// TestLockStoreNotInTheServersDatabases: the lock store may not live in
// local (not replicated: locks would diverge across a failover), admin or
// config (the server's; sealing them would refuse their commands), in any
// case.
func TestLockStoreNotInTheServersDatabases(t *testing.T) {
	for _, db := range []string{"admin", "config", "local", "Local", "ADMIN"} {
		c := Default()
		c.Lockstore.Database = db
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), "lockstore.database") {
			t.Errorf("lockstore.database %q: %v, want it refused", db, err)
		}
	}
	c := Default()
	c.Lockstore.Database = "ops"
	if err := c.Validate(); err != nil {
		t.Errorf("lockstore.database ops: %v", err)
	}
}
