// Package dial is rlhub's one connection seam: every Go client and every
// hub-to-hub link opens its gRPC connections and its data-plane client
// here, so TLS, the bearer token, keepalives and message limits are set in
// one place (a Config) instead of at each call site.
//
// To use it:
//  1. Build a Config: the zero value is plaintext with no token (the
//     loopback default); Files.Load reads certificates and a token from
//     files, as the command line's --tls-ca/--tls-cert/--tls-key/
//     --token-file flags do.
//  2. cfg.GRPC(addr, extra...) opens a *grpc.ClientConn; extra options
//     (a component's tuned window sizes) come after the seam's own.
//  3. cfg.Bulk() returns a data-plane client (package bulk) with the same
//     TLS settings and token.
//
// An address may name a cluster instead of one hub ("h1:p1,h2:p2" or
// "etcd://E/NAME", cluster.go): the connection then finds the primary
// (Cluster/Primary, or etcd), follows it across failovers, and retries
// only calls that provably were not applied or are reads; CurrentPrimary
// tells the data plane where to dial.
package dial

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/netsec"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	"github.com/rlhub/rlhub/internal/wire/chunkcodec"
)

// Defaults of Config's zero fields.
const (
	DefaultMaxMsgBytes   = 16 << 20
	DefaultKeepaliveTime = 30 * time.Second
	keepaliveTimeout     = 20 * time.Second
)

// TokenHeader is the gRPC metadata key that carries the bearer token
// ("authorization: Bearer <token>"); internal/auth reads it.
const TokenHeader = "authorization"

// Config is how a client connects to a hub. The zero value is plaintext,
// no token, DefaultMaxMsgBytes and DefaultKeepaliveTime.
type Config struct {
	// TLS, when non-nil, encrypts gRPC and the data plane and verifies the
	// hub against its RootCAs (a client certificate in Certificates makes
	// it mutual TLS). nil means plaintext.
	TLS *tls.Config
	// Token is sent with every RPC and in the data-plane handshake; ""
	// sends none (a hub without a token file accepts that). Without TLS
	// it is sent to loopback addresses only: any other is refused before
	// anything is sent (netsec.PlaintextToken).
	Token string
	// MaxMsgBytes bounds one gRPC message in each direction; 0 means
	// DefaultMaxMsgBytes.
	MaxMsgBytes int
	// KeepaliveTime is how long a connection may be idle before the
	// client pings the hub (a dead peer is noticed 20 s after an
	// unanswered ping); 0 means DefaultKeepaliveTime, negative disables
	// pings. The hub permits pings every 10 s (internal/hub).
	KeepaliveTime time.Duration
	// FollowTimeout bounds a unary call on a cluster target whose context
	// has no deadline (it waits for a primary); 0 means
	// DefaultFollowTimeout. Plain addresses are not affected.
	FollowTimeout time.Duration
	// Etcd is how etcd is reached for an etcd:// cluster target (TLS, a
	// user): cluster.EtcdSecurity; the zero value is plaintext, loopback
	// only.
	Etcd cluster.EtcdSecurity
}

// Secure reports whether the configuration uses TLS.
func (c Config) Secure() bool { return c.TLS != nil }

// Options are the gRPC dial options of c: transport credentials, the
// token, message limits, keepalives and the chunk codec's buffer pool.
func (c Config) Options() []grpc.DialOption {
	maxMsg := c.MaxMsgBytes
	if maxMsg <= 0 {
		maxMsg = DefaultMaxMsgBytes
	}
	opts := append(chunkcodec.DialOptions(),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsg), grpc.MaxCallSendMsgSize(maxMsg)))
	if c.TLS != nil {
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(c.TLS.Clone())))
	} else {
		opts = append(opts, grpc.WithTransportCredentials(plaintext{insecure.NewCredentials()}),
			grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				return tlsHint(invoker(ctx, method, req, reply, cc, opts...))
			}),
			grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
				cs, err := streamer(ctx, desc, cc, method, opts...)
				return cs, tlsHint(err)
			}))
	}
	if c.Token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer{md: map[string]string{TokenHeader: "Bearer " + c.Token}, plaintext: c.TLS == nil}))
	}
	if ka := c.KeepaliveTime; ka >= 0 {
		if ka == 0 {
			ka = DefaultKeepaliveTime
		}
		opts = append(opts, grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: ka, Timeout: keepaliveTimeout, PermitWithoutStream: true}))
	}
	return opts
}

// tlsHint adds what to do to the error of a plaintext call that a hub
// serving TLS ended: gRPC reports only that the server's preface never
// came ("error reading server preface: EOF"). When gRPC itself closed the
// connection at its connect deadline ("use of closed network
// connection"), the hub did not end it: it accepted the connection and
// sent nothing (hung, stopped, or not a gRPC server), and the error says
// that instead.
func tlsHint(err error) error {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "error reading server preface") {
		return err
	}
	if strings.Contains(st.Message(), "use of closed network connection") {
		return status.Error(codes.Unavailable, st.Message()+
			" (the hub accepted the connection but sent nothing within the connect timeout: it is hung or stopped, or the address is not a hub's)")
	}
	return status.Error(codes.Unavailable, st.Message()+
		" (the hub closed the connection before answering; if it serves TLS, pass its CA: --tls-ca or RLHUB_TLS_CA)")
}

