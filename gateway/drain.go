package gateway

import (
	"context"
	"errors"
)

// BeginDrain makes /readyz answer 503 ("draining") from now on while the
// gateway keeps serving, so that endpoints and load balancers stop sending
// new clients before the shutdown starts (config shutdownDrainDelay).
// Calling it again does nothing.
func (g *Gateway) BeginDrain() {
	g.drain.Do(func() {
		g.admin.AddCheck("draining", func(context.Context) error {
			return errors.New("draining before shutdown: new clients should go elsewhere")
		})
		g.logger.Info("draining: /readyz reports not ready; serving until the shutdown starts")
	})
}
