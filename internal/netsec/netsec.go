// Package netsec holds the few checks and file loads that every rlhub
// process makes before it opens or accepts a connection: whether an
// address stays on this machine, and reading certificates and secrets from
// files. The hub's flags (internal/cli), its clients (internal/dial), its
// metrics endpoint and its etcd client (internal/cluster) share them, so
// the rule "plaintext only on loopback" means one thing everywhere.
//
// It depends on the standard library only: the packages above import each
// other and must all be able to import it.
package netsec

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"github.com/rlhub/rlhub/internal/errs"
)

// IsLoopbackHost reports whether host (a name or an IP, no port) names
// this machine: "localhost" or a loopback IP. An empty host (every
// interface) is not.
func IsLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// IsLoopback reports whether addr ("host:port", or a bare host) only
// reaches or accepts connections on this machine.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	return IsLoopbackHost(host)
}

// PlaintextToken is nil when a client may send its bearer token without
// TLS to addr ("host:port" as dialled, or a connection's peer address):
// only on loopback, where a hub serves plaintext with tokens (tests, one
// machine). Off loopback a hub that takes tokens serves TLS (serve and
// relay refuse otherwise), so a plaintext client holding a token is
// misconfigured or talking to an impostor: it is refused, before the
// token is written, with ErrUnauthenticated naming addr (bounded) and
// what to pass.
func PlaintextToken(addr string) error {
	if IsLoopback(addr) {
		return nil
	}
	return fmt.Errorf("%w: refusing to send the token in plaintext to %s, which is not a loopback address: "+
		"give the hub's CA to use TLS (--tls-ca or RLHUB_TLS_CA; Go: Security.TLS or SecurityFiles.CA; Python: Security(ca=...))",
		errs.ErrUnauthenticated, errs.Quote(addr))
}

// Advertised is the address other machines are told to dial (in etcd)
// for a server that listens on listen and is bound at bound. advertise,
// when given (`--advertise`: HOST, or HOST:PORT when a port is mapped
// elsewhere), is that address, with bound's port when it has none: a
// Kubernetes pod listens on 0.0.0.0 and is reached by its stable DNS
// name. Otherwise it is listen's host as given — a name stays a name, so
// that clients check the server's certificate against the name it was
// issued for, not against an address the name resolved to here — with
// bound's port (listen's may be 0). An address without a host, or with
// an unspecified one (0.0.0.0, ::), names no machine and is an error.
func Advertised(listen, advertise string, bound net.Addr) (string, error) {
	_, boundPort, err := net.SplitHostPort(bound.String())
	if err != nil {
		return "", err
	}
	if advertise != "" {
		host, port, err := net.SplitHostPort(advertise)
		if err != nil { // no port: the bound one
			host, port = advertise, boundPort
		}
		if !namesMachine(host) || port == "" {
			return "", fmt.Errorf("--advertise %s names no machine and port: give this machine's name or address, as other machines reach it", errs.Quote(advertise))
		}
		return net.JoinHostPort(host, port), nil
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("listen address %s: want HOST:PORT", errs.Quote(listen)) // err would echo it whole
	}
	if !namesMachine(host) {
		return "", fmt.Errorf("--listen %s names no machine: other machines would be told to dial %s; listen on this machine's name or address (the one its certificate is for), or name it with --advertise", errs.Quote(listen), bound)
	}
	return net.JoinHostPort(host, boundPort), nil
}

// namesMachine says whether host can be dialled from another machine:
// not empty, not an unspecified address (0.0.0.0, ::).
func namesMachine(host string) bool {
	ip := net.ParseIP(host)
	return host != "" && (ip == nil || !ip.IsUnspecified())
}

// CertPool reads a PEM file of certificates into a pool. The error names
// the file, never its content.
func CertPool(path string) (*x509.CertPool, error) {
	b, err := ReadFile(path, MaxPEMBytes)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}

// KeyPair loads a certificate and its key (PEM); both or neither may be
// given, and neither gives no certificate.
func KeyPair(certFile, keyFile string) ([]tls.Certificate, error) {
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("a certificate needs both its certificate and key files")
	}
	if certFile == "" {
		return nil, nil
	}
	kp, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	return []tls.Certificate{kp}, nil
}

// MaxPEMBytes bounds a certificate bundle read by CertPool (the system's
// own bundle is about 200 kB).
const MaxPEMBytes = 4 << 20

// MaxSecretBytes bounds a token or password file.
const MaxSecretBytes = 4096

// ReadFile reads at most limit bytes of path; a longer file is an error
// (a file named by mistake is not read whole into memory).
func ReadFile(path string, limit int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, int64(limit)+1))
	if err != nil {
		return nil, err
	}
	if len(b) > limit {
		return nil, fmt.Errorf("%s is longer than %d bytes", path, limit)
	}
	return b, nil
}
