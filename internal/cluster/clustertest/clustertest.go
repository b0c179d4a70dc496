// Package clustertest runs a real etcd (Debian's etcd-server binary) on
// loopback for the tests of packages that use internal/cluster.
package clustertest

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/rlhub/rlhub/internal/testkit"
)

// Etcd is one etcd process; Kill and Start stop and restart it on the same
// data and ports.
type Etcd struct {
	// Endpoint is the client URL, http://127.0.0.1:PORT.
	Endpoint string

	tb       testing.TB
	dir      string
	peer     string
	cmd      *exec.Cmd
	waitDone chan struct{}
	// extra are more etcd flags (TLS: secure.go); probe is the client
	// config that reaches it (nil: plaintext Endpoint).
	extra []string
	probe *clientv3.Config
}

func freeAddr(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Start runs a fresh single-member etcd, killed at cleanup. It fails tb
// with the set-up step to run when etcd is not installed.
func Start(tb testing.TB) *Etcd {
	tb.Helper()
	if _, err := exec.LookPath("etcd"); err != nil {
		tb.Fatal("etcd is not installed: scripts/setup.d/20-etcd.sh installs Debian's etcd-server")
	}
	e := &Etcd{tb: tb, dir: tb.TempDir(), Endpoint: "http://" + freeAddr(tb), peer: "http://" + freeAddr(tb)}
	e.Restart()
	tb.Cleanup(e.Kill)
	return e
}

// Restart starts the process again (after Kill) and waits until it serves.
func (e *Etcd) Restart() {
	e.tb.Helper()
	log, err := os.OpenFile(filepath.Join(e.dir, "etcd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		e.tb.Fatal(err)
	}
	defer log.Close()
	e.cmd = exec.Command("etcd", "--name", "t", "--data-dir", filepath.Join(e.dir, "data"),
		"--listen-client-urls", e.Endpoint, "--advertise-client-urls", e.Endpoint,
		"--listen-peer-urls", e.peer, "--initial-advertise-peer-urls", e.peer,
		"--initial-cluster", "t="+e.peer, "--log-level", "error")
	e.cmd.Args = append(e.cmd.Args, e.extra...)
	e.cmd.Stdout, e.cmd.Stderr = log, log
	if err := e.cmd.Start(); err != nil {
		e.tb.Fatal(err)
	}
	e.waitDone = make(chan struct{})
	cmd, done := e.cmd, e.waitDone
	go func() { cmd.Wait(); close(done) }()
	testkit.Eventually(e.tb, 30*time.Second, "etcd to serve", func() bool {
		pc := clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: time.Second, Logger: zap.NewNop()}
		if e.probe != nil {
			pc = *e.probe
		}
		cli, err := clientv3.New(pc)
		if err != nil {
			return false
		}
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err = cli.Get(ctx, "probe")
		return err == nil
	})
}

// Kill SIGKILLs the process and waits for it.
func (e *Etcd) Kill() {
	if e.cmd != nil && e.cmd.Process != nil {
		e.cmd.Process.Kill()
		<-e.waitDone
		e.cmd = nil
	}
}
