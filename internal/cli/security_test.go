package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/hub"
	arsrun "github.com/rlhub/rlhub/internal/run"
	"github.com/rlhub/rlhub/internal/testkit"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A non-loopback --listen without TLS and tokens exits non-zero, before
// listening, with a message naming the flags to pass.
func TestServeRefusesExposedPlaintext(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	code, _, errOut := run(t, ctx, "serve", "--listen", "0.0.0.0:0", "--data", "")
	if code == 0 || !strings.Contains(errOut, "--tls-cert FILE --tls-key FILE and --auth-tokens FILE") || !strings.Contains(errOut, "--insecure") {
		t.Fatalf("code %d, stderr %q", code, errOut)
	}
	dir := t.TempDir()
	if code, out, errOut := run(t, ctx, "cert", "--dir", dir); code != 0 {
		t.Fatalf("cert: %d %s %s", code, out, errOut)
	}
	// TLS alone is not enough off loopback: tokens are missing.
	code, _, errOut = run(t, ctx, "serve", "--listen", "0.0.0.0:0", "--data", "",
		"--tls-cert", filepath.Join(dir, "server.pem"), "--tls-key", filepath.Join(dir, "server-key.pem"))
	if code == 0 || !strings.Contains(errOut, "--auth-tokens FILE") || strings.Contains(errOut, "--tls-cert FILE") {
		t.Fatalf("TLS without tokens: code %d, stderr %q", code, errOut)
	}
}

// --insecure lets an exposed listener through, loudly; loopback needs
// nothing.
func TestServeSecurityApply(t *testing.T) {
	for _, tc := range []struct {
		listen   string
		insecure bool
		ok       bool
		warn     bool
	}{
		{"0.0.0.0:0", false, false, false},
		{":7470", false, false, false},
		{"0.0.0.0:0", true, true, true},
		{"127.0.0.1:0", false, true, false},
		{"localhost:0", false, true, false},
		{"[::1]:0", false, true, false},
	} {
		var stderr strings.Builder
		g := &globals{stderr: &stderr, logger: testkit.Logger()}
		cfg := hub.Config{Listen: tc.listen}
		s := serveSecurity{insecure: tc.insecure}
		err := s.apply(g, &cfg)
		if (err == nil) != tc.ok || strings.Contains(stderr.String(), "WARNING") != tc.warn {
			t.Errorf("%s insecure=%v: err %v, stderr %q", tc.listen, tc.insecure, err, stderr.String())
		}
	}
}

