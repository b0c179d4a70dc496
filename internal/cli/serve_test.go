package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// serveCLI runs `rlhub serve --listen 127.0.0.1:0 --data "" ARGS…` in
// this process (args after serve's own, so they may override --data) and
// returns the address it bound, read from --addr-file: no port is picked
// and freed first. Cleanup stops it (as SIGINT would) and checks it
// exited 0.
func serveCLI(t *testing.T, args ...string) string {
	t.Helper()
	addrFile := filepath.Join(t.TempDir(), "addr")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var errOut string
	go func() {
		code, _, e := run(t, ctx, append([]string{"serve", "--listen", "127.0.0.1:0", "--addr-file", addrFile, "--data", ""}, args...)...)
		errOut = e
		done <- code
	}()
	t.Cleanup(func() {
		cancel()
		if code := testkit.Recv(t, done, 30*time.Second, fmt.Sprintf("serve %v to stop", args)); code != 0 {
			t.Errorf("serve %v exited %d: %s", args, code, errOut)
		}
	})
	var addr string
	testkit.Eventually(t, 30*time.Second, fmt.Sprintf("serve %v to write its address", args), func() bool {
		b, err := os.ReadFile(addrFile)
		addr = strings.TrimSpace(string(b))
		return err == nil && strings.HasSuffix(string(b), "\n")
	})
	return addr
}

// serveInProcess runs serveCLI, waits until the hub answers health checks
// and returns a store client for it.
func serveInProcess(t *testing.T, args ...string) *storerpc.Client {
	t.Helper()
	addr := serveCLI(t, args...)
	if code, _, errOut := run(t, context.Background(), "ping", "--wait", "--hub", addr, "--timeout", "20s"); code != 0 {
		t.Fatalf("serve %v never became healthy: %s", args, errOut)
	}
	c, err := storerpc.NewClient(storerpc.ClientConfig{Addr: addr, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func push(c *storerpc.Client, name string, version uint64, blob []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := c.Push(ctx, store.PushRequest{Name: name, Version: version, Expect: store.ExpectAny, Blob: blob})
	return err
}

// Each store flag of `rlhub serve` reaches the store: a push over a limit
// is refused with the limit's gRPC code, and one within it lands.
func TestServeStoreLimitFlags(t *testing.T) {
	small := storetest.Blob(t, 1, 4)  // well under 1 KiB
	big := storetest.Blob(t, 2, 1024) // 4 KiB of floats
	for _, tc := range []struct {
		flags    []string
		name     string
		blob     []byte
		wantCode codes.Code
		wantErr  error
	}{
		{[]string{"--max-model-bytes", "1KiB"}, "m", big, codes.ResourceExhausted, errs.ErrFull},
		{[]string{"--max-model-bytes", "1KiB"}, "m", small, codes.OK, nil},
		{[]string{"--max-model-bytes", "8192"}, "m", big, codes.OK, nil},
		{[]string{"--max-header-bytes", "8B"}, "m", small, codes.InvalidArgument, errs.ErrInvalid},
		{[]string{"--max-name-bytes", "4"}, "model", small, codes.InvalidArgument, errs.ErrInvalid},
		{[]string{"--max-name-bytes", "4"}, "mode", small, codes.OK, nil},
		{[]string{"--name-pattern", "^[a-z]+$"}, "m1", small, codes.InvalidArgument, errs.ErrInvalid},
		{[]string{"--name-pattern", "^[a-z]+$"}, "policy", small, codes.OK, nil},
	} {
		t.Run(strings.Join(tc.flags, "=")+"/"+tc.name, func(t *testing.T) {
			c := serveInProcess(t, tc.flags...)
			err := push(c, tc.name, 1, tc.blob)
			if got := status.Code(err); got != tc.wantCode {
				t.Fatalf("push of %d bytes as %q: code %v (%v), want %v", len(tc.blob), tc.name, got, err, tc.wantCode)
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("push error %v is not %v", err, tc.wantErr)
			}
		})
	}
}

// --store-retain bounds the versions kept: with 2, the third push drops
// the first.
func TestServeStoreRetainFlag(t *testing.T) {
	c := serveInProcess(t, "--store-retain", "2")
	for v := uint64(1); v <= 3; v++ {
		if err := push(c, "p", v, storetest.Blob(t, v, 4)); err != nil {
			t.Fatalf("push v%d: %v", v, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	infos, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 1 || !slices.Equal(infos[0].Retained, []uint64{2, 3}) {
		t.Fatalf("List = %+v, want model p retaining versions [2 3]", infos)
	}
	if _, err := c.Get(ctx, "p", 1); !errors.Is(err, errs.ErrNotFound) {
		t.Errorf("Get v1 after it fell out of retention: %v, want NotFound", err)
	}
}

func TestServeRejectsBadStoreFlags(t *testing.T) {
	for _, tc := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--max-model-bytes", "1XB"}, "max-model-bytes"},
		{[]string{"--max-model-bytes", "-5"}, "max-model-bytes"},
		{[]string{"--max-header-bytes", "lots"}, "max-header-bytes"},
		{[]string{"--name-pattern", "("}, "--name-pattern"},
		{[]string{"--store-retain", "-1"}, "--store-retain -1: give a positive value"},
		{[]string{"--max-model-bytes", "8"}, "MaxModelBytes"},
	} {
		args := append([]string{"serve", "--listen", "127.0.0.1:0", "--data", ""}, tc.flags...)
		code, _, errOut := run(t, context.Background(), args...)
		if code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("serve %v: code %d, stderr %q; want a failure naming %s", tc.flags, code, errOut, tc.want)
		}
	}
}

// Cluster flags that contradict each other fail before anything starts.
func TestServeRejectsConflictingClusterFlags(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--etcd", "127.0.0.1:1", "--embedded-etcd", filepath.Join(dir, "etcd"), "--cluster", "c"}, "--etcd and --embedded-etcd: give one"},
		{[]string{"--role", "reducer", "--primary", "127.0.0.1:1", "--embedded-etcd", filepath.Join(dir, "etcd")}, "--embedded-etcd needs --role all"},
	} {
		args := append([]string{"serve", "--listen", "127.0.0.1:0", "--data", ""}, tc.flags...)
		code, _, errOut := run(t, context.Background(), args...)
		if code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("serve %v: code %d, stderr %q; want a failure saying %q", tc.flags, code, errOut, tc.want)
		}
		if _, err := os.Stat(filepath.Join(dir, "etcd")); !os.IsNotExist(err) {
			t.Errorf("serve %v started an embedded etcd (its directory: %v)", tc.flags, err)
		}
	}
}

func TestByteSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		str  string
	}{
		{"0", 0, "0"},
		{"1000", 1000, "1000"},
		{"12B", 12, "12"},
		{"64KiB", 64 << 10, "64KiB"},
		{"1536KiB", 1536 << 10, "1536KiB"},
		{"512MiB", 512 << 20, "512MiB"},
		{"4GiB", 4 << 30, "4GiB"},
		{"1048576", 1 << 20, "1MiB"},
	} {
		var b byteSize
		if err := b.Set(tc.in); err != nil || int64(b) != tc.want || b.String() != tc.str {
			t.Errorf("Set(%q) = %d, %v, String %q; want %d, nil, %q", tc.in, int64(b), err, b.String(), tc.want, tc.str)
		}
	}
	for _, in := range []string{"", "KiB", "1.5GiB", "-1", "1TiB", "1 MiB", "9223372036854775807GiB"} {
		var b byteSize
		if err := b.Set(in); err == nil {
			t.Errorf("Set(%q) = %d, want an error", in, int64(b))
		}
	}
}
