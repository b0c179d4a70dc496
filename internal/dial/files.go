package dial

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/rlhub/rlhub/internal/netsec"
)

// Files names the files a Config is loaded from (the command line's shared
// connection flags; the Python client reads the same names from the same
// RLHUB_* environment variables).
type Files struct {
	// CA is a PEM file of the certificate authorities that sign the hub's
	// certificate; set means TLS. "" with TLS set means the system roots.
	CA string
	// Cert and Key are this client's certificate and key (PEM) for mutual
	// TLS; both or neither.
	Cert, Key string
	// ServerName overrides the name the hub's certificate is checked
	// against (default: the host of the address dialed).
	ServerName string
	// TLS asks for TLS with the system roots when CA is "".
	TLS bool
	// TokenFile holds the bearer token (surrounding white space ignored);
	// Token is the token itself and wins when both are set.
	TokenFile, Token string
}

// FromEnv fills the empty fields of f from RLHUB_TLS_CA, RLHUB_TLS_CERT,
// RLHUB_TLS_KEY, RLHUB_TLS_SERVER_NAME, RLHUB_TOKEN_FILE and RLHUB_TOKEN.
func (f Files) FromEnv() Files {
	set := func(dst *string, env string) {
		if *dst == "" {
			*dst = os.Getenv(env)
		}
	}
	set(&f.CA, "RLHUB_TLS_CA")
	set(&f.Cert, "RLHUB_TLS_CERT")
	set(&f.Key, "RLHUB_TLS_KEY")
	set(&f.ServerName, "RLHUB_TLS_SERVER_NAME")
	set(&f.TokenFile, "RLHUB_TOKEN_FILE")
	set(&f.Token, "RLHUB_TOKEN")
	return f
}

// Load reads the files into a Config.
func (f Files) Load() (Config, error) {
	var c Config
	token, err := f.token()
	if err != nil {
		return c, err
	}
	c.Token = token
	if f.CA == "" && !f.TLS && f.Cert == "" {
		return c, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName}
	if f.CA != "" {
		pool, err := netsec.CertPool(f.CA)
		if err != nil {
			return c, fmt.Errorf("dial: --tls-ca: %w", err)
		}
		tc.RootCAs = pool
	}
	if (f.Cert == "") != (f.Key == "") {
		return c, errors.New("dial: a client certificate needs both --tls-cert and --tls-key")
	}
	certs, err := netsec.KeyPair(f.Cert, f.Key)
	if err != nil {
		return c, fmt.Errorf("dial: --tls-cert/--tls-key: %w", err)
	}
	tc.Certificates = certs
	c.TLS = tc
	return c, nil
}

func (f Files) token() (string, error) {
	if f.Token != "" {
		return strings.TrimSpace(f.Token), nil
	}
	if f.TokenFile == "" {
		return "", nil
	}
	b, err := netsec.ReadFile(f.TokenFile, netsec.MaxSecretBytes)
	if err != nil {
		return "", fmt.Errorf("dial: token file: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" || strings.ContainsAny(t, " \t\r\n") {
		return "", fmt.Errorf("dial: token file %s must hold one token", f.TokenFile)
	}
	return t, nil
}

// HostOf is the host part of addr ("host:port"), or addr itself.
func HostOf(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// ServerTLS is the server side of TLS for a hub: its certificate and key,
// and, when clientCA is set, mutual TLS (every client must present a
// certificate signed by clientCA).
func ServerTLS(certFile, keyFile, clientCA string) (*tls.Config, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("dial: a TLS hub needs both --tls-cert and --tls-key")
	}
	certs, err := netsec.KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("dial: server certificate: %w", err)
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: certs}
	if clientCA != "" {
		pool, err := netsec.CertPool(clientCA)
		if err != nil {
			return nil, fmt.Errorf("dial: --tls-client-ca: %w", err)
		}
		c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return c, nil
}
