package wire

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// BenchmarkSend measures what sending a state dict costs on the real path:
// Plan → Chunks → grpc-go client stream on 127.0.0.1 → Assembler → Finish
// (decode), against a plain TCP transfer of the same bytes from tensor
// memory into a preallocated buffer. The machine is shared and its load
// swings, so every iteration does one TCP transfer and one gRPC transfer
// back to back and times each. Reported per size and gRPC variant:
//
//	GB/s         blob bytes per second through gRPC
//	tcpGB/s      the same through plain TCP, interleaved
//	x_tcp        GB/s over tcpGB/s
//	allocB/B     bytes allocated (sender and receiver are one process) per
//	             blob byte and transfer: 1.0 is the receiver's one buffer;
//	             each further 1.0 is a copy-sized allocation (docs/wire.md)
//
// ns/op covers both transfers. Go's MB/s column is not reported (it would
// mix the two).
//
//	GOEXPERIMENT=simd go test -run '^$' -bench BenchmarkSend ./internal/wire/

// blobService is a test-only client-streaming method carrying the transfer
// shape of tensor.proto: one BlobInfo, then Chunks; it answers a BlobInfo
// with the size it assembled.
var blobService = grpc.ServiceDesc{
	ServiceName: "rlhub.test.Blob",
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    "Upload",
		ClientStreams: true,
		Handler: func(_ any, stream grpc.ServerStream) error {
			info := new(rlhubv1.BlobInfo)
			if err := stream.RecvMsg(info); err != nil {
				return err
			}
			a, err := NewAssembler(info.TotalBytes, Limits{MaxBytes: 1 << 30})
			if err != nil {
				return grpcerr.ToStatus(err)
			}
			c := new(rlhubv1.Chunk)
			for {
				err := stream.RecvMsg(c)
				if err == io.EOF {
					break
				}
				if err != nil {
					return err
				}
				if err := a.Write(c.Data); err != nil {
					return grpcerr.ToStatus(err)
				}
			}
			f, blob, err := a.Finish()
			if err != nil {
				return grpcerr.ToStatus(err)
			}
			return stream.SendMsg(&rlhubv1.BlobInfo{TotalBytes: uint64(len(blob)), Version: uint64(f.Tensors.Len())})
		},
	}},
}

// benchDict is an MLP-like state dict of about size bytes: 8 layers of an
// [h,h] F32 weight and an [h] bias.
func benchDict(size int) *tensor.StateDict {
	h := int64(1)
	for 8*4*(h+1)*(h+1) <= int64(size) {
		h++
	}
	sd := &tensor.StateDict{}
	for i := range 8 {
		w, b := tensor.NewF32(fmt.Sprintf("layers.%d.weight", i), h, h), tensor.NewF32(fmt.Sprintf("layers.%d.bias", i), h)
		for j := range w.Data {
			w.Data[j] = byte(j)
		}
		_ = sd.Add(w)
		_ = sd.Add(b)
	}
	return sd
}

func BenchmarkSend(b *testing.B) {
	for _, sz := range []struct {
		name  string
		bytes int
	}{{"16MiB", 16 << 20}, {"256MiB", 256 << 20}} {
		l, err := safetensors.Plan(benchDict(sz.bytes), nil)
		if err != nil {
			b.Fatal(err)
		}
		for _, v := range []struct {
			name string
			srv  []grpc.ServerOption
			dial []grpc.DialOption
		}{
			{"grpc-stream", nil, nil},
			// Without the transport's 32 KiB read/write buffers (copies S2
			// and R2 in docs/wire.md), at the cost of more syscalls.
			{"grpc-stream-unbuffered",
				[]grpc.ServerOption{grpc.ReadBufferSize(0), grpc.WriteBufferSize(0)},
				[]grpc.DialOption{grpc.WithReadBufferSize(0), grpc.WithWriteBufferSize(0)}},
		} {
			b.Run(fmt.Sprintf("size=%s/%s", sz.name, v.name), func(b *testing.B) {
				tcp := startTCPPeer(b, l)
				defer tcp.stop()
				g := startGRPCPeer(b, l, v.srv, v.dial)
				defer g.stop()
				if err := g.send(); err != nil { // warm the connection up
					b.Fatal(err)
				}
				var tTCP, tGRPC time.Duration
				var alloc uint64
				var ms0, ms1 runtime.MemStats
				for b.Loop() {
					t0 := time.Now()
					if err := tcp.send(); err != nil {
						b.Fatal(err)
					}
					t1 := time.Now()
					runtime.ReadMemStats(&ms0)
					t2 := time.Now()
					if err := g.send(); err != nil {
						b.Fatal(err)
					}
					t3 := time.Now()
					runtime.ReadMemStats(&ms1)
					tTCP += t1.Sub(t0)
					tGRPC += t3.Sub(t2)
					alloc += ms1.TotalAlloc - ms0.TotalAlloc
				}
				per := func(d time.Duration) float64 {
					return float64(l.Size) * float64(b.N) / d.Seconds() / 1e9
				}
				b.ReportMetric(per(tGRPC), "GB/s")
				b.ReportMetric(per(tTCP), "tcpGB/s")
				b.ReportMetric(per(tGRPC)/per(tTCP), "x_tcp")
				b.ReportMetric(float64(alloc)/float64(b.N)/float64(l.Size), "allocB/B")
			})
		}
	}
}

