package dial

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/auth"
)

func TestFilesLoad(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tok := write("tok", "  rlh_abc\n")
	c, err := Files{TokenFile: tok}.Load()
	if err != nil || c.Token != "rlh_abc" || c.Secure() {
		t.Fatalf("token file: %+v, %v", c, err)
	}
	if c, err := (Files{}).Load(); err != nil || c.Secure() || c.Token != "" {
		t.Fatalf("zero Files: %+v, %v", c, err)
	}
	for name, f := range map[string]Files{
		"empty token file":   {TokenFile: write("empty", "\n")},
		"two tokens":         {TokenFile: write("two", "a b")},
		"missing token file": {TokenFile: filepath.Join(dir, "nope")},
		"token file of 5 kB": {TokenFile: write("big", strings.Repeat("t", 5000))},
		"CA not PEM":         {CA: write("ca", "not pem")},
		"cert without key":   {CA: "", Cert: write("c", "x")},
	} {
		if _, err := f.Load(); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
	// A certificate that cannot be read is named by its flags and file
	// (a hub's own --tls-cert is loaded here too: not only a client's).
	missing := filepath.Join(dir, "missing.pem")
	if _, err := (Files{Cert: missing, Key: missing}).Load(); err == nil || !strings.Contains(err.Error(), "--tls-cert/--tls-key") || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing certificate: %v", err)
	}
	if _, err := ServerTLS("", "", ""); err == nil || !strings.Contains(err.Error(), "--tls-key") {
		t.Errorf("ServerTLS without files: %v", err)
	}
}

func TestFromEnvFillsOnlyEmptyFields(t *testing.T) {
	t.Setenv("RLHUB_TLS_CA", "/env/ca.pem")
	t.Setenv("RLHUB_TOKEN_FILE", "/env/tok")
	f := Files{CA: "/flag/ca.pem"}.FromEnv()
	if f.CA != "/flag/ca.pem" || f.TokenFile != "/env/tok" {
		t.Fatalf("%+v", f)
	}
}

func TestOptionsCarryCredentials(t *testing.T) {
	// Plaintext with and without a token: the options build a client.
	for _, c := range []Config{{}, {Token: "rlh_x", KeepaliveTime: -1}} {
		conn, err := c.GRPC("127.0.0.1:1")
		if err != nil {
			t.Fatal(err)
		}
		conn.Close()
	}
}

// A plaintext call to a hub that serves TLS fails, as gRPC has it, with
// "error reading server preface"; the error says what to do about it.
func TestPlaintextToTLSSaysWhatToDo(t *testing.T) {
	dir := t.TempDir()
	ca, err := auth.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c, k, err := ca.Issue("server", []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := auth.WritePair(dir, "server", c, k); err != nil {
		t.Fatal(err)
	}
	srvTLS, err := ServerTLS(filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem"), "")
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(srvTLS)))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }() // the owner: the test stops it below
	defer func() { srv.Stop(); <-done }()

	conn, err := Config{}.GRPC(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "if it serves TLS, pass its CA") {
		t.Fatalf("plaintext call to a TLS server: %v", err)
	}
	st, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("plaintext stream to a TLS server: %v", err)
	}
	if !strings.Contains(err.Error(), "if it serves TLS, pass its CA") {
		t.Errorf("plaintext stream to a TLS server, no hint: %v", err)
	}
	// The hint is only for that failure: another one keeps its text.
	if e := tlsHint(status.Error(codes.Unavailable, "connection refused")); strings.Contains(e.Error(), "TLS") {
		t.Errorf("hint on another error: %v", e)
	}
}
