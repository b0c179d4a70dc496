package metrics_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/metrics"
	"github.com/rlhub/rlhub/internal/testkit"
)

// Off loopback the endpoint needs TLS and tokens, or Insecure; with
// tokens every path but the two probes wants a reader token, as a bearer
// token or as the basic-auth password (what a browser sends for the
// dashboard).
func TestEndpointSecureByDefault(t *testing.T) {
	if _, err := metrics.New(metrics.Config{Listen: "0.0.0.0:0", Logger: testkit.Logger()}); err == nil || !strings.Contains(err.Error(), "not a loopback address") {
		t.Fatalf("exposed plaintext endpoint: %v", err)
	}
	// With Insecure it serves, and says so in the log: never silently.
	var logs testkit.Buffer
	ms, err := metrics.New(metrics.Config{Listen: "0.0.0.0:0", Insecure: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatalf("with Insecure: %v", err)
	}
	ms.Start()
	testkit.Eventually(t, 10*time.Second, "the insecure endpoint's warning", func() bool {
		return strings.Contains(logs.String(), "level=WARN") && strings.Contains(logs.String(), "INSECURE")
	})
	ms.Close()

	tok, hash, _ := auth.NewToken()
	v := auth.NewVerifier(map[string]auth.Principal{hash: {Name: "prom", Role: auth.Reader, Scopes: []string{""}}})
	ms, err = metrics.New(metrics.Config{Listen: "127.0.0.1:0", Auth: v, Sources: metrics.Sources{Auth: v.Stats}, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	ms.Start()
	defer ms.Close()
	hc := &http.Client{Timeout: 10 * time.Second}
	get := func(path string, set func(*http.Request)) int {
		t.Helper()
		req, _ := http.NewRequestWithContext(context.Background(), "GET", "http://"+ms.Addr()+path, nil)
		set(req)
		var resp *http.Response
		testkit.Eventually(t, 10*time.Second, "the endpoint to answer", func() bool {
			resp, err = hc.Do(req)
			return err == nil
		})
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 && path == "/metrics" {
			for _, f := range []string{"rlhub_auth_tokens 1", "rlhub_auth_live_calls 0", `rlhub_auth_quota_refusals_total{quota="bytes"} 0`} {
				if !strings.Contains(string(b), f) {
					t.Errorf("/metrics has no %s", f)
				}
			}
		}
		return resp.StatusCode
	}
	for _, c := range []struct {
		what string
		path string
		set  func(*http.Request)
		want int
	}{
		{"no token", "/metrics", func(*http.Request) {}, 401},
		{"unknown token", "/metrics", func(r *http.Request) { r.Header.Set("Authorization", "Bearer rlh_nope") }, 401},
		{"bearer", "/metrics", func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+tok) }, 200},
		{"basic", "/", func(r *http.Request) { r.SetBasicAuth("any", tok) }, 200},
		{"basic, no token", "/api/state", func(r *http.Request) { r.SetBasicAuth("any", "") }, 401},
		// The probes alone need no token (an orchestrator's probe holds none).
		{"liveness probe, no token", "/healthz", func(*http.Request) {}, 200},
		{"readiness probe, no token", "/readyz", func(*http.Request) {}, 200},
		{"a path below a probe, no token", "/healthz/x", func(*http.Request) {}, 401},
		{"a probe's twin path, no token", "/readyz/", func(*http.Request) {}, 401},
	} {
		if got := get(c.path, c.set); got != c.want {
			t.Errorf("%s %s: %d, want %d", c.what, c.path, got, c.want)
		}
	}
}

// On loopback without tokens the endpoint answers requests that name
// loopback only: a page elsewhere that points its own name at 127.0.0.1
// (DNS rebinding) cannot read the dashboard's state through the
// operator's browser. Probes answer whatever the Host.
func TestLoopbackEndpointRefusesOtherHosts(t *testing.T) {
	ms, err := metrics.New(metrics.Config{Listen: "127.0.0.1:0", Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	ms.Start()
	defer ms.Close()
	hc := &http.Client{Timeout: 10 * time.Second}
	_, port, _ := net.SplitHostPort(ms.Addr())
	get := func(path, host string) int {
		t.Helper()
		req, _ := http.NewRequestWithContext(context.Background(), "GET", "http://"+ms.Addr()+path, nil)
		req.Host = host
		var resp *http.Response
		testkit.Eventually(t, 10*time.Second, "the endpoint to answer", func() bool {
			resp, err = hc.Do(req)
			return err == nil
		})
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct {
		path, host string
		want       int
	}{
		{"/api/state", "127.0.0.1:" + port, 200},
		{"/api/state", "localhost:" + port, 200},
		{"/metrics", "[::1]:" + port, 200},
		{"/api/state", "attacker.example:" + port, 403},
		{"/metrics", "attacker.example", 403},
		{"/", "10.0.0.1:" + port, 403},
		{"/healthz", "attacker.example", 200},
	} {
		if got := get(c.path, c.host); got != c.want {
			t.Errorf("GET %s with Host %s: %d, want %d", c.path, c.host, got, c.want)
		}
	}
}
