package policy

import (
	"net"
	"slices"

	"github.com/lockgate/lockgate/config"
)

// Clients narrows a rule to some clients (config.Clients, compiled).
type Clients struct {
	AppNames []string
	Users    []string
	Networks []*net.IPNet
	// Others is the mode for clients that do not match.
	Others Mode
	// OthersUnlocked is what their writes holding no lock get.
	OthersUnlocked config.UnlockedWriters
}

func compileClients(c *config.Clients, others Mode, othersUnlocked config.UnlockedWriters) *Clients {
	if c == nil {
		return nil
	}
	if others == "" {
		others = Audit
	}
	if othersUnlocked == "" {
		othersUnlocked = config.UnlockedRefuse
	}
	out := &Clients{AppNames: c.AppNames, Users: c.Users, Others: others, OthersUnlocked: othersUnlocked}
	for _, n := range c.Networks {
		if _, ipn, err := net.ParseCIDR(n); err == nil {
			out.Networks = append(out.Networks, ipn)
		}
	}
	return out
}

// match reports whether a client matches every list given.
func (c *Clients) match(app, user string, ip net.IP) bool {
	if len(c.AppNames) > 0 && !slices.Contains(c.AppNames, app) {
		return false
	}
	if len(c.Users) > 0 && !slices.Contains(c.Users, user) {
		return false
	}
	if len(c.Networks) > 0 {
		in := false
		for _, n := range c.Networks {
			in = in || (ip != nil && n.Contains(ip))
		}
		if !in {
			return false
		}
	}
	return true
}

// ForClient returns the rule as it applies to one client: unchanged when
// the rule names no clients or the client is one of them, with the mode
// for other clients otherwise.
func (r Rule) ForClient(app, user string, ip net.IP) Rule {
	if r.Clients == nil || r.Clients.match(app, user, ip) {
		return r
	}
	r.Mode, r.Unlocked = r.Clients.Others, r.Clients.OthersUnlocked
	return r
}
