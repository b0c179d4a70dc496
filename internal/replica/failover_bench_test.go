package replica_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
)

// TestFailoverTimes measures failover, from one SIGKILL of the primary
// (while a client publishes every ~10 ms) to two moments: the first
// version the new primary publishes (acknowledged by every standby
// left), and every collector of startCollectors (the Go data-plane
// client on etcd://, the push stream through Failover on the hub list,
// Failover over the data plane on etcd://, a relay's shared memory)
// applying a version of the new term; p50/p99 of each over
// RLHUB_FAILOVER_KILLS kills (skipped when unset) at a 2s lease. The
// killed hub is restarted on its data and address after each kill, so
// every kill finds three hubs (and the hub list stays true). Figures go
// to the log (docs/benchlog).
func TestFailoverTimes(t *testing.T) {
	kills, _ := strconv.Atoi(os.Getenv("RLHUB_FAILOVER_KILLS"))
	if kills <= 0 {
		t.Skip("set RLHUB_FAILOVER_KILLS=N to measure failover over N kills")
	}
	f := measureFailover(t, kills)
	t.Logf("failover, lease 2s, %d kills, %d collectors: kill → first version by the new primary p50 %v p99 %v (max %v); kill → every collector on the new term p50 %v p99 %v (max %v)",
		kills, f.collectors, f.toPublish.q(0.5), f.toPublish.q(0.99), f.toPublish.q(1), f.toEvery.q(0.5), f.toEvery.q(0.99), f.toEvery.q(1))
}

// BenchmarkFailover is TestFailoverTimes for `make benchref`:
// RLHUB_FAILOVER_KILLS kills (default 3) of a three-hub cluster at a 2s
// lease, reporting kill → first version by the new primary (p50_s,
// p99_s: the maximum below 100 kills) and kill → every collector on the
// new term (every_p50_s, every_p99_s), both from the same kills, the
// lease (lease_s) and each p99 in leases.
func BenchmarkFailover(b *testing.B) {
	kills, _ := strconv.Atoi(os.Getenv("RLHUB_FAILOVER_KILLS"))
	if kills <= 0 {
		kills = 3
	}
	b.Run("lease=2s", func(b *testing.B) {
		var f failoverTimes
		for range b.N {
			f = measureFailover(b, kills)
		}
		b.ReportMetric(f.toPublish.q(0.50).Seconds(), "p50_s")
		b.ReportMetric(f.toPublish.q(0.99).Seconds(), "p99_s")
		b.ReportMetric(f.toEvery.q(0.50).Seconds(), "every_p50_s")
		b.ReportMetric(f.toEvery.q(0.99).Seconds(), "every_p99_s")
		b.ReportMetric(2, "lease_s")
		b.ReportMetric(f.toPublish.q(0.99).Seconds()/2, "p99_leases")
		b.ReportMetric(f.toEvery.q(0.99).Seconds()/2, "every_p99_leases")
		b.ReportMetric(float64(kills), "kills")
	})
}

// durations are measured times, in the order measured.
type durations []time.Duration

// q is the p quantile (1: the maximum), to the millisecond.
func (d durations) q(p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))].Round(time.Millisecond)
}

// failoverTimes is measureFailover's figures, one per kill.
type failoverTimes struct {
	toPublish, toEvery durations
	collectors         int
}

