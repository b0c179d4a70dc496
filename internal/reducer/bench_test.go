package reducer_test

import (
	"context"
	"fmt"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/hub/hubtest"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
)

// benchModel is a float32 model of about n parameters in 4 tensors.
func benchModel(n int) *tensor.StateDict {
	sd, _ := tensor.NewStateDict(
		tensor.NewF32("l1.weight", int64(n/2/256), 256),
		tensor.NewF32("l1.bias", 256),
		tensor.NewF32("l2.weight", int64(n/2/256), 256),
		tensor.NewF32("l2.bias", 256),
	)
	r := rand.New(rand.NewPCG(1, 1))
	for _, t := range sd.Tensors() {
		f, _ := t.Float32s()
		for i := range f {
			f[i] = 0.01 * float32(r.NormFloat64())
		}
	}
	return sd
}

// BenchmarkPushPull: 2 clients push gradients of a 1M- and a 25M-parameter
// float32 model over loopback gRPC to a secondary, which forwards batches
// of `batch` gradients (or what it has after 1ms) to the primary, which
// steps SGD and publishes each version to the store. The secondary runs in
// the primary's hub (in-hub: forwards are calls) or in a hub of its own
// (own-hub: forwards cross loopback gRPC). Everything shares this process
// and its 2 cores. One op = one gradient pushed. Reported:
// grads_applied/s, MB/s of gradient bytes pushed, push→new-version-visible
// p50/p99 (from the client's call to the store publish that contains the
// gradient), for two client loops: loop=push pushes back to back (the
// pipeline saturated: p50 is mostly queueing, about 2 clients ÷ rate), and
// loop=pushpull pushes the next gradient only once the version holding the
// previous one is visible (the push-pull loop of a learner; wakes on the
// publish hook, i.e. when the store's WaitNewer/Watch would return it);
// loop=learner (1M, in-hub only) then also pulls the newest version over
// gRPC before the next push, as a learner does (MB/s and ratio_vs_tcp
// still count pushed bytes only). Also reported: the process's CPU time
// per gradient (cpu_ms/grad: clients and
// hubs together, the figure to compare when the machine is loaded), its
// page faults per gradient (faults/grad: fresh memory the runtime had
// returned to the OS and hands out again), and a
// plain TCP copy of the same bytes over 2 loopback connections in the same
// run (tcp_MB/s: the median of one copy before and two after the pushes;
// tcp_spread: their max ÷ min; ratio_vs_tcp).
func BenchmarkPushPull(b *testing.B) {
	for _, n := range []int{1 << 20, 25 << 20} {
		for _, batch := range []int{1, 2} {
			for _, remote := range []bool{false, true} {
				topo := "secondary=in-hub"
				if remote {
					topo = "secondary=own-hub"
				}
				for _, loop := range []string{loopPush, loopPushPull, loopLearner} {
					if loop == loopLearner && (remote || n > 1<<20) {
						continue // one learner cell: 1M, secondary in the hub
					}
					b.Run(fmt.Sprintf("params=%dM/batch=%d/%s/loop=%s", n>>20, batch, topo, loop), func(b *testing.B) { benchPushPull(b, n, batch, remote, loop) })
				}
			}
		}
	}
}

// The client loops of BenchmarkPushPull.
const (
	loopPush     = "push"
	loopPushPull = "pushpull"
	loopLearner  = "learner"
)

