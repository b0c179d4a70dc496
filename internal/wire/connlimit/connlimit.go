// Package connlimit bounds a gRPC server's connections in time, the same
// on every rlhub server (the hub, rlhub relay): a connection's HTTP/2
// handshake must end within a timeout, and a connection gone silent is
// pinged and closed when the ping goes unanswered (a peer whose host went
// away without a word, a half-open connection). The keepalive pings
// clients send (internal/dial: every 30 s, calls or not) are accepted;
// gRPC's default policy (5 min, only with a call) answered them with
// GOAWAY too_many_pings.
package connlimit

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// The defaults a server takes for a bound left 0.
const (
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultKeepaliveTime    = time.Minute
	DefaultKeepaliveTimeout = 20 * time.Second
)

// MinClientPingInterval is the shortest interval between a client's
// keepalive pings a server accepts; a client that pings more often is
// disconnected (GOAWAY too_many_pings), so clients' keepalive time must be
// at least this.
const MinClientPingInterval = 10 * time.Second

// ServerOptions bound a server's connections: handshake is the HTTP/2
// handshake's timeout, keepaliveTime how long a connection may be silent
// before the server pings it and keepaliveTimeout how long it then waits
// for the answer; 0 means the default.
func ServerOptions(handshake, keepaliveTime, keepaliveTimeout time.Duration) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ConnectionTimeout(or(handshake, DefaultHandshakeTimeout)),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: or(keepaliveTime, DefaultKeepaliveTime), Timeout: or(keepaliveTimeout, DefaultKeepaliveTimeout)}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: MinClientPingInterval, PermitWithoutStream: true}),
	}
}

func or(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}
