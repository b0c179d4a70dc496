//go:build linux

package wsync_test

import (
	"context"
	"fmt"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wsync/shm"
	"io"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/wsync"
	"github.com/rlhub/rlhub/internal/wsync/relay"
)

// BenchmarkDeliver measures time-to-all-collectors-have-it: from the
// moment a version is published until every collector has applied it (holds
// it whole in its own memory, or by pointer for in-process), for each
// transport, model size and collector count. Right before each
// sub-benchmark the same run measures a memcpy of the model and a plain TCP
// copy of it over loopback (medians), and the sub-benchmark reports its p50
// against both (x-memcpy, %tcp-rate).
//
// Transports: inproc (Board.Publish → receivers adopt the pointer); shm and
// shm-nocrc (shm.Writer.Write into a double buffer: CRC-32C by the writer,
// copying with up to min(GOMAXPROCS, 4) goroutines; readers in goroutines
// copy the slot out into private memory, verifying the CRC (shm) or
// relying on the seqlock, the default (shm-nocrc)); shm-lease (the same
// writer with 2 + n slots, so each of the n readers gets a lease entry;
// readers lease the newest slot and decode it in place, seqlock only, no
// copy: "applied" means the Receiver has adopted the leased snapshot, as
// for inproc); shm-lease-into (the default shm collector, ShmDialer:
// the same leasing readers, each with CopyInto into its own state dict
// and the slot released right after, so "applied" means the version is in
// the collector's own tensors, as gloo's broadcast leaves it in the
// receiver's tensor); shm-copy-into (the copying reader, ShmCopyDialer,
// seqlock only, then CopyInto: the copying reader's path to the
// collector's tensors, two copies per collector); push
// (store.Push on a real hub → WeightSync Attach streams, one connection per
// collector, clients reusing receive buffers as PushDialer's do); push-dp
// (store.Push on a real hub → DataPlaneClients long-polling the hub's
// weight-sync data-plane watch, each version written with writev from the
// store's snapshot once per connection, read into reused buffers);
// storewatch (store.Push → StoreSource over storerpc.Client, the store
// service's watch); relay-shm (store.Push → one relay over gRPC → its
// segment → readers); relay-dp-shm / relay-dp-lease (the relay follows the
// store's data-plane watch, receiving each version straight into its next
// slot; copying / leasing readers); 2relays-dp-lease (two relays, two
// "hosts", each with n/2 leasing readers).
//
//	GOEXPERIMENT=simd go test -run '^$' -bench Deliver -benchtime 20x ./internal/wsync/
func BenchmarkDeliver(b *testing.B) {
	for _, size := range []int{16 << 20, 128 << 20} {
		blob := benchBlob(b, size)
		for _, tr := range []string{"inproc", "shm", "shm-nocrc", "shm-lease", "shm-lease-into", "shm-copy-into", "push", "push-dp", "storewatch", "relay-shm", "relay-dp-shm", "relay-dp-lease", "2relays-dp-lease"} {
			for _, n := range []int{1, 2, 8} {
				b.Run(fmt.Sprintf("%s/%dMiB/%dcollectors", tr, size>>20, n), func(b *testing.B) {
					// Baselines right before, under the same machine load.
					memcpy, tcp, tcpCPU := baselines(b, blob)
					d, pub, cpu := deliver(b, tr, blob, n)
					report(b, d, len(blob), memcpy, tcp)
					// The breakdown: how long publishing took (for shm the
					// writer's copy + CRC + wake-up; for push and storewatch
					// the store's Push) and the rest of each delivery
					// (notification, the collectors' copies, the apply).
					rest := make([]time.Duration, len(d))
					for i := range d {
						rest[i] = d[i] - pub[i]
					}
					b.ReportMetric(float64(median(pub).Microseconds())/1000, "publish-p50-ms")
					b.ReportMetric(float64(median(rest).Microseconds())/1000, "after-publish-p50-ms")
					b.ReportMetric(float64(tcpCPU.Microseconds())/1000, "tcp-cpu-ms")
					// CPU time of this process (both ends) per delivery: the
					// figure the shared machine's load disturbs least.
					b.ReportMetric(float64(cpu.Microseconds())/1000/float64(len(d)), "cpu-ms/op")
				})
			}
		}
	}
}

