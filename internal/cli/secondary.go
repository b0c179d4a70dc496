package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/netsec"
)

// runAnnouncedSecondaries serves cfg's hub of secondary reducers
// (`serve --role reducer --etcd`) and announces it in etcd under the
// cluster (kind "secondary", its address and the ids of its secondaries)
// once every secondary has attached to the primary, so that gradient
// clients given the cluster find it from an etcd watch. The announcement
// lives on the process's lease: a secondary that dies drops out when the
// lease's TTL passes; one whose lease is lost (etcd away too long)
// announces itself again. The announcement is withdrawn before the hub
// stops.
func runAnnouncedSecondaries(ctx context.Context, cfg hub.Config, f *clusterFlags, logger *slog.Logger) error {
	if _, err := netsec.Advertised(cfg.Listen, cfg.Advertise, &net.TCPAddr{}); err != nil { // announced to other machines
		return &exitError{code: 2, err: fmt.Errorf("serve --role reducer --etcd: %v", err)}
	}
	h, err := hub.New(cfg)
	if err != nil {
		return err
	}
	// The hub stops after the announcement is withdrawn (below), not with
	// ctx, so clients stop picking it before it refuses them.
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	runErr := make(chan error, 1)
	go func() { runErr <- h.Run(runCtx) }()

	id := f.id
	cc := cluster.Config{Endpoints: f.endpoints(), Cluster: f.name, LeaseTTL: f.leaseTTL, Logger: logger, Security: etcdSecurity(ctx, f.insecure)}
	var a *cluster.Announcement
	defer func() {
		if a != nil {
			a.Close()
		}
	}()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	waitingSince := time.Now()
	var lastTry time.Time // announcing is retried at most once a second
	for {
		var lost <-chan struct{}
		if a != nil {
			lost = a.Lost()
		}
		select {
		case <-ctx.Done():
			if a != nil {
				a.Close()
				a = nil
			}
			stop()
			return <-runErr
		case err := <-runErr:
			return err
		case <-lost:
			logger.Warn("cluster: the secondaries' announcement was lost; announcing again")
			a.Close()
			a = nil
			continue
		case <-tick.C:
		}
		if a != nil || time.Since(lastTry) < time.Second {
			continue
		}
		addr := h.Addr()
		if addr == nil || !allAttached(h) {
			if time.Since(waitingSince) > 10*time.Second {
				logger.Info("cluster: secondaries waiting for the primary before they are announced", "primary", cfg.Reducer.Primary)
				waitingSince = time.Now()
			}
			continue
		}
		// The name --listen gave (netsec.Advertised), as a hub's member
		// address: clients check the certificate against it.
		adv, _ := netsec.Advertised(cfg.Listen, cfg.Advertise, addr) // checked above
		info := cluster.ServiceInfo{Kind: cluster.KindSecondary, ID: id, Addr: adv}
		if info.ID == "" {
			host, _ := os.Hostname()
			_, port, _ := net.SplitHostPort(addr.String())
			info.ID = host + "-" + port
		}
		for _, s := range h.Reducer().SecondaryNodes() {
			info.Secondaries = append(info.Secondaries, s.ID())
		}
		lastTry = time.Now()
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		a, err = cluster.Announce(actx, cc, info)
		cancel()
		if err != nil {
			if errors.Is(err, errs.ErrInvalid) || errors.Is(err, errs.ErrExists) || errors.Is(err, errs.ErrUnauthenticated) || errors.Is(err, errs.ErrPermission) {
				// Settings or credentials: trying again cannot help.
				stop()
				<-runErr
				return fmt.Errorf("announce the secondaries in etcd: %w", err)
			}
			logger.Warn("cluster: announcing the secondaries failed; trying again", "err", err)
			a = nil
		}
	}
}

func allAttached(h *hub.Hub) bool {
	for _, s := range h.Reducer().SecondaryNodes() {
		if !s.Attached() {
			return false
		}
	}
	return true
}
