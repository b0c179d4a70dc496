package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wsync"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// issueToken runs `rlhub token new` into file and returns the token's path.
func issueToken(t *testing.T, ctx context.Context, dir, file, role, scope, name string) string {
	t.Helper()
	out := filepath.Join(dir, name+".token")
	if code, o, e := run(t, ctx, "token", "new", "--append", file, "--role", role, "--scope", scope, "--name", name, "--out", out); code != 0 {
		t.Fatalf("token new %s: %d %s %s", name, code, o, e)
	}
	return out
}

// TestRelayListenTLSAndTokens: `rlhub relay` serves its local stream with
// the hub's server flags. Over TLS with a token a collector gets the
// hub's version through it; no token is Unauthenticated, a token of
// another scope PermissionDenied, plaintext fails; its metrics endpoint
// is HTTPS and wants a reader token; and off loopback without them the
// relay refuses to start.
func TestRelayListenTLSAndTokens(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	certs := filepath.Join(dir, "certs")
	if code, o, e := run(t, ctx, "cert", "--dir", certs); code != 0 {
		t.Fatalf("cert: %d %s %s", code, o, e)
	}
	ca, srvCert, srvKey := filepath.Join(certs, "ca.pem"), filepath.Join(certs, "server.pem"), filepath.Join(certs, "server-key.pem")
	hubTokens, relayTokens := filepath.Join(dir, "hub-tokens"), filepath.Join(dir, "relay-tokens")
	relayTok := issueToken(t, ctx, dir, hubTokens, "worker", "m", "relay")
	collTok := issueToken(t, ctx, dir, relayTokens, "worker", "m", "collector")
	otherTok := issueToken(t, ctx, dir, relayTokens, "worker", "x/", "other")

	srvTLS, err := dial.ServerTLS(srvCert, srvKey, "")
	if err != nil {
		t.Fatal(err)
	}
	v, err := auth.LoadFile(hubTokens)
	if err != nil {
		t.Fatal(err)
	}
	h, err := hub.New(hub.Config{Listen: "127.0.0.1:0", TLS: srvTLS, Auth: v, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, err := h.Store().Push(ctx, store.PushRequest{Name: "m", Version: 1, Expect: store.ExpectAny, Blob: storetest.Blob(t, 1, 1000)}); err != nil {
		t.Fatal(err)
	}

	// Off loopback without TLS and tokens: refused, exit 2.
	if code, _, e := run(t, ctx, "relay", "--upstream", h.Addr().String(), "--model", "m", "--no-shm", "--listen", "0.0.0.0:0"); code != 2 || !strings.Contains(e, "--auth-tokens FILE") {
		t.Fatalf("exposed plaintext relay: code %d, %q", code, e)
	}

	relayAddr, metricsAddr := freeAddr(t), freeAddr(t)
	rctx, rcancel := context.WithCancel(ctx)
	relayDone := make(chan int, 1)
	go func() {
		code, _, _ := run(t, rctx, "relay", "--upstream", h.Addr().String(), "--model", "m", "--no-shm", "--listen", relayAddr,
			"--tls-ca", ca, "--tls-cert", srvCert, "--tls-key", srvKey, "--token-file", relayTok,
			"--auth-tokens", relayTokens, "--metrics-listen", metricsAddr)
		relayDone <- code
	}()
	defer func() {
		rcancel()
		if code := testkit.Recv(t, relayDone, 30*time.Second, "the relay to stop"); code != 0 {
			t.Errorf("relay exited %d", code)
		}
	}()

	conn := func(token string) *grpc.ClientConn {
		cfg, err := dial.Files{CA: ca, TokenFile: token}.Load()
		if err != nil {
			t.Fatal(err)
		}
		c, err := cfg.GRPC(relayAddr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	good := conn(collTok)
	var cl *wsync.Client
	testkit.Eventually(t, 30*time.Second, "a collector to attach to the relay over TLS", func() bool {
		cl, err = wsync.Attach(ctx, wsync.ClientConfig{Conn: good, CollectorID: "c1", Model: "m"})
		return err == nil
	})
	snap, err := cl.WaitNewer(ctx, 0)
	cl.Close()
	if err != nil || snap.Version != 1 {
		t.Fatalf("version through the relay: %v, %v", snap, err)
	}
	// The relay follows the TLS hub over its data plane, with its TLS and
	// token (it once dialed that plaintext and without the token, was
	// refused, and fell back to the push stream for good): the hub hears
	// its own reports as relay/data-plane (its collector's, forwarded, as
	// relay/push).
	hubCfg, err := dial.Files{CA: ca, TokenFile: relayTok}.Load()
	if err != nil {
		t.Fatal(err)
	}
	hubConn, err := hubCfg.GRPC(h.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer hubConn.Close()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		st, err := rlhubv1.NewWeightSyncClient(hubConn).Status(ctx, &rlhubv1.SyncStatusRequest{Model: "m"})
		if err != nil {
			t.Fatalf("the hub's sync status: %v", err)
		}
		var via []string
		found := false
		for _, m := range st.GetModels() {
			for _, c := range m.GetCollectors() {
				via = append(via, c.GetCollectorId()+" via "+c.GetVia())
				found = found || strings.HasPrefix(c.GetCollectorId(), "relay-") && c.GetVia() == "relay/data-plane"
			}
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the hub hears %q, want the relay via relay/data-plane", via)
		}
	}
	status1 := func(c *grpc.ClientConn) error {
		_, err := rlhubv1.NewWeightSyncClient(c).Status(ctx, &rlhubv1.SyncStatusRequest{Model: "m"})
		return err
	}
	if err := status1(good); err != nil {
		t.Fatalf("status with the collector token: %v", err)
	}
	if err := status1(conn("")); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("no token: %v", err)
	}
	if err := status1(conn(otherTok)); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("another scope: %v", err)
	}
	plain, err := grpc.NewClient(relayAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if err := status1(plain); err == nil {
		t.Fatal("a plaintext call to a TLS relay succeeded")
	}

	// The metrics endpoint: HTTPS, a reader token.
	pem, err := os.ReadFile(ca)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 10 * time.Second}
	tok, _ := os.ReadFile(collTok)
	scrape := func(token string) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, "GET", "https://"+metricsAddr+"/metrics", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := scrape(strings.TrimSpace(string(tok))); code != http.StatusOK || !strings.Contains(body, "rlhub_sync_streams") || !strings.Contains(body, "rlhub_auth_tokens 2") {
		t.Fatalf("scrape with a token: %d %.300q", code, body)
	}
	if code, _ := scrape(""); code != http.StatusUnauthorized {
		t.Fatalf("scrape without a token: %d, want 401", code)
	}
	if resp, err := http.Get("http://" + metricsAddr + "/metrics"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), "rlhub_") {
			t.Fatal("the metrics endpoint answered plain HTTP")
		}
	}
}

