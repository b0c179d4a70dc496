package testkit

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// A Lab is a few "machines" on one Ethernet segment, for tests that must
// not run on loopback alone: each Host is a Linux network namespace with
// its own address (10.213.N.i/24), its own loopback and, for the processes
// started on it, its own hostname (a UTS namespace), joined by a veth pair
// to a bridge in this process's namespace; each host's /etc/hosts names
// every host of the lab (writeHosts). The bridge holds 10.213.N.254,
// so the test process itself reaches every host. Cut and Heal take a
// host's link down and up: a partition, in which the host's processes keep
// running and its TCP connections stall rather than reset, as when a
// switch port or a cable fails.
//
// Labs need root and iproute2 (`ip`); NewLab skips the test, with the
// reason, where they are missing. Every lab's names carry this process's
// pid (rlPIDx…: interface names have 15 bytes), so parallel test binaries do not collide, and a lab left behind by
// a test binary that was SIGKILLed is removed by the next NewLab.
type Lab struct {
	id     string // "rl", the pid and a letter: the prefix of every name the lab creates
	bridge string
	subnet netip.Prefix
	Hosts  []*Host
}

// Host is one machine of a Lab.
type Host struct {
	Name string // its hostname, as its processes see it
	IP   string // its address on the lab's segment
	ns   string // the network namespace
	veth string // the link's end on the bridge (this process's namespace)
}

// labs counts the labs this process built: a lab's names are unique
// while the one before it may still be going away.
var (
	labsMu sync.Mutex // and labLock between processes
	labs   int
)

// labLock serialises choosing a subnet and creating the links between the
// test binaries that build labs at the same time.
const labLock = "/tmp/rlhub-netlab.lock"

// LabAvailable says why labs cannot be built here, or nil.
func LabAvailable() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("network namespaces need root (euid %d)", os.Geteuid())
	}
	for _, tool := range []string{"ip", "unshare"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found (Debian: iproute2, util-linux)", tool)
		}
	}
	return nil
}

// NewLab builds a lab with one host per name (a hostname each, at most 8)
// and removes it at tb's cleanup: after the processes started on it,
// which tb's cleanups, running last-in first-out, kill first.
func NewLab(tb testing.TB, names ...string) *Lab {
	tb.Helper()
	if err := LabAvailable(); err != nil {
		tb.Skipf("no network lab on this machine: %v", err)
	}
	if len(names) == 0 || len(names) > 8 {
		tb.Fatalf("NewLab: %d hosts, want 1 to 8", len(names))
	}
	labsMu.Lock()
	defer labsMu.Unlock()
	lock, err := os.OpenFile(labLock, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		tb.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		tb.Fatal(err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)

	sweepLabs(tb)
	labs++
	l := &Lab{id: fmt.Sprintf("rl%d%c", os.Getpid(), 'a'+labs%26)}
	l.bridge = l.id + "br"
	l.subnet, err = freeSubnet()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.remove(tb) })
	base := l.subnet.Addr().As4()
	bridgeIP := netip.AddrFrom4([4]byte{base[0], base[1], base[2], 254})
	run(tb, "ip", "link", "add", l.bridge, "type", "bridge", "forward_delay", "0")
	run(tb, "ip", "addr", "add", bridgeIP.String()+"/24", "dev", l.bridge)
	run(tb, "ip", "link", "set", l.bridge, "up")
	for i, name := range names {
		h := &Host{
			Name: name,
			IP:   netip.AddrFrom4([4]byte{base[0], base[1], base[2], byte(i + 1)}).String(),
			ns:   fmt.Sprintf("%s-%d", l.id, i+1),
			veth: fmt.Sprintf("%sv%d", l.id, i+1),
		}
		peer := h.veth + "p"
		run(tb, "ip", "netns", "add", h.ns)
		l.Hosts = append(l.Hosts, h)
		run(tb, "ip", "link", "add", h.veth, "type", "veth", "peer", "name", peer)
		run(tb, "ip", "link", "set", peer, "netns", h.ns)
		run(tb, "ip", "link", "set", h.veth, "master", l.bridge)
		run(tb, "ip", "link", "set", h.veth, "up")
		run(tb, "ip", "-n", h.ns, "link", "set", "lo", "up")
		run(tb, "ip", "-n", h.ns, "link", "set", peer, "name", "eth0")
		run(tb, "ip", "-n", h.ns, "addr", "add", h.IP+"/24", "dev", "eth0")
		run(tb, "ip", "-n", h.ns, "link", "set", "eth0", "up")
		run(tb, "ip", "-n", h.ns, "route", "add", "default", "via", bridgeIP.String())
	}
	l.writeHosts(tb)
	return l
}

// writeHosts gives every host an /etc/hosts naming every host of the lab
// (`ip netns exec` mounts /etc/netns/NS/hosts over /etc/hosts), so that
// processes on the lab find each other by hostname, as machines do
// through DNS. This process (outside the lab) does not.
func (l *Lab) writeHosts(tb testing.TB) {
	tb.Helper()
	hosts := "127.0.0.1 localhost\n::1 localhost\n"
	for _, h := range l.Hosts {
		hosts += h.IP + " " + h.Name + "\n"
	}
	for _, h := range l.Hosts {
		dir := filepath.Join("/etc/netns", h.ns)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			tb.Fatalf("lab: %v", err)
		}
		if err := os.WriteFile(filepath.Join(dir, "hosts"), []byte(hosts), 0o644); err != nil {
			tb.Fatalf("lab: %v", err)
		}
	}
}