// measureFailover kills a three-hub cluster's primary kills times while a
// client publishes and the collectors of startCollectors follow the
// cluster, and times each kill to the new primary's first version and to
// every collector on the new term.
func measureFailover(t testing.TB, kills int) failoverTimes {
	e := clustertest.Start(t)
	c := newClusterTTL(t, e.Endpoint, 3, "2s")
	const model = "pol"
	blob := storetest.Blob(t, 1, 1<<14)

	type landed struct {
		at             time.Time
		version, epoch uint64
	}
	var mu sync.Mutex
	var log []landed
	published := func() []landed {
		mu.Lock()
		defer mu.Unlock()
		return append([]landed(nil), log...)
	}
	c.push(model, 1, 0, blob)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // the publisher: follows the primary through etcd
		v := uint64(1)
		for {
			select {
			case <-stop:
				return
			default:
			}
			st, err := c.status()
			if err != nil || st.Primary == nil {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			cl, _ := storerpc.NewClient(storerpc.ClientConfig{Addr: st.Primary.Addr, MaxAttempts: 1, CallTimeout: 3 * time.Second})
			for {
				select {
				case <-stop:
					cl.Close()
					return
				default:
				}
				info, err := cl.Push(context.Background(), store.PushRequest{Name: model, Version: v + 1, Expect: store.ExpectAny, Blob: blob})
				if err != nil {
					if cur, gerr := cl.List(context.Background()); gerr == nil {
						for _, i := range cur {
							if i.Name == model {
								v = max(v, i.Version)
							}
						}
					}
					break
				}
				v = info.Version
				mu.Lock()
				log = append(log, landed{at: time.Now(), version: info.Version, epoch: info.Epoch})
				mu.Unlock()
				time.Sleep(10 * time.Millisecond)
			}
			cl.Close()
			time.Sleep(10 * time.Millisecond)
		}
	})
	defer func() { close(stop); wg.Wait() }()
	set, _ := startCollectors(t, c, e.Endpoint, model)

	f := failoverTimes{collectors: len(set.all)}
	after := uint64(0)
	for k := range kills {
		l, p := c.leader(after)
		testkit.Eventually(t, 2*time.Minute, fmt.Sprintf("every collector on a version of epoch %d", l.Epoch), func() bool {
			for _, fc := range set.all {
				if got := fc.deliveries(); len(got) == 0 || got[len(got)-1].epoch != l.Epoch {
					return false
				}
			}
			return true
		})
		killed := time.Now()
		p.kill()
		var first time.Time
		testkit.Eventually(t, time.Minute, "the new primary's first version", func() bool {
			for _, x := range published() {
				if x.epoch > l.Epoch {
					first = x.at
					return true
				}
			}
			return false
		})
		var every time.Time
		var each []string
		testkit.Eventually(t, time.Minute, "every collector on a version of the new term", func() bool {
			every, each = time.Time{}, nil
			for _, fc := range set.all {
				at := fc.firstOfEpochAfter(l.Epoch)
				if at.IsZero() {
					return false
				}
				each = append(each, fmt.Sprintf("%s %v", fc.name, at.Sub(killed).Round(time.Millisecond)))
				if at.After(every) {
					every = at
				}
			}
			return true
		})
		f.toPublish, f.toEvery = append(f.toPublish, first.Sub(killed)), append(f.toEvery, every.Sub(killed))
		t.Logf("kill %d (epoch %d): first publish %v, every collector %v (%s)", k+1, l.Epoch,
			first.Sub(killed).Round(time.Millisecond), every.Sub(killed).Round(time.Millisecond), strings.Join(each, ", "))
		after = l.Epoch
		if k == kills-1 {
			break
		}
		// Back on its data and its address (the hub list names it): three
		// hubs for the next kill.
		if !slices.Contains(p.args, "--listen") {
			p.args = append(slices.Clone(p.args), "--listen", p.addr)
		}
		c.start(p)
		testkit.Eventually(t, time.Minute, "three members again", func() bool {
			st, err := c.status()
			return err == nil && len(st.Members) == 3
		})
		// Publishes wait for every standby's acknowledgement: 20 more
		// versions mean the restarted hub follows again. The pause lets
		// it campaign too, so every kill finds the same cluster (one run
		// killed the primary 3.6 s after a restart and the restarted hub
		// followed no new primary for a minute: see the s8 ha-cost
		// benchlog).
		n := len(published())
		testkit.Eventually(t, 2*time.Minute, "20 versions published with three hubs", func() bool { return len(published()) >= n+20 })
		time.Sleep(3 * time.Second)
	}
	return f
}

// TestReplicationCost measures the store's push and pull throughput and
// the reducer's gradients applied per second on a single hub and on a
// cluster primary with two standbys (acks all, and acks 0), interleaved
// in one run (RLHUB_REPLICATION_COST=1, RLHUB_REPLICATION_ROUNDS rounds,
// default 3; skipped otherwise). RLHUB_REPLICATION_HUBS sets the
// acks-all cluster's size (default 3), RLHUB_REPLICATION_ARGS adds serve
// flags to its hubs (e.g. --replica-sync fsync). Each figure's ratio is
// against the single hub of the same round; the medians over the rounds
// close the log.
//
// Every round measures each of the three twice: shared, every process
// free to run on every CPU this test may use (standbys on the same cores
// as the primary take CPU from it, as on one host); and pinned, which
// stands in for separate hosts: the measured primary (or the single hub)
// and this process, which runs the load clients, on one half of the CPUs,
// and everything else — the standbys, etcd, the idle hubs of the other
// setups — on the other half (on two CPUs: CPU 0 and CPU 1). The single
// hub's baseline gets exactly the primary's CPUs.
func TestReplicationCost(t *testing.T) {
	if os.Getenv("RLHUB_REPLICATION_COST") == "" {
		t.Skip("set RLHUB_REPLICATION_COST=1 to measure")
	}
	rounds := 3
	if r, err := strconv.Atoi(os.Getenv("RLHUB_REPLICATION_ROUNDS")); err == nil && r > 0 {
		rounds = r
	}
	nh := 3 // RLHUB_REPLICATION_HUBS=1: a cluster of one (fencing, no standby), the control
	if h, err := strconv.Atoi(os.Getenv("RLHUB_REPLICATION_HUBS")); err == nil && h > 0 {
		nh = h
	}
	r := measureReplication(t, rounds, nh)
	for _, l := range []layout{shared, pinned} {
		if len(r.ratios[l][0]) == 0 {
			continue
		}
		x := func(i int) float64 { return median(r.ratios[l][i]) }
		c := func(i int) float64 { return median(r.cpu[l][i]) }
		for k, sl := range steadyLoads {
			y := func(i int) float64 { return median(r.steady[l][k][i]) }
			pushes := func(i int) string {
				if sl.pushers == 0 {
					return ""
				}
				return fmt.Sprintf(" pushes %.2fx", y(i))
			}
			t.Logf("replication cost, %s, median of %d rounds (ratio to a single hub): steady state (%s): acks all: grads applied %.2fx%s pulls %.2fx; acks 0: grads applied %.2fx%s pulls %.2fx",
				l, rounds, sl.name, y(0), pushes(1), y(2), y(3), pushes(4), y(5))
		}
		t.Logf("replication cost, %s, median of %d rounds (ratio to a single hub): per-op latency (one client, each op waiting for the one before): acks all: pushes %.2fx pulls %.2fx grads %.2fx; acks 0: pushes %.2fx pulls %.2fx grads %.2fx; CPU per push: single hub %.1f ms, acks-all primary %.1f ms + standbys %.1f ms, acks-0 primary %.1f ms",
			l, rounds, x(0), x(1), x(2), x(3), x(4), x(5), c(0), c(1), c(2), c(3))
	}
}

