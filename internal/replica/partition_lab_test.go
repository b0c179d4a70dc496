package replica_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// The tests in this file run docs/cluster.md's "three machines" on a
// testkit.Lab: hosts m1, m2 and m3, each a network namespace with its
// own address, an etcd member and `rlhub serve --etcd` on IP:7470 with
// TLS, token files and the admin token the hubs follow each other with
// (docs/security.md: off loopback a hub needs both). etcd stays plaintext
// (--etcd-insecure): its TLS is TestSecureClusterFailsOver's subject, and
// what is tested here is the hubs' behaviour when a machine's link fails.
// The test process is the clients' machine ("c1"): it reaches every host
// through the lab's bridge, so a cut host is cut off from it too.

// labHub is one hub on a lab host.
type labHub struct {
	host *testkit.Host
	id   string
	data string
	proc *testkit.Proc
}

func (h *labHub) addr() string { return h.host.IP + ":7470" }

// out is the hub's log so far.
func (h *labHub) out() string { return h.proc.Output() }

// labCluster is a three-host cluster on a lab.
type labCluster struct {
	t    *testing.T
	lab  *testkit.Lab
	etcd *clustertest.LabEtcd
	name string
	dir  string // certificates and tokens
	hubs []*labHub
}

func newLabCluster(t *testing.T, extra ...string) *labCluster {
	lab := testkit.NewLab(t, "m1", "m2", "m3")
	// --pre-vote, as docs/cluster.md's deployment asks (etcd 3.5 has it on
	// by default; Debian's 3.4 does not): without it a member cut off
	// raises its raft term while it campaigns alone, and on its return
	// deposes etcd's leader; every lease's keep-alive then pauses for an
	// election, and a 2 s lease may lapse: a hub failover for nothing.
	e := clustertest.StartOnLab(t, lab.Hosts, "--pre-vote")
	lc := &labCluster{t: t, lab: lab, etcd: e, name: "part", dir: t.TempDir()}
	var ips []string
	for _, h := range lab.Hosts {
		ips = append(ips, h.IP)
	}
	lc.cli("cert", "--dir", lc.dir, "--hosts", strings.Join(ips, ","))
	for _, role := range []string{"admin", "trainer"} {
		lc.cli("token", "new", "--role", role, "--scope", "*", "--out", lc.file(role+".token"), "--append", lc.file("tokens"))
	}
	for _, h := range lab.Hosts {
		hub := &labHub{host: h, id: h.Name, data: t.TempDir()}
		addrFile := filepath.Join(t.TempDir(), "addr")
		args := append([]string{"--etcd-insecure", "--log-level", "info", "serve",
			"--listen", hub.addr(), "--addr-file", addrFile, "--data", hub.data,
			"--etcd", e.Endpoints, "--cluster", lc.name, "--lease-ttl", "2s", "--member-id", hub.id,
			"--store-retain", "100000",
			"--tls-cert", lc.file("server.pem"), "--tls-key", lc.file("server-key.pem"), "--tls-client-ca", lc.file("ca.pem"),
			"--auth-tokens", lc.file("tokens"),
			// Its own dials (a standby's stream from the primary): the CA
			// and the admin token.
			"--tls-ca", lc.file("ca.pem"), "--token-file", lc.file("admin.token")}, extra...)
		hub.proc = h.Start(t, testkit.ProcConfig{Name: "hub " + hub.id, Args: args, AddrFile: addrFile})
		lc.hubs = append(lc.hubs, hub)
	}
	return lc
}

func (lc *labCluster) file(name string) string { return filepath.Join(lc.dir, name) }