// Host returns the lab's host named name.
func (l *Lab) Host(tb testing.TB, name string) *Host {
	tb.Helper()
	for _, h := range l.Hosts {
		if h.Name == name {
			return h
		}
	}
	tb.Fatalf("lab: no host %q", name)
	return nil
}

// Start starts cfg's process on h, as StartProc does (the same cleanup,
// output and address file): in h's network namespace, under h's hostname.
// The wrapper execs the program, so the process's pid is the program's
// own and signals reach it.
func (h *Host) Start(tb testing.TB, cfg ProcConfig) *Proc {
	tb.Helper()
	cfg.Wrap = append([]string{"ip", "netns", "exec", h.ns, "unshare", "--uts", "--",
		"sh", "-c", `hostname "$0" && exec "$@"`, h.Name}, cfg.Wrap...)
	if cfg.Name == "" {
		cfg.Name = "rlhub"
		if cfg.Path != "" {
			cfg.Name = filepath.Base(cfg.Path)
		}
	}
	cfg.Name += "@" + h.Name
	return StartProc(tb, cfg)
}

// Cut takes h's link down: nothing reaches h and nothing leaves it until
// Heal; its processes and their connections stay as they are.
func (h *Host) Cut(tb testing.TB) {
	tb.Helper()
	run(tb, "ip", "link", "set", h.veth, "down")
}

// Heal brings h's link back up.
func (h *Host) Heal(tb testing.TB) {
	tb.Helper()
	run(tb, "ip", "link", "set", h.veth, "up")
}

// CutFrom cuts h off from others alone, both ways: each host's namespace
// gets a blackhole route to the other's address, so what either sends the
// other is dropped (TCP connections between them stall, new ones fail),
// while h and others still reach the rest of the lab and this process —
// an etcd member cut off from its peers but not from its clients, say.
// HealFrom removes the routes.
func (h *Host) CutFrom(tb testing.TB, others ...*Host) {
	tb.Helper()
	for _, o := range others {
		run(tb, "ip", "-n", h.ns, "route", "add", "blackhole", o.IP+"/32")
		run(tb, "ip", "-n", o.ns, "route", "add", "blackhole", h.IP+"/32")
	}
}

// HealFrom undoes CutFrom between h and others.
func (h *Host) HealFrom(tb testing.TB, others ...*Host) {
	tb.Helper()
	for _, o := range others {
		run(tb, "ip", "-n", h.ns, "route", "del", "blackhole", o.IP+"/32")
		run(tb, "ip", "-n", o.ns, "route", "del", "blackhole", h.IP+"/32")
	}
}

func (l *Lab) remove(tb testing.TB) {
	// The kernel tears a deleted namespace down in the background; the
	// veth pairs are deleted here first, so that they are gone at once.
	for _, h := range l.Hosts {
		if out, err := exec.Command("ip", "link", "del", h.veth).CombinedOutput(); err != nil {
			tb.Errorf("lab: ip link del %s: %v: %s", h.veth, err, out)
		}
		if out, err := exec.Command("ip", "netns", "del", h.ns).CombinedOutput(); err != nil {
			tb.Errorf("lab: ip netns del %s: %v: %s", h.ns, err, out)
		}
		os.RemoveAll(filepath.Join("/etc/netns", h.ns))
	}
	if out, err := exec.Command("ip", "link", "del", l.bridge).CombinedOutput(); err != nil {
		tb.Errorf("lab: ip link del %s: %v: %s", l.bridge, err, out)
	}
}

// sweepLabs removes the namespaces and bridges of labs whose test binary
// is gone (SIGKILLed before its cleanup ran).
func sweepLabs(tb testing.TB) {
	dead := func(name string) bool {
		rest, ok := strings.CutPrefix(name, "rl")
		if !ok {
			return false
		}
		end := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
		if end <= 0 {
			return false
		}
		pid, err := strconv.Atoi(rest[:end])
		if err != nil {
			return false
		}
		return syscall.Kill(pid, 0) == syscall.ESRCH
	}
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 0 && strings.Contains(f[0], "-") && dead(f[0]) {
				_ = exec.Command("ip", "netns", "del", f[0]).Run()
				os.RemoveAll(filepath.Join("/etc/netns", f[0]))
			}
		}
	}
	if out, err := exec.Command("ip", "-o", "link", "show", "type", "bridge").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			name := strings.TrimSuffix(f[1], ":")
			if strings.HasSuffix(name, "br") && dead(name) {
				_ = exec.Command("ip", "link", "del", name).Run()
			}
		}
	}
	_ = tb
}

// freeSubnet is a 10.213.N.0/24 that no interface here has an address in.
func freeSubnet() (netip.Prefix, error) {
	out, err := exec.Command("ip", "-o", "-4", "addr", "show").Output()
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("ip addr show: %v", err)
	}
	for n := 1; n < 255; n++ {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 213, byte(n), 0}), 24)
		if !strings.Contains(string(out), fmt.Sprintf(" 10.213.%d.", n)) {
			return p, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("no free 10.213.N.0/24")
}

func run(tb testing.TB, name string, args ...string) {
	tb.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		tb.Fatalf("lab: %s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}