// BenchmarkReplicationCost is TestReplicationCost for `make benchref`:
// RLHUB_REPLICATION_ROUNDS rounds (default 5: one round's steady window
// moves by ±50% with the machine's load), reporting, with the
// processes shared on every CPU and pinned as separate hosts (the _pinned
// metrics): under the steady load (steadyLoad), the acks-all primary's
// gradients applied/s and the single hub's (grads/s, single_grads/s) and
// the medians of the per-round ratios for gradients applied, pushes and
// pulls, with acks all and acks 0 (x_steady_… under the mixed load,
// x_train_… under gradient training, which has no pushes; grads/s and
// single_grads/s are the mixed load's, train_grads/s and
// single_train_grads/s gradient training's); and the per-op latency
// figures of one serial client (serial_pushes/s, single_serial_pushes/s,
// x_serial_…).
func BenchmarkReplicationCost(b *testing.B) {
	rounds := 5
	if r, err := strconv.Atoi(os.Getenv("RLHUB_REPLICATION_ROUNDS")); err == nil && r > 0 {
		rounds = r
	}
	b.Run("size=1MiB", func(b *testing.B) {
		var r replicationRun
		for range b.N {
			r = measureReplication(b, rounds, 3)
		}
		// With RLHUB_REPLICATION_BASE_BIN the second cluster is the base
		// build's (acks all): its figures end in _base, not _acks0.
		sfx := "_acks0"
		if os.Getenv("RLHUB_REPLICATION_BASE_BIN") != "" {
			sfx = "_base"
		}
		names := []string{"x_serial_pushes", "x_serial_pulls", "x_serial_grads", "x_serial_pushes" + sfx, "x_serial_pulls" + sfx, "x_serial_grads" + sfx}
		// Per load: the metrics' stem (x_<stem>_grads …) and the prefix of
		// its gradients applied/s.
		stems := [nLoads][2]string{training: {"train", "train_"}, mixed: {"steady", ""}}
		for l, suffix := range map[layout]string{shared: "", pinned: "_pinned"} {
			if len(r.ratios[l][0]) == 0 {
				continue
			}
			for i, name := range names {
				b.ReportMetric(median(r.ratios[l][i]), name+suffix)
			}
			b.ReportMetric(median(r.cluster[l]), "serial_pushes/s"+suffix)
			b.ReportMetric(median(r.single[l]), "single_serial_pushes/s"+suffix)
			for k, sl := range steadyLoads {
				stem, gp := stems[k][0], stems[k][1]
				for i, what := range []string{"grads", "pushes", "pulls", "grads" + sfx, "pushes" + sfx, "pulls" + sfx} {
					if sl.pushers == 0 && strings.HasPrefix(what, "pushes") {
						continue
					}
					b.ReportMetric(median(r.steady[l][k][i]), "x_"+stem+"_"+what+suffix)
				}
				b.ReportMetric(median(r.steadyCluster[l][k]), gp+"grads/s"+suffix)
				b.ReportMetric(median(r.steadySingle[l][k]), "single_"+gp+"grads/s"+suffix)
				// The spread the median is taken over: one round's ratio moves
				// with the machine's load by more than the goal's margin.
				if g := r.steady[l][k][0]; len(g) > 0 {
					b.ReportMetric(slices.Min(g), "x_"+stem+"_grads_min"+suffix)
					b.ReportMetric(slices.Max(g), "x_"+stem+"_grads_max"+suffix)
				}
			}
		}
		// CPU per push (pinned when measured: no other process shares the
		// primary's CPUs there): the single hub, the acks-all primary, its
		// standbys together, and the primary's over the single hub's.
		l := shared
		if len(r.cpu[pinned][0]) > 0 {
			l = pinned
		}
		b.ReportMetric(median(r.cpu[l][0]), "cpu_ms/push_single")
		b.ReportMetric(median(r.cpu[l][1]), "cpu_ms/push_primary")
		b.ReportMetric(median(r.cpu[l][2]), "cpu_ms/push_standbys")
		b.ReportMetric(median(r.cpu[l][1])/median(r.cpu[l][0]), "x_cpu_primary")
		b.ReportMetric(median(r.cpu[l][3]), "cpu_ms/push_primary"+sfx)
	})
}