// peer is one side of a benchmark transfer: send moves the layout once and
// waits for the receiver's acknowledgement; stop ends every goroutine the
// peer started and waits for them.
type peer struct {
	send func() error
	stop func()
}

// startTCPPeer: the sender writes the layout straight from tensor memory
// (Layout.WriteTo) after an 8-byte length; the receiver reads it into one
// preallocated buffer and acknowledges with one byte. No user-space copy on
// either side.
func startTCPPeer(b *testing.B, l *safetensors.Layout) peer {
	ln := testkit.Listen(b)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		buf := tensor.AlignedBytes(int(l.Size))
		var hdr [8]byte
		for {
			if _, err := io.ReadFull(conn, hdr[:]); err != nil {
				return
			}
			n := binary.LittleEndian.Uint64(hdr[:])
			if n > uint64(len(buf)) {
				return
			}
			if _, err := io.ReadFull(conn, buf[:n]); err != nil {
				return
			}
			if _, err := conn.Write([]byte{1}); err != nil {
				return
			}
		}
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		ln.Close()
		wg.Wait()
		b.Fatal(err)
	}
	var hdr, ack [8]byte
	binary.LittleEndian.PutUint64(hdr[:], uint64(l.Size))
	return peer{
		send: func() error {
			if _, err := conn.Write(hdr[:]); err != nil {
				return err
			}
			if _, err := l.WriteTo(conn); err != nil {
				return err
			}
			_, err := io.ReadFull(conn, ack[:1])
			return err
		},
		stop: func() { conn.Close(); ln.Close(); wg.Wait() },
	}
}

func startGRPCPeer(b *testing.B, l *safetensors.Layout, srvOpts []grpc.ServerOption, dialOpts []grpc.DialOption) peer {
	// The server stops at b's cleanup.
	addr := testkit.ServeGRPC(b, nil, func(s *grpc.Server) { s.RegisterService(&blobService, struct{}{}) }, srvOpts...)
	conn, err := grpc.NewClient(addr, append(dialOpts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		b.Fatal(err)
	}
	send := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cs, err := conn.NewStream(ctx, &blobService.Streams[0], "/rlhub.test.Blob/Upload")
		if err != nil {
			return err
		}
		if err := cs.SendMsg(&rlhubv1.BlobInfo{Model: "bench", TotalBytes: uint64(l.Size), ChunkBytes: DefaultChunkBytes}); err != nil {
			return err
		}
		msg := new(rlhubv1.Chunk)
		if err := Chunks(l, DefaultChunkBytes, func(c []byte) error {
			msg.Data = c // SendMsg has marshalled msg when it returns
			return cs.SendMsg(msg)
		}); err != nil {
			return err
		}
		if err := cs.CloseSend(); err != nil {
			return err
		}
		reply := new(rlhubv1.BlobInfo)
		if err := cs.RecvMsg(reply); err != nil {
			return grpcerr.FromStatus(err)
		}
		if reply.TotalBytes != uint64(l.Size) || reply.Version != uint64(len(l.Order)) {
			return fmt.Errorf("server assembled %d bytes / %d tensors, sent %d / %d", reply.TotalBytes, reply.Version, l.Size, len(l.Order))
		}
		return nil
	}
	return peer{send: send, stop: func() { conn.Close() }}
}