// GRPC opens a client connection to addr (lazily, as grpc.NewClient
// does). extra options are applied after c's own, so a component may
// raise window sizes or limits for its traffic.
//
// addr may be a cluster target (cluster.go: "h1:p1,h2:p2" or
// "etcd://E/NAME"): the connection then follows the cluster's primary.
func (c Config) GRPC(addr string, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
	if strings.Contains(addr, ",") || strings.HasPrefix(addr, "etcd://") {
		t, err := ParseTarget(addr)
		if err != nil {
			return nil, err
		}
		if err := c.checkToken(t.Hubs...); err != nil {
			return nil, err
		}
		if t.Clustered() {
			return c.follow(t, extra)
		}
		addr = t.Hubs[0]
	}
	if err := c.checkToken(addr); err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(addr, append(c.Options(), extra...)...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return conn, nil
}

// Bulk returns a data-plane client that connects as c does (TLS with the
// data plane's ALPN name, the token in its handshake).
func (c Config) Bulk() *bulk.Client {
	return bulk.NewClientConfig(bulk.ClientConfig{TLS: c.TLS, Token: c.Token})
}

// checkToken refuses, before anything is dialled, a plaintext
// configuration with a token for any of addrs that is not loopback
// (netsec.PlaintextToken). The addresses an etcd:// target learns at run
// time are checked by bearer, on the connection itself.
func (c Config) checkToken(addrs ...string) error {
	if c.TLS != nil || c.Token == "" {
		return nil
	}
	for _, a := range addrs {
		if err := netsec.PlaintextToken(a); err != nil {
			return fmt.Errorf("dial: %w", err)
		}
	}
	return nil
}

// bearer is a per-RPC credential carrying the token. Over TLS it demands
// transport security, as grpc-go's own token credentials do; plaintext
// (a loopback hub with a token file, in tests and on one machine) it
// allows only to a connection dialled for a loopback name (plaintext)
// whose peer is loopback, which it checks on each call's connection, so
// that a cluster's primary learned at run time (etcd://) is checked where
// it is dialled: otherwise the call fails Unauthenticated
// (netsec.PlaintextToken) before its headers, the token among them, are
// written. The name is checked as named, as GRPC and the data plane check
// it: this machine's hostname, which /etc/hosts may map to 127.0.1.1, is
// refused though its connection's peer is loopback.
type bearer struct {
	md        map[string]string
	plaintext bool // no TLS: loopback peers only
}

func (b bearer) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	if b.plaintext {
		where, port := "an unknown peer", ""
		if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
			if p.Addr.Network() == "unix" {
				return b.md, nil // a socket file: this machine
			}
			where = p.Addr.String()
			_, port, _ = net.SplitHostPort(where)
		}
		if ri, ok := credentials.RequestInfoFromContext(ctx); ok {
			if d, ok := ri.AuthInfo.(dialledAs); ok && d.name != "" {
				name := d.name
				if _, _, err := net.SplitHostPort(name); err != nil && port != "" {
					name = net.JoinHostPort(name, port) // a resolver address's host alone: named with the port dialled
				}
				if err := netsec.PlaintextToken(name); err != nil {
					return nil, status.Error(codes.Unauthenticated, err.Error())
				}
			}
		}
		if err := netsec.PlaintextToken(where); err != nil {
			return nil, status.Error(codes.Unauthenticated, err.Error())
		}
	}
	return b.md, nil
}
func (b bearer) RequireTransportSecurity() bool { return !b.plaintext }

// plaintext is insecure transport credentials whose connections keep the
// name they were dialled for (dialledAs): the authority gRPC hands the
// handshake, a resolver address's ServerName (a followed primary's host)
// or else the target's. bearer holds a call's token to it.
type plaintext struct {
	credentials.TransportCredentials
}

func (p plaintext) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	c, ai, err := p.TransportCredentials.ClientHandshake(ctx, authority, conn)
	if err != nil {
		return c, ai, err
	}
	return c, dialledAs{AuthInfo: ai, name: authority}, nil
}

func (p plaintext) Clone() credentials.TransportCredentials {
	return plaintext{p.TransportCredentials.Clone()}
}

// dialledAs is a plaintext connection's AuthInfo: no security, and the
// name the connection was dialled for.
type dialledAs struct {
	credentials.AuthInfo
	name string
}

// GetCommonAuthInfo is what gRPC reads for a connection's security level
// (credentials.CheckSecurityLevel): none, as insecure's own.
func (dialledAs) GetCommonAuthInfo() credentials.CommonAuthInfo {
	return credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}
}
