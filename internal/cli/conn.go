package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/dial"
)

// connFlags are the connection flags every command shares (root
// persistent flags): how a client reaches a hub. Empty flags fall back to
// the RLHUB_TLS_CA, RLHUB_TLS_CERT, RLHUB_TLS_KEY, RLHUB_TLS_SERVER_NAME,
// RLHUB_TOKEN_FILE and RLHUB_TOKEN environment variables, which the Python
// client reads too.
//
// The --etcd-* flags are how every command reaches etcd when it is given
// one (serve, relay, cluster status, a client's --etcd, `train ars` and its
// workers): TLS, a client certificate, and an etcd user whose password is
// read from a file (never from the command line). They fall back to the
// RLHUB_ETCD_* environment (cluster.EtcdSecurity).
type connFlags struct {
	files dial.Files
	etcd  cluster.EtcdSecurity
}

// register adds the flags to root as persistent flags.
func (f *connFlags) register(root *cobra.Command) {
	fs := root.PersistentFlags()
	fs.StringVar(&f.files.CA, "tls-ca", "", "PEM file of the CA that signs the hub's certificate: connect with TLS (env RLHUB_TLS_CA)")
	fs.StringVar(&f.files.Cert, "tls-cert", "", "PEM certificate: a client's for mutual TLS; for serve, the hub's own (env RLHUB_TLS_CERT)")
	fs.StringVar(&f.files.Key, "tls-key", "", "PEM private key of --tls-cert (env RLHUB_TLS_KEY)")
	fs.StringVar(&f.files.ServerName, "tls-server-name", "", "name to check the hub's certificate against (default: the host dialed)")
	fs.StringVar(&f.files.TokenFile, "token-file", "", "file holding this client's token, sent with every call (env RLHUB_TOKEN_FILE or RLHUB_TOKEN)")
	fs.StringVar(&f.etcd.CACert, "etcd-cacert", "", "PEM file of the CA that signs etcd's certificate: reach etcd over TLS (env RLHUB_ETCD_CACERT)")
	fs.StringVar(&f.etcd.Cert, "etcd-cert", "", "PEM client certificate for an etcd that checks clients (env RLHUB_ETCD_CERT)")
	fs.StringVar(&f.etcd.Key, "etcd-key", "", "PEM private key of --etcd-cert (env RLHUB_ETCD_KEY)")
	fs.StringVar(&f.etcd.User, "etcd-user", "", "etcd user to authenticate as, with --etcd-password-file (env RLHUB_ETCD_USER)")
	fs.StringVar(&f.etcd.PasswordFile, "etcd-password-file", "", "file whose first line is --etcd-user's password (env RLHUB_ETCD_PASSWORD_FILE)")
	fs.BoolVar(&f.etcd.Insecure, "etcd-insecure", false, "allow plaintext to an etcd endpoint off loopback (serve's and relay's --insecure allow it too)")
}

// load resolves the flags (and the environment) into a dial.Config.
func (f *connFlags) load() (dial.Config, error) {
	f.files = f.files.FromEnv()
	f.etcd = f.etcd.FromEnv()
	c, err := f.files.Load()
	c.Etcd = f.etcd
	return c, err
}

// args are the flags that reproduce f on a child command line (the ARS
// workers `train ars` starts).
func (f *connFlags) args() []string {
	var out []string
	add := func(name, v string) {
		if v != "" {
			out = append(out, "--"+name, v)
		}
	}
	add("tls-ca", f.files.CA)
	add("tls-cert", f.files.Cert)
	add("tls-key", f.files.Key)
	add("tls-server-name", f.files.ServerName)
	add("token-file", f.files.TokenFile)
	return append(out, f.etcd.Args()...)
}

type dialKey struct{}

// withDial stores the command's dial.Config in its context (the root's
// PersistentPreRunE does).
func withDial(ctx context.Context, c dial.Config) context.Context {
	return context.WithValue(ctx, dialKey{}, c)
}

// dialConfig is the command's dial.Config (zero, plaintext, outside a
// command).
func dialConfig(ctx context.Context) dial.Config {
	if ctx == nil {
		return dial.Config{}
	}
	c, _ := ctx.Value(dialKey{}).(dial.Config)
	return c
}

// dialHub opens a client connection to a hub address with the command's
// connection flags.
func dialHub(ctx context.Context, addr string) (*grpcClientConn, error) {
	conn, err := dialConfig(ctx).GRPC(addr)
	if err != nil {
		return nil, fmt.Errorf("hub: %w", err)
	}
	return conn, nil
}