func benchPushPull(b *testing.B, n, batch int, remote bool, loop string) {
	wait := loop != loopPush
	var mu sync.Mutex
	published := map[reduce.ID]time.Time{}
	visible := sync.NewCond(&mu) // broadcast when published changes
	secondaries := 1
	if remote {
		secondaries = -1
	}
	quiet := testkit.Logger()
	h := hubtest.Start(b, hub.Config{Logger: quiet, Reducer: reducer.Config{Secondaries: secondaries, BatchSize: batch, MaxWait: time.Millisecond, MaxQueue: 8,
		OnApply: func(_ string, _ uint64, members []reduce.ID, _ []float32) {
			now := time.Now()
			mu.Lock()
			for _, id := range members {
				published[id] = now
			}
			visible.Broadcast()
			mu.Unlock()
		}}})
	addr := h.Addr().String()
	model := benchModel(n)
	blob, _ := safetensors.Encode(model, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := h.Store().Push(ctx, store.PushRequest{Name: "bench", Version: 1, Blob: blob}); err != nil {
		b.Fatal(err)
	}
	admin, err := reducer.NewClient(reducer.ClientConfig{Hub: addr, ClientID: "admin"})
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close()
	if _, _, err := admin.Register(ctx, reducer.ModelConfig{Model: "bench", Optimizer: optim.Config{Kind: optim.SGD, LR: 1e-6}, Reduction: reduce.Mean}); err != nil {
		b.Fatal(err)
	}
	if remote {
		// The secondary in a hub of its own: it forwards to the primary
		// over loopback gRPC too. It closes when the benchmark ends.
		hubtest.Start(b, hub.Config{Logger: quiet, Reducer: reducer.Config{Primary: addr, Secondaries: 1, BatchSize: batch, MaxWait: time.Millisecond, MaxQueue: 8}})
	}
	waitSecondaries(b, admin, 1)
	grad := benchModel(n) // the same bytes every push: the reducer does not care
	gradBytes := grad.ByteSize()

	const clients = 2
	pullers := make([]*storerpc.Client, clients)
	if loop == loopLearner {
		for i := range pullers {
			if pullers[i], err = storerpc.NewClient(storerpc.ClientConfig{Addr: addr}); err != nil {
				b.Fatal(err)
			}
			defer pullers[i].Close()
		}
	}
	cls := make([]*reducer.Client, clients)
	for i := range cls {
		cls[i], err = reducer.NewClient(reducer.ClientConfig{Hub: addr, ClientID: fmt.Sprintf("b%d", i)})
		if err != nil {
			b.Fatal(err)
		}
		defer cls[i].Close()
		if _, err := cls[i].PushGrad(ctx, "bench", 0, grad); err != nil { // warm up the connection
			b.Fatal(err)
		}
	}
	waitApplied(b, &mu, published, clients)

	// The TCP baseline is measured once before and twice after the pushes
	// and its median reported, so that a burst of load from elsewhere
	// during one measurement moves the ratio less.
	tcpCount := max(4, min(b.N, 64))
	tcps := []float64{tcpCopyMBps(b, gradBytes, clients, tcpCount)}

	starts := make([]map[reduce.ID]time.Time, clients)
	b.SetBytes(gradBytes)
	b.ResetTimer()
	cpu0, faults0 := reducer.ProcessUsage()
	t0 := time.Now()
	var wg sync.WaitGroup
	for i := range clients {
		starts[i] = map[reduce.ID]time.Time{}
		k := b.N / clients
		if i < b.N%clients {
			k++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range k {
				st := time.Now()
				seq := uint64(1000 + j) // above the warm-up push's seq
				id := reduce.ID{Client: cls[i].ID(), Seq: seq}
				if _, err := cls[i].PushSeq(ctx, "bench", 0, seq, grad); err != nil {
					b.Error(err)
					return
				}
				starts[i][id] = st
				if wait { // the push-pull loop: next push once this one is visible
					mu.Lock()
					for published[id].IsZero() {
						visible.Wait()
					}
					mu.Unlock()
				}
				if loop == loopLearner { // and pull it, as a learner does
					if _, err := pullers[i].Get(ctx, "bench", 0); err != nil {
						b.Error(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	waitApplied(b, &mu, published, clients+b.N)
	elapsed := time.Since(t0)
	cpu1, faults1 := reducer.ProcessUsage()
	cpu, faults := cpu1-cpu0, faults1-faults0
	b.StopTimer()

	var lat []time.Duration
	mu.Lock()
	for i := range starts {
		for id, st := range starts[i] {
			lat = append(lat, published[id].Sub(st))
		}
	}
	mu.Unlock()
	slices.Sort(lat)
	rate := float64(b.N) / elapsed.Seconds()
	mbps := rate * float64(gradBytes) / 1e6
	tcps = append(tcps, tcpCopyMBps(b, gradBytes, clients, tcpCount), tcpCopyMBps(b, gradBytes, clients, tcpCount))
	slices.Sort(tcps)
	tcp := tcps[1]
	if st, err := admin.Stats(ctx, ""); err == nil {
		b.ReportMetric(st.GetPublishP50Us()/1000, "admit_publish_p50_ms")
	}
	b.ReportMetric(rate, "grads_applied/s")
	b.ReportMetric(mbps, "MB/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50_ms")
	b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)].Microseconds())/1000, "p99_ms")
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu_ms/grad")
	b.ReportMetric(float64(faults)/float64(b.N), "faults/grad")
	b.ReportMetric(tcp, "tcp_MB/s")
	b.ReportMetric(tcps[2]/tcps[0], "tcp_spread")
	b.ReportMetric(mbps/tcp, "ratio_vs_tcp")
}

func waitApplied(b *testing.B, mu *sync.Mutex, published map[reduce.ID]time.Time, n int) {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		mu.Lock()
		got := len(published)
		mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d gradients applied", got, n)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// tcpCopyMBps copies `count` blobs of size bytes over each of conns
// loopback TCP connections at once and returns the aggregate MB/s: the
// baseline for moving the same bytes. conns is the number of clients,
// because the clients push concurrently, each over its own connection.
// The writer sends each blob with one Write and the reader lands each blob
// in a buffer of its size (io.ReadFull), as a receiver that keeps the
// bytes must: the plainest fast copy, not one that reads into a small
// scratch buffer and throws it away.
func tcpCopyMBps(b *testing.B, size int64, conns, count int) float64 {
	lis := testkit.Listen(b)
	defer lis.Close()
	buf := make([]byte, size)
	var wg sync.WaitGroup
	accepted := make(chan net.Conn, conns)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range conns {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	var cs []net.Conn
	for range conns {
		c, err := net.Dial("tcp", lis.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		cs = append(cs, c)
	}
	wg.Wait()
	t0 := time.Now()
	for range conns {
		s := <-accepted
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer s.Close()
			dst := make([]byte, size)
			for range count {
				if _, err := io.ReadFull(s, dst); err != nil {
					return
				}
			}
		}()
	}
	for _, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range count {
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
			c.Close()
		}()
	}
	wg.Wait()
	return float64(conns) * float64(count) * float64(size) / 1e6 / time.Since(t0).Seconds()
}
