// Package upstream finds the MongoDB server that takes writes and dials
// connections to it, one per proxied client connection.
//
// Discovery and election following are delegated to the Go driver's server
// discovery and monitoring: a small monitoring client watches the
// deployment named by the URI and reports its topology. This package never
// carries application traffic over that client and never authenticates on
// a client's behalf: the bytes of each proxied connection, including its
// authentication conversation, travel over the raw connection Dial returns.
package upstream
