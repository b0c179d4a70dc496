package testkit

import (
	"bufio"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// hello dials addr and returns the line the "hostname" child says.
func hello(addr string, timeout time.Duration) (string, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

func TestLabHostsAreMachines(t *testing.T) {
	lab := NewLab(t, "m1", "m2")
	ports := map[string]string{}
	for _, h := range lab.Hosts {
		addrFile := filepath.Join(t.TempDir(), "addr")
		p := h.Start(t, ProcConfig{Path: os.Args[0], Args: []string{"hostname", addrFile},
			Env: []string{childEnv + "=1"}, AddrFile: addrFile, StartTimeout: 30 * time.Second})
		host, port, err := net.SplitHostPort(p.Addr())
		if err != nil || host != h.Name {
			t.Fatalf("%s's child published %q (%v); want its hostname %q", h.Name, p.Addr(), err, h.Name)
		}
		ports[h.Name] = port
	}
	for _, h := range lab.Hosts {
		got, err := hello(net.JoinHostPort(h.IP, ports[h.Name]), 10*time.Second)
		if err != nil || got != h.Name {
			t.Fatalf("%s at %s: %q, %v", h.Name, h.IP, got, err)
		}
	}
	// Each host has its own loopback: m2's port on 127.0.0.1 is not
	// here, where no child listens.
	if _, err := hello(net.JoinHostPort("127.0.0.1", ports["m2"]), time.Second); err == nil {
		t.Fatal("m2's child answered on this namespace's loopback")
	}

	m1 := lab.Host(t, "m1")
	m1.Cut(t)
	if got, err := hello(net.JoinHostPort(m1.IP, ports["m1"]), time.Second); err == nil {
		t.Fatalf("m1 answered %q while cut off", got)
	}
	if got, err := hello(net.JoinHostPort(lab.Host(t, "m2").IP, ports["m2"]), 10*time.Second); err != nil || got != "m2" {
		t.Fatalf("m2 while m1 is cut off: %q, %v", got, err)
	}
	m1.Heal(t)
	Eventually(t, 20*time.Second, "m1 reachable after Heal", func() bool {
		got, err := hello(net.JoinHostPort(m1.IP, ports["m1"]), time.Second)
		return err == nil && got == "m1"
	})
}
