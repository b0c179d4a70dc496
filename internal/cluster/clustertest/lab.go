package clustertest

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/rlhub/rlhub/internal/testkit"
)

// LabEtcd is an etcd cluster with one member on each of some hosts of a
// testkit.Lab, as docs/cluster.md's three-machine deployment runs it:
// member NAME on NAME's address, client port 2379, peer port 2380
// (every host has its own ports), plaintext.
type LabEtcd struct {
	// Endpoints is every member's client address, "IP:2379", joined by
	// commas: what `--etcd` takes.
	Endpoints string
	Members   []*LabMember
}

// LabMember is one member; Kill and Restart stop and start it on its data.
type LabMember struct {
	Host *testkit.Host
	Proc *testkit.Proc
	tb   testing.TB
	args []string
}

// StartOnLab starts one member per host and waits until the cluster
// serves; the members are killed at tb's cleanup. extra are flags every
// member gets.
func StartOnLab(tb testing.TB, hosts []*testkit.Host, extra ...string) *LabEtcd {
	tb.Helper()
	path, err := exec.LookPath("etcd")
	if err != nil {
		tb.Fatal("etcd is not installed: scripts/setup.d/20-etcd.sh installs Debian's etcd-server")
	}
	var initial, endpoints []string
	for _, h := range hosts {
		initial = append(initial, h.Name+"=http://"+h.IP+":2380")
		endpoints = append(endpoints, h.IP+":2379")
	}
	e := &LabEtcd{Endpoints: strings.Join(endpoints, ",")}
	for _, h := range hosts {
		m := &LabMember{Host: h, tb: tb, args: append([]string{
			"--name", h.Name, "--data-dir", filepath.Join(tb.TempDir(), "etcd-"+h.Name),
			"--listen-client-urls", "http://" + h.IP + ":2379", "--advertise-client-urls", "http://" + h.IP + ":2379",
			"--listen-peer-urls", "http://" + h.IP + ":2380", "--initial-advertise-peer-urls", "http://" + h.IP + ":2380",
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--log-level", "error"}, extra...)}
		m.Proc = h.Start(tb, testkit.ProcConfig{Name: "etcd", Path: path, Args: m.args})
		e.Members = append(e.Members, m)
	}
	e.WaitServing(tb, endpoints)
	return e
}

// WaitServing waits until a linearizable read through endpoints (from
// this process: the lab's bridge reaches every host) succeeds.
func (e *LabEtcd) WaitServing(tb testing.TB, endpoints []string) {
	tb.Helper()
	testkit.Eventually(tb, 60*time.Second, "etcd on the lab to serve", func() bool {
		cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: time.Second, Logger: zap.NewNop()})
		if err != nil {
			return false
		}
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = cli.Get(ctx, "probe")
		return err == nil
	})
}

// Kill SIGKILLs the member.
func (m *LabMember) Kill() { m.Proc.Kill() }

// Restart starts a killed member again on its data directory (etcd then
// ignores the initial-cluster flags) and waits until it serves.
func (m *LabMember) Restart() {
	m.tb.Helper()
	path, _ := exec.LookPath("etcd")
	m.Proc = m.Host.Start(m.tb, testkit.ProcConfig{Name: "etcd", Path: path, Args: m.args})
	(&LabEtcd{}).WaitServing(m.tb, []string{m.Host.IP + ":2379"})
}