// layout is where the processes of a measurement may run.
type layout int

const (
	shared layout = iota // every process on every CPU
	pinned               // the measured hub and the clients on half the CPUs, the rest on the other half
)

func (l layout) String() string {
	if l == pinned {
		return "pinned as separate hosts"
	}
	return "shared cores"
}

// replicationRun is measureReplication's figures, one entry per round,
// per layout: the ratios to the single hub (acks all: pushes, pulls,
// grads; acks 0: the same) and the pushes/s of the acks-all primary and
// the single hub.
type replicationRun struct {
	ratios          [2][6][]float64
	cluster, single [2][]float64
	// steady is the steady-state ratios per load (steadyLoads: acks all:
	// gradients applied, pushes, pulls; acks 0: the same), steadyCluster
	// and steadySingle the acks-all primary's and the single hub's
	// gradients applied/s.
	steady                      [2][nLoads][6][]float64
	steadyCluster, steadySingle [2][nLoads][]float64
	// cpu is CPU ms per push: the single hub, the acks-all primary, its
	// standbys together, the acks-0 primary.
	cpu [2][4][]float64
}

// cpuTime is the CPU time (user + system) the processes pids have used,
// from /proc (clock ticks of 10 ms); a process that has gone counts 0.
func cpuTime(pids ...int) time.Duration {
	var total time.Duration
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		k, _ := strconv.ParseInt(f[12], 10, 64)
		total += time.Duration(u+k) * 10 * time.Millisecond
	}
	return total
}

// A steady load: learners gradient learners on one model, each pushing
// its next 1 MiB gradient as soon as the last was admitted (on the version
// it was admitted at: no learner waits for a version), pushers store
// clients pushing 1 MiB versions of their own models back to back, and
// pullers pulling newest versions back to back: of the trained model
// (pullTrained: collectors on the policy being trained) or of the pushers'
// models. Figures over steadyWindow after steadyWarm.
type steadyLoad struct {
	name                       string
	learners, pushers, pullers int
	pullTrained                bool
}

// steadyLoads are measured in every round and layout, in this order:
// gradient training (the trained model's versions are all that is
// published, and all that the collectors pull) and a mixed load, in which
// two store clients also publish 1 MiB versions of other models back to
// back, each waiting for its acknowledgement.
var steadyLoads = [nLoads]steadyLoad{
	training: {name: "gradient training: 4 learners, 2 collectors pulling the trained model, 1 MiB each", learners: 4, pullers: 2, pullTrained: true},
	mixed:    {name: "mixed: 4 learners, 2 pushers, 2 pullers of the pushed models, 1 MiB each", learners: 4, pushers: 2, pullers: 2},
}

const (
	training = iota
	mixed
	nLoads
)

const steadyWarm = 500 * time.Millisecond

// steadyWindow is 3 s, or RLHUB_REPLICATION_STEADY (a duration): a longer
// window to profile the processes under the steady load (perf record).
var steadyWindow = func() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("RLHUB_REPLICATION_STEADY")); err == nil && d > 0 {
		return d
	}
	return 3 * time.Second
}()

