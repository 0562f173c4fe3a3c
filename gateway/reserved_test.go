package gateway

import (
	"reflect"
	"testing"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/guard"
)

// TestLockStoreSealedWhereverItLives: the lock store's names are sealed on
// the upstream even when lockstore.uri names another deployment (two URIs
// may reach the same servers), with the configured names or the defaults.
func TestLockStoreSealedWhereverItLives(t *testing.T) {
	for _, tt := range []struct {
		ls   config.Lockstore
		want guard.Reserved
	}{
		{config.Lockstore{}, guard.ReservedFor("lockgate", "locks")},
		{config.Lockstore{URI: "mongodb://elsewhere:27017/"}, guard.ReservedFor("lockgate", "locks")},
		{config.Lockstore{URI: "mongodb://elsewhere:27017/", Database: "ops", Collection: "mutex"}, guard.Reserved{DB: "ops", Collections: []string{"mutex", "mutex_claims", "mutex_txns", "mutex_instances", "mutex_wake"}}},
	} {
		if got := reservedNamespaces(tt.ls); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%+v: sealed %+v, want %+v", tt.ls, got, tt.want)
		}
	}
}
