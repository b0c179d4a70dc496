package hub

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
)

// BenchmarkSecurityCost measures what TLS and token checks cost, against
// plaintext in the same run: mode=plain (no TLS, no tokens), tls (TLS, no
// tokens), tls+token (TLS and a token checked on every call and data-plane
// request), mtls+token (client certificates too). op=grads: 2 Go reducer
// clients push 1M-parameter (4 MiB) float32 gradients back to back on the
// data plane to the hub's secondary (batch 2), which forwards to the
// primary (SGD step, publish); reported grads_applied/s (one op = one
// gradient pushed; the clock stops when every one is applied). op=pull:
// one Go store client pulls a 4M-parameter (16 MiB) model over gRPC;
// MB/s. Also cpu_ms/op: the process's CPU time (clients and hub together)
// per op, the figure to compare on a loaded machine. Everything shares
// this process and its cores.
//
//	go test ./internal/hub -run '^$' -bench SecurityCost -benchtime 200x -count 3
func BenchmarkSecurityCost(b *testing.B) {
	for _, op := range []string{"grads", "pull"} {
		for _, mode := range []string{"plain", "tls", "tls+token", "mtls+token"} {
			b.Run(fmt.Sprintf("op=%s/mode=%s", op, mode), func(b *testing.B) { benchSecurity(b, op, mode) })
		}
	}
}

func benchSecurity(b *testing.B, op, mode string) {
	pk := newPKI(b)
	var applied atomic.Int64
	cfg := Config{Listen: "127.0.0.1:0", Logger: testkit.Logger(), Reducer: reducer.Config{BatchSize: 2, MaxWait: time.Millisecond, MaxQueue: 8,
		OnApply: func(_ string, _ uint64, members []reduce.ID, _ []float32) { applied.Add(int64(len(members))) }}}
	files := dial.Files{}
	if mode != "plain" {
		clientCA := ""
		if mode == "mtls+token" {
			clientCA = pk.path("ca.pem")
			files.Cert, files.Key = pk.path("client.pem"), pk.path("client-key.pem")
		}
		tc, err := dial.ServerTLS(pk.path("server.pem"), pk.path("server-key.pem"), clientCA)
		if err != nil {
			b.Fatal(err)
		}
		cfg.TLS = tc
		files.CA = pk.path("ca.pem")
	}
	if mode == "tls+token" || mode == "mtls+token" {
		tok, hash, err := auth.NewToken()
		if err != nil {
			b.Fatal(err)
		}
		cfg.Auth = auth.NewVerifier(map[string]auth.Principal{hash: {Name: "bench", Role: auth.Admin, Scopes: []string{"bench/"}}})
		files.Token = tok
	}
	dc, err := files.Load()
	if err != nil {
		b.Fatal(err)
	}
	h, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := h.Start(); err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	addr := h.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	params := 1 << 20
	if op == "pull" {
		params = 4 << 20
	}
	model := benchStateDict(params)
	blob, _ := safetensors.Encode(model, nil)
	if _, err := h.Store().Push(ctx, store.PushRequest{Name: "bench/m", Version: 1, Blob: blob}); err != nil {
		b.Fatal(err)
	}

	if op == "pull" {
		sc, err := storerpc.NewClient(storerpc.ClientConfig{Addr: addr, Dial: dc})
		if err != nil {
			b.Fatal(err)
		}
		defer sc.Close()
		if _, err := sc.Get(ctx, "bench/m", 0); err != nil { // warm up
			b.Fatal(err)
		}
		b.SetBytes(int64(len(blob)))
		b.ResetTimer()
		cpu0 := procCPU()
		for range b.N {
			if _, err := sc.Get(ctx, "bench/m", 0); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64((procCPU()-cpu0).Microseconds())/1e3/float64(b.N), "cpu_ms/op")
		return
	}

	admin, err := reducer.NewClient(reducer.ClientConfig{Hub: addr, Dial: dc, ClientID: "admin"})
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close()
	if _, _, err := admin.Register(ctx, reducer.ModelConfig{Model: "bench/m", Optimizer: optim.Config{Kind: optim.SGD, LR: 1e-6}, Reduction: reduce.Mean}); err != nil {
		b.Fatal(err)
	}
	const clients = 2
	cls := make([]*reducer.Client, clients)
	for i := range cls {
		if cls[i], err = reducer.NewClient(reducer.ClientConfig{Hub: addr, Dial: dc, ClientID: fmt.Sprintf("c%d", i)}); err != nil {
			b.Fatal(err)
		}
		defer cls[i].Close()
		if _, err := cls[i].PushGrad(ctx, "bench/m", 0, model); err != nil { // warm up the connection
			b.Fatal(err)
		}
	}
	testkit.Eventually(b, time.Minute, "warm-up gradients applied", func() bool { return applied.Load() == clients })
	applied.Store(0)
	b.SetBytes(model.ByteSize())
	b.ResetTimer()
	start, cpu0 := time.Now(), procCPU()
	var next atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, clients)
	for i := range cls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				if _, err := cls[i].PushGrad(ctx, "bench/m", 0, model); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	testkit.Eventually(b, time.Minute, "every gradient applied", func() bool { return applied.Load() >= int64(b.N) })
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "grads_applied/s")
	b.ReportMetric(float64((procCPU()-cpu0).Microseconds())/1e3/float64(b.N), "cpu_ms/op")
}

// procCPU is the process's user + system CPU time so far.
func procCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchStateDict is a float32 model of n parameters in 2 tensors.
func benchStateDict(n int) *tensor.StateDict {
	sd, _ := tensor.NewStateDict(tensor.NewF32("l1.weight", int64(n/2/256), 256), tensor.NewF32("l2.weight", int64(n/2/256), 256))
	for i, t := range sd.Tensors() {
		f, _ := t.Float32s()
		for j := range f {
			f[j] = 0.001 * float32((i+j)%97)
		}
	}
	return sd
}
