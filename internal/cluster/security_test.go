package cluster

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/testkit"
)

// Against a real etcd with TLS, client-certificate checks and auth on: the
// right CA, client certificate, user and password join, announce and read;
// a wrong password, no client certificate, the wrong CA or a role without
// the cluster's prefix each fail with an error naming etcd, and leave no
// key behind.
func TestEtcdTLSAndAuth(t *testing.T) {
	s := clustertest.StartSecure(t, "sec")
	good := EtcdSecurity{CACert: s.CACert, Cert: s.ClientCert, Key: s.ClientKey, User: s.User, PasswordFile: s.PasswordFile}
	cfg := func(sec EtcdSecurity, cluster string) Config {
		return Config{Endpoints: []string{"http://" + s.HostPort()}, Cluster: cluster, Addr: "127.0.0.1:1", ID: "h1",
			LeaseTTL: 5 * time.Second, DialTimeout: 15 * time.Second, Logger: testkit.Logger(), Security: sec}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	bad := map[string]struct {
		sec     EtcdSecurity
		cluster string
		want    error
		text    string
	}{
		"wrong password": {func() EtcdSecurity { b := good; b.PasswordFile = s.WrongPasswordFile; return b }(), "sec", errs.ErrUnauthenticated, "authentication failed"},
		"no client cert": {func() EtcdSecurity { b := good; b.Cert, b.Key = "", ""; return b }(), "sec", errs.ErrUnavailable, "TLS handshake"},
		"wrong CA":       {func() EtcdSecurity { b := good; b.CACert = s.OtherCA; return b }(), "sec", errs.ErrUnavailable, "certificate signed by unknown authority"},
		"other prefix":   {good, "other", errs.ErrPermission, "permission denied"},
	}
	for name, c := range bad {
		t.Run(name, func(t *testing.T) {
			bctx, bcancel := context.WithTimeout(ctx, 30*time.Second)
			defer bcancel()
			m, err := Join(bctx, cfg(c.sec, c.cluster))
			if err == nil {
				m.Close()
				t.Fatal("join succeeded")
			}
			_, aerr := Announce(bctx, cfg(c.sec, c.cluster), ServiceInfo{Kind: KindRelay, ID: "r1", Addr: "127.0.0.1:2"})
			rd, err2 := OpenReader(cfg(c.sec, c.cluster))
			var rerr error
			if err2 == nil {
				_, rerr = rd.Status(bctx)
				rd.Close()
			} else {
				rerr = err2
			}
			for what, e := range map[string]error{"join": err, "announce": aerr, "status": rerr} {
				if e == nil {
					t.Errorf("%s succeeded", what)
					continue
				}
				if !strings.Contains(e.Error(), "etcd") || !strings.Contains(e.Error(), c.text) {
					t.Errorf("%s: %v: want the text to name etcd and %q", what, e, c.text)
				}
				if !errors.Is(e, c.want) {
					t.Errorf("%s: %v, want %v", what, e, c.want)
				}
			}
			if keys := s.Keys(t, "/rlhub/"); len(keys) != 0 {
				t.Fatalf("a refused client left keys: %v", keys)
			}
		})
	}

	m, err := Join(ctx, cfg(good, "sec"))
	if err != nil {
		t.Fatalf("join with the right credentials: %v", err)
	}
	defer m.Close()
	if _, err := m.Campaign(ctx); err != nil {
		t.Fatalf("campaign: %v", err)
	}
	a, err := Announce(ctx, cfg(good, "sec"), ServiceInfo{Kind: KindRelay, ID: "r1", Addr: "127.0.0.1:2", Host: "here"})
	if err != nil {
		t.Fatalf("announce: %v", err)
	}
	defer a.Close()
	rd, err := OpenReader(cfg(good, "sec"))
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	l, err := rd.Leader(ctx)
	if err != nil || l.ID != "h1" {
		t.Fatalf("leader %v, %v", l, err)
	}
	ss, err := rd.Services(ctx, KindRelay, "")
	if err != nil || len(ss) != 1 || ss[0].Host != "here" {
		t.Fatalf("services %v, %v", ss, err)
	}
}

// Bad settings are refused before anything is dialed: plaintext to an
// endpoint off loopback (unless Insecure), half a key pair, a user
// without a password file, an empty or missing password file.
func TestEtcdSecurityRefusedBeforeDialing(t *testing.T) {
	dir := t.TempDir()
	empty := dir + "/empty"
	clustertestWrite(t, empty, "")
	cases := map[string]struct {
		eps []string
		sec EtcdSecurity
	}{
		"plaintext off loopback":  {[]string{"http://10.9.8.7:2379"}, EtcdSecurity{}},
		"one of two off loopback": {[]string{"http://127.0.0.1:2379", "http://etcd.example:2379"}, EtcdSecurity{}},
		"cert without key":        {[]string{"http://127.0.0.1:2379"}, EtcdSecurity{Cert: "c.pem"}},
		"user without password":   {[]string{"http://127.0.0.1:2379"}, EtcdSecurity{User: "u"}},
		"empty password file":     {[]string{"http://127.0.0.1:2379"}, EtcdSecurity{User: "u", PasswordFile: empty}},
		"missing password file":   {[]string{"http://127.0.0.1:2379"}, EtcdSecurity{User: "u", PasswordFile: dir + "/nope"}},
		"missing CA":              {[]string{"http://127.0.0.1:2379"}, EtcdSecurity{CACert: dir + "/nope"}},
	}
	for name, c := range cases {
		_, err := OpenReader(Config{Endpoints: c.eps, Cluster: "x", Security: c.sec})
		if !errors.Is(err, errs.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if _, err := OpenReader(Config{Endpoints: []string{"http://10.9.8.7:2379"}, Cluster: "x", Security: EtcdSecurity{Insecure: true}}); err != nil {
		t.Errorf("--insecure off loopback: %v", err)
	}
	if _, err := (EtcdSecurity{}).resolve([]string{"10.9.8.7:2379"}); !errors.Is(err, errs.ErrInvalid) {
		t.Errorf("plaintext off loopback, no scheme: %v, want ErrInvalid", err)
	}
	if ec, err := (EtcdSecurity{CACert: ""}).resolve([]string{"http://localhost:2379", "http://[::1]:2379", "127.0.0.1:2379"}); err != nil || ec.tls != nil {
		t.Errorf("loopback plaintext: %v %v", ec, err)
	}
}

func clustertestWrite(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}
