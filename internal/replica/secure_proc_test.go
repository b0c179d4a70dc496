package replica_test

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// TestSecureClusterFailsOver runs the deployment docs/cluster.md
// recommends off loopback, as real processes: etcd over TLS with client
// certificates and a user limited to the cluster's keys; two hubs serving
// mutual TLS with token files, the standby following the primary with an
// admin token. A trainer client that finds the primary through etcd (TLS
// and user too) pushes, the primary is SIGKILLed, the standby takes over
// with every acknowledged version, and the same client goes on pushing.
// Without a token, or with a reader's, the new primary refuses.
func TestSecureClusterFailsOver(t *testing.T) {
	bin := testkit.Binary(t)
	dir := t.TempDir()
	cli := func(args ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput(); err != nil {
			t.Fatalf("rlhub %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	cli("cert", "--dir", dir, "--hosts", "127.0.0.1")
	tokens := filepath.Join(dir, "tokens")
	for _, role := range []string{"admin", "trainer", "reader"} {
		cli("token", "new", "--role", role, "--scope", "*", "--out", filepath.Join(dir, role+".token"), "--append", tokens)
	}
	pem := func(name string) string { return filepath.Join(dir, name+".pem") }

	name := "secure"
	e := clustertest.StartSecure(t, name)
	sec := cluster.EtcdSecurity{CACert: e.CACert, Cert: e.ClientCert, Key: e.ClientKey, User: e.User, PasswordFile: e.PasswordFile}
	hubArgs := append(sec.Args(),
		"--tls-cert", pem("server"), "--tls-key", pem("server-key"), "--tls-client-ca", pem("ca"), "--auth-tokens", tokens,
		// Its own dials (a standby's stream from the primary): the CA,
		// and the admin token.
		"--tls-ca", pem("ca"), "--token-file", filepath.Join(dir, "admin.token"))
	// A 3 s lease: renewed every second, each attempt given 750 ms. With
	// 1 s (every 333 ms, 250 ms each) a loaded 2-core machine's etcd,
	// TLS and a user's token to check, missed enough renewals that the
	// primary's lease lapsed between c.leader and the first push (v1
	// landed at a later term). The SIGKILL's failover waits the TTL.
	c := &testCluster{t: t, etcd: e.Endpoint, name: name, leaseTTL: "3s", etcdSec: sec}
	for _, id := range []string{"h0", "h1"} {
		h := &hubProc{t: t, id: id, data: t.TempDir(), args: hubArgs}
		c.hubs = append(c.hubs, h)
		c.start(h)
	}

	// A client's connection as the CLI's flags make it (dial.Files).
	client := func(role string) *storerpc.Client {
		t.Helper()
		files := dial.Files{CA: pem("ca"), Cert: pem("client"), Key: pem("client-key")}
		if role != "" {
			files.TokenFile = filepath.Join(dir, role+".token")
		}
		dc, err := files.Load()
		if err != nil {
			t.Fatal(err)
		}
		dc.Etcd = sec
		cl, err := storerpc.NewClient(storerpc.ClientConfig{Addr: dial.EtcdTarget(e.HostPort(), name),
			Dial:        dc,
			CallTimeout: 30 * time.Second, MaxAttempts: 20, MaxBackoff: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		return cl
	}
	trainer := client("trainer")
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	blobs := map[uint64][]byte{}
	push := func(v uint64) store.Info {
		t.Helper()
		blobs[v] = storetest.Blob(t, v, 1024)
		info, err := trainer.Push(ctx, store.PushRequest{Name: "pol", Version: v, Expect: v - 1, Blob: blobs[v]})
		var se *errs.StaleError
		if errors.As(err, &se) && se.CurrentVersion == v { // landed; its answer was lost to the kill
			return store.Info{Name: "pol", Version: v, Epoch: se.CurrentEpoch}
		}
		if err != nil {
			t.Fatalf("trainer push v%d: %v", v, err)
		}
		return info
	}

	l1, p1 := c.leader(0)
	standby := c.standbys(p1)[0]
	c.synced(standby, l1)
	for v := uint64(1); v <= 3; v++ {
		if info := push(v); info.Epoch != l1.Epoch {
			t.Fatalf("v%d landed at epoch %d, want the primary's %d", v, info.Epoch, l1.Epoch)
		}
	}

	p1.kill()
	l2, p2 := c.leader(l1.Epoch)
	if p2 != standby {
		t.Fatalf("primary after the kill is %s, want the standby %s", p2.id, standby.id)
	}
	if info := push(4); info.Epoch != l2.Epoch {
		t.Fatalf("v4 landed at epoch %d, want the new primary's %d", info.Epoch, l2.Epoch)
	}
	for v := uint64(2); v <= 4; v++ { // the store keeps 3 versions
		snap, err := trainer.Get(ctx, "pol", v)
		if err != nil || !bytes.Equal(snap.Blob, blobs[v]) {
			t.Fatalf("pol v%d from the new primary: %v (%d bytes), want it byte-identical", v, err, blobLen(snap))
		}
	}

	// The new primary checks tokens as the old one did.
	if _, err := client("").Push(ctx, store.PushRequest{Name: "pol", Version: 5, Expect: 4, Blob: blobs[4]}); !errors.Is(err, errs.ErrUnauthenticated) {
		t.Fatalf("push without a token: %v, want Unauthenticated", err)
	}
	if _, err := client("reader").Push(ctx, store.PushRequest{Name: "pol", Version: 5, Expect: 4, Blob: blobs[4]}); !errors.Is(err, errs.ErrPermission) {
		t.Fatalf("push with a reader's token: %v, want PermissionDenied", err)
	}
	// Every key the hubs wrote is under their cluster's prefix (the only
	// keys their etcd user may touch).
	for _, k := range e.Keys(t, "/") {
		if !strings.HasPrefix(k, "/rlhub/"+name+"/") {
			t.Errorf("etcd key %q outside the cluster's prefix", k)
		}
	}
}

func blobLen(s *store.Snapshot) int {
	if s == nil {
		return 0
	}
	return len(s.Blob)
}
