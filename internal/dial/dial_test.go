package dial

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
