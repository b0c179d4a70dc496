package netsec

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:7070": true,
		"127.8.9.1:1":    true,
		"[::1]:7070":     true,
		"::1":            true,
		"localhost:80":   true,
		"localhost":      true,
		":7070":          false, // every interface
		"0.0.0.0:7070":   false,
		"10.0.0.1:7070":  false,
		"example.com:1":  false,
		"localhost.evil": false,
		"":               false,
	} {
		if got := IsLoopback(addr); got != want {
			t.Errorf("IsLoopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

func TestReadFileRefusesWhatIsLongerThanItsBound(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "secret")
	if err := os.WriteFile(p, []byte(strings.Repeat("x", 10)), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadFile(p, 10); err != nil || len(b) != 10 {
		t.Fatalf("at the bound: %d bytes, %v", len(b), err)
	}
	b, err := ReadFile(p, 9)
	if err == nil || b != nil || !strings.Contains(err.Error(), "longer than 9 bytes") {
		t.Fatalf("past the bound: %q, %v", b, err)
	}
	if _, err := ReadFile(filepath.Join(dir, "missing"), 9); !os.IsNotExist(err) {
		t.Fatalf("missing file: %v", err)
	}
}

func TestCertPoolNamesTheFileNotItsContent(t *testing.T) {
	p := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(p, []byte("hunter2 is not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := CertPool(p)
	if err == nil || !strings.Contains(err.Error(), p) || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("CertPool of a non-PEM file: %v", err)
	}
}

func TestKeyPairNeedsBothFiles(t *testing.T) {
	if certs, err := KeyPair("", ""); err != nil || certs != nil {
		t.Fatalf("neither: %v, %v", certs, err)
	}
	for _, pair := range [][2]string{{"cert.pem", ""}, {"", "key.pem"}} {
		if _, err := KeyPair(pair[0], pair[1]); err == nil || !strings.Contains(err.Error(), "both") {
			t.Fatalf("KeyPair(%q, %q): %v", pair[0], pair[1], err)
		}
	}
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
	os.WriteFile(cert, []byte("not pem"), 0o600)
	os.WriteFile(key, []byte("not pem"), 0o600)
	if _, err := KeyPair(cert, key); err == nil {
		t.Fatal("a pair that is not PEM was loaded")
	}
}

func TestAdvertised(t *testing.T) {
	bound := &net.TCPAddr{IP: net.IPv4zero, Port: 7470}
	for _, c := range []struct{ listen, advertise, want, err string }{
		{"m1:0", "", "m1:7470", ""},                                       // a name stays a name, the bound port
		{"10.0.0.5:7470", "", "10.0.0.5:7470", ""},                        // an address as given
		{"0.0.0.0:7470", "", "", "names no machine"},                      // every interface: no machine
		{":7470", "", "", "names no machine"},                             // the same
		{"[::]:7470", "", "", "names no machine"},                         // the same, IPv6
		{"0.0.0.0:7470", "hub-0.hub.ml.svc", "hub-0.hub.ml.svc:7470", ""}, // a pod by its DNS name
		{"0.0.0.0:7470", "hub.example:443", "hub.example:443", ""},        // a port mapped elsewhere
		{"m1:7470", "[fd00::5]:7470", "[fd00::5]:7470", ""},
		{"m1:7470", "0.0.0.0", "", "--advertise"},
		{"m1:7470", "[::]:9", "", "--advertise"},
		{"nonsense", "", "", "listen address"},
	} {
		got, err := Advertised(c.listen, c.advertise, bound)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("Advertised(%q, %q) = %q, %v; want an error with %q", c.listen, c.advertise, got, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("Advertised(%q, %q) = %q, %v; want %q", c.listen, c.advertise, got, err, c.want)
		}
	}
	long := strings.Repeat("x", 10000) // no port: an error, which must not echo it all
	if _, err := Advertised(long, "", bound); err == nil || len(err.Error()) > 300 {
		t.Errorf("a long listen address without a port: %v", err)
	}
}
