package policy

import (
	"net"
	"testing"
	"time"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/namespace"
)

func TestUnlockedWritersPerClientSet(t *testing.T) {
	p, err := Compile(config.Policy{Default: config.ModeOff, MaxCandidates: 10, Namespaces: []config.NamespaceRule{
		{Match: "shop.orders", Mode: config.ModeEnforce, Clients: &config.Clients{AppNames: []string{"editor"}},
			OtherClients: config.ModeEnforce, OtherClientsUnlockedWriters: config.UnlockedWait, UnlockedWaitMS: 300},
		{Match: "shop.carts", Mode: config.ModeEnforce, UnlockedWriters: config.UnlockedRefuseIfLocked},
		{Match: "shop.audit", Mode: config.ModeAudit, UnlockedWriters: config.UnlockedWait},
		{Match: "shop.plain", Mode: config.ModeEnforce},
	}})
	if err != nil {
		t.Fatal(err)
	}
	ip := net.ParseIP("10.0.0.1")
	orders := p.Lookup(namespace.Of("shop.orders"))
	if r := orders.ForClient("editor", "", ip); r.Unlocked != config.UnlockedRefuse || r.Implicit() {
		t.Errorf("named client: %q, implicit %v; want refuse", r.Unlocked, r.Implicit())
	}
	if r := orders.ForClient("batch", "", ip); r.Unlocked != config.UnlockedWait || !r.Implicit() || r.UnlockedWait != 300*time.Millisecond {
		t.Errorf("other client: %q %v, implicit %v; want wait 300ms", r.Unlocked, r.UnlockedWait, r.Implicit())
	}
	if r := p.Lookup(namespace.Of("shop.carts")); r.Unlocked != config.UnlockedRefuseIfLocked || !r.Implicit() || r.UnlockedWait != config.DefaultUnlockedWaitMS*time.Millisecond {
		t.Errorf("carts: %+v", r)
	}
	if r := p.Lookup(namespace.Of("shop.audit")); r.Implicit() {
		t.Error("an audited rule takes no implicit lock")
	}
	if r := p.Lookup(namespace.Of("shop.plain")); r.Unlocked != config.UnlockedRefuse || r.Implicit() {
		t.Errorf("plain: %q", r.Unlocked)
	}
	if r := p.Lookup(namespace.Of("other.x")); r.Unlocked != config.UnlockedRefuse {
		t.Errorf("default: %q", r.Unlocked)
	}
}
