package clustertest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/rlhub/rlhub/internal/netsec"
)

// Secure is an etcd served over TLS that checks client certificates, with
// authentication enabled: a root user and one user (User) whose role may
// read and write only the keys of cluster Cluster (/rlhub/Cluster/).
type Secure struct {
	*Etcd
	// Cluster is the cluster name User's role covers.
	Cluster string
	// CACert signs etcd's and the clients' certificates; OtherCA signs
	// nothing etcd trusts (a wrong CA).
	CACert, OtherCA string
	// ClientCert and ClientKey are a client certificate CACert signed.
	ClientCert, ClientKey string
	// User and PasswordFile are the limited user; WrongPasswordFile
	// holds another password.
	User, PasswordFile, WrongPasswordFile string
	// Root is a client as etcd's root user (to read every key).
	Root *clientv3.Client
}

// StartSecure runs etcd with TLS, client-certificate checks and auth
// (users made with the Go client's Auth API). Killed at cleanup.
func StartSecure(tb testing.TB, cluster string) *Secure {
	tb.Helper()
	dir := tb.TempDir()
	ca, caKey := newCA(tb, dir, "ca")
	newCA(tb, dir, "other-ca")
	leaf(tb, dir, "server", ca, caKey, x509.ExtKeyUsageServerAuth)
	leaf(tb, dir, "client", ca, caKey, x509.ExtKeyUsageClientAuth)
	s := &Secure{Cluster: cluster, CACert: filepath.Join(dir, "ca.pem"), OtherCA: filepath.Join(dir, "other-ca.pem"),
		ClientCert: filepath.Join(dir, "client.pem"), ClientKey: filepath.Join(dir, "client-key.pem"),
		User: "hub", PasswordFile: filepath.Join(dir, "password"), WrongPasswordFile: filepath.Join(dir, "wrong")}
	write(tb, s.PasswordFile, []byte("s3cret-hub\n"))
	write(tb, s.WrongPasswordFile, []byte("not-it\n"))
	const rootPW = "s3cret-root"

	e := &Etcd{tb: tb, dir: tb.TempDir(), Endpoint: "https://" + freeAddr(tb), peer: "http://" + freeAddr(tb)}
	e.extra = []string{"--cert-file", filepath.Join(dir, "server.pem"), "--key-file", filepath.Join(dir, "server-key.pem"),
		"--trusted-ca-file", s.CACert, "--client-cert-auth"}
	tc := s.tlsConfig(tb)
	e.probe = &clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: time.Second, Logger: zap.NewNop(), TLS: tc}
	tb.Cleanup(e.Kill) // before Restart: one that fails still kills the process
	e.Restart()
	s.Etcd = e

	cli, err := clientv3.New(*e.probe)
	if err != nil {
		tb.Fatalf("etcd client: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := "/rlhub/" + cluster + "/"
	steps := []func() error{
		func() error { _, err := cli.RoleAdd(ctx, "root"); return err },
		func() error { _, err := cli.UserAdd(ctx, "root", rootPW); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := cli.RoleAdd(ctx, "rlhub-"+cluster); return err },
		func() error {
			_, err := cli.RoleGrantPermission(ctx, "rlhub-"+cluster, prefix, clientv3.GetPrefixRangeEnd(prefix), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := cli.UserAdd(ctx, s.User, "s3cret-hub"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, s.User, "rlhub-"+cluster); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			cli.Close()
			tb.Fatalf("etcd auth set-up step %d: %v", i, err)
		}
	}
	cli.Close()
	root := *e.probe
	root.Username, root.Password = "root", rootPW
	root.DialTimeout = 15 * time.Second // fetching a token runs bcrypt on a loaded etcd
	e.probe = &root
	s.Root, err = clientv3.New(root)
	if err != nil {
		tb.Fatalf("etcd client as root: %v", err)
	}
	tb.Cleanup(func() { s.Root.Close() })
	return s
}

// Keys lists every key etcd holds under prefix (as root).
func (s *Secure) Keys(tb testing.TB, prefix string) []string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := s.Root.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		tb.Fatalf("list %s as root: %v", prefix, err)
	}
	var out []string
	for _, kv := range resp.Kvs {
		out = append(out, string(kv.Key))
	}
	return out
}

// HostPort is the endpoint without its scheme.
func (s *Secure) HostPort() string { return strings.TrimPrefix(s.Endpoint, "https://") }

func (s *Secure) tlsConfig(tb testing.TB) *tls.Config {
	tb.Helper()
	pool, err := netsec.CertPool(s.CACert)
	if err != nil {
		tb.Fatalf("read CA: %v", err)
	}
	certs, err := netsec.KeyPair(s.ClientCert, s.ClientKey)
	if err != nil {
		tb.Fatal(err)
	}
	return &tls.Config{RootCAs: pool, Certificates: certs, MinVersion: tls.VersionTLS12}
}

func write(tb testing.TB, path string, b []byte) {
	tb.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		tb.Fatal(err)
	}
}

func writePEM(tb testing.TB, path, typ string, der []byte) {
	tb.Helper()
	write(tb, path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
}

func newCA(tb testing.TB, dir, name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "rlhub test " + name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	writePEM(tb, filepath.Join(dir, name+".pem"), "CERTIFICATE", der)
	return cert, key
}

func leaf(tb testing.TB, dir, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, usage x509.ExtKeyUsage) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		tb.Fatal(err)
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	writePEM(tb, filepath.Join(dir, name+".pem"), "CERTIFICATE", der)
	writePEM(tb, filepath.Join(dir, name+"-key.pem"), "PRIVATE KEY", kb)
}
