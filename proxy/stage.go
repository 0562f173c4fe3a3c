package proxy

import "context"

// A Stage is one concern of the request path: the boundary of what
// clients may reach, lock commands, sessions, enforcement
// (docs/ARCHITECTURE.md). Decide either settles the request, returning
// the Decision and true, or passes it to the next stage with false. It is
// called as Interceptor.Intercept is: one request at a time per
// connection, concurrently across connections, with the request valid
// only until it returns.
type Stage interface {
	Decide(ctx context.Context, req *Request) (Decision, bool)
}

// StageFunc is a function as a Stage.
type StageFunc func(ctx context.Context, req *Request) (Decision, bool)

// Decide implements Stage.
func (f StageFunc) Decide(ctx context.Context, req *Request) (Decision, bool) { return f(ctx, req) }

// Chain is an Interceptor made of stages, run in order for each request:
// the first stage that settles a request decides it, and a request that
// no stage settles is forwarded as it came. The order is the design: a
// stage may rely on every stage before it having passed the request.
type Chain []Stage

// Intercept implements Interceptor.
func (c Chain) Intercept(ctx context.Context, req *Request) Decision {
	for _, s := range c {
		if d, ok := s.Decide(ctx, req); ok {
			return d
		}
	}
	return Decision{Action: Forward}
}