// benchBlob is a safetensors blob of about size bytes (one F32 tensor).
func benchBlob(b *testing.B, size int) []byte {
	w := tensor.NewF32("w", int64(size/4))
	for i := range w.Data {
		w.Data[i] = byte(i * 7)
	}
	sd, _ := tensor.NewStateDict(w)
	blob, err := safetensors.Encode(sd, nil)
	if err != nil {
		b.Fatal(err)
	}
	return blob
}

// baselines measures, now, the median of a memcpy of blob into warm memory
// and of a plain TCP copy of it over loopback into a warm buffer.
// tcpCPU is both ends' CPU time per TCP copy.
func baselines(b *testing.B, blob []byte) (memcpy, tcp, tcpCPU time.Duration) {
	b.Helper()
	dst := make([]byte, len(blob))
	copy(dst, blob)
	var ms []time.Duration
	for range 7 {
		t0 := time.Now()
		copy(dst, blob)
		ms = append(ms, time.Since(t0))
	}
	lis := testkit.Listen(b)
	defer lis.Close()
	done := make(chan error, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		for range 5 {
			if _, err := c.Write(blob); err != nil {
				done <- err
				return
			}
			var ack [1]byte
			if _, err := io.ReadFull(c, ack[:]); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	c, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	var ts []time.Duration
	cpu0 := cpuTime()
	for range 5 {
		t0 := time.Now()
		if _, err := io.ReadFull(c, dst); err != nil {
			b.Fatal(err)
		}
		ts = append(ts, time.Since(t0))
		c.Write([]byte{1})
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	// The ack round trips are negligible.
	return median(ms), median(ts), (cpuTime() - cpu0) / 5
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func report(b *testing.B, d []time.Duration, size int, memcpy, tcp time.Duration) {
	slices.Sort(d)
	p50 := d[len(d)/2]
	p99 := d[min(len(d)-1, (len(d)*99+99)/100-1)]
	b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(memcpy.Microseconds())/1000, "memcpy-ms")
	b.ReportMetric(float64(tcp.Microseconds())/1000, "tcp-ms")
	b.ReportMetric(float64(p50)/float64(memcpy), "x-memcpy")
	b.ReportMetric(100*float64(tcp)/float64(p50), "%tcp-rate")
	b.ReportMetric(float64(size)/p50.Seconds()/1e9, "GB/s")
}

// fleet is n collectors, each a Receiver following its own Source in a
// goroutine, signalling every applied version.
type fleet struct {
	applied chan uint64
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// applies, when not nil, is each collector's Apply (nil: adopt the
// snapshot).
func startFleet(b *testing.B, sources []wsync.Source, applies []wsync.ApplyFunc) *fleet {
	f := &fleet{applied: make(chan uint64, 16*len(sources))}
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	for i, src := range sources {
		var apply wsync.ApplyFunc
		if applies != nil {
			apply = applies[i]
		}
		r, err := wsync.NewReceiver(wsync.ReceiverConfig{Source: src, Apply: apply, OnApplied: func(v uint64) { f.applied <- v }})
		if err != nil {
			b.Fatal(err)
		}
		f.wg.Add(1)
		go func() { defer f.wg.Done(); r.Run(ctx) }()
	}
	return f
}

// wait blocks until n collectors have applied version v.
func (f *fleet) wait(b *testing.B, n int, v uint64) {
	deadline := time.After(2 * time.Minute)
	for got := 0; got < n; {
		select {
		case av := <-f.applied:
			if av == v {
				got++
			}
		case <-deadline:
			b.Fatalf("collectors did not all get v%d", v)
		}
	}
}

func (f *fleet) stop() {
	f.cancel()
	f.wg.Wait()
}

// deliver runs b.N deliveries over transport tr to n collectors and returns
// each one's time-to-all-have-it, the time its publish call took, and the
// process's CPU time over all of them. Four versions warm every path up
// untimed.
func deliver(b *testing.B, tr string, blob []byte, n int) (d, pub []time.Duration, cpu time.Duration) {
	ctx := context.Background()
	var publish func(v uint64)
	var sources []wsync.Source
	var applies []wsync.ApplyFunc // nil: every collector adopts the snapshot
	var cleanup []func()
	defer func() {
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
	}()
	startHub := func() *hub.Hub {
		h, err := hub.New(hub.Config{Listen: "127.0.0.1:0", Logger: testkit.Logger(), Store: store.Config{MaxModelBytes: 1 << 30}})
		if err != nil {
			b.Fatal(err)
		}
		if err := h.Start(); err != nil {
			b.Fatal(err)
		}
		cleanup = append(cleanup, func() { h.Close() })
		publish = func(v uint64) {
			if _, err := h.Store().Push(ctx, store.PushRequest{Name: "m", Version: v, Expect: store.ExpectAny, Blob: blob}); err != nil {
				b.Fatal(err)
			}
		}
		return h
	}
	dialT := func(addr string) *grpc.ClientConn {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		cleanup = append(cleanup, func() { conn.Close() })
		return conn
	}
	snapOf := func(v uint64) *store.Snapshot {
		f, err := safetensors.Decode(blob)
		if err != nil {
			b.Fatal(err)
		}
		return &store.Snapshot{Name: "m", Version: v, Blob: blob, Tensors: f.Tensors}
	}

	switch tr {
	case "inproc":
		board := wsync.NewBoard("m")
		publish = func(v uint64) { board.Publish(ctx, snapOf(v)) }
		for range n {
			sources = append(sources, board)
		}
	case "shm", "shm-nocrc", "shm-lease", "shm-lease-into", "shm-copy-into":
		path := fmt.Sprintf("/dev/shm/rlhub-wsync-bench-%d", os.Getpid())
		lease := tr == "shm-lease" || tr == "shm-lease-into"
		if strings.HasSuffix(tr, "-into") {
			// Each collector's own weights, faulted in, as a model's are.
			f, err := safetensors.Decode(blob)
			if err != nil {
				b.Fatal(err)
			}
			for range n {
				var ts []*tensor.Tensor
				for _, t := range f.Tensors.Tensors() {
					own := *t
					own.Data = make([]byte, len(t.Data))
					copy(own.Data, t.Data)
					ts = append(ts, &own)
				}
				sd, err := tensor.NewStateDict(ts...)
				if err != nil {
					b.Fatal(err)
				}
				applies = append(applies, wsync.CopyInto(sd))
			}
		}
		slots := 2
		if lease {
			slots = 2 + n // a lease entry per collector
		}
		w, err := shm.Create(shm.Config{Path: path, Name: "m", Capacity: int64(len(blob)), Slots: slots, Replace: true})
		if err != nil {
			b.Fatal(err)
		}
		cleanup = append(cleanup, func() { w.Close() })
		publish = func(v uint64) {
			if err := w.Write(v, 0, blob); err != nil {
				b.Fatal(err)
			}
		}
		for range n {
			r, err := shm.Open(shm.ReaderConfig{Path: path, Verify: tr == "shm", Lease: lease})
			if err != nil {
				b.Fatal(err)
			}
			if r.Leasing() != lease {
				b.Fatalf("reader leasing = %v, want %v", r.Leasing(), lease)
			}
			cleanup = append(cleanup, func() { r.Close() })
			sources = append(sources, r)
		}
	case "push":
		h := startHub()
		for i := range n {
			cl, err := wsync.Attach(ctx, wsync.ClientConfig{Conn: dialT(h.Addr().String()), CollectorID: fmt.Sprint("c", i), Model: "m", ReuseBuffers: true})
			if err != nil {
				b.Fatal(err)
			}
			cleanup = append(cleanup, func() { cl.Close() })
			sources = append(sources, cl)
		}
	case "push-dp":
		h := startHub()
		for i := range n {
			cl, err := wsync.NewDataPlaneClient(wsync.DataPlaneConfig{Addr: h.Addr().String(), CollectorID: fmt.Sprint("c", i), Model: "m", Logger: testkit.Logger()})
			if err != nil {
				b.Fatal(err)
			}
			cleanup = append(cleanup, func() { cl.Close() })
			sources = append(sources, cl)
		}
	case "storewatch":
		h := startHub()
		for range n {
			sc, err := storerpc.NewClient(storerpc.ClientConfig{Conn: dialT(h.Addr().String())})
			if err != nil {
				b.Fatal(err)
			}
			cleanup = append(cleanup, func() { sc.Close() })
			sources = append(sources, wsync.StoreSource{Store: sc, Name: "m"})
		}
	case "relay-shm", "relay-dp-shm", "relay-dp-lease", "2relays-dp-lease":
		// relay-shm: the relay follows the WeightSync push stream (gRPC);
		// relay-dp-*: the store's data-plane watch, cut-through into its
		// segment; *-lease: 2 + k slots and leasing readers; 2relays: two
		// relays (two "hosts"), each serving n/2 collectors.
		h := startHub()
		relays := 1
		if tr == "2relays-dp-lease" {
			relays = 2
		}
		lease := tr == "relay-dp-lease" || tr == "2relays-dp-lease"
		per := max(n/relays, 1)
		for ri := range relays {
			path := fmt.Sprintf("/dev/shm/rlhub-wsync-bench-relay-%d-%d", os.Getpid(), ri)
			cfg := relay.Config{Upstream: dialT(h.Addr().String()), Model: "m", ID: fmt.Sprint("relay-", ri), ShmPath: path, Logger: testkit.Logger()}
			if tr != "relay-shm" {
				cfg.UpstreamAddr = h.Addr().String()
			}
			if lease {
				cfg.ShmSlots = 2 + per
			}
			rl, err := relay.New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() { defer close(done); rl.Run(rctx) }()
			cleanup = append(cleanup, func() { cancel(); <-done })
			if ri == 0 {
				publish(1) // the relay sizes its segment from the first version
			}
			for rl.Newest() == 0 {
				time.Sleep(time.Millisecond)
			}
			for range per {
				var r *shm.Reader
				for r == nil {
					if r, err = shm.Open(shm.ReaderConfig{Path: path, Lease: lease}); err != nil {
						time.Sleep(time.Millisecond)
					}
				}
				if r.Leasing() != lease {
					b.Fatalf("reader leasing = %v, want %v", r.Leasing(), lease)
				}
				cleanup = append(cleanup, func() { r.Close() })
				sources = append(sources, r)
			}
		}
		n = len(sources)
	default:
		b.Fatalf("unknown transport %q", tr)
	}

	f := startFleet(b, sources, applies)
	cleanup = append(cleanup, f.stop)
	v := uint64(0)
	if strings.Contains(tr, "relay") {
		v = 1 // v1 was published to size the segment
	}
	// Untimed warm-up: enough versions that every collector has filled
	// each buffer it alternates between, so allocations per op show the
	// steady state.
	for range 4 {
		v++
		publish(v)
		f.wait(b, n, v)
	}
	d = make([]time.Duration, 0, b.N)
	pub = make([]time.Duration, 0, b.N)
	runtime.GC()
	b.ResetTimer()
	cpu0 := cpuTime()
	for range b.N {
		v++
		t0 := time.Now()
		publish(v)
		t1 := time.Now()
		f.wait(b, n, v)
		d = append(d, time.Since(t0))
		pub = append(pub, t1.Sub(t0))
	}
	cpu = cpuTime() - cpu0
	b.StopTimer()
	return d, pub, cpu
}

// cpuTime is this process's user + system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
