package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/netsec"
)

// EtcdSecurity is how every rlhub process reaches etcd: TLS (the CA that
// signs etcd's certificate, and a client certificate when etcd asks for
// one) and etcd's own authentication (a user and the file holding its
// password: a password is never taken on a command line). The zero value
// is plaintext without a user, which is accepted only for loopback
// endpoints unless Insecure (the hub's own rule, docs/security.md).
//
// The command line's --etcd-cacert, --etcd-cert, --etcd-key, --etcd-user
// and --etcd-password-file fill it, falling back to RLHUB_ETCD_CACERT,
// RLHUB_ETCD_CERT, RLHUB_ETCD_KEY, RLHUB_ETCD_USER and
// RLHUB_ETCD_PASSWORD_FILE, which the Python client (rlhub.discover) reads
// too.
type EtcdSecurity struct {
	// CACert is a PEM file of the CAs that sign etcd's certificate; set
	// means TLS (http:// endpoints are dialed as https://).
	CACert string
	// Cert and Key are this client's certificate and key (PEM), for an
	// etcd started with --client-cert-auth; both or neither.
	Cert, Key string
	// User is the etcd user to authenticate as ("" means none); its
	// password is the first line of PasswordFile.
	User, PasswordFile string
	// Insecure lets a plaintext connection to an endpoint off loopback
	// through (anyone on the path can read and forge the cluster's keys).
	Insecure bool
}

// FromEnv fills s's empty fields from the RLHUB_ETCD_* environment, and
// sets Insecure when RLHUB_ETCD_INSECURE is 1, true or yes.
func (s EtcdSecurity) FromEnv() EtcdSecurity {
	set := func(dst *string, env string) {
		if *dst == "" {
			*dst = os.Getenv(env)
		}
	}
	set(&s.CACert, "RLHUB_ETCD_CACERT")
	set(&s.Cert, "RLHUB_ETCD_CERT")
	set(&s.Key, "RLHUB_ETCD_KEY")
	set(&s.User, "RLHUB_ETCD_USER")
	set(&s.PasswordFile, "RLHUB_ETCD_PASSWORD_FILE")
	switch strings.ToLower(os.Getenv("RLHUB_ETCD_INSECURE")) { // as Python's discover reads it
	case "1", "true", "yes":
		s.Insecure = true
	}
	return s
}

// Args are the command-line flags that reproduce s (for the child
// processes a command starts, such as `train ars`'s workers).
func (s EtcdSecurity) Args() []string {
	var out []string
	add := func(name, v string) {
		if v != "" {
			out = append(out, "--"+name, v)
		}
	}
	add("etcd-cacert", s.CACert)
	add("etcd-cert", s.Cert)
	add("etcd-key", s.Key)
	add("etcd-user", s.User)
	add("etcd-password-file", s.PasswordFile)
	if s.Insecure {
		out = append(out, "--etcd-insecure")
	}
	return out
}

// etcdClient is what EtcdSecurity resolves to for clientv3.Config.
type etcdClient struct {
	endpoints      []string
	tls            *tls.Config
	user, password string
}

// resolve checks s against endpoints and loads its files. Errors name the
// flag or file at fault and never echo a file's content.
func (s EtcdSecurity) resolve(endpoints []string) (etcdClient, error) {
	var out etcdClient
	useTLS := s.CACert != "" || s.Cert != ""
	for _, e := range endpoints {
		if strings.HasPrefix(e, "https://") {
			useTLS = true
		}
	}
	if (s.Cert == "") != (s.Key == "") {
		return out, fmt.Errorf("%w: cluster: an etcd client certificate needs both --etcd-cert and --etcd-key", errs.ErrInvalid)
	}
	if (s.User == "") != (s.PasswordFile == "") {
		return out, fmt.Errorf("%w: cluster: etcd authentication needs both --etcd-user and --etcd-password-file", errs.ErrInvalid)
	}
	for _, e := range endpoints {
		u := e
		if useTLS {
			u = "https://" + strings.TrimPrefix(strings.TrimPrefix(e, "http://"), "https://")
		}
		if !useTLS && !s.Insecure && !loopbackURL(u) {
			return out, fmt.Errorf("%w: cluster: etcd endpoint %s is not on loopback and would be reached without TLS: pass --etcd-cacert (and --etcd-cert/--etcd-key if etcd checks clients; docs/cluster.md, Deployment), or --insecure", errs.ErrInvalid, errs.Quote(hostOfURL(u)))
		}
		out.endpoints = append(out.endpoints, u)
	}
	if useTLS {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if s.CACert != "" {
			pool, err := netsec.CertPool(s.CACert)
			if err != nil {
				return out, fmt.Errorf("%w: cluster: --etcd-cacert: %v", errs.ErrInvalid, err)
			}
			tc.RootCAs = pool
		}
		certs, err := netsec.KeyPair(s.Cert, s.Key)
		if err != nil {
			return out, fmt.Errorf("%w: cluster: --etcd-cert/--etcd-key: %v", errs.ErrInvalid, err)
		}
		tc.Certificates = certs
		out.tls = tc
	}
	if s.User != "" {
		b, err := netsec.ReadFile(s.PasswordFile, netsec.MaxSecretBytes)
		if err != nil {
			return out, fmt.Errorf("%w: cluster: --etcd-password-file: %v", errs.ErrInvalid, err)
		}
		pw, _, _ := strings.Cut(string(b), "\n")
		pw = strings.TrimRight(pw, "\r")
		if pw == "" {
			return out, fmt.Errorf("%w: cluster: --etcd-password-file is empty", errs.ErrInvalid)
		}
		out.user, out.password = s.User, pw
	}
	return out, nil
}

func hostOfURL(u string) string {
	if !strings.Contains(u, "://") { // host:port, as etcd's client takes it too
		if h, _, err := net.SplitHostPort(u); err == nil {
			return h
		}
		return u
	}
	p, err := url.Parse(u)
	if err != nil || p.Host == "" {
		return u
	}
	if h, _, err := net.SplitHostPort(p.Host); err == nil {
		return h
	}
	return p.Host
}

// loopbackURL reports whether an endpoint URL names this machine: a
// loopback IP or localhost (a unix socket is local too).
func loopbackURL(u string) bool {
	if strings.HasPrefix(u, "unix://") || strings.HasPrefix(u, "unixs://") {
		return true
	}
	return netsec.IsLoopbackHost(hostOfURL(u))
}

// etcdError wraps an error from etcd (or from reaching it) so that it names
// etcd and its endpoints and says what to check: a refused user or
// password is errs.ErrUnauthenticated, a role without the cluster's keys
// errs.ErrPermission, a failed TLS handshake or anything else
// errs.ErrUnavailable. The text is bounded.
func etcdError(endpoints []string, err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if len(msg) > 400 {
		msg = msg[:400] + "…"
	}
	where := strings.Join(endpoints, ",")
	if len(where) > 200 {
		where = where[:200] + "…"
	}
	kind, hint := errs.ErrUnavailable, ""
	code := grpcstatus.Code(err)
	switch {
	case errors.Is(err, rpctypes.ErrAuthFailed) || errors.Is(err, rpctypes.ErrGRPCAuthFailed) ||
		errors.Is(err, rpctypes.ErrInvalidAuthToken) || errors.Is(err, rpctypes.ErrGRPCInvalidAuthToken) ||
		errors.Is(err, rpctypes.ErrUserEmpty) || errors.Is(err, rpctypes.ErrGRPCUserEmpty) ||
		code == codes.Unauthenticated || strings.Contains(msg, "authentication failed") || strings.Contains(msg, "user name is empty"):
		kind, hint = errs.ErrUnauthenticated, " (check --etcd-user and --etcd-password-file)"
	case errors.Is(err, rpctypes.ErrPermissionDenied) || errors.Is(err, rpctypes.ErrGRPCPermissionDenied) ||
		code == codes.PermissionDenied || strings.Contains(msg, "permission denied"):
		kind, hint = errs.ErrPermission, " (the etcd user's role must grant readwrite on the cluster's prefix /rlhub/NAME/)"
	case strings.Contains(msg, "x509") || strings.Contains(msg, "tls:") || strings.Contains(msg, "handshake"):
		hint = " (TLS to etcd failed: check --etcd-cacert, and --etcd-cert/--etcd-key if etcd checks clients)"
	}
	if where != "" {
		where = " " + where
	}
	return fmt.Errorf("%w: cluster: etcd%s: %s%s", kind, where, msg, hint)
}

// checkTLS shakes hands with the first endpoint that accepts a TCP
// connection, so that a wrong CA or a missing client certificate is
// reported as such (etcd's client would only time out). An endpoint that
// does not answer is left to the client (etcd may be restarting).
func (ec etcdClient) checkTLS(timeout time.Duration) error {
	if ec.tls == nil {
		return nil
	}
	for _, e := range ec.endpoints {
		p, err := url.Parse(e)
		if err != nil || p.Host == "" {
			continue
		}
		tc := ec.tls.Clone()
		if tc.ServerName == "" {
			tc.ServerName = hostOfURL(e)
		}
		d := &net.Dialer{Timeout: timeout}
		conn, err := tls.DialWithDialer(d, "tcp", p.Host, tc)
		if err == nil {
			// TLS 1.3 reports a refused client certificate only on the
			// first read: wait briefly for the server's alert.
			_ = conn.SetReadDeadline(time.Now().Add(min(timeout, 300*time.Millisecond)))
			_, rerr := conn.Read(make([]byte, 1))
			conn.Close()
			var ne net.Error
			if rerr == nil || errors.As(rerr, &ne) && ne.Timeout() || errors.Is(rerr, io.EOF) {
				return nil
			}
			err = rerr
		}
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			continue // not listening: not a TLS problem
		}
		var te net.Error
		if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &te) && te.Timeout() {
			// Accepted but never answered (a stopped or hung member, its
			// kernel still accepting): not a TLS problem either; the next
			// endpoint decides.
			continue
		}
		return fmt.Errorf("%w: cluster: etcd %s: TLS handshake: %v (check --etcd-cacert, and --etcd-cert/--etcd-key if etcd checks clients)", errs.ErrUnavailable, e, err)
	}
	return nil
}
