package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
)

// TestMachinesByName runs docs/cluster.md's three machines as its
// commands read: certificates from `rlhub cert --hosts m1,m2,m3,127.0.0.1`
// (names, no addresses), hubs told `--listen mN:7470`, etcd endpoints by
// name; every machine resolves the others' names (the lab's /etc/hosts).
// The standbys sync with the primary over TLS, and a trainer on c1 given
// only the cluster pushes a version and lists it. The hubs must tell
// etcd the name they were given: an address resolved from it is not in
// the certificate, and every TLS handshake with it fails.
func TestMachinesByName(t *testing.T) {
	lab := testkit.NewLab(t, "m1", "m2", "m3", "c1")
	machines, c1 := lab.Hosts[:3], lab.Hosts[3]
	p := newPKI(t, "m1", "m2", "m3", "127.0.0.1")
	clustertest.StartOnLab(t, machines)
	var eps []string
	for _, m := range machines {
		eps = append(eps, m.Name+":2379")
	}
	etcd := []string{"--etcd", strings.Join(eps, ","), "--cluster", "prod", "--etcd-insecure"}
	hubs := map[string]*testkit.Proc{}
	for _, m := range machines {
		addrFile := filepath.Join(t.TempDir(), "addr")
		args := append([]string{"--log-level", "info", "serve", "--listen", m.Name + ":7470", "--data", t.TempDir(), "--addr-file", addrFile,
			"--member-id", m.Name, "--lease-ttl", "2s",
			"--tls-cert", p.pem("server"), "--tls-key", p.pem("server-key"), "--tls-client-ca", p.pem("ca"), "--auth-tokens", p.tokens,
			"--tls-ca", p.pem("ca"), "--token-file", p.token("admin")}, etcd...)
		hubs[m.Name] = m.Start(t, testkit.ProcConfig{Name: "hub", Args: args, AddrFile: addrFile})
	}
	// Every standby syncs with the primary (over TLS, at the address the
	// primary registered).
	testkit.Eventually(t, 2*time.Minute, "two standbys synced with the primary", func() bool {
		n := 0
		for _, h := range hubs {
			if strings.Contains(h.Output(), `msg="replica: full sync applied"`) {
				n++
			}
		}
		return n == 2
	})

	sd, _ := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{4}, []float32{1, 2, 3, 4}))
	blob, err := safetensors.Encode(sd, nil)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "w.safetensors")
	if err := os.WriteFile(file, blob, 0o644); err != nil {
		t.Fatal(err)
	}
	client := func(args ...string) []string {
		return append(append(args, etcd...), "--tls-ca", p.pem("ca"), "--tls-cert", p.pem("client"), "--tls-key", p.pem("client-key"),
			"--token-file", p.token("trainer"), "--timeout", "60s")
	}
	if out, code := run(t, c1, "model push", client("model", "push", "--name", "pol", "--version", "1", file)...); code != 0 {
		t.Fatalf("push from c1 through the cluster: exit %d:\n%s", code, out)
	}
	out, code := run(t, c1, "model ls", client("model", "ls")...)
	if code != 0 || !strings.Contains(out, "pol") {
		t.Fatalf("model ls from c1: exit %d:\n%s", code, out)
	}

	// Gradients from c1: the hubs' secondaries are announced by name too.
	admin := client("reducer", "register", "--model", "pol", "--optimizer", "sgd", "--lr", "0.01")
	admin[len(admin)-3] = p.token("admin") // the --token-file's value
	if out, code := run(t, c1, "reducer register", admin...); code != 0 {
		t.Fatalf("reducer register from c1: exit %d:\n%s", code, out)
	}
	stop := filepath.Join(t.TempDir(), "stop")
	learner := c1.Start(t, testkit.ProcConfig{Name: "learner", Path: os.Args[0], Env: []string{childEnv + "=1"},
		Args: []string{"learner", "-target", "etcd://" + strings.Join(eps, ",") + "/prod", "-model", "pol", "-id", "l", "-stop", stop,
			"-ca", p.pem("ca"), "-cert", p.pem("client"), "-key", p.pem("client-key"), "-token", p.token("trainer")}})
	t.Cleanup(func() { os.WriteFile(stop, nil, 0o644) })
	testkit.Eventually(t, 2*time.Minute, "version 5 from the learner's gradients", func() bool {
		out, code := run(t, c1, "model ls", client("model", "ls")...)
		for _, line := range strings.Split(out, "\n") {
			var name string
			var v int
			if n, _ := fmt.Sscan(line, &name, &v); code == 0 && n == 2 && name == "pol" && v >= 5 {
				return true
			}
		}
		return false
	})
	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if st := learner.Wait(t, 2*time.Minute); !st.Success() {
		t.Fatalf("learner: %v\n%s", st, learner.Output())
	}
	if s := parseSummary(t, learner); s.failed > 0 || s.ok == 0 {
		t.Fatalf("learner on c1: %+v\n%s", s, learner.Output())
	}

	out, code = run(t, c1, "cluster status", append([]string{"cluster", "status"}, etcd...)...)
	if code != 0 {
		t.Fatalf("cluster status from c1: exit %d:\n%s", code, out)
	}
	for _, m := range machines {
		if !strings.Contains(out, fmt.Sprintf("%s:7470", m.Name)) {
			t.Errorf("cluster status does not list %s at %s:7470:\n%s", m.Name, m.Name, out)
		}
	}
}
