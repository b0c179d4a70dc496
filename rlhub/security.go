package rlhub

import (
	"crypto/tls"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/dial"
)

// Security is how a client reaches a hub that runs with TLS and tokens
// (docs/security.md): every client of this package connects through the
// same seam as the rlhub binary (internal/dial), on gRPC and on the data
// plane alike. The zero value is plaintext with no token: a hub on
// loopback without a token file.
type Security struct {
	// TLS, when non-nil, encrypts both planes and checks the hub's
	// certificate against RootCAs (nil RootCAs: the system roots); a
	// client certificate in Certificates makes it mutual TLS.
	TLS *tls.Config
	// Token is sent with every call ("authorization: Bearer …") and in
	// the data plane's handshake; "" sends none.
	Token string
	// Etcd is how a cluster target's etcd (etcd://…, ClusterTarget) is
	// reached: TLS, a client certificate, a user, or Insecure for
	// plaintext off loopback (docs/cluster.md, Deployment). The zero
	// value is plaintext, which is refused for an endpoint off loopback.
	Etcd EtcdSecurity
}

// EtcdSecurity is how etcd is reached: the --etcd-* flags, or the
// RLHUB_ETCD_* environment (EtcdSecurity{}.FromEnv()).
type EtcdSecurity = cluster.EtcdSecurity

// SecurityFiles names PEM and token files, as the command line's
// --tls-ca, --tls-cert, --tls-key, --tls-server-name and --token-file
// flags do (FromEnv fills empty fields from the RLHUB_* variables the
// command line and the Python client read).
type SecurityFiles = dial.Files

// LoadSecurity reads f's files into a Security.
func LoadSecurity(f SecurityFiles) (Security, error) {
	c, err := f.Load()
	if err != nil {
		return Security{}, err
	}
	return Security{TLS: c.TLS, Token: c.Token}, nil
}

// SecurityFromEnv is LoadSecurity of the RLHUB_TLS_CA, RLHUB_TLS_CERT,
// RLHUB_TLS_KEY, RLHUB_TLS_SERVER_NAME, RLHUB_TOKEN_FILE and RLHUB_TOKEN
// environment variables, with Etcd from RLHUB_ETCD_* (as the command line
// and the Python client read them).
func SecurityFromEnv() (Security, error) {
	s, err := LoadSecurity(SecurityFiles{}.FromEnv())
	s.Etcd = EtcdSecurity{}.FromEnv()
	return s, err
}

// ClusterTarget is the hub address of cluster name whose primary is read
// from etcd (endpoints comma-separated host:port): any Hub or Addr field
// of this package takes it, or a comma-separated list of the cluster's
// hub addresses, and the client then follows the primary across
// failovers (docs/cluster.md, Clients).
func ClusterTarget(etcdEndpoints, name string) string { return dial.EtcdTarget(etcdEndpoints, name) }

func (s Security) dial() dial.Config { return dial.Config{TLS: s.TLS, Token: s.Token, Etcd: s.Etcd} }
