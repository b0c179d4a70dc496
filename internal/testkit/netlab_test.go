package testkit

import (
	"bufio"
	"net"
	"os"
	"os/exec"
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

// askFrom is what host from hears from the "hostname" child at addr
// within timeout: ten seconds where it is expected to answer (a loaded
// machine's reply must not read as a cut), one where it is cut off (the
// wait is how a cut shows).
func askFrom(t *testing.T, from *Host, addr string, timeout time.Duration) string {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", from.ns, os.Args[0], "ask", addr, timeout.String())
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("ask %s from %s: %v: %s", addr, from.Name, err, out)
	}
	return strings.TrimSpace(string(out))
}

// CutFrom cuts one host off from some hosts only: m1 and m2 no longer
// reach each other, either way, while m3 and this process reach both;
// HealFrom joins them again.
func TestLabCutFromIsAPartitionBetweenHosts(t *testing.T) {
	lab := NewLab(t, "m1", "m2", "m3")
	addr := map[string]string{}
	for _, h := range lab.Hosts {
		addrFile := filepath.Join(t.TempDir(), "addr")
		p := h.Start(t, ProcConfig{Path: os.Args[0], Args: []string{"hostname", addrFile},
			Env: []string{childEnv + "=1"}, AddrFile: addrFile, StartTimeout: 30 * time.Second})
		_, port, _ := net.SplitHostPort(p.Addr())
		addr[h.Name] = net.JoinHostPort(h.IP, port)
	}
	m1, m2, m3 := lab.Host(t, "m1"), lab.Host(t, "m2"), lab.Host(t, "m3")
	if got := askFrom(t, m2, addr["m1"], 10*time.Second); got != "m1" {
		t.Fatalf("m2 → m1 before the cut: %q", got)
	}
	m1.CutFrom(t, m2)
	for _, c := range []struct {
		from *Host
		to   string
		want bool
	}{{m2, "m1", false}, {m1, "m2", false}, {m3, "m1", true}, {m3, "m2", true}, {m1, "m3", true}} {
		timeout := time.Second // how long a cut takes to show
		if c.want {
			timeout = 10 * time.Second
		}
		got := askFrom(t, c.from, addr[c.to], timeout)
		if (got == c.to) != c.want {
			t.Errorf("%s → %s while m1 is cut from m2: %q (want reached: %v)", c.from.Name, c.to, got, c.want)
		}
	}
	for _, h := range []string{"m1", "m2"} {
		if got, err := hello(addr[h], 5*time.Second); err != nil || got != h {
			t.Errorf("this process → %s while m1 is cut from m2: %q, %v", h, got, err)
		}
	}
	m1.HealFrom(t, m2)
	if got := askFrom(t, m2, addr["m1"], 10*time.Second); got != "m1" {
		t.Fatalf("m2 → m1 after HealFrom: %q", got)
	}
}