// cli runs the rlhub binary here (certificates, tokens).
func (lc *labCluster) cli(args ...string) {
	lc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, testkit.Binary(lc.t), args...).CombinedOutput(); err != nil {
		lc.t.Fatalf("rlhub %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// endpoints are the etcd client addresses of the hosts not in cut.
func (lc *labCluster) endpoints(cut ...*labHub) []string {
	var out []string
	for _, h := range lc.hubs {
		if !containsHub(cut, h) {
			out = append(out, h.host.IP+":2379")
		}
	}
	return out
}

func containsHub(hs []*labHub, h *labHub) bool {
	for _, x := range hs {
		if x == h {
			return true
		}
	}
	return false
}

// status reads the cluster from etcd through the members of the hosts
// not in cut.
func (lc *labCluster) status(cut ...*labHub) (cluster.Status, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return cluster.Read(ctx, cluster.Config{Endpoints: lc.endpoints(cut...), Cluster: lc.name, DialTimeout: 2 * time.Second,
		Security: cluster.EtcdSecurity{Insecure: true}})
}

// leader waits for a primary elected after epoch `after` that logged
// serving its term, read through the hosts not in cut.
func (lc *labCluster) leader(after uint64, cut ...*labHub) (cluster.Leader, *labHub) {
	lc.t.Helper()
	var l cluster.Leader
	var p *labHub
	testkit.Eventually(lc.t, 90*time.Second, fmt.Sprintf("a primary with an epoch above %d serving its term", after), func() bool {
		st, err := lc.status(cut...)
		if err != nil || st.Primary == nil || st.Primary.Epoch <= after {
			return false
		}
		l, p = *st.Primary, nil
		for _, h := range lc.hubs {
			if h.id == l.ID {
				p = h
			}
		}
		if p == nil {
			lc.t.Fatalf("primary %s is none of the test's hubs", l)
		}
		return strings.Contains(p.out(), fmt.Sprintf("msg=\"cluster: serving as primary\" epoch=%d ", l.Epoch))
	})
	return l, p
}

// synced waits until h has applied a full sync from primary l and l has
// recorded it in sync (testCluster.synced).
func (lc *labCluster) synced(h *labHub, l cluster.Leader) {
	lc.t.Helper()
	testkit.Eventually(lc.t, 90*time.Second, h.id+" synced with "+l.String(), func() bool {
		out := h.out()
		i := strings.LastIndex(out, `msg="replica: full sync applied"`)
		return i >= 0 && strings.HasSuffix(strings.SplitN(out[i:], "\n", 2)[0], fmt.Sprintf(" epoch=%d", l.Epoch))
	})
	testkit.Eventually(lc.t, 90*time.Second, h.id+" recorded in sync by "+l.String(), func() bool {
		st, err := lc.status()
		return err == nil && (st.InSync == nil || st.InSync.Epoch != l.Epoch || st.InSync.Has(h.id))
	})
}

// etcdLeader is the address of the host whose etcd member leads.
func (lc *labCluster) etcdLeader() string {
	lc.t.Helper()
	var ip string
	testkit.Eventually(lc.t, 30*time.Second, "etcd's leader", func() bool {
		cli, err := clientv3.New(clientv3.Config{Endpoints: lc.endpoints(), DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return false
		}
		defer cli.Close()
		for _, h := range lc.hubs {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			st, err := cli.Status(ctx, h.host.IP+":2379")
			cancel()
			if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
				ip = h.host.IP
				return true
			}
		}
		return false
	})
	return ip
}

// moveEtcdLeader makes the etcd member on h's host etcd's leader (etcd's
// MoveLeader, sent to the current leader).
func (lc *labCluster) moveEtcdLeader(h *labHub) {
	lc.t.Helper()
	testkit.Eventually(lc.t, 30*time.Second, "etcd's leader moved to "+h.id, func() bool {
		leader := lc.etcdLeader()
		if leader == h.host.IP {
			return true
		}
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{leader + ":2379"}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return false
		}
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := cli.Status(ctx, h.host.IP+":2379")
		if err != nil {
			return false
		}
		_, err = cli.MoveLeader(ctx, st.Header.MemberId)
		return err == nil && lc.etcdLeader() == h.host.IP
	})
}

// dialConfig is a trainer client's connection as the CLI's flags make it.
func (lc *labCluster) dialConfig() dial.Config {
	lc.t.Helper()
	dc, err := dial.Files{CA: lc.file("ca.pem"), Cert: lc.file("client.pem"), Key: lc.file("client-key.pem"),
		TokenFile: lc.file("trainer.token")}.Load()
	if err != nil {
		lc.t.Fatal(err)
	}
	dc.Etcd = cluster.EtcdSecurity{Insecure: true}
	return dc
}

// client is a trainer's store client of addr: a hub, or the cluster
// (dial.EtcdTarget) to follow its primary. Each call is tried once.
func (lc *labCluster) client(addr string, callTimeout time.Duration) *storerpc.Client {
	lc.t.Helper()
	cl, err := storerpc.NewClient(storerpc.ClientConfig{Addr: addr, Dial: lc.dialConfig(), CallTimeout: callTimeout, MaxAttempts: 1})
	if err != nil {
		lc.t.Fatal(err)
	}
	lc.t.Cleanup(func() { cl.Close() })
	return cl
}

// followingClient follows the cluster's primary through etcd (every
// member's endpoint, as a trainer is configured).
func (lc *labCluster) followingClient(callTimeout time.Duration) *storerpc.Client {
	return lc.client(dial.EtcdTarget(lc.etcd.Endpoints, lc.name), callTimeout)
}

// storeFiles is h's mirrored store: every file under DATA/store but
// dot-directories, temporaries and locks, by path, with its bytes.
func storeFiles(t testing.TB, h *labHub) map[string][]byte {
	t.Helper()
	root := filepath.Join(h.data, "store")
	out := map[string][]byte{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // a model removed under the walk
			}
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if strings.HasPrefix(name, ".") && path != root {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasPrefix(name, ".") || strings.HasSuffix(name, ".tmp") || strings.Contains(strings.ToLower(name), "lock") {
			return nil
		}
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		out[rel] = b
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	return out
}

// sameFiles says how a and b differ ("" when they do not).
func sameFiles(a, b map[string][]byte) string {
	for p, x := range a {
		y, ok := b[p]
		if !ok {
			return p + " only on the first"
		}
		if !bytes.Equal(x, y) {
			return p + " differs"
		}
	}
	for p := range b {
		if _, ok := a[p]; !ok {
			return p + " only on the second"
		}
	}
	return ""
}

// sameStore waits until h's store holds what p's does, file for file.
func sameStore(t testing.TB, p, h *labHub) {
	t.Helper()
	var diff string
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if diff = sameFiles(storeFiles(t, p), storeFiles(t, h)); diff == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's store is not %s's after 60s: %s", h.id, p.id, diff)
		}
	}
}

