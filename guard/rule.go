package guard

import (
	"net"

	"github.com/lockgate/lockgate/policy"
	"github.com/lockgate/lockgate/proxy"
)

// ruleFor is rule r as it applies to the request's client (a rule may be
// narrowed to some clients, config.Clients).
func (g *Guard) ruleFor(r policy.Rule, req *proxy.Request) policy.Rule {
	if r.Clients == nil {
		return r
	}
	c := req.Client
	var ip net.IP
	if a, ok := c.RemoteAddr.(*net.TCPAddr); ok {
		ip = a.IP
	} else if h, _, err := net.SplitHostPort(c.Addr); err == nil {
		ip = net.ParseIP(h)
	}
	return r.ForClient(c.AppName(), c.User(), ip)
}
