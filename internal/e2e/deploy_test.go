package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/testkit"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain(os.Args[1:]))
	}
	goleak.VerifyTestMain(testkit.Main(m),
		// etcd's client keeps a resolver goroutine per process.
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
	)
}

// pki is what `rlhub cert` and `rlhub token new` made for a deployment:
// one CA, a certificate valid for every lab address (server and client
// use), a client certificate, and a token file with one token per role.
type pki struct {
	dir, tokens string
}

func (p pki) pem(name string) string   { return filepath.Join(p.dir, name+".pem") }
func (p pki) token(role string) string { return filepath.Join(p.dir, role+".token") }

// rlhubCLI runs one rlhub command here and fails t unless it succeeds.
func rlhubCLI(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, testkit.Binary(t), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("rlhub %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func newPKI(t *testing.T, hosts ...string) pki {
	t.Helper()
	p := pki{dir: t.TempDir()}
	p.tokens = filepath.Join(p.dir, "tokens")
	rlhubCLI(t, "cert", "--dir", p.dir, "--hosts", strings.Join(hosts, ","))
	for _, role := range []string{"admin", "trainer", "worker", "reader"} {
		rlhubCLI(t, "token", "new", "--role", role, "--scope", "*", "--out", p.token(role), "--append", p.tokens)
	}
	return p
}

// deployment is docs/cluster.md's three-machine deployment on a lab:
// machines m1, m2, m3, each with an etcd member, a hub, a hub of
// secondary reducers and a relay of the model with collectors reading it;
// learners on c1. etcd is plaintext (--etcd-insecure: the lab's etcd has
// no TLS); every hub and relay link is mutual TLS with tokens.
type deployment struct {
	t        *testing.T
	lab      *testkit.Lab
	machines []*testkit.Host
	client   *testkit.Host // c1
	etcd     *clustertest.LabEtcd
	pki      pki
	name     string
	model    string
	stop     string // learners stop once this file exists, collectors once stop+".collectors" does

	procs map[string][]*testkit.Proc // by host name: what dies with the machine
	hubs  map[string]*hubProc        // by host name
	seg   map[string]string          // the relay's segment, by host name
}

type hubProc struct {
	host *testkit.Host
	id   string
	data string
	proc *testkit.Proc
}

func newDeployment(t *testing.T) *deployment {
	t.Helper()
	lab := testkit.NewLab(t, "m1", "m2", "m3", "c1")
	d := &deployment{t: t, lab: lab, machines: lab.Hosts[:3], client: lab.Hosts[3],
		name: "prod", model: "pol", stop: filepath.Join(t.TempDir(), "stop"),
		procs: map[string][]*testkit.Proc{}, hubs: map[string]*hubProc{}, seg: map[string]string{}}
	hosts := []string{"127.0.0.1"}
	for _, h := range lab.Hosts {
		hosts = append(hosts, h.Name, h.IP)
	}
	d.pki = newPKI(t, hosts...)
	d.etcd = clustertest.StartOnLab(t, d.machines)
	for i, m := range d.etcd.Members {
		d.procs[d.machines[i].Name] = append(d.procs[d.machines[i].Name], m.Proc)
	}
	// The learners and collectors stop at the end even if the test failed
	// (a cleanup before the processes' own, which kill them).
	t.Cleanup(func() {
		os.WriteFile(d.stop, nil, 0o644)
		os.WriteFile(d.stop+".collectors", nil, 0o644)
	})
	return d
}

// etcdFlags are every rlhub command's etcd flags here.
func (d *deployment) etcdFlags() []string {
	return []string{"--etcd", d.etcd.Endpoints, "--cluster", d.name, "--etcd-insecure"}
}

// target is what clients are given: only the cluster.
func (d *deployment) target() string { return dial.EtcdTarget(d.etcd.Endpoints, d.name) }

// hubTLS are the server flags of docs/cluster.md's HUB_TLS and the hub's
// own dials (a standby following the primary, a secondary attaching): the
// CA and the admin token.
func (d *deployment) hubTLS() []string {
	return []string{"--tls-cert", d.pki.pem("server"), "--tls-key", d.pki.pem("server-key"), "--tls-client-ca", d.pki.pem("ca"),
		"--auth-tokens", d.pki.tokens, "--tls-ca", d.pki.pem("ca"), "--token-file", d.pki.token("admin")}
}

// startHub runs `rlhub serve --etcd` on h, listening on h's address.
func (d *deployment) startHub(h *testkit.Host, extra ...string) *hubProc {
	t := d.t
	t.Helper()
	hp := &hubProc{host: h, id: h.Name, data: t.TempDir()}
	addrFile := filepath.Join(t.TempDir(), "addr")
	args := append([]string{"--log-level", "info", "serve", "--listen", h.IP + ":7470", "--data", hp.data, "--addr-file", addrFile,
		"--member-id", hp.id, "--lease-ttl", "2s", "--reduce-batch-size", "1"}, d.etcdFlags()...)
	args = append(append(args, d.hubTLS()...), extra...)
	hp.proc = h.Start(t, testkit.ProcConfig{Name: "hub", Args: args, AddrFile: addrFile})
	d.hubs[h.Name] = hp
	d.procs[h.Name] = append(d.procs[h.Name], hp.proc)
	return hp
}

// startSecondaries runs `serve --role reducer --etcd` on h: a hub of
// secondary reducers that follows the primary and announces itself.
func (d *deployment) startSecondaries(h *testkit.Host) *testkit.Proc {
	t := d.t
	t.Helper()
	addrFile := filepath.Join(t.TempDir(), "addr")
	args := append([]string{"--log-level", "info", "serve", "--role", "reducer", "--reducer-secondaries", "1",
		"--listen", h.IP + ":7480", "--data", t.TempDir(), "--addr-file", addrFile, "--member-id", h.Name + "-sec",
		"--lease-ttl", "2s", "--reduce-batch-size", "1"}, d.etcdFlags()...)
	p := h.Start(t, testkit.ProcConfig{Name: "secondaries", Args: append(args, d.hubTLS()...), AddrFile: addrFile})
	d.procs[h.Name] = append(d.procs[h.Name], p)
	return p
}

// startRelay runs `rlhub relay --etcd` for the model on h: listening on
// h's loopback (its collectors only), announced in etcd under h's
// hostname. Its own segment and port per host: the lab's hosts share
// /dev/shm, which machines do not, and a collector that took another
// host's announcement must not find a relay anyway.
func (d *deployment) startRelay(h *testkit.Host) *testkit.Proc {
	t := d.t
	t.Helper()
	seg := fmt.Sprintf("/dev/shm/rlhub-e2e-%d-%s-%d", os.Getpid(), h.Name, time.Now().UnixNano())
	t.Cleanup(func() { os.Remove(seg) }) // after the relay is killed
	d.seg[h.Name] = seg
	// Each machine's relay on its own port, so that a collector given
	// another machine's relay would not reach it on its own loopback.
	port := 7471
	for i, m := range d.machines {
		if m == h {
			port += i
		}
	}
	args := append([]string{"--log-level", "info", "relay", "--model", d.model, "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--shm", seg,
		"--tls-cert", d.pki.pem("server"), "--tls-key", d.pki.pem("server-key"),
		// A worker's token: the relay is a collector upstream (WeightSync
		// Attach needs worker; a reader's token is refused).
		"--tls-ca", d.pki.pem("ca"), "--token-file", d.pki.token("worker")}, d.etcdFlags()...)
	p := h.Start(t, testkit.ProcConfig{Name: "relay", Args: args})
	testkit.Eventually(t, 60*time.Second, "the relay on "+h.Name+" to listen", func() bool {
		select {
		case <-p.Done():
			t.Fatalf("the relay on %s exited:\n%s", h.Name, p.Output())
		default:
		}
		return strings.Contains(p.Output(), "listening on ")
	})
	d.procs[h.Name] = append(d.procs[h.Name], p)
	return p
}

// collector starts a collector of kind ("collector-push": the public Go
// package's rlhub.Collector on etcd://, configured from the RLHUB_*
// environment as a program would be; "collector-shm": a reader of the
// segment of the relay announced on its host) on h and waits until it is
// up.
func (d *deployment) collector(h *testkit.Host, kind string) *testkit.Proc {
	d.t.Helper()
	id := kind + "-" + h.Name
	p := d.child(h, kind, id, "RLHUB_TLS_CA="+d.pki.pem("ca"), "RLHUB_TLS_CERT="+d.pki.pem("client"),
		"RLHUB_TLS_KEY="+d.pki.pem("client-key"), "RLHUB_TOKEN_FILE="+d.pki.token("worker"), "RLHUB_ETCD_INSECURE=1")
	testkit.Eventually(d.t, 2*time.Minute, id+" to be up", func() bool {
		select {
		case <-p.Done():
			d.t.Fatalf("%s exited:\n%s", id, p.Output())
		default:
		}
		return strings.Contains(p.Output(), "collector up")
	})
	return p
}

// child starts this test binary on h as a learner or collector.
func (d *deployment) child(h *testkit.Host, kind, id string, env ...string) *testkit.Proc {
	t := d.t
	t.Helper()
	stop := d.stop
	if kind != "learner" { // collectors run on until the end
		stop += ".collectors"
	}
	args := []string{kind, "-target", d.target(), "-model", d.model, "-id", id, "-stop", stop,
		"-ca", d.pki.pem("ca"), "-cert", d.pki.pem("client"), "-key", d.pki.pem("client-key")}
	role := "worker" // collectors: WeightSync Attach and reports
	if kind == "learner" {
		role = "trainer"
	}
	args = append(args, "-token", d.pki.token(role))
	env = append([]string{childEnv + "=1"}, env...)
	p := h.Start(t, testkit.ProcConfig{Name: kind + " " + id, Path: os.Args[0], Args: args, Env: env})
	if kind != "learner" {
		d.procs[h.Name] = append(d.procs[h.Name], p)
	}
	return p
}

// leader waits for a primary elected after epoch `after` that serves its
// term (its log says so) and returns it.
func (d *deployment) leader(after uint64) (cluster.Leader, *hubProc) {
	d.t.Helper()
	var l cluster.Leader
	var hp *hubProc
	testkit.Eventually(d.t, 2*time.Minute, fmt.Sprintf("a primary with an epoch above %d serving its term", after), func() bool {
		st, err := d.status()
		if err != nil || st.Primary == nil || st.Primary.Epoch <= after {
			return false
		}
		l, hp = *st.Primary, d.hubs[st.Primary.ID]
		if hp == nil {
			d.t.Fatalf("primary %s is none of the deployment's hubs", l)
		}
		return strings.Contains(hp.proc.Output(), fmt.Sprintf("msg=\"cluster: serving as primary\" epoch=%d ", l.Epoch))
	})
	return l, hp
}

// status reads the cluster from this process (the bridge reaches every
// host).
func (d *deployment) status() (cluster.Status, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return cluster.Read(ctx, cluster.Config{Endpoints: strings.Split(d.etcd.Endpoints, ","), Cluster: d.name,
		DialTimeout: 3 * time.Second, Security: cluster.EtcdSecurity{Insecure: true}})
}

// dialConfig is a client's connection config with role's token.
func (d *deployment) dialConfig(role string) dial.Config {
	d.t.Helper()
	files := dial.Files{CA: d.pki.pem("ca"), Cert: d.pki.pem("client"), Key: d.pki.pem("client-key")}
	if role != "" {
		files.TokenFile = d.pki.token(role)
	}
	dc, err := files.Load()
	if err != nil {
		d.t.Fatal(err)
	}
	dc.Etcd = cluster.EtcdSecurity{Insecure: true}
	return dc
}

// die is the machine's death: its link is cut first, so nothing it held
// is closed to its peers (no FIN, no RST: connections to it stall, as
// when power goes), then every process on it is SIGKILLed at once.
func (d *deployment) die(h *testkit.Host) time.Time {
	d.t.Helper()
	h.Cut(d.t)
	at := time.Now()
	procs := d.procs[h.Name]
	for _, p := range procs {
		_ = syscall.Kill(p.Pid(), syscall.SIGKILL)
	}
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Go(p.Kill) // reaps
	}
	wg.Wait()
	return at
}

