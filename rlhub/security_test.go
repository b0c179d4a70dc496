package rlhub_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/hub/hubtest"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/rlhub"
)

// secureHub is a real hub with mutual TLS on both planes and tokens for
// every model: an admin's, a trainer's and a reader's. It returns the
// hub's address, the directory of the PEM files (ca.pem, client.pem, client-key.pem)
// and the tokens by role name.
func secureHub(t *testing.T) (addr, dir string, tok map[string]string) {
	t.Helper()
	dir = t.TempDir()
	ca, err := auth.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteCA(dir); err != nil {
		t.Fatal(err)
	}
	for name, hosts := range map[string][]string{"server": {"127.0.0.1"}, "client": nil} {
		c, k, err := ca.Issue(name, hosts, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := auth.WritePair(dir, name, c, k); err != nil {
			t.Fatal(err)
		}
	}
	tlsCfg, err := dial.ServerTLS(filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem"), filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	tokens := map[string]auth.Principal{}
	tok = map[string]string{}
	for _, role := range []auth.Role{auth.Admin, auth.Trainer, auth.Reader} {
		secret, hash, err := auth.NewToken()
		if err != nil {
			t.Fatal(err)
		}
		tokens[hash] = auth.Principal{Name: role.String(), Role: role, Scopes: []string{""}}
		tok[role.String()] = secret
	}
	h := hubtest.Start(t, hub.Config{TLS: tlsCfg, Auth: auth.NewVerifier(tokens), Logger: testkit.Logger(),
		Reducer: reducer.Config{BatchSize: 1}})
	return h.Addr().String(), dir, tok
}

func security(t *testing.T, dir, token string, clientCert bool) rlhub.Security {
	t.Helper()
	f := rlhub.SecurityFiles{CA: filepath.Join(dir, "ca.pem"), Token: token}
	if clientCert {
		f.Cert, f.Key = filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	}
	s, err := rlhub.LoadSecurity(f)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The public package over mutual TLS with tokens: the store (push, pull),
// gradients on the data plane, and a push-stream collector all work; a
// plaintext client, a client without its certificate, a client without a
// token and a reader's push are each refused.
func TestPublicClientOverMutualTLSWithTokens(t *testing.T) {
	addr, dir, tok := secureHub(t)
	trainer, reader := tok["trainer"], tok["reader"]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sec := security(t, dir, trainer, true)

	s, err := rlhub.DialStore(rlhub.StoreConfig{Addr: addr, Security: sec, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Push(ctx, "policy", 1, 0, weights(1)); err != nil {
		t.Fatalf("push over mTLS with a trainer token: %v", err)
	}
	snap, err := s.Pull(ctx, "policy", 0)
	if err != nil || snap.Version != 1 {
		t.Fatalf("pull: %v, %v", snap, err)
	}

	// A push-stream collector gets version 1.
	c, err := rlhub.NewCollector(ctx, rlhub.CollectorConfig{Hub: addr, Model: "policy", Security: sec})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testkit.Eventually(t, 20*time.Second, "the collector to run version 1", func() bool {
		pctx, pcancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer pcancel()
		_, _ = c.Poll(pctx)
		return c.Version() == 1
	})
	// So does a data-plane collector: TLS and the token on the data plane.
	dc, err := rlhub.NewCollector(ctx, rlhub.CollectorConfig{Hub: addr, Model: "policy", Via: rlhub.ViaDataPlane, Security: sec})
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	if ok, err := dc.Poll(ctx); !ok || err != nil || dc.Version() != 1 || dc.Transport() != "dataplane" {
		t.Fatalf("data-plane collector over mTLS: applied %v, %v, version %d on %s", ok, err, dc.Version(), dc.Transport())
	}

	// Each missing piece is refused, and changes nothing.
	for name, cfg := range map[string]rlhub.StoreConfig{
		"plaintext":           {Addr: addr, MaxAttempts: 1},
		"no client cert":      {Addr: addr, MaxAttempts: 1, Security: security(t, dir, trainer, false)},
		"no token":            {Addr: addr, MaxAttempts: 1, Security: security(t, dir, "", true)},
		"reader token pushes": {Addr: addr, MaxAttempts: 1, Security: security(t, dir, reader, true)},
	} {
		bad, err := rlhub.DialStore(cfg)
		if err != nil {
			t.Fatal(err)
		}
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = bad.Push(cctx, "policy", 2, 1, weights(2))
		ccancel()
		bad.Close()
		switch name {
		case "no token":
			if !errors.Is(err, errs.ErrUnauthenticated) {
				t.Errorf("%s: %v, want Unauthenticated", name, err)
			}
		case "reader token pushes":
			if !errors.Is(err, errs.ErrPermission) {
				t.Errorf("%s: %v, want PermissionDenied", name, err)
			}
		default:
			if err == nil {
				t.Errorf("%s: push accepted", name)
			}
		}
	}
	if snap, err := s.Pull(ctx, "policy", 0); err != nil || snap.Version != 1 {
		t.Fatalf("after the refused pushes: %v, %v (want version 1)", snap, err)
	}
}

// Gradients over mutual TLS: an admin registers the model, a trainer's
// push travels the data plane (the token in its handshake) and the hub
// applies it; a trainer may not register.
func TestPublicGradientsOverMutualTLS(t *testing.T) {
	addr, dir, tok := secureHub(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sec := security(t, dir, tok["trainer"], true)
	s, err := rlhub.DialStore(rlhub.StoreConfig{Addr: addr, Security: sec})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Push(ctx, "grads", 1, 0, weights(1)); err != nil {
		t.Fatal(err)
	}
	g, err := rlhub.DialGrads(rlhub.GradConfig{Hub: addr, ClientID: "t0", Security: sec, MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	training := rlhub.ModelTraining{Model: "grads", Optimizer: rlhub.Optimizer{Kind: rlhub.SGD, LR: 0.5}}
	if _, _, err = g.RegisterModel(ctx, training); !errors.Is(err, errs.ErrPermission) {
		t.Fatalf("a trainer registering a model: %v, want PermissionDenied (admin only)", err)
	}
	adm, err := rlhub.DialGrads(rlhub.GradConfig{Hub: addr, Security: security(t, dir, tok["admin"], true)})
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	if _, _, err := adm.RegisterModel(ctx, training); err != nil {
		t.Fatalf("an admin registering: %v", err)
	}
	if _, err := g.Push(ctx, "grads", 1, weights(1)); err != nil {
		t.Fatalf("a trainer's gradient over mTLS: %v", err)
	}
	next, err := s.WaitNewer(ctx, "grads", 1)
	if err != nil {
		t.Fatal(err)
	}
	if w, _ := next.Tensors.Get("w").Float32s(); next.Version != 2 || w[0] != 0.5 || w[1] != -0.5 {
		t.Fatalf("after one SGD step: version %d w %v, want 2 [0.5 -0.5]", next.Version, w)
	}
}

// A client given a list of hubs whose first is dead finds the live one
// (Cluster/Primary) and works.
func TestPublicClientTakesAHubList(t *testing.T) {
	addr, stop := startHub()
	defer stop()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := rlhub.DialStore(rlhub.StoreConfig{Addr: dead + "," + addr})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Push(ctx, "policy", 1, 0, weights(1)); err != nil {
		t.Fatalf("push through a hub list: %v", err)
	}
	if got := rlhub.ClusterTarget("127.0.0.1:2379", "demo"); got != "etcd://127.0.0.1:2379/demo" {
		t.Fatalf("ClusterTarget = %q", got)
	}
}
