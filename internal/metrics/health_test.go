package metrics_test

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/metrics"
	"github.com/rlhub/rlhub/internal/netsec"
	"github.com/rlhub/rlhub/internal/testkit"
)

// The readiness probe follows the process's role as the cluster reports
// it, moment to moment: a primary and a synced standby are ready, a
// standby still copying the primary's state is not (503, with the reason),
// and a process outside a cluster is ready while it serves; the liveness
// probe answers 200 throughout. HEAD answers as GET, other methods are
// not the probes'.
func TestProbesFollowTheRole(t *testing.T) {
	var mu sync.Mutex
	st := metrics.ClusterStats{Epoch: 7}
	ms, err := metrics.New(metrics.Config{Listen: "127.0.0.1:0", Logger: testkit.Logger(), Sources: metrics.Sources{Cluster: func() metrics.ClusterStats {
		mu.Lock()
		defer mu.Unlock()
		return st
	}}})
	if err != nil {
		t.Fatal(err)
	}
	ms.Start()
	defer ms.Close()
	hc := &http.Client{Timeout: 10 * time.Second}
	probeAt := func(addr, method, path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(context.Background(), method, "http://"+addr+path, nil)
		var resp *http.Response
		testkit.Eventually(t, 10*time.Second, "the endpoint to answer", func() bool {
			resp, err = hc.Do(req)
			return err == nil
		})
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	probe := func(method, path string) (int, string) {
		t.Helper()
		return probeAt(ms.Addr(), method, path)
	}
	set := func(s metrics.ClusterStats) {
		mu.Lock()
		st = s
		mu.Unlock()
	}
	for _, c := range []struct {
		st       metrics.ClusterStats
		code     int
		contains string
	}{
		{metrics.ClusterStats{Epoch: 7}, 503, "not yet synced"},
		{metrics.ClusterStats{Epoch: 7, Synced: true, Unit: 3}, 200, "standby, synced with the primary of epoch 7"},
		{metrics.ClusterStats{Epoch: 9, Primary: true}, 200, "primary, epoch 9"},
		{metrics.ClusterStats{Epoch: 9}, 503, "standby, not yet synced with a primary (epoch 9)"},
		{metrics.ClusterStats{Epoch: 9, Synced: true, Outside: true}, 503, "not a cluster member (joining, or out after a local fault)"},
	} {
		set(c.st)
		code, body := probe("GET", metrics.ReadyPath)
		if code != c.code || !strings.Contains(body, c.contains) {
			t.Errorf("readyz with %+v: %d %q, want %d and %q", c.st, code, body, c.code, c.contains)
		}
		if code, _ := probe("HEAD", metrics.ReadyPath); code != c.code {
			t.Errorf("HEAD readyz with %+v: %d, want %d", c.st, code, c.code)
		}
		if code, body := probe("GET", metrics.LivePath); code != 200 || body != "ok" {
			t.Errorf("healthz with %+v: %d %q, want 200 ok", c.st, code, body)
		}
	}
	if code, _ := probe("POST", metrics.ReadyPath); code != http.StatusMethodNotAllowed && code != http.StatusNotFound {
		t.Errorf("POST readyz: %d, want the mux's refusal", code)
	}

	plain, err := metrics.New(metrics.Config{Listen: "127.0.0.1:0", Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	plain.Start()
	defer plain.Close()
	if code, body := probeAt(plain.Addr(), "GET", metrics.ReadyPath); code != 200 || body != "ready" {
		t.Errorf("readyz outside a cluster: %d %q, want 200 ready", code, body)
	}
}

// With mutual TLS (the hub's --tls-client-ca) and tokens, a probe that
// presents no certificate and no token — as Kubernetes' HTTPS probes do —
// reaches /healthz and /readyz, and nothing else: /metrics and the
// dashboard want a certificate the client CA signed, then a token. A
// certificate from another CA is refused at the handshake.
func TestProbesNeedNoClientCertificate(t *testing.T) {
	dir := t.TempDir()
	ca, err := auth.NewCA("rlhub test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := auth.NewCA("someone else", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteCA(dir); err != nil {
		t.Fatal(err)
	}
	issue := func(c *auth.CA, name string) tls.Certificate {
		certPEM, keyPEM, err := c.Issue(name, []string{"127.0.0.1"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := auth.WritePair(dir, name, certPEM, keyPEM); err != nil {
			t.Fatal(err)
		}
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return pair
	}
	issue(ca, "server")
	client, stranger := issue(ca, "client"), issue(other, "stranger")
	srvTLS, err := dial.ServerTLS(filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem"), filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	tok, hash, _ := auth.NewToken()
	v := auth.NewVerifier(map[string]auth.Principal{hash: {Name: "prom", Role: auth.Reader, Scopes: []string{""}}})
	ms, err := metrics.New(metrics.Config{Listen: "127.0.0.1:0", TLS: srvTLS, Auth: v, Logger: testkit.Logger(),
		Sources: metrics.Sources{Cluster: func() metrics.ClusterStats { return metrics.ClusterStats{Primary: true, Epoch: 3} }}})
	if err != nil {
		t.Fatal(err)
	}
	ms.Start()
	defer ms.Close()
	pool, err := netsec.CertPool(filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	get := func(cert *tls.Certificate, token, path string) (int, error) {
		t.Helper()
		tc := &tls.Config{RootCAs: pool}
		if cert != nil { // sent whatever CAs the server names
			tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
		}
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}, Timeout: 10 * time.Second}
		defer hc.CloseIdleConnections()
		req, _ := http.NewRequestWithContext(context.Background(), "GET", "https://"+ms.Addr()+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	testkit.Eventually(t, 10*time.Second, "the endpoint to answer", func() bool {
		_, err := get(nil, "", metrics.LivePath)
		return err == nil
	})
	for _, c := range []struct {
		what  string
		cert  *tls.Certificate
		token string
		path  string
		want  int
	}{
		{"liveness, no certificate, no token", nil, "", metrics.LivePath, 200},
		{"readiness, no certificate, no token", nil, "", metrics.ReadyPath, 200},
		{"metrics, no certificate, a token", nil, tok, "/metrics", 401},
		{"dashboard, no certificate, a token", nil, tok, "/", 401},
		{"metrics, a certificate, no token", &client, "", "/metrics", 401},
		{"metrics, a certificate and a token", &client, tok, "/metrics", 200},
	} {
		if got, err := get(c.cert, c.token, c.path); err != nil || got != c.want {
			t.Errorf("%s: %d (%v), want %d", c.what, got, err, c.want)
		}
	}
	if got, err := get(&stranger, tok, "/metrics"); err == nil {
		t.Errorf("a certificate another CA signed: %d, want the handshake refused", got)
	}
}