// summary is a learner's last line: every push and its outcome.
type summary struct{ pushes, ok, exists, unknown, failed int }

func parseSummary(t *testing.T, p *testkit.Proc) summary {
	t.Helper()
	out := p.Output()
	i := strings.LastIndex(out, "summary ")
	if i < 0 {
		t.Fatalf("%s printed no summary:\n%s", p.Name(), out)
	}
	var s summary
	fields := map[string]*int{"pushes": &s.pushes, "ok": &s.ok, "exists": &s.exists, "unknown": &s.unknown, "failed": &s.failed}
	for _, kv := range strings.Fields(strings.SplitN(out[i+len("summary "):], "\n", 2)[0]) {
		k, v, _ := strings.Cut(kv, "=")
		n, err := strconv.Atoi(v)
		if p := fields[k]; p != nil && err == nil {
			*p = n
		}
	}
	return s
}

// applied is one line a collector printed: a version it applied.
type applied struct {
	version, epoch uint64
	via            string
	at             time.Time
}

func parseApplied(out string) []applied {
	var got []applied
	for _, line := range strings.Split(out, "\n") {
		var a applied
		var at int64
		if _, err := fmt.Sscanf(line, "applied v=%d epoch=%d via=%s at=%d", &a.version, &a.epoch, &a.via, &at); err == nil {
			a.at = time.Unix(0, at)
			got = append(got, a)
		}
	}
	return got
}