// landed is one push a client saw succeed.
type landed struct {
	at             time.Time
	version, epoch uint64
	acked          bool // the push's own answer (false: a retry found it there, stale at its version)
}

// attempt is one push: when it started, whether it was acknowledged,
// and if not, why.
type attempt struct {
	at, end time.Time
	acked   bool
	err     string
}

// pusher pushes versions 1, 2, … of one model through one client, each
// with Expect the one before, in its own goroutine (run; Stop ends it),
// retrying a version until it lands, and records what landed. The blob
// of version v is blobs[v-1], whichever attempt carried it.
type pusher struct {
	cl    *storerpc.Client
	model string
	blobs [][]byte
	call  time.Duration // each push's deadline

	mu       sync.Mutex
	landed   []landed
	attempts []attempt      // every push, in order
	errs     map[string]int // the errors seen, counted
	last     string         // the newest error

	stop chan struct{}
	done chan struct{}
}

// pushBlobs is how many versions a pusher has blobs for: ~30 pushes a
// second on the lab, so minutes of pushing.
const pushBlobs = 10000

func newPusher(t testing.TB, cl *storerpc.Client, model string, n int, call time.Duration) *pusher {
	p := &pusher{cl: cl, model: model, call: call, errs: map[string]int{}, stop: make(chan struct{}), done: make(chan struct{})}
	for v := range n {
		p.blobs = append(p.blobs, storetest.Blob(t, uint64(v+1)*31+7, 64))
	}
	return p
}

// run is the pusher's goroutine; it ends at Stop or when the blobs run out.
func (p *pusher) run() {
	defer close(p.done)
	v := uint64(1)
	for int(v) <= len(p.blobs) {
		select {
		case <-p.stop:
			return
		default:
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), p.call)
		info, err := p.cl.Push(ctx, store.PushRequest{Name: p.model, Version: v, Expect: v - 1, Blob: p.blobs[v-1]})
		cancel()
		var se *errs.StaleError
		p.mu.Lock()
		a := attempt{at: start, end: time.Now(), acked: err == nil}
		if err != nil {
			a.err = err.Error()
		}
		p.attempts = append(p.attempts, a)
		switch {
		case err == nil:
			p.landed = append(p.landed, landed{at: time.Now(), version: info.Version, epoch: info.Epoch, acked: true})
			v++
		case errors.As(err, &se) && se.CurrentVersion == v:
			// An earlier attempt landed; its answer was lost.
			p.landed = append(p.landed, landed{at: time.Now(), version: v, epoch: se.CurrentEpoch})
			v++
		default:
			msg := err.Error()
			if i := strings.Index(msg, "; last lookup"); i > 0 {
				msg = msg[:i]
			}
			p.errs[msg]++
			p.last = msg
		}
		p.mu.Unlock()
		if err != nil {
			select {
			case <-p.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		} else {
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// Stop ends run and waits for it.
func (p *pusher) Stop() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}

func (p *pusher) snapshot() []landed {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]landed(nil), p.landed...)
}

// ackedRunSince reports whether n pushes in a row, all started after
// since, were acknowledged.
func (p *pusher) ackedRunSince(since time.Time, n int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	run := 0
	for _, a := range p.attempts {
		switch {
		case a.at.Before(since):
		case a.acked:
			if run++; run >= n {
				return true
			}
		default:
			run = 0
		}
	}
	return false
}

// failedWith lists the errors containing what of the pushes started
// after since.
func (p *pusher) failedWith(since time.Time, what string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, a := range p.attempts {
		if a.at.After(since) && strings.Contains(a.err, what) {
			out = append(out, a.err)
		}
	}
	return out
}

// firstAckedFrom is when the first push started after since that was
// acknowledged ended (zero: none yet).
func (p *pusher) firstAckedFrom(since time.Time) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range p.attempts {
		if a.acked && a.at.After(since) {
			return a.end
		}
	}
	return time.Time{}
}