// median is the median of xs (the mean of the middle two of an even
// count: taking the upper one made the median of two rounds their
// maximum); NaN when xs is empty.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// measureReplication runs rounds of the measurement on a single hub, a
// cluster of nh hubs with acks all and one of three with acks 0,
// interleaved, each shared and pinned (pinned is left out, and said so,
// when this process may use fewer than two CPUs).
func measureReplication(t testing.TB, rounds, nh int) replicationRun {
	const n, size = 100, 1 << 20 // 1 MiB blobs (256 Ki float32)
	blob := storetest.Blob(t, 1, size/4)
	const ng = 30 // gradients per round
	// The reducer's default batch (4 gradients, 5 ms max wait): the
	// steady load's learners fill it while a step publishes; the serial
	// gradients each wait out the max wait, on every setup alike.
	singleProc := startPlainHubProc(t, "--reduce-batch-size", "4")
	single := singleProc.Addr()
	e := startEtcd(t)
	clusterArgs := func(extra string) []string {
		return append([]string{"--reduce-batch-size", "4"}, strings.Fields(extra)...)
	}
	allArgs := clusterArgs(os.Getenv("RLHUB_REPLICATION_ARGS"))
	all := newClusterTTL(t, e, nh, "2s", allArgs...)
	lAll, pAll := all.leader(0)
	// RLHUB_REPLICATION_BASE_BIN: an A/B of two builds in one run. The
	// second cluster is then that build's, acks all like the first
	// (figures labelled "base"), instead of this build's with acks 0.
	second := "acks 0"
	var async *testCluster
	if base := os.Getenv("RLHUB_REPLICATION_BASE_BIN"); base != "" {
		second = "base build, acks all"
		// RLHUB_REPLICATION_BASE_ARGS, when set, replaces
		// RLHUB_REPLICATION_ARGS for the base cluster (an A/B of two
		// settings of one build: BASE_BIN the same binary).
		baseArgs := allArgs
		if ba, ok := os.LookupEnv("RLHUB_REPLICATION_BASE_ARGS"); ok {
			baseArgs = clusterArgs(ba)
		}
		async = newClusterBin(t, e, nh, "2s", base, baseArgs...)
	} else {
		async = newClusterTTL(t, e, 3, "2s", "--replica-acks", "0", "--reduce-batch-size", "4")
	}
	lAsync, pAsync := async.leader(0)
	// Every standby follows before anything is timed (a standby still
	// joining would hold the first publishes for its full sync).
	for _, c := range []*testCluster{all, async} {
		c.push("warm", 1, 0, blob)
	}

	// The pinning: this process (the load clients) and the measured hub
	// on `near`, every other process on `far`; everyone back on `cpus`
	// after.
	cpus, err := ownCPUs()
	if err != nil {
		t.Fatal(err)
	}
	near, far := cpus[:len(cpus)/2], cpus[len(cpus)/2:]
	layouts := []layout{shared, pinned}
	if len(cpus) < 2 {
		layouts = layouts[:1]
		t.Logf("this process may use %d CPU (%s): no pinned measurement", len(cpus), cpus)
	}
	everyone := func() []int {
		pids := append([]int{singleProc.Pid()}, childrenNamed("etcd")...)
		for _, c := range []*testCluster{all, async} {
			for _, h := range c.hubs {
				pids = append(pids, h.proc.Pid())
			}
		}
		return pids
	}
	place := func(measured int) {
		for _, pid := range everyone() {
			set := far
			if pid == measured {
				set = near
			}
			if err := pin(pid, set); err != nil {
				t.Fatal(err)
			}
		}
		if err := pin(os.Getpid(), near); err != nil {
			t.Fatal(err)
		}
	}
	unpin := func() {
		for _, pid := range append(everyone(), os.Getpid()) {
			if err := pin(pid, cpus); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer unpin()
	if len(layouts) > 1 {
		t.Logf("pinned: this process (the load clients) and the measured hub (single hub %d, acks-all primary %d, acks-0 primary %d) on CPUs %s; the standbys, etcd and the idle hubs on CPUs %s",
			singleProc.Pid(), pAll.proc.Pid(), pAsync.proc.Pid(), near, far)
	}

	gsd, _ := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{size / 4}, make([]float32, size/4)))
	gblob, err := safetensors.Encode(gsd, nil)
	if err != nil {
		t.Fatal(err)
	}
	ones := make([]float32, size/4)
	for i := range ones {
		ones[i] = 1
	}
	grad, _ := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{size / 4}, ones))
	// cost is what one setup's publishes cost: the CPU time (user +
	// system) the measured hub and its standbys spent per push, in ms.
	type cost struct{ hub, standbys float64 }
	measure := func(addr string, hub int, standbys []int) (pushes, pulls, grads float64, c cost) {
		cl, err := storerpc.NewClient(storerpc.ClientConfig{Addr: addr, MaxAttempts: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		ctx := context.Background()
		model := fmt.Sprintf("m%d", time.Now().UnixNano())
		hub0, sb0 := cpuTime(hub), cpuTime(standbys...)
		start := time.Now()
		for v := uint64(1); v <= n; v++ {
			if _, err := cl.Push(ctx, store.PushRequest{Name: model, Version: v, Expect: v - 1, Blob: blob}); err != nil {
				t.Fatalf("push to %s: %v", addr, err)
			}
		}
		pushes = n / time.Since(start).Seconds()
		c = cost{hub: float64(cpuTime(hub)-hub0) / float64(time.Millisecond) / n,
			standbys: float64(cpuTime(standbys...)-sb0) / float64(time.Millisecond) / n}
		start = time.Now()
		for range n {
			if _, err := cl.Get(ctx, model, 0); err != nil {
				t.Fatal(err)
			}
		}
		pulls = n / time.Since(start).Seconds()

		// Gradients: each pushed on the newest version, the next once it
		// is applied (a new version published), one at a time.
		gmodel := "g" + model
		if _, err := cl.Push(ctx, store.PushRequest{Name: gmodel, Version: 1, Blob: gblob}); err != nil {
			t.Fatal(err)
		}
		rc, err := reducer.NewClient(reducer.ClientConfig{Hub: addr, ClientID: "bench"})
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		if _, _, err := rc.Register(ctx, reducer.ModelConfig{Model: gmodel, Optimizer: optim.Config{Kind: optim.SGD, LR: 0.01}}); err != nil {
			t.Fatal(err)
		}
		versions := make(chan uint64, ng+1)
		wctx, wcancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		defer func() { wcancel(); wg.Wait() }()
		wg.Go(func() {
			_ = cl.Watch(wctx, gmodel, 1, func(s *store.Snapshot, _ uint64) error {
				versions <- s.Version
				return nil
			})
		})
		start = time.Now()
		v := uint64(1)
		for range ng {
			if _, err := rc.PushGrad(ctx, gmodel, v, grad); err != nil {
				t.Fatalf("gradient to %s: %v", addr, err)
			}
			for nv := range versions {
				if nv > v {
					v = nv
					break
				}
			}
		}
		grads = ng / time.Since(start).Seconds()
		return pushes, pulls, grads, c
	}
	// steady is one setup's steady state under steadyLoad: gradients
	// applied per second (the hub's own counter), pushes and pulls
	// completed per second, and the CPUs the hub and its standbys kept
	// busy, over steadyWindow after steadyWarm of the load.
	type steadyState struct{ grads, pushes, pulls, hubCPU, standbysCPU, clientsCPU float64 }
	steady := func(load steadyLoad, addr string, hub int, standbys []int) steadyState {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		tag := fmt.Sprintf("s%d", time.Now().UnixNano())
		client := func() *storerpc.Client {
			cl, err := storerpc.NewClient(storerpc.ClientConfig{Addr: addr, MaxAttempts: 1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cl.Close() })
			return cl
		}
		var wg sync.WaitGroup
		failed := make(chan error, 1)
		fail := func(err error) {
			if ctx.Err() == nil {
				select {
				case failed <- err:
				default:
				}
			}
		}
		gmodel := "g" + tag
		if _, err := client().Push(ctx, store.PushRequest{Name: gmodel, Version: 1, Blob: gblob}); err != nil {
			t.Fatal(err)
		}
		var rcs []*reducer.Client
		for i := range load.learners {
			rc, err := reducer.NewClient(reducer.ClientConfig{Hub: addr, ClientID: fmt.Sprintf("%s-%d", tag, i)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rc.Close() })
			rcs = append(rcs, rc)
		}
		if _, _, err := rcs[0].Register(ctx, reducer.ModelConfig{Model: gmodel, Optimizer: optim.Config{Kind: optim.SGD, LR: 0.01}}); err != nil {
			t.Fatal(err)
		}
		for _, rc := range rcs { // each on the version its last gradient was admitted at
			wg.Go(func() {
				v := uint64(1)
				for ctx.Err() == nil {
					r, err := rc.PushGrad(ctx, gmodel, v, grad)
					if err != nil {
						fail(fmt.Errorf("gradient to %s: %w", addr, err))
						return
					}
					v = max(v, r.Version)
				}
			})
		}
		var pushes, pulls atomic.Int64
		models := make([]string, load.pushers)
		for i := range models {
			models[i] = fmt.Sprintf("%s-%d", tag, i)
			cl := client()
			if _, err := cl.Push(ctx, store.PushRequest{Name: models[i], Version: 1, Blob: blob}); err != nil {
				t.Fatal(err)
			}
			wg.Go(func() {
				for v := uint64(2); ctx.Err() == nil; v++ {
					if _, err := cl.Push(ctx, store.PushRequest{Name: models[i], Version: v, Expect: v - 1, Blob: blob}); err != nil {
						fail(fmt.Errorf("push to %s: %w", addr, err))
						return
					}
					pushes.Add(1)
				}
			})
		}
		for i := range load.pullers {
			cl := client()
			pulled := gmodel
			if !load.pullTrained {
				pulled = models[i%len(models)]
			}
			wg.Go(func() {
				for ctx.Err() == nil {
					if _, err := cl.Get(ctx, pulled, 0); err != nil {
						fail(fmt.Errorf("pull from %s: %w", addr, err))
						return
					}
					pulls.Add(1)
				}
			})
		}
		applied := func() float64 {
			st, err := rcs[0].HubStats(ctx, addr)
			if err != nil {
				t.Fatalf("stats of %s: %v", addr, err)
			}
			return float64(st.Models[gmodel].Counters.Applied)
		}
		time.Sleep(steadyWarm)
		g0, p0, l0 := applied(), pushes.Load(), pulls.Load()
		hub0, sb0, cl0, start := cpuTime(hub), cpuTime(standbys...), cpuTime(os.Getpid()), time.Now()
		time.Sleep(steadyWindow)
		g1, p1, l1 := applied(), pushes.Load(), pulls.Load()
		hub1, sb1, cl1, secs := cpuTime(hub), cpuTime(standbys...), cpuTime(os.Getpid()), time.Since(start).Seconds()
		cancel()
		wg.Wait()
		select {
		case err := <-failed:
			t.Fatal(err)
		default:
		}
		return steadyState{grads: (g1 - g0) / secs, pushes: float64(p1-p0) / secs, pulls: float64(l1-l0) / secs,
			hubCPU: (hub1 - hub0).Seconds() / secs, standbysCPU: (sb1 - sb0).Seconds() / secs, clientsCPU: (cl1 - cl0).Seconds() / secs}
	}
	standbysOf := func(c *testCluster, primary *hubProc) []int {
		var pids []int
		for _, h := range c.standbys(primary) {
			pids = append(pids, h.proc.Pid())
		}
		return pids
	}
	var run replicationRun
	for round := range rounds {
		for _, l := range layouts {
			at := func(addr string, pid int, standbys []int) (float64, float64, float64, cost) {
				if l == pinned {
					place(pid)
					defer unpin()
				}
				return measure(addr, pid, standbys)
			}
			steadyAt := func(load steadyLoad, addr string, pid int, standbys []int) steadyState {
				if l == pinned {
					place(pid)
					defer unpin()
				}
				return steady(load, addr, pid, standbys)
			}
			load, _ := os.ReadFile("/proc/loadavg")
			sp, sl, sg, sc := at(single, singleProc.Pid(), nil)
			// The two clusters in turns, first one then the other.
			var cp, cl, cg, ap, al, ag float64
			var cc, ac cost
			if round%2 == 0 {
				cp, cl, cg, cc = at(lAll.Addr, pAll.proc.Pid(), standbysOf(all, pAll))
				ap, al, ag, ac = at(lAsync.Addr, pAsync.proc.Pid(), standbysOf(async, pAsync))
			} else {
				ap, al, ag, ac = at(lAsync.Addr, pAsync.proc.Pid(), standbysOf(async, pAsync))
				cp, cl, cg, cc = at(lAll.Addr, pAll.proc.Pid(), standbysOf(all, pAll))
			}
			t.Logf("round %d, %s, 1 MiB, load %s: single hub %.1f pushes/s %.1f pulls/s %.1f grads/s; primary + %d standbys, acks all: %.1f pushes/s (%.2fx) %.1f pulls/s (%.2fx) %.1f grads/s (%.2fx); %s: %.1f pushes/s (%.2fx) %.1f pulls/s (%.2fx) %.1f grads/s (%.2fx)",
				round+1, l, strings.Join(strings.Fields(string(load))[:3], " "), sp, sl, sg, nh-1, cp, cp/sp, cl, cl/sl, cg, cg/sg, second, ap, ap/sp, al, al/sl, ag, ag/sg)
			t.Logf("round %d, %s, CPU per push (user+system): single hub %.1f ms; acks all: primary %.1f ms, its standbys %.1f ms together; %s: primary %.1f ms, standbys %.1f ms",
				round+1, l, sc.hub, cc.hub, cc.standbys, second, ac.hub, ac.standbys)
			run.cpu[l][0], run.cpu[l][1] = append(run.cpu[l][0], sc.hub), append(run.cpu[l][1], cc.hub)
			run.cpu[l][2], run.cpu[l][3] = append(run.cpu[l][2], cc.standbys), append(run.cpu[l][3], ac.hub)
			for i, r := range []float64{cp / sp, cl / sl, cg / sg, ap / sp, al / sl, ag / sg} {
				run.ratios[l][i] = append(run.ratios[l][i], r)
			}
			run.cluster[l], run.single[l] = append(run.cluster[l], cp), append(run.single[l], sp)

			for k, sl := range steadyLoads {
				load, _ = os.ReadFile("/proc/loadavg")
				ss := steadyAt(sl, single, singleProc.Pid(), nil)
				var cs, as steadyState
				if round%2 == 0 {
					cs = steadyAt(sl, lAll.Addr, pAll.proc.Pid(), standbysOf(all, pAll))
					as = steadyAt(sl, lAsync.Addr, pAsync.proc.Pid(), standbysOf(async, pAsync))
				} else {
					as = steadyAt(sl, lAsync.Addr, pAsync.proc.Pid(), standbysOf(async, pAsync))
					cs = steadyAt(sl, lAll.Addr, pAll.proc.Pid(), standbysOf(all, pAll))
				}
				pushed := func(c steadyState, ratio bool) string { // nothing for a load without pushers
					switch {
					case sl.pushers == 0:
						return ""
					case !ratio:
						return fmt.Sprintf(" %.1f pushes/s", c.pushes)
					}
					return fmt.Sprintf(" %.1f pushes/s (%.2fx)", c.pushes, c.pushes/ss.pushes)
				}
				t.Logf("round %d, %s, steady state (%s), load %s: single hub %.1f grads applied/s%s %.1f pulls/s (CPUs busy: hub %.2f, load clients %.2f); acks all: %.1f grads/s (%.2fx)%s %.1f pulls/s (%.2fx) (primary %.2f, standbys %.2f, load clients %.2f); %s: %.1f grads/s (%.2fx)%s %.1f pulls/s (%.2fx) (primary %.2f, standbys %.2f, load clients %.2f)",
					round+1, l, sl.name, strings.Join(strings.Fields(string(load))[:3], " "), ss.grads, pushed(ss, false), ss.pulls, ss.hubCPU, ss.clientsCPU,
					cs.grads, cs.grads/ss.grads, pushed(cs, true), cs.pulls, cs.pulls/ss.pulls, cs.hubCPU, cs.standbysCPU, cs.clientsCPU,
					second, as.grads, as.grads/ss.grads, pushed(as, true), as.pulls, as.pulls/ss.pulls, as.hubCPU, as.standbysCPU, as.clientsCPU)
				if ss.grads == 0 || ss.pulls == 0 || (sl.pushers > 0 && ss.pushes == 0) {
					// Seen on this shared machine: the single hub's pushes and
					// gradients stalled for a whole window while its pulls went
					// on; a ratio to nothing says nothing.
					t.Logf("round %d, %s, %s: the single hub completed nothing of a kind in the window; its steady ratios are left out", round+1, l, sl.name)
					continue
				}
				pushes := func(c steadyState) float64 { // a load without pushers: no ratio (NaN, not 0/0 taken for a figure)
					if sl.pushers == 0 {
						return math.NaN()
					}
					return c.pushes / ss.pushes
				}
				for i, r := range []float64{cs.grads / ss.grads, pushes(cs), cs.pulls / ss.pulls, as.grads / ss.grads, pushes(as), as.pulls / ss.pulls} {
					run.steady[l][k][i] = append(run.steady[l][k][i], r)
				}
				run.steadyCluster[l][k], run.steadySingle[l][k] = append(run.steadyCluster[l][k], cs.grads), append(run.steadySingle[l][k], ss.grads)
			}
		}
	}
	return run
}

func startEtcd(t testing.TB) string {
	t.Helper()
	return clustertest.Start(t).Endpoint
}

// startPlainHubProc runs `rlhub serve` without a cluster.
func startPlainHubProc(t testing.TB, extra ...string) *testkit.Proc {
	t.Helper()
	addrFile := filepath.Join(t.TempDir(), "addr")
	return testkit.StartProc(t, testkit.ProcConfig{Name: "plain hub", AddrFile: addrFile,
		Args: append([]string{"--log-level", "warn", "serve", "--listen", "127.0.0.1:0", "--data", t.TempDir(), "--addr-file", addrFile}, extra...)})
}

// cpuSet is a set of CPU numbers, as taskset -c lists them.
type cpuSet []int

func (s cpuSet) String() string {
	var parts []string
	for _, c := range s {
		parts = append(parts, strconv.Itoa(c))
	}
	return strings.Join(parts, ",")
}

func (s cpuSet) unix() *unix.CPUSet {
	var set unix.CPUSet
	for _, c := range s {
		set.Set(c)
	}
	return &set
}

// ownCPUs is the CPUs this process may run on.
func ownCPUs() (cpuSet, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, err
	}
	var out cpuSet
	for c := range 1024 {
		if set.IsSet(c) {
			out = append(out, c)
		}
	}
	return out, nil
}

