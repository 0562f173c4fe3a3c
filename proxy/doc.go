// Package proxy accepts MongoDB client connections and relays each one to
// its own upstream connection, byte for byte, except where an Interceptor
// decides otherwise and where the upstream's handshake reply must be
// rewritten so that drivers keep talking to the proxy.
//
// Contracts:
//   - One upstream connection per client connection, so authentication
//     conversations, cursors, exhaust streams and transactions stay on the
//     connection that started them. The proxy never authenticates on a
//     client's behalf.
//   - Requests are read once into pooled buffers and forwarded as the same
//     bytes when nothing changes. Replies are not decoded, except
//     handshake replies.
//   - Replies the proxy makes are framed in the request's own opcode family,
//     with responseTo set, and written under the same lock as forwarded
//     replies. A fire-and-forget request (moreToCome) is never answered; if
//     it is refused, the connection closes, as mongod does.
//   - A malformed or oversized message closes only its own connection, with
//     a logged reason and a counted error. A panic in a connection handler
//     is recovered, logged and closes only that connection.
//
// The package never decides policy: whatever is not the relay itself is the
// Interceptor's business.
package proxy