// longestGap is the longest time between from and to without a push
// ending acknowledged (counted from from).
func (p *pusher) longestGap(from, to time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var gap time.Duration
	prev := from
	for _, a := range p.attempts {
		if a.acked && a.end.After(prev) && !a.end.After(to) {
			gap = max(gap, a.end.Sub(prev))
			prev = a.end
		}
	}
	return max(gap, to.Sub(prev))
}

// attemptedAfter reports whether a push started after since has ended.
func (p *pusher) attemptedAfter(since time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.attempts) > 0 && p.attempts[len(p.attempts)-1].at.After(since)
}

// failedAfter counts the pushes after since that were not acknowledged.
func (p *pusher) failedAfter(since time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, a := range p.attempts {
		if a.at.After(since) && !a.acked {
			n++
		}
	}
	return n
}

// firstAfter is the first push that landed at an epoch above epoch.
func (p *pusher) firstAfter(epoch uint64) (landed, bool) {
	for _, l := range p.snapshot() {
		if l.epoch > epoch {
			return l, true
		}
	}
	return landed{}, false
}

func (p *pusher) errors() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	for m, n := range p.errs {
		fmt.Fprintf(&b, "\n  %d× %s", n, m)
	}
	return b.String()
}

// checkLanded checks, on the hub cl reaches, that every version p saw
// land is there byte-identical at the epoch it landed at, that versions
// grew, and that the newest is the newest that landed.
func (p *pusher) checkLanded(t testing.TB, cl *storerpc.Client, where string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	got := p.snapshot()
	if len(got) == 0 {
		t.Fatalf("%s: nothing landed", p.model)
	}
	for i, l := range got {
		if i > 0 && l.version <= got[i-1].version {
			t.Fatalf("%s: v%d landed after v%d", p.model, l.version, got[i-1].version)
		}
		snap, err := cl.Get(ctx, p.model, l.version)
		if err != nil {
			t.Fatalf("%s v%d (landed at epoch %d) on %s: %v", p.model, l.version, l.epoch, where, err)
		}
		if !bytes.Equal(snap.Blob, p.blobs[l.version-1]) || snap.Epoch != l.epoch {
			t.Fatalf("%s v%d on %s: %d bytes at epoch %d, want the %d bytes pushed, at epoch %d", p.model, l.version, where,
				len(snap.Blob), snap.Epoch, len(p.blobs[l.version-1]), l.epoch)
		}
	}
	newest, err := cl.Get(ctx, p.model, 0)
	if err != nil || newest.Version != got[len(got)-1].version {
		t.Fatalf("%s's newest on %s: %v %v, want v%d, the last that landed", p.model, where, newest, err, got[len(got)-1].version)
	}
}

// pushFrom runs `rlhub model push` on host h against the hub at addr:
// a client on the same side of a partition as that hub. It returns the
// process's output and whether it exited 0 (the push acknowledged).
func (lc *labCluster) pushFrom(h *testkit.Host, addr, model string, version uint64, blob []byte) (string, bool) {
	lc.t.Helper()
	file := filepath.Join(lc.t.TempDir(), fmt.Sprintf("%s-%d.safetensors", model, version))
	if err := os.WriteFile(file, blob, 0o600); err != nil {
		lc.t.Fatal(err)
	}
	args := []string{"--tls-ca", lc.file("ca.pem"), "--tls-cert", lc.file("client.pem"), "--tls-key", lc.file("client-key.pem"),
		"--token-file", lc.file("trainer.token"),
		"model", "push", "--hub", addr, "--timeout", "15s", "--name", model, "--version", strconv.FormatUint(version, 10), file}
	if version > 1 {
		args = append(args, "--expect", strconv.FormatUint(version-1, 10))
	}
	p := h.Start(lc.t, testkit.ProcConfig{Name: "model push", Args: args})
	st := p.Wait(lc.t, 2*time.Minute)
	return strings.TrimSpace(p.Output()), st.ExitCode() == 0
}