// --shm and --no-shm exclude each other: --no-shm dropped --shm without
// a word before.
func TestRelayRefusesShmAndNoShm(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	code, _, errOut := run(t, ctx, "relay", "--upstream", "127.0.0.1:1", "--model", "m", "--no-shm", "--shm", filepath.Join(t.TempDir(), "seg"))
	if code == 0 || !strings.Contains(errOut, "no-shm") || !strings.Contains(errOut, "shm") {
		t.Fatalf("relay --no-shm --shm: exit %d, %q; want a refusal naming both flags", code, errOut)
	}
}

// TestRelayChecksCallsOnTheirHeaders: `rlhub relay --auth-tokens` refuses
// a call without a token on its headers, before its message, and caps
// the calls a peer has in progress at twice --max-streams-per-peer, as a
// hub does. Before, a unary call (WeightSync/Report) that never sent its
// message held a relay goroutine for as long as its peer liked, token or
// not, and any number of them.
func TestRelayChecksCallsOnTheirHeaders(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	tokens := filepath.Join(dir, "relay-tokens")
	collTok := issueToken(t, ctx, dir, tokens, "worker", "m", "collector")
	h, err := hub.New(hub.Config{Listen: "127.0.0.1:0", Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, err := h.Store().Push(ctx, store.PushRequest{Name: "m", Version: 1, Expect: store.ExpectAny, Blob: storetest.Blob(t, 1, 1000)}); err != nil {
		t.Fatal(err)
	}
	const maxStreams = 2
	relayAddr := freeAddr(t)
	rctx, rcancel := context.WithCancel(ctx)
	relayDone := make(chan int, 1)
	go func() {
		code, _, _ := run(t, rctx, "relay", "--upstream", h.Addr().String(), "--model", "m", "--no-shm", "--listen", relayAddr,
			"--auth-tokens", tokens, "--max-streams-per-peer", fmt.Sprint(maxStreams))
		relayDone <- code
	}()
	defer func() {
		rcancel()
		if code := testkit.Recv(t, relayDone, 30*time.Second, "the relay to stop"); code != 0 {
			t.Errorf("relay exited %d", code)
		}
	}()
	cfg, err := dial.Files{TokenFile: collTok}.Load()
	if err != nil {
		t.Fatal(err)
	}
	good, err := cfg.GRPC(relayAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	status0 := func() error {
		_, err := rlhubv1.NewWeightSyncClient(good).Status(ctx, &rlhubv1.SyncStatusRequest{Model: "m"})
		return err
	}
	testkit.Eventually(t, 30*time.Second, "the relay to answer a collector's token", func() bool { return status0() == nil })

	// A unary call opened as a stream: its headers go now, its message
	// never. The answer must come from the headers alone.
	held := func(conn *grpc.ClientConn, cctx context.Context) grpc.ClientStream {
		cs, err := conn.NewStream(cctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, rlhubv1.WeightSync_Report_FullMethodName)
		if err != nil {
			t.Fatal(err)
		}
		return cs
	}
	answer := func(cs grpc.ClientStream) codes.Code {
		return status.Code(cs.RecvMsg(&rlhubv1.SyncReportResponse{}))
	}
	anon, err := grpc.NewClient(relayAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	actx, acancel := context.WithTimeout(ctx, 10*time.Second)
	if code := answer(held(anon, actx)); code != codes.Unauthenticated {
		t.Errorf("a call without a token and without its message: %v, want Unauthenticated on its headers", code)
	}
	acancel()

	// With a valid token: 2 × --max-streams-per-peer calls are held, the
	// next is refused at once.
	hctx, hcancel := context.WithCancel(ctx)
	for range 2 * maxStreams {
		held(good, hctx)
	}
	octx, ocancel := context.WithTimeout(ctx, 10*time.Second)
	if code := answer(held(good, octx)); code != codes.ResourceExhausted {
		t.Errorf("a call past %d held ones: %v, want ResourceExhausted", 2*maxStreams, code)
	}
	ocancel()
	hcancel() // the held calls end: their places come back
	testkit.Eventually(t, 10*time.Second, "a call to be served once the held ones ended", func() bool { return status0() == nil })
}
