// Package clustertest runs a real etcd (Debian's etcd-server binary) on
// loopback for the tests of packages that use internal/cluster.
package clustertest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/rlhub/rlhub/internal/netsec"
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
	name     string // the member's name ("t" alone)
	initial  string // --initial-cluster
	cmd      *exec.Cmd
	waitDone chan struct{}
	// extra are more etcd flags (TLS: secure.go); probe is the client
	// config that reaches it (nil: plaintext Endpoint).
	extra []string
	probe *clientv3.Config
}

// freeAddr is a loopback address for an etcd to listen on (etcd binds the
// port it is given, not port 0): testkit.FreeAddr, below the kernel's
// ephemeral range.
func freeAddr(tb testing.TB) string {
	tb.Helper()
	return testkit.FreeAddr(tb)
}

// Start runs a fresh single-member etcd, killed at cleanup. It fails tb
// with the set-up step to run when etcd is not installed.
func Start(tb testing.TB) *Etcd {
	tb.Helper()
	if _, err := exec.LookPath("etcd"); err != nil {
		tb.Fatal("etcd is not installed: scripts/setup.d/20-etcd.sh installs Debian's etcd-server")
	}
	e := &Etcd{tb: tb, dir: tb.TempDir(), Endpoint: "http://" + freeAddr(tb), peer: "http://" + freeAddr(tb)}
	tb.Cleanup(e.Kill) // before Restart: one that fails still kills the process
	e.Restart()
	return e
}

// StartCluster runs a fresh n-member etcd cluster on loopback, killed at
// cleanup, and waits until every member serves.
func StartCluster(tb testing.TB, n int) []*Etcd {
	tb.Helper()
	return startCluster(tb, n, "http", nil, nil)
}

// StartTLSCluster is StartCluster with TLS client URLs: each member's
// server certificate (127.0.0.1) is signed by the CA at the path it
// returns; client certificates are not checked.
func StartTLSCluster(tb testing.TB, n int) ([]*Etcd, string) {
	tb.Helper()
	dir := tb.TempDir()
	ca, caKey := newCA(tb, dir, "ca")
	leaf(tb, dir, "server", ca, caKey, x509.ExtKeyUsageServerAuth)
	caPath := filepath.Join(dir, "ca.pem")
	pool, err := netsec.CertPool(caPath)
	if err != nil {
		tb.Fatal(err)
	}
	extra := []string{"--cert-file", filepath.Join(dir, "server.pem"), "--key-file", filepath.Join(dir, "server-key.pem")}
	return startCluster(tb, n, "https", extra, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}), caPath
}

func startCluster(tb testing.TB, n int, scheme string, extra []string, tc *tls.Config) []*Etcd {
	tb.Helper()
	if _, err := exec.LookPath("etcd"); err != nil {
		tb.Fatal("etcd is not installed: scripts/setup.d/20-etcd.sh installs Debian's etcd-server")
	}
	var es []*Etcd
	var initial []string
	for i := range n {
		e := &Etcd{tb: tb, dir: tb.TempDir(), Endpoint: scheme + "://" + freeAddr(tb), peer: "http://" + freeAddr(tb), name: fmt.Sprintf("m%d", i+1), extra: extra}
		if tc != nil {
			e.probe = &clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: time.Second, Logger: zap.NewNop(), TLS: tc}
		}
		initial = append(initial, e.name+"="+e.peer)
		es = append(es, e)
	}
	for _, e := range es {
		e.initial = strings.Join(initial, ",")
		e.start()
		tb.Cleanup(e.Kill)
	}
	for _, e := range es {
		e.wait()
	}
	return es
}

// Endpoints are es's client URLs.
func Endpoints(es []*Etcd) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Endpoint)
	}
	return out
}

// Restart starts the process again (after Kill) and waits until it serves.
func (e *Etcd) Restart() {
	e.tb.Helper()
	e.start()
	e.wait()
}

// Stop SIGSTOPs the process: it keeps its sockets open and answers
// nothing, as a member whose machine was cut off or died without
// resetting its connections. Cont resumes it.
func (e *Etcd) Stop() { e.signal(syscall.SIGSTOP) }

// Cont SIGCONTs a stopped process.
func (e *Etcd) Cont() { e.signal(syscall.SIGCONT) }

func (e *Etcd) signal(s syscall.Signal) {
	e.tb.Helper()
	if e.cmd == nil || e.cmd.Process == nil {
		e.tb.Fatalf("etcd %s is not running", e.name)
	}
	if err := e.cmd.Process.Signal(s); err != nil {
		e.tb.Fatalf("etcd %s: %v: %v", e.name, s, err)
	}
}

func (e *Etcd) start() {
	e.tb.Helper()
	if e.name == "" { // a single member (secure.go)
		e.name, e.initial = "t", "t="+e.peer
	}
	log, err := os.OpenFile(filepath.Join(e.dir, "etcd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		e.tb.Fatal(err)
	}
	defer log.Close()
	e.cmd = exec.Command("etcd", "--name", e.name, "--data-dir", filepath.Join(e.dir, "data"),
		"--listen-client-urls", e.Endpoint, "--advertise-client-urls", e.Endpoint,
		"--listen-peer-urls", e.peer, "--initial-advertise-peer-urls", e.peer,
		"--initial-cluster", e.initial, "--log-level", "error")
	if strings.Contains(e.initial, ",") {
		// A member cut off must not depose the leader on its return
		// (docs/cluster.md's deployment asks for it; etcd 3.4 lacks it).
		e.cmd.Args = append(e.cmd.Args, "--pre-vote")
	}
	e.cmd.Args = append(e.cmd.Args, e.extra...)
	e.cmd.Stdout, e.cmd.Stderr = log, log
	if err := e.cmd.Start(); err != nil {
		e.tb.Fatal(err)
	}
	e.waitDone = make(chan struct{})
	cmd, done := e.cmd, e.waitDone
	go func() { cmd.Wait(); close(done) }()
}

// serveTimeout bounds wait (this package's tests shorten it).
var serveTimeout = 30 * time.Second

// Wait waits until the process serves a linearizable read (after Cont).
func (e *Etcd) Wait() { e.tb.Helper(); e.wait() }

// wait waits until the process serves a linearizable read.
func (e *Etcd) wait() {
	e.tb.Helper()
	testkit.Eventually(e.tb, serveTimeout, "etcd to serve", func() bool {
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
		e.cmd.Process.Kill() // a stopped process dies too
		<-e.waitDone
		e.cmd = nil
	}
}