// Issue a CA, certificates and tokens with the CLI, serve over mutual TLS
// with a token file, and train CartPole with ARS through it: `train ars`
// (an admin token) and its worker process (the same flags) over mutual
// TLS; a reader may list but not push; no token is refused.
func TestTrainARSOverMutualTLSWithTokens(t *testing.T) {
	useHelperWorkers(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	if code, out, errOut := run(t, ctx, "cert", "--dir", dir, "--hosts", "127.0.0.1"); code != 0 {
		t.Fatalf("cert: %d %s %s", code, out, errOut)
	}
	for _, f := range []string{"ca-key.pem", "server-key.pem", "client-key.pem"} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v mode %v, want 0600", f, err, st.Mode().Perm())
		}
	}
	tokens := filepath.Join(dir, "tokens")
	for _, role := range []string{"admin", "reader"} {
		code, out, errOut := run(t, ctx, "token", "new", "--role", role, "--scope", "*", "--out", filepath.Join(dir, role+".token"), "--append", tokens)
		if code != 0 || !strings.Contains(out, "sha256:") || strings.Contains(out, "rlh_") {
			t.Fatalf("token new: %d %q %s", code, out, errOut)
		}
	}
	raw, _ := os.ReadFile(tokens)
	tok, _ := os.ReadFile(filepath.Join(dir, "admin.token"))
	if strings.Contains(string(raw), strings.TrimSpace(string(tok))) {
		t.Fatal("the token file holds a token, not only its hash")
	}
	addr := serveCLI(t, "--tls-cert", filepath.Join(dir, "server.pem"), "--tls-key", filepath.Join(dir, "server-key.pem"),
		"--tls-client-ca", filepath.Join(dir, "ca.pem"), "--auth-tokens", tokens)
	tlsFlags := []string{"--tls-ca", filepath.Join(dir, "ca.pem"), "--tls-cert", filepath.Join(dir, "client.pem"), "--tls-key", filepath.Join(dir, "client-key.pem")}
	as := func(role string) []string {
		return append(append([]string{}, tlsFlags...), "--token-file", filepath.Join(dir, role+".token"))
	}
	testkit.Eventually(t, 30*time.Second, "the hub to answer over TLS", func() bool {
		code, _, _ := run(t, ctx, append(as("reader"), "ping", "--hub", addr, "--timeout", "2s")...)
		return code == 0
	})

	// No token: Unauthenticated; a reader pushing: PermissionDenied.
	blob := filepath.Join(dir, "w.safetensors")
	if err := os.WriteFile(blob, smallSafetensors(), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := run(t, ctx, append(tlsFlags, "model", "ls", "--hub", addr)...)
	if code == 0 || !strings.Contains(errOut, "unauthenticated") {
		t.Fatalf("no token: code %d, stderr %q", code, errOut)
	}
	code, _, errOut = run(t, ctx, append(as("reader"), "model", "push", "--hub", addr, "--name", "p", "--version", "1", "--expect", "0", blob)...)
	if code == 0 || !strings.Contains(errOut, "permission denied") || !strings.Contains(errOut, "needs role trainer") {
		t.Fatalf("reader push: code %d, stderr %q", code, errOut)
	}
	// No client certificate: the TLS handshake fails.
	code, _, _ = run(t, ctx, "--tls-ca", filepath.Join(dir, "ca.pem"), "--token-file", filepath.Join(dir, "admin.token"), "ping", "--hub", addr, "--timeout", "3s")
	if code == 0 {
		t.Fatal("a client without a certificate reached a mutual-TLS hub")
	}

	out := t.TempDir()
	code, stdout, errOut := run(t, ctx, append(as("admin"), "--log-level", "warn", "train", "ars", "--hub", addr, "--env", "CartPole-v1", "--workers", "1",
		"--seed", "2", "--target", "200", "--out", out)...)
	if code != 0 {
		t.Fatalf("train over mTLS: code %d\nstdout %s\nstderr %s", code, stdout, errOut)
	}
	var sum arsrun.Summary
	raw, err := os.ReadFile(filepath.Join(out, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &sum); err != nil {
		t.Fatal(err)
	}
	if !sum.ReachedTarget || sum.Workers != 1 || sum.Steps == 0 {
		t.Fatalf("summary %s", raw)
	}
}

// smallSafetensors is a one-tensor safetensors blob (F32 [2]).
func smallSafetensors() []byte {
	h := `{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`
	for len(h)%8 != 0 {
		h += " "
	}
	b := []byte{byte(len(h)), 0, 0, 0, 0, 0, 0, 0}
	b = append(b, h...)
	return append(b, make([]byte, 8)...)
}

// On a cluster a hub and a hub of secondaries register the host --listen
// names (netsec.Advertised): one that names no machine (every interface)
// is refused, since other machines would be told to dial it.
func TestClusteredListenMustNameAMachine(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, role := range []string{"all", "reducer"} {
		code, _, errOut := run(t, ctx, "serve", "--listen", "0.0.0.0:0", "--insecure", "--data", t.TempDir(), "--role", role,
			"--etcd", "127.0.0.1:1", "--cluster", "x")
		if code == 0 || !strings.Contains(errOut, "names no machine") || !strings.Contains(errOut, "--advertise") {
			t.Fatalf("serve --role %s --listen 0.0.0.0:0 --etcd: code %d, stderr %q", role, code, errOut)
		}
	}
}

// A hub listening on every interface (a Kubernetes pod) joins the cluster
// under the name --advertise gives it, with the bound port: that is what
// etcd tells other machines to dial.
func TestClusteredHubAdvertisesTheGivenName(t *testing.T) {
	e := clustertest.Start(t)
	p := startServeChild(t, fmt.Sprintf("serve --listen 0.0.0.0:0 --advertise 127.0.0.1 --insecure --data %s --etcd %s --cluster adv --member-id a1",
		t.TempDir(), e.Endpoint))
	host, port, err := net.SplitHostPort(p.Addr())
	if err != nil || host != "127.0.0.1" {
		t.Fatalf("address file %q (%v); want 127.0.0.1:PORT", p.Addr(), err)
	}
	want := "a1@127.0.0.1:" + port
	testkit.Eventually(t, 30*time.Second, "the hub's member record to name "+want, func() bool {
		_, out, _ := run(t, context.Background(), "cluster", "status", "--etcd", e.Endpoint, "--cluster", "adv")
		return strings.Contains(out, want)
	})
	// It serves there: a client that dials the advertised address reaches it.
	if code, out, errOut := run(t, context.Background(), "ping", "--hub", p.Addr()); code != 0 {
		t.Fatalf("ping %s: %d %s %s", p.Addr(), code, out, errOut)
	}
}

// TestServeExitsOnAMisconfiguredEtcd: a hub whose etcd settings cannot
// work — plaintext to an endpoint off loopback, a wrong password, a user
// whose role does not cover the cluster — exits with an error naming the
// setting, instead of retrying its join for ever as for an etcd that is
// down. Nothing is registered.
func TestServeExitsOnAMisconfiguredEtcd(t *testing.T) {
	s := clustertest.StartSecure(t, "mine")
	secure := func(cluster, pw string) []string {
		return []string{"--etcd", s.Endpoint, "--cluster", cluster, "--etcd-cacert", s.CACert,
			"--etcd-cert", s.ClientCert, "--etcd-key", s.ClientKey, "--etcd-user", s.User, "--etcd-password-file", pw}
	}
	for _, c := range []struct {
		name string
		etcd []string
		want []string
	}{
		{"plaintext off loopback", []string{"--etcd", "10.1.2.3:2379", "--cluster", "mine"}, []string{"invalid argument", "not on loopback", "--etcd-cacert"}},
		{"wrong password", secure("mine", s.WrongPasswordFile), []string{"unauthenticated", "--etcd-password-file"}},
		{"role without the cluster", secure("theirs", s.PasswordFile), []string{"permission denied", "/rlhub/NAME/"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			args := append([]string{"serve", "--listen", "127.0.0.1:0", "--data", t.TempDir(), "--member-id", "h1"}, c.etcd...)
			code, _, errOut := run(t, ctx, args...)
			if ctx.Err() != nil {
				t.Fatalf("serve ran until the test's deadline (code %d); want it to exit on its own: %s", code, errOut)
			}
			if code == 0 {
				t.Fatalf("serve exited 0; want an error: %s", errOut)
			}
			for _, w := range c.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("serve's error does not say %q:\n%s", w, errOut)
				}
			}
		})
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	resp, err := s.Root.Get(rctx, "/rlhub/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		t.Errorf("a refused hub left the key %s", kv.Key)
	}
}