// TestPartitionedPrimaryPublishesNothing cuts the primary's machine off
// the network while a trainer on the clients' side pushes versions
// (acks all) and a trainer on the primary's own machine pushes to it:
// the cut-off primary acknowledges nothing; on the majority side a
// standby is elected and the trainer, following the cluster through
// etcd, goes on pushing to it; healed, the old primary has stepped down
// by itself and converges to the new primary's store. Every version
// acknowledged to any client is on the new primary byte-identical at the
// epoch it was acknowledged with.
func TestPartitionedPrimaryPublishesNothing(t *testing.T) {
	lc := newLabCluster(t)
	l1, p1 := lc.leader(0)
	for _, h := range lc.hubs {
		if h != p1 {
			lc.synced(h, l1)
		}
	}
	trainer := newPusher(t, lc.followingClient(5*time.Second), "pol", pushBlobs, 5*time.Second)
	go trainer.run() // the owner: trainer.Stop, below and at cleanup
	t.Cleanup(trainer.Stop)
	testkit.Eventually(t, 60*time.Second, "five versions acknowledged before the cut", func() bool {
		return len(trainer.snapshot()) >= 5
	})

	// The same trainer on the primary's machine is acknowledged while the
	// machine is connected: what it sees once cut off is the partition's.
	if out, ok := lc.pushFrom(p1.host, p1.addr(), "local", 1, storetest.Blob(t, 999, 256)); !ok {
		t.Fatalf("a push from %s's own machine before the cut: %s", p1.id, out)
	}

	cut := time.Now()
	p1.host.Cut(t)
	t.Logf("cut %s (the primary, epoch %d) at version %d", p1.id, l1.Epoch, len(trainer.snapshot()))

	// The probe measures the new primary's first publish: it pushes to
	// whichever primary etcd's majority names, dialing it directly.
	probeDone, stopProbe := make(chan time.Time, 1), make(chan struct{})
	dc := lc.dialConfig()
	go func() { // the owner: the test waits for probeDone, below or at cleanup
		defer close(probeDone)
		deadline := time.Now().Add(2 * time.Minute)
		blob := trainer.blobs[0]
		for time.Now().Before(deadline) {
			select {
			case <-stopProbe:
				return
			default:
			}
			st, err := lc.status(p1)
			if err != nil || st.Primary == nil || st.Primary.Epoch <= l1.Epoch {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			cl, err := storerpc.NewClient(storerpc.ClientConfig{Addr: st.Primary.Addr, Dial: dc, CallTimeout: 3 * time.Second, MaxAttempts: 1})
			if err == nil {
				_, err = cl.Push(context.Background(), store.PushRequest{Name: "probe", Version: 1, Blob: blob})
				cl.Close()
			}
			if err == nil {
				probeDone <- time.Now()
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	t.Cleanup(func() {
		close(stopProbe)
		for range probeDone {
		}
	})

	// (a) A trainer on the primary's machine keeps pushing to it: no
	// attempt is acknowledged, and each says why.
	var sideErrs []string
	for v := uint64(1); v <= 3; v++ {
		out, ok := lc.pushFrom(p1.host, p1.addr(), "side", v, storetest.Blob(t, 1000+v, 256))
		t.Logf("partition → side v%d answered (the process ended): %v", v, time.Since(cut).Round(time.Millisecond))
		if ok {
			t.Fatalf("the cut-off primary acknowledged side v%d:\n%s", v, out)
		}
		if !strings.Contains(out, "etcd cannot confirm this hub's term") && !strings.Contains(out, "not acknowledged") &&
			!strings.Contains(out, "this hub is a standby") {
			t.Fatalf("side v%d on the cut-off primary failed without saying why:\n%s", v, out)
		}
		sideErrs = append(sideErrs, out)
	}
	t.Logf("the cut-off primary's answers to a trainer on its machine:\n%s", strings.Join(sideErrs, "\n"))

	// (b) The majority elects a standby; the trainer follows it.
	l2, p2 := lc.leader(l1.Epoch, p1)
	if p2 == p1 {
		t.Fatalf("the cut-off %s is primary again (epoch %d)", p1.id, l2.Epoch)
	}
	var first landed
	testkit.Eventually(t, 2*time.Minute, "the trainer's first push acknowledged by the new primary", func() bool {
		var ok bool
		first, ok = trainer.firstAfter(l1.Epoch)
		return ok
	})
	probeAt, ok := <-probeDone
	if !ok {
		t.Fatal("the probe never published on the new primary")
	}
	t.Logf("partition → new primary %s (epoch %d) published: %v; → the following trainer's first acknowledged push on it: %v (errors meanwhile:%s)",
		p2.id, l2.Epoch, probeAt.Sub(cut).Round(time.Millisecond), first.at.Sub(cut).Round(time.Millisecond), trainer.errors())
	n := len(trainer.snapshot())
	testkit.Eventually(t, 60*time.Second, "five more versions on the new primary", func() bool {
		return len(trainer.snapshot()) >= n+5
	})

	// (c) Heal: the old primary has stepped down by itself, rejoins as a
	// standby and converges. (It syncs from the new term's primary, or a
	// later one's should the heal move etcd's leadership and a lease
	// lapse meanwhile.)
	p1.host.Heal(t)
	testkit.Eventually(t, 90*time.Second, p1.id+" synced from a primary of epoch "+strconv.FormatUint(l2.Epoch, 10)+" or later", func() bool {
		return syncedEpoch(p1.out()) >= l2.Epoch
	})
	if !strings.Contains(p1.out(), `msg="cluster: this hub is no longer the primary; stepping down" epoch=`+strconv.FormatUint(l1.Epoch, 10)) {
		t.Fatalf("%s never logged stepping down from epoch %d", p1.id, l1.Epoch)
	}
	t.Logf("%s's step-down, from the cut:\n%s", p1.id, logSince(p1.out(), cut,
		"term proof", "stepping down", "taking it as lost", "graceful stop", "hub stopped", "did not answer in time"))
	testkit.Eventually(t, 60*time.Second, "five more versions with the old primary back", func() bool {
		return len(trainer.snapshot()) >= n+10
	})
	trainer.Stop()
	if st := p1.proc.State(); st != nil {
		t.Fatalf("%s ended: %v", p1.id, st)
	}

	l3, pc := lc.leader(l2.Epoch - 1)
	newest := lc.client(pc.addr(), 20*time.Second)
	trainer.checkLanded(t, newest, pc.id)
	for _, l := range trainer.snapshot() {
		if l.epoch != l1.Epoch && l.epoch < l2.Epoch {
			t.Fatalf("v%d landed at epoch %d, neither the old term's %d nor the new one's %d or later", l.version, l.epoch, l1.Epoch, l2.Epoch)
		}
		if l.epoch == l1.Epoch && l.at.After(first.at) {
			t.Fatalf("v%d was acknowledged at the old epoch %d after the new primary acknowledged v%d", l.version, l.epoch, first.version)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if s, err := newest.Get(ctx, "side", 0); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("side, never acknowledged, on the new primary: %v %v", s, err)
	}
	// Every copy converges to the primary's store (what the cut-off
	// primary wrote and nobody acknowledged is gone from its copy).
	for _, h := range lc.hubs {
		if h != pc {
			sameStore(t, pc, h)
		}
	}
	st, err := lc.status()
	if err != nil || st.Primary == nil || st.Primary.Epoch < l3.Epoch || len(st.Members) != 3 {
		t.Fatalf("cluster after the heal: %+v %v, want 3 members and a primary of epoch %d or later", st, err, l3.Epoch)
	}
}

// logSince is the lines of a hub's log (slog text) that hold one of
// what, each led by its time after since (measured, never asserted).
func logSince(out string, since time.Time, what ...string) string {
	var b strings.Builder
	for l := range strings.SplitSeq(out, "\n") {
		if !slices.ContainsFunc(what, func(w string) bool { return strings.Contains(l, w) }) {
			continue
		}
		f := strings.Fields(l)
		if len(f) == 0 || !strings.HasPrefix(f[0], "time=") {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(f[0], "time="))
		if err != nil || at.Before(since) {
			continue
		}
		fmt.Fprintf(&b, "  +%v %s\n", at.Sub(since).Round(time.Millisecond), strings.Join(f[1:], " "))
	}
	return b.String()
}

// syncedEpoch is the epoch of the newest full sync a hub's log shows
// applied (0: none).
func syncedEpoch(out string) uint64 {
	const line = `msg="replica: full sync applied"`
	i := strings.LastIndex(out, line)
	if i < 0 {
		return 0
	}
	l := strings.SplitN(out[i:], "\n", 2)[0]
	j := strings.LastIndex(l, " epoch=")
	if j < 0 {
		return 0
	}
	ep, _ := strconv.ParseUint(l[j+len(" epoch="):], 10, 64)
	return ep
}

// TestPartitionedStandbyDropsOutAndCatchesUp cuts a standby's machine off
// the network while a trainer pushes with acks all: publishes wait for it
// at most until its lease lapses, then go on without it — acknowledged,
// every one, once etcd no longer lists it — and nothing acknowledged is
// lost; healed, it rejoins and catches up with the primary's store. The
// primary keeps its term through the cut, though the etcd member cut
// with the standby is one its lease renewals go through
// (TestCutEtcdMachineKeepsThePrimary cuts that again and again).
func TestPartitionedStandbyDropsOutAndCatchesUp(t *testing.T) {
	lc := newLabCluster(t)
	l1, p := lc.leader(0)
	trainer := newPusher(t, lc.followingClient(30*time.Second), "pol", pushBlobs, 30*time.Second)
	go trainer.run() // the owner: trainer.Stop, below and at cleanup
	t.Cleanup(trainer.Stop)
	var s *labHub
	for _, h := range lc.hubs {
		if h != p {
			lc.synced(h, l1)
			s = h
		}
	}
	n := len(trainer.snapshot())
	testkit.Eventually(t, 60*time.Second, "five versions acknowledged before the cut", func() bool {
		return len(trainer.snapshot()) >= n+5
	})

	before := len(trainer.snapshot())
	leads := lc.etcdLeader() == s.host.IP
	cut := time.Now()
	s.host.Cut(t)
	t.Logf("cut %s (a standby; the primary is %s, epoch %d; etcd's leader there: %v) at version %d", s.id, p.id, l1.Epoch, leads, before)
	// Its lease lapses; etcd (through the hosts still connected) lists it
	// no more.
	var gone time.Time
	testkit.Eventually(t, 90*time.Second, s.id+"'s registration to lapse", func() bool {
		st, err := lc.status(s)
		if err != nil {
			return false
		}
		for _, m := range st.Members {
			if m.ID == s.id {
				return false
			}
		}
		gone = time.Now()
		return true
	})
	// From then on publishes do not wait for it: ten in a row are
	// acknowledged, and none started later than a grace after the lapse
	// fails for want of a standby's acknowledgement. (The primary reads
	// the standbys every quarter lease, a push in flight meanwhile stops
	// waiting then; the grace, far above that, only keeps a loaded
	// machine's late read from counting. A publish that waited for the
	// lapsed standby would fail --replica-ack-timeout, 10 s, after it
	// started; before the fix every one did, for minutes.)
	testkit.Eventually(t, 2*time.Minute, "ten pushes in a row acknowledged without "+s.id, func() bool {
		return trainer.ackedRunSince(gone, 10)
	})
	const grace = 5 * time.Second
	testkit.Eventually(t, 2*time.Minute, "a push started after the grace to end", func() bool {
		return trainer.attemptedAfter(gone.Add(grace))
	})
	if failed := trainer.failedWith(gone.Add(grace), "standbys acknowledged the publish"); len(failed) > 0 {
		t.Fatalf("%d pushes after %s's lease lapsed waited for it and failed:\n%s", len(failed), s.id, strings.Join(failed, "\n"))
	}
	resumed := trainer.firstAckedFrom(cut)
	t.Logf("partition → %s's registration gone: %v; → the first push started after the cut acknowledged: %v; pushes not acknowledged after the cut: %d (errors:%s)",
		s.id, gone.Sub(cut).Round(time.Millisecond), resumed.Sub(cut).Round(time.Millisecond), trainer.failedAfter(cut), trainer.errors())
	if st, err := lc.status(s); err != nil || st.Primary == nil || st.Primary.Epoch != l1.Epoch || steppedDown(p, l1.Epoch) {
		t.Fatalf("the primary %s (epoch %d) lost its term when a standby's machine was cut: now %v %v", p.id, l1.Epoch, st.Primary, err)
	}

	// Heal: it rejoins, follows and catches up.
	n = len(trainer.snapshot())
	s.host.Heal(t)
	l2, _ := lc.leader(0)
	testkit.Eventually(t, 90*time.Second, s.id+" back in the cluster, synced", func() bool {
		st, err := lc.status()
		if err != nil {
			return false
		}
		for _, m := range st.Members {
			if m.ID == s.id {
				return syncedEpoch(s.out()) >= l2.Epoch && strings.Count(s.out(), `msg="replica: full sync applied"`) >= 2
			}
		}
		return false
	})
	testkit.Eventually(t, 60*time.Second, "five more versions with the standby back", func() bool {
		return len(trainer.snapshot()) >= n+5
	})
	trainer.Stop()
	l3, pc := lc.leader(0)
	if l3.Epoch != l1.Epoch {
		t.Logf("the primary changed after the heal: %s (epoch %d) → %s (epoch %d)", p.id, l1.Epoch, pc.id, l3.Epoch)
	}
	trainer.checkLanded(t, lc.client(pc.addr(), 20*time.Second), pc.id)
	for _, h := range lc.hubs {
		if h != pc {
			sameStore(t, pc, h)
		}
	}
}

// steppedDown reports whether hub h logged stepping down from its term
// of epoch.
func steppedDown(h *labHub, epoch uint64) bool {
	return strings.Contains(h.out(), `msg="cluster: this hub is no longer the primary; stepping down" epoch=`+strconv.FormatUint(epoch, 10))
}

// TestCutEtcdMachineKeepsThePrimary cuts a standby's machine off the
// network, heals it, and cuts the other standby's, cuts times: each cut
// silences one of the three etcd members, one the primary's lease
// renewals go through in turn (its log names the member it passed over:
// checked), and at every other cut etcd's leader (moved there first).
// The primary keeps its term every time: the same epoch, no step-down,
// and the trainer's pushes (acks 1: the standby left up acknowledges;
// what a publish waits for is not what is tested) are acknowledged again
// after the cut, ten in a row. The log reports, per cut, the time from
// the cut to the first acknowledged push started after it
// (docs/benchlog/2026-12-03-s16-keepalive.md).
func TestCutEtcdMachineKeepsThePrimary(t *testing.T) {
	const cuts = 4
	lc := newLabCluster(t, "--replica-acks", "1")
	l, p := lc.leader(0)
	trainer := newPusher(t, lc.followingClient(30*time.Second), "pol", pushBlobs, 30*time.Second)
	go trainer.run() // the owner: trainer.Stop, below and at cleanup
	t.Cleanup(trainer.Stop)
	var standbys []*labHub
	for _, h := range lc.hubs {
		if h != p {
			lc.synced(h, l)
			standbys = append(standbys, h)
		}
	}
	var lost int
	for c := range cuts {
		s := standbys[c%len(standbys)]
		n := len(trainer.snapshot())
		testkit.Eventually(t, 60*time.Second, "five versions acknowledged before the cut", func() bool {
			return len(trainer.snapshot()) >= n+5
		})
		if c%2 == 1 {
			// Every other cut takes etcd's leader with it: etcd elects
			// another while the primary's renewals wait.
			lc.moveEtcdLeader(s)
		}
		leads := lc.etcdLeader() == s.host.IP
		// The primary logs passing an endpoint over when it was not
		// already skipping it (and its answering again): wait until it
		// does not skip s's member (one that did not answer during an
		// earlier cut's etcd election is skipped for 5 TTLs), so that the
		// cut is seen passing it over anew.
		ep := "endpoint=http://" + s.host.IP + ":2379"
		passedOver := `msg="cluster: etcd endpoint did not answer in time; using the others" ` + ep + " "
		testkit.Eventually(t, 60*time.Second, p.id+" using "+s.id+"'s etcd member", func() bool {
			out := p.out()
			bad := strings.LastIndex(out, passedOver)
			return bad < 0 || bad < strings.LastIndex(out, `msg="cluster: etcd endpoint answers again" `+ep+"\n")
		})
		before := strings.Count(p.out(), passedOver)
		const fullSync = `msg="replica: full sync applied"`
		syncs := strings.Count(s.out(), fullSync)
		cut := time.Now()
		s.host.Cut(t)
		// Ten in a row acknowledged, started after the cut and again after
		// the time a lease could wait for an answer (TTL + 5 s: the
		// primary would have stepped down by then).
		testkit.Eventually(t, 2*time.Minute, "ten pushes in a row acknowledged after the cut", func() bool {
			return trainer.ackedRunSince(cut, 10)
		})
		after := cut.Add(10 * time.Second)
		testkit.Eventually(t, 2*time.Minute, "ten pushes in a row acknowledged 10 s after the cut", func() bool {
			return trainer.ackedRunSince(after, 10)
		})
		resumed := trainer.firstAckedFrom(cut)
		st, err := lc.status(s)
		kept := err == nil && st.Primary != nil && st.Primary.Epoch == l.Epoch && !steppedDown(p, l.Epoch)
		t.Logf("cut %d: %s (etcd's leader there: %v); the primary %s kept its term: %v; cut → the first push started after it acknowledged: %v; the longest time without an acknowledgement from the cut: %v; pushes not acknowledged: %d",
			c+1, s.id, leads, p.id, kept, resumed.Sub(cut).Round(time.Millisecond), trainer.longestGap(cut, time.Now()).Round(time.Millisecond), trainer.failedAfter(cut))
		if !kept {
			lost++
			t.Errorf("cut %d (%s's machine; etcd's leader there: %v): the primary %s lost its term of epoch %d (now %v %v)", c+1, s.id, leads, p.id, l.Epoch, st.Primary, err)
		} else {
			// The primary's renewals went through the cut member and passed
			// it over: what the cut tests.
			// (An error, not a stop: the cuts go on.)
			deadline := time.Now().Add(30 * time.Second)
			for strings.Count(p.out(), passedOver) == before && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
			}
			if strings.Count(p.out(), passedOver) == before {
				t.Errorf("cut %d: the primary %s's log does not show it passing over %s's etcd member", c+1, p.id, s.id)
			}
		}
		s.host.Heal(t)
		if !kept {
			l, p = lc.leader(l.Epoch)
			standbys = standbys[:0]
			for _, h := range lc.hubs {
				if h != p {
					standbys = append(standbys, h)
				}
			}
		}
		// Every standby back in the cluster and synced (the cut one again)
		// before the next cut.
		for _, h := range standbys {
			testkit.Eventually(t, 90*time.Second, h.id+" back in the cluster, synced", func() bool {
				st, err := lc.status()
				if err != nil {
					return false
				}
				for _, m := range st.Members {
					if m.ID == h.id {
						return syncedEpoch(h.out()) >= l.Epoch && (h != s || !kept || strings.Count(s.out(), fullSync) > syncs)
					}
				}
				return false
			})
		}
	}
	trainer.Stop()
	if lost > 0 {
		t.Fatalf("the primary lost its term at %d of %d cuts of a standby's machine", lost, cuts)
	}
	trainer.checkLanded(t, lc.client(p.addr(), 20*time.Second), p.id)
}