// pin restricts every thread of process pid (this process too: pid
// os.Getpid()) to set, as `taskset -a -p -c SET PID` does. A thread a
// pinned thread starts inherits its set, so once every thread is pinned
// the process stays pinned; the threads are listed again until no new one
// appeared during a pass.
func pin(pid int, set cpuSet) error {
	mask := set.unix()
	done := map[int]bool{}
	for pass := 0; pass < 10; pass++ {
		tids, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
		if err != nil {
			return fmt.Errorf("pin %d: %w", pid, err)
		}
		fresh := false
		for _, d := range tids {
			tid, err := strconv.Atoi(d.Name())
			if err != nil || done[tid] {
				continue
			}
			if err := unix.SchedSetaffinity(tid, mask); err != nil && err != unix.ESRCH {
				return fmt.Errorf("pin %d thread %d to %s: %w", pid, tid, set, err)
			}
			done[tid], fresh = true, true
		}
		if !fresh {
			return nil
		}
	}
	return nil
}

// childrenNamed lists this process's children whose command is name (the
// etcd a test started, say).
func childrenNamed(name string) []int {
	ents, _ := os.ReadDir("/proc")
	self := os.Getpid()
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …; comm may hold spaces and parentheses.
		s := string(b)
		open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || close < open {
			continue
		}
		fields := strings.Fields(s[close+1:])
		if len(fields) < 2 || s[open+1:close] != name {
			continue
		}
		if ppid, _ := strconv.Atoi(fields[1]); ppid == self {
			out = append(out, pid)
		}
	}
	slices.Sort(out)
	return out
}
