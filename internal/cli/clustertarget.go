package cli

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/dial"
)

// hubFlagNames are the flags that name the hub a client command talks to.
// Each takes a cluster target too (internal/dial): "h1:p1,h2:p2" or
// "etcd://E/NAME".
var hubFlagNames = []string{"hub", "upstream"}

// addClusterTargetFlags gives every client command (one with a hub flag;
// not serve, whose --etcd joins a cluster) --etcd and --cluster: the
// primary is then read from etcd and followed, as if the hub flag were
// dial.EtcdTarget(etcd, cluster).
func addClusterTargetFlags(root *cobra.Command) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		if c.Name() == "serve" || c.Flags().Lookup("etcd") != nil || hubFlag(c) == "" {
			return
		}
		c.Flags().String("etcd", "", "etcd endpoints (comma-separated): follow the primary of --cluster, read from etcd, instead of --"+hubFlag(c))
		c.Flags().String("cluster", "rlhub", "cluster name, with --etcd")
	}
	walk(root)
}

// hubFlag is the name of c's hub flag, or "".
func hubFlag(c *cobra.Command) string {
	for _, n := range hubFlagNames {
		if c.LocalFlags().Lookup(n) != nil || c.InheritedFlags().Lookup(n) != nil {
			return n
		}
	}
	return ""
}

// applyClusterTarget turns --etcd/--cluster into the hub flag's value.
func applyClusterTarget(cmd *cobra.Command) error {
	if cmd.Name() == "serve" {
		return nil
	}
	ef := cmd.Flags().Lookup("etcd")
	name := hubFlag(cmd)
	if ef == nil || name == "" || ef.Value.String() == "" {
		return nil
	}
	if cmd.Flags().Changed(name) {
		return fmt.Errorf("give --%s or --etcd, not both", name)
	}
	target := dial.EtcdTarget(ef.Value.String(), cmd.Flags().Lookup("cluster").Value.String())
	if _, err := dial.ParseTarget(target); err != nil {
		return fmt.Errorf("--etcd/--cluster: %w", err)
	}
	return cmd.Flags().Set(name, target)
}

// announce registers this process in etcd as a service of kind (a relay)
// when the command was given --etcd, so clients find it there
// (cluster.Reader.Services); the returned func withdraws it. Without
// --etcd it does nothing.
// insecure (the command's --insecure) also allows plaintext etcd off
// loopback.
func announce(cmd *cobra.Command, logger *slog.Logger, info cluster.ServiceInfo, insecure bool) (func(), error) {
	ef := cmd.Flags().Lookup("etcd")
	if ef == nil || ef.Value.String() == "" {
		return func() {}, nil
	}
	t, err := dial.ParseTarget(dial.EtcdTarget(ef.Value.String(), cmd.Flags().Lookup("cluster").Value.String()))
	if err != nil {
		return nil, err
	}
	if info.ID == "" {
		host, _ := os.Hostname()
		_, port, _ := net.SplitHostPort(info.Addr)
		info.ID = host + "-" + port
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
	defer cancel()
	a, err := cluster.Announce(ctx, cluster.Config{Endpoints: t.Etcd, Cluster: t.Cluster, Logger: logger, Security: etcdSecurity(cmd.Context(), insecure)}, info)
	if err != nil {
		return nil, fmt.Errorf("announce the %s in etcd: %w", info.Kind, err)
	}
	return func() { a.Close() }, nil
}

// etcdSecurity is the command's etcd client config (the --etcd-* flags);
// insecure (serve's or relay's --insecure) also allows plaintext off
// loopback, as it does for the command's own listener.
func etcdSecurity(ctx context.Context, insecure bool) cluster.EtcdSecurity {
	s := dialConfig(ctx).Etcd
	s.Insecure = s.Insecure || insecure
	return s
}
