package cli

import (
	"context"
	"fmt"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wsync/shm"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/hub/hubtest"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/wsync"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

func TestSyncStatusAndRelay(t *testing.T) {
	h := hubtest.Start(t, hub.Config{Logger: testkit.Logger()})
	addr := h.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	push := func(v uint64) {
		t.Helper()
		if _, err := h.Store().Push(ctx, store.PushRequest{Name: "m", Version: v, Expect: store.ExpectAny, Blob: storetest.Blob(t, v, 1000)}); err != nil {
			t.Fatal(err)
		}
	}
	push(1)

	// A relay on this host, via the CLI.
	relayAddr := freeAddr(t)
	seg := filepath.Join(t.TempDir(), "seg")
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		seg = fmt.Sprintf("/dev/shm/rlhub-cli-test-%d", os.Getpid())
	}
	rctx, rcancel := context.WithCancel(ctx)
	relayDone := make(chan int, 1)
	go func() {
		code, _, _ := run(t, rctx, "relay", "--upstream", addr, "--model", "m", "--id", "relay-a", "--listen", relayAddr, "--shm", seg, "--shm-slots", "3")
		relayDone <- code
	}()
	conn, err := grpc.NewClient(relayAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var cl *wsync.Client
	testkit.Eventually(t, 30*time.Second, "a collector to attach to the relay", func() bool {
		cl, err = wsync.Attach(ctx, wsync.ClientConfig{Conn: conn, CollectorID: "local-1", Model: "m"})
		return err == nil
	})
	snap, err := cl.WaitNewer(ctx, 0)
	if err != nil || snap.Version != 1 {
		t.Fatalf("via relay: %v, %v", snap, err)
	}
	cl.Close()
	// --shm-slots 3: one collector may lease and read in place. The relay
	// publishes to its stream's board before its segment, so the segment
	// can still be missing, or empty, just after a stream collector got v1.
	var rs *shm.Reader
	testkit.Eventually(t, 30*time.Second, "the relay's segment to open", func() bool {
		rs, err = shm.Open(shm.ReaderConfig{Path: seg, Lease: true})
		return err == nil
	})
	s, err := rs.WaitNewer(ctx, 0)
	if err != nil || s.Version != 1 {
		t.Fatalf("relay's segment holds %v, %v; want v1", s, err)
	}
	if !rs.Leasing() || rs.Stats().InPlace != 1 {
		t.Fatalf("a leasing reader of a 3-slot segment: leasing %v, stats %+v", rs.Leasing(), rs.Stats())
	}
	rs.Close()

	// A collector on another transport reports v1; the hub moves to v3.
	hc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	if err := wsync.Report(ctx, hc, &rlhubv1.CollectorReport{CollectorId: "shm-7", Model: "m", Version: 1, Via: "shm"}); err != nil {
		t.Fatal(err)
	}
	push(2)
	push(3)
	row := func(out, id string) []string {
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) > 0 && f[0] == id {
				return f
			}
		}
		return nil
	}
	var out string
	testkit.Eventually(t, 30*time.Second, "the relay to report v3 in sync status", func() bool {
		code, o, errOut := run(t, ctx, "sync", "status", "--hub", addr)
		if code != 0 {
			t.Fatalf("sync status: code %d, %s", code, errOut)
		}
		out = o
		f := row(out, "relay-a")
		return len(f) >= 2 && f[1] == "3"
	})
	for _, want := range []string{"model m: newest v3", "lag histogram: ≤0:"} {
		if !strings.Contains(out, want) {
			t.Errorf("sync status output lacks %q:\n%s", want, out)
		}
	}
	if f := row(out, "shm-7"); strings.Join(f[:4], " ") != "shm-7 1 2 shm" {
		t.Errorf("shm-7 row %q, want version 1, lag 2, via shm:\n%s", f, out)
	}
	t.Logf("sync status:\n%s", out)
	rcancel()
	if code := <-relayDone; code != 0 {
		t.Fatalf("relay exited %d", code)
	}
	if _, err := os.Stat(seg); !os.IsNotExist(err) {
		t.Fatalf("relay left its segment: %v", err)
	}
	if code, _, errOut := run(t, ctx, "relay", "--model", "m"); code == 0 || !strings.Contains(errOut, "upstream") {
		t.Fatalf("relay without --upstream: code %d, %q", code, errOut)
	}
}
