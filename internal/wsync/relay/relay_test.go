//go:build linux

package relay

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/wsync"
	"github.com/rlhub/rlhub/internal/wsync/shm"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
)

func TestRelayServesLocalCollectorsAndFallsBackWhenItDies(t *testing.T) {
	h := startHub(t)
	h.push(t, 1, 1000)
	path := wsynctest.ShmPath(t)
	// 3 slots: one lease entry, for leaseC.
	relay, err := New(Config{Upstream: dial(t, h.addr), Model: "m", ID: "relay-1", ShmPath: path, ShmSlots: 3, ReportEvery: 10 * time.Millisecond, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	relayErr := make(chan error, 1)
	go func() { defer wg.Done(); relayErr <- relay.Run(ctx) }()
	defer func() { cancel(); wg.Wait() }()
	waitFor(t, "relay at v1", func() bool { s := relay.Board().Newest(); return s != nil && s.Version == 1 })
	// The board gets a version before the segment does: a collector
	// started in between would find no segment and rightly take the
	// upstream, which is not what this test starts with.
	waitSegment(t, path, 1)

	relayConn, upConn := dial(t, relay.Addr()), dial(t, h.addr)
	shmC := startFailoverCollector(t,
		wsync.ShmCopyDialer("relay-shm", path, "m"),
		wsync.PushDialer("upstream", upConn, "shm-collector", "m"))
	streamC := startFailoverCollector(t,
		wsync.PushDialer("relay-stream", relayConn, "stream-collector", "m"),
		wsync.PushDialer("upstream", upConn, "stream-collector", "m"))
	// The leasing collector counts the versions it got in place: views of
	// the segment its current reader maps.
	var leaseReader atomic.Pointer[shm.Reader]
	leasing := wsync.ShmReaderDialer("relay-shm", shm.ReaderConfig{Path: path, Lease: true})
	var leased atomic.Uint64
	leaseC := startFailoverCollectorApply(t, func(s *store.Snapshot) error {
		if r := leaseReader.Load(); r != nil && r.InMapping(s.Blob) {
			leased.Add(1)
		}
		return wsynctest.Check(s)
	}, wsync.Dialer{Name: "relay-shm", Dial: func(ctx context.Context, have uint64) (wsync.Source, io.Closer, error) {
		src, closer, err := leasing.Dial(ctx, have)
		if err == nil {
			leaseReader.Store(src.(*shm.Reader))
		}
		return src, closer, err
	}}, wsync.PushDialer("upstream", upConn, "lease-collector", "m"))
	all := []*failoverCollector{shmC, streamC, leaseC}
	for _, c := range all {
		waitFor(t, "collectors at v1 via the relay", func() bool { return c.recv.Version() == 1 })
	}
	if shmC.f.Current() != "relay-shm" || streamC.f.Current() != "relay-stream" || leaseC.f.Current() != "relay-shm" {
		t.Fatalf("sources: %q, %q, %q; want the relay's", shmC.f.Current(), streamC.f.Current(), leaseC.f.Current())
	}

	h.push(t, 2, 1000)
	for _, c := range all {
		waitFor(t, "collectors at v2 via the relay", func() bool { return c.recv.Version() == 2 })
	}
	// Upstream holds one stream for the host (the relay's) and sees the
	// relay's collectors through forwarded reports.
	waitFor(t, "forwarded report", func() bool {
		st := h.svc.Lag(ctx, "m")
		if len(st) != 1 {
			return false
		}
		attached, forwarded := 0, false
		for _, c := range st[0].Collectors {
			if c.Attached {
				attached++
				if c.ID != "relay-1" {
					t.Fatalf("collector %q attached upstream directly", c.ID)
				}
			}
			if c.ID == "stream-collector" && c.Version == 2 && c.Via == "relay/push" {
				forwarded = true
			}
		}
		return attached == 1 && forwarded
	})

	// A version that outgrows the relay's segment: the relay replaces the
	// segment; its shm collector re-opens it (or takes the relay's stream)
	// and stays on the relay.
	h.push(t, 3, 8000)
	for _, c := range all {
		waitFor(t, "collectors at the bigger v3 via the relay", func() bool { return c.recv.Version() == 3 })
		if cur := c.f.Current(); cur == "upstream" {
			t.Fatalf("a segment resize sent a collector to the upstream")
		}
	}

	// The relay dies: every collector falls back to the upstream and gets
	// the next version from there.
	cancel()
	if err := <-relayErr; err != nil {
		t.Fatalf("relay Run: %v", err)
	}
	if n := leased.Load(); n == 0 {
		t.Fatal("the leasing collector never got a version in place from the relay's segment")
	}
	h.push(t, 4, 1000)
	for _, c := range all {
		waitFor(t, "collectors at v4 via the upstream", func() bool { return c.recv.Version() == 4 })
		if c.f.Current() != "upstream" {
			t.Fatalf("after relay death the source is %q, want upstream", c.f.Current())
		}
	}
}

// runRelayChild is the relay process of TestRelayProcessKilled: it prints
// its address and relays until it is killed (or a minute passes).
func runRelayChild() int {
	conn, err := grpc.NewClient(os.Getenv("RLHUB_WSYNC_UPSTREAM"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay child:", err)
		return 1
	}
	r, err := New(Config{Upstream: conn, Model: "m", ID: "relay-proc", ShmPath: os.Getenv("RLHUB_WSYNC_SHM"), Logger: quiet()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay child:", err)
		return 1
	}
	fmt.Println("addr", r.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r.Run(ctx)
	return 0
}

// startRelayProc runs a relay of upstream's model "m" in a child process
// publishing to the segment at path, and waits until the segment holds
// version v. kill SIGKILLs and reaps it (once; also at cleanup).
func startRelayProc(t *testing.T, upstream, path string, v uint64) (addr string, kill func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=relay", "RLHUB_WSYNC_UPSTREAM="+upstream, "RLHUB_WSYNC_SHM="+path)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	kill = func() {
		if !killed {
			killed = true
			cmd.Process.Kill()
			cmd.Wait() // reaped: its pid no longer exists
		}
	}
	t.Cleanup(kill)
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "addr ") {
		kill()
		t.Fatalf("relay process: %q %v", sc.Text(), sc.Err())
	}
	waitFor(t, "relay segment", func() bool {
		r, err := shm.Open(shm.ReaderConfig{Path: path})
		if err != nil {
			return false
		}
		defer r.Close()
		return r.Published() >= v
	})
	return strings.TrimPrefix(sc.Text(), "addr "), kill
}

// The relay is a separate process killed with SIGKILL: it cannot close its
// segment or say goodbye. Its collectors notice (stream reset, writer pid
// gone) and fall back to the upstream.
func TestRelayProcessKilled(t *testing.T) {
	h := startHub(t)
	h.push(t, 1, 1000)
	path := wsynctest.ShmPath(t)
	relayAddr, kill := startRelayProc(t, h.addr, path, 1)

	upConn := dial(t, h.addr)
	shmC := startFailoverCollector(t, wsync.ShmDialer("relay-shm", path, "m"), wsync.PushDialer("upstream", upConn, "shm-collector", "m"))
	streamC := startFailoverCollector(t,
		wsync.PushDialer("relay-stream", dial(t, relayAddr), "stream-collector", "m"),
		wsync.PushDialer("upstream", upConn, "stream-collector", "m"))
	for _, c := range []*failoverCollector{shmC, streamC} {
		waitFor(t, "collectors at v1 via the relay", func() bool { return c.recv.Version() == 1 })
	}
	if shmC.f.Current() != "relay-shm" || streamC.f.Current() != "relay-stream" {
		t.Fatalf("sources: %q, %q; want the relay's", shmC.f.Current(), streamC.f.Current())
	}

	kill()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("a killed relay cannot remove its segment, yet: %v", err)
	}
	h.push(t, 2, 1000)
	for _, c := range []*failoverCollector{shmC, streamC} {
		waitFor(t, "collectors at v2 via the upstream", func() bool { return c.recv.Version() == 2 })
		if c.f.Current() != "upstream" {
			t.Fatalf("after the relay was killed the source is %q, want upstream", c.f.Current())
		}
	}
}

// A relay SIGKILLed and started again (same segment, a new port): its
// collectors, on the upstream meanwhile, go back to it by themselves
// (Failover's probe of its preferred sources) and versions only grow
// throughout.
func TestCollectorsGoBackToARestartedRelay(t *testing.T) {
	h := startHub(t)
	h.push(t, 1, 1000)
	path := wsynctest.ShmPath(t)
	var mu sync.Mutex
	relayAddr, kill := startRelayProc(t, h.addr, path, 1)
	// The stream collector dials whichever address the relay has now, as
	// a collector that looks its host's relay up at each dial does.
	relayStream := wsync.Dialer{Name: "relay-stream", Dial: func(ctx context.Context, have uint64) (wsync.Source, io.Closer, error) {
		mu.Lock()
		addr := relayAddr
		mu.Unlock()
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, nil, err
		}
		src, closer, err := wsync.PushDialer("relay-stream", conn, "stream-collector", "m").Dial(ctx, have)
		if err != nil {
			conn.Close()
			return nil, nil, err
		}
		return src, closerFunc(func() error { closer.Close(); return conn.Close() }), nil
	}}
	upConn := dial(t, h.addr)
	var grew sync.Map // collector → a version that went backwards
	growing := func(name string) wsync.ApplyFunc {
		var last uint64
		return func(s *store.Snapshot) error {
			if s.Version <= last {
				grew.Store(name, fmt.Sprintf("v%d after v%d", s.Version, last))
			}
			last = s.Version
			return wsynctest.Check(s)
		}
	}
	shmC := startFailoverCollectorApply(t, growing("shm"), wsync.ShmDialer("relay-shm", path, "m"), wsync.PushDialer("upstream", upConn, "shm-collector", "m"))
	streamC := startFailoverCollectorApply(t, growing("stream"), relayStream, wsync.PushDialer("upstream", upConn, "stream-collector", "m"))
	cs := []*failoverCollector{shmC, streamC}
	want := []string{"relay-shm", "relay-stream"}
	for i, c := range cs {
		waitFor(t, "collectors at v1 via the relay", func() bool { return c.recv.Version() == 1 && c.f.Current() == want[i] })
	}

	kill()
	h.push(t, 2, 1000)
	for _, c := range cs {
		waitFor(t, "collectors at v2 via the upstream", func() bool { return c.recv.Version() == 2 && c.f.Current() == "upstream" })
	}

	addr, _ := startRelayProc(t, h.addr, path, 2)
	mu.Lock()
	relayAddr = addr
	mu.Unlock()
	for i, c := range cs {
		waitFor(t, want[i]+" collector back on the relay", func() bool { return c.f.Current() == want[i] })
	}
	h.push(t, 3, 1000)
	for i, c := range cs {
		waitFor(t, "collectors at v3 via the relay", func() bool { return c.recv.Version() == 3 })
		if c.f.Current() != want[i] {
			t.Fatalf("the collector took v3 from %q, want %q", c.f.Current(), want[i])
		}
	}
	grew.Range(func(k, v any) bool {
		t.Errorf("%s collector: %s", k, v)
		return true
	})
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }
