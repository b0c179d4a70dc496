package replica_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// secureTokenCluster starts two clustered hubs with TLS and a token file
// each (polled every 200 ms), as docs/cluster.md's secure deployment.
func secureTokenCluster(t *testing.T) (c *testCluster, dir string, tokenFiles map[string]string) {
	bin := testkit.Binary(t)
	dir = t.TempDir()
	cli := func(args ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput(); err != nil {
			t.Fatalf("rlhub %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	cli("cert", "--dir", dir, "--hosts", "127.0.0.1")
	pem := func(name string) string { return filepath.Join(dir, name+".pem") }
	master := filepath.Join(dir, "tokens")
	cli("token", "new", "--role", "admin", "--scope", "*", "--name", "adm", "--out", filepath.Join(dir, "admin.token"), "--append", master)
	cli("token", "new", "--role", "reader", "--scope", "*", "--name", "rd", "--out", filepath.Join(dir, "reader.token"), "--append", master)
	lines, err := os.ReadFile(master)
	if err != nil {
		t.Fatal(err)
	}
	e := clustertest.Start(t)
	c = &testCluster{t: t, etcd: e.Endpoint, name: "tokens", leaseTTL: "2s"}
	tokenFiles = map[string]string{}
	for _, id := range []string{"h0", "h1"} {
		// Each hub its own token file (one per machine).
		tf := filepath.Join(dir, "tokens-"+id)
		if err := os.WriteFile(tf, lines, 0o600); err != nil {
			t.Fatal(err)
		}
		tokenFiles[id] = tf
		h := &hubProc{t: t, id: id, data: t.TempDir(), args: []string{
			"--tls-cert", pem("server"), "--tls-key", pem("server-key"), "--auth-tokens", tf, "--auth-reload", "200ms",
			"--tls-ca", pem("ca"), "--token-file", filepath.Join(dir, "admin.token")}}
		c.hubs = append(c.hubs, h)
		c.start(h)
	}
	return c, dir, tokenFiles
}

// readerList lists models on addr with the reader's token over TLS.
func readerList(t *testing.T, dir, addr string) error {
	files := dial.Files{CA: filepath.Join(dir, "ca.pem"), TokenFile: filepath.Join(dir, "reader.token")}
	dc, err := files.Load()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := storerpc.NewClient(storerpc.ClientConfig{Addr: addr, Dial: dc, MaxAttempts: 1, CallTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	_, err = cl.List(context.Background())
	return err
}

// A token revoked in a standby's token file (`rlhub token revoke`, the
// documented way) while it is a standby must be refused once that hub is
// elected primary (docs/security.md: serve reloads the token file when it
// changes, polled every --auth-reload). Nothing watched the file while the
// hub was a standby, and the watcher its term started took the changed
// file as the one loaded.
func TestTokenRevokedOnAStandbyIsRefusedAfterItTakesOver(t *testing.T) {
	c, dir, tf := secureTokenCluster(t)
	l1, p1 := c.leader(0)
	standby := c.standbys(p1)[0]
	c.synced(standby, l1)
	if err := readerList(t, dir, standby.addr); err != nil && !errors.Is(err, errs.ErrUnavailable) {
		t.Logf("list on the standby before: %v", err)
	}
	if out, err := exec.Command(testkit.Binary(t), "token", "revoke", "--file", tf[standby.id], "--name", "rd").CombinedOutput(); err != nil {
		t.Fatalf("token revoke: %v\n%s", err, out)
	}
	time.Sleep(2 * time.Second) // ten --auth-reload polls
	p1.kill()
	_, p2 := c.leader(l1.Epoch)
	if p2 != standby {
		t.Fatalf("new primary %s, want %s", p2.id, standby.id)
	}
	time.Sleep(1 * time.Second) // five more polls, as primary
	err := readerList(t, dir, p2.addr)
	if !errors.Is(err, errs.ErrUnauthenticated) {
		t.Fatalf("the reader token revoked in %s's token file 3 s before is still accepted by it as primary: List err = %v (want Unauthenticated)", p2.id, err)
	}
}

// docs/security.md: `kill -HUP $(pgrep -f 'rlhub serve')` reloads a hub's
// tokens; SIGHUP ends only *other* rlhub processes. A clustered serve
// that is a standby must survive it (it had no SIGHUP handler: SIGHUP
// killed every standby of a cluster so signalled).
func TestStandbySurvivesSIGHUP(t *testing.T) {
	c, _, _ := secureTokenCluster(t)
	l1, p1 := c.leader(0)
	standby := c.standbys(p1)[0]
	c.synced(standby, l1)
	standby.signal(syscall.SIGHUP)
	select {
	case <-standby.proc.Done():
		sig, _ := standby.proc.KilledBy()
		t.Fatalf("standby serve %s ended on SIGHUP (killed by %v); its log ends:\n%s", standby.id, sig, tail(standby.out.String(), 3))
	case <-time.After(3 * time.Second):
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// docs/security.md's policy table: /rlhub.v1.Cluster/Replication needs a
// reader token; docs/cluster.md: on a standby only "health,
// Cluster/Primary and the refusals answer every caller". A standby of a
// hub with --auth-tokens used to answer Replication with no token at all.
func TestStandbyReplicationNeedsAToken(t *testing.T) {
	c, dir, _ := secureTokenCluster(t)
	l1, p1 := c.leader(0)
	standby := c.standbys(p1)[0]
	c.synced(standby, l1)
	dc, err := dial.Files{CA: filepath.Join(dir, "ca.pem")}.Load() // TLS, no token
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []*hubProc{p1, standby} {
		conn, err := dc.GRPC(h.addr)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := rlhubv1.NewClusterClient(conn).Replication(ctx, &rlhubv1.ReplicationRequest{})
		cancel()
		conn.Close()
		role := "primary"
		if h == standby {
			role = "standby"
		}
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s %s: Cluster/Replication without a token: %v, err %v; want Unauthenticated", role, h.id, resp, err)
		}
	}
}
