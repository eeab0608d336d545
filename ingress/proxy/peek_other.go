//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package proxy

import "net"

// peekIdle cannot look at a connection here: the idle watch (Pool.watch) covers what
// arrived while the connection idled, and the request retried on a fresh connection
// covers a kept-alive one the upstream closed.
func peekIdle(net.Conn) idleState { return quiet }
