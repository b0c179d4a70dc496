package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
)

// run runs rlhub on h with args and returns its output and exit code.
func run(t *testing.T, h *testkit.Host, name string, args ...string) (string, int) {
	t.Helper()
	p := h.Start(t, testkit.ProcConfig{Name: name, Args: args})
	st := p.Wait(t, 2*time.Minute)
	return p.Output(), st.ExitCode()
}

// TestSecurityOffLoopback is docs/security.md's "secure by default" across
// machines. A hub told to listen on its machine's address without TLS and
// tokens refuses to start (exit 2, naming the missing flags and
// --insecure); with --insecure it serves and says so. A hub with mutual TLS
// and tokens on m1 is reached from c1 by the CLI with a trainer's token
// and the CA; without a token, with a wrong token, or trusting another CA
// the same push is refused with a clear error, and the version list read
// with a reader's token is unchanged.
func TestSecurityOffLoopback(t *testing.T) {
	lab := testkit.NewLab(t, "m1", "c1")
	m1, c1 := lab.Hosts[0], lab.Hosts[1]
	p := newPKI(t, "127.0.0.1", m1.Name, m1.IP)
	other := t.TempDir() // another CA, and a certificate it signed for m1
	rlhubCLI(t, "cert", "--dir", other, "--hosts", m1.IP)
	listen := m1.IP + ":7470"

	out, code := run(t, m1, "open hub", "serve", "--listen", listen, "--data", t.TempDir())
	if code != 2 || !strings.Contains(out, "is not a loopback address") || !strings.Contains(out, "--tls-cert") ||
		!strings.Contains(out, "--auth-tokens") || !strings.Contains(out, "--insecure") {
		t.Fatalf("serve --listen %s without TLS or tokens: exit %d, want 2 and the missing flags named:\n%s", listen, code, out)
	}
	out, code = run(t, m1, "hub with TLS only", "serve", "--listen", listen, "--data", t.TempDir(),
		"--tls-cert", p.pem("server"), "--tls-key", p.pem("server-key"))
	if code != 2 || !strings.Contains(out, "--auth-tokens") || strings.Contains(out, "--tls-cert FILE") {
		t.Fatalf("serve --listen %s with TLS and no tokens: exit %d, want 2 naming --auth-tokens only:\n%s", listen, code, out)
	}
	addrFile := filepath.Join(t.TempDir(), "addr")
	insecure := m1.Start(t, testkit.ProcConfig{Name: "insecure hub", Args: []string{"serve", "--listen", listen, "--data", t.TempDir(),
		"--addr-file", addrFile, "--insecure"}, AddrFile: addrFile})
	if !strings.Contains(insecure.Output(), "WARNING: --insecure") {
		t.Errorf("serve --insecure did not warn:\n%s", insecure.Output())
	}
	insecure.Stop(syscall.SIGTERM, 10*time.Second)

	addrFile = filepath.Join(t.TempDir(), "addr")
	hub := m1.Start(t, testkit.ProcConfig{Name: "hub", Args: []string{"serve", "--listen", listen, "--data", t.TempDir(),
		"--addr-file", addrFile, "--tls-cert", p.pem("server"), "--tls-key", p.pem("server-key"),
		"--tls-client-ca", p.pem("ca"), "--auth-tokens", p.tokens}, AddrFile: addrFile})
	if hub.Addr() != listen {
		t.Fatalf("the hub serves %s, want %s", hub.Addr(), listen)
	}

	sd, _ := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{4}, []float32{1, 2, 3, 4}))
	blob, err := safetensors.Encode(sd, nil)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "w.safetensors")
	if err := os.WriteFile(file, blob, 0o644); err != nil {
		t.Fatal(err)
	}
	wrong := filepath.Join(t.TempDir(), "wrong.token")
	if err := os.WriteFile(wrong, []byte("rlhub_not-a-token-this-hub-issued\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	client := func(ca, token string, args ...string) []string {
		out := append(args, "--hub", listen, "--tls-ca", ca, "--tls-cert", p.pem("client"), "--tls-key", p.pem("client-key"), "--timeout", "20s")
		if token != "" {
			out = append(out, "--token-file", token)
		}
		return out
	}
	push := func(v string) []string { return []string{"model", "push", "--name", "pol", "--version", v, file} }
	list := func() string {
		t.Helper()
		out, code := run(t, c1, "model ls", client(p.pem("ca"), p.token("reader"), "model", "ls")...)
		if code != 0 {
			t.Fatalf("model ls with a reader's token: exit %d:\n%s", code, out)
		}
		return out
	}

	if out, code := run(t, c1, "push as trainer", client(p.pem("ca"), p.token("trainer"), push("1")...)...); code != 0 {
		t.Fatalf("push v1 as a trainer from c1: exit %d:\n%s", code, out)
	}
	before := list()
	if !strings.Contains(before, "pol") {
		t.Fatalf("model ls after v1 shows no pol:\n%s", before)
	}
	for _, c := range []struct {
		name, ca, token string
		want            []string // in the error, lower case
	}{
		{"no token", p.pem("ca"), "", []string{"unauthenticated"}},
		{"a wrong token", p.pem("ca"), wrong, []string{"unauthenticated"}},
		{"a reader's token", p.pem("ca"), p.token("reader"), []string{"permission denied", "trainer"}},
		{"another CA", filepath.Join(other, "ca.pem"), p.token("trainer"), []string{"certificate"}},
	} {
		out, code := run(t, c1, "push with "+c.name, client(c.ca, c.token, push("2")...)...)
		low := strings.ToLower(out)
		for _, w := range c.want {
			if code == 0 || !strings.Contains(low, w) {
				t.Errorf("push with %s: exit %d, want a refusal mentioning %q:\n%s", c.name, code, w, out)
			}
		}
		if after := list(); after != before {
			t.Errorf("push with %s changed the version list:\nbefore:\n%s\nafter:\n%s", c.name, before, after)
		}
	}
}
