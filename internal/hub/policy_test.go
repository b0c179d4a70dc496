package hub

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
)

// pki is a development CA with a server certificate for 127.0.0.1 and a
// client certificate, as `rlhub cert` writes them.
type pki struct{ dir string }

func (p pki) path(name string) string { return filepath.Join(p.dir, name) }

func newPKI(t testing.TB) pki {
	t.Helper()
	dir := t.TempDir()
	ca, err := auth.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteCA(dir); err != nil {
		t.Fatal(err)
	}
	for name, hosts := range map[string][]string{"server": {"127.0.0.1", "localhost"}, "client": nil} {
		c, k, err := ca.Issue(name, hosts, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := auth.WritePair(dir, name, c, k); err != nil {
			t.Fatal(err)
		}
	}
	return pki{dir}
}

// caller is one identity the policy test calls with.
type caller struct {
	name  string
	token string
	p     *auth.Principal // nil: no token, or one the hub does not know
}

// want is what the table says c gets from r: "" (allowed),
// codes.Unauthenticated or codes.PermissionDenied.
func (c caller) want(r auth.Rule) codes.Code {
	if r.Role == auth.Public {
		return codes.OK
	}
	if c.p == nil {
		return codes.Unauthenticated
	}
	if c.p.Role < r.Role {
		return codes.PermissionDenied
	}
	switch r.Model.Kind {
	case auth.NoModel:
		return codes.OK
	case auth.Namespace:
		if !c.p.Covers(r.Model.Prefix) {
			return codes.PermissionDenied
		}
	default:
		for _, m := range r.Model.Models(requestFor(r)) {
			if !c.p.Covers(m) {
				return codes.PermissionDenied
			}
		}
	}
	return codes.OK
}

// callers: no token, an unknown token, one unscoped token per role, an
// admin scoped to other models, and an admin scoped to exactly the
// models the calls name.
func callers(t testing.TB) ([]caller, *auth.Verifier) {
	tokens := map[string]auth.Principal{}
	out := []caller{{name: "no-token"}, {name: "unknown-token", token: "rlh_not-issued"}}
	add := func(name string, p auth.Principal) {
		tok, hash, err := auth.NewToken()
		if err != nil {
			t.Fatal(err)
		}
		p.Name = name
		tokens[hash] = p
		out = append(out, caller{name: name, token: tok, p: &p})
	}
	for _, r := range []auth.Role{auth.Reader, auth.Worker, auth.Trainer, auth.Admin} {
		add(r.String(), auth.Principal{Role: r, Scopes: []string{""}})
	}
	add("admin-wrong-scope", auth.Principal{Role: auth.Admin, Scopes: []string{"other/"}})
	add("admin-right-scope", auth.Principal{Role: auth.Admin, Scopes: []string{"t/", auth.ARSModelPrefix}})
	return out, auth.NewVerifier(tokens)
}

const (
	testModel = "t/m"
	testRun   = "r1"
)

// requestFor is r's request (a stream's first message, a data-plane
// header) naming testModel or testRun where the rule reads a model.
func requestFor(r auth.Rule) proto.Message {
	var name protoreflect.FullName
	if r.Plane == auth.DataPlane {
		name = r.Header
	} else {
		md := methodDesc(r.Method)
		if md == nil {
			panic("no descriptor for " + r.Method)
		}
		name = md.Input().FullName()
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(name)
	if err != nil {
		panic(err)
	}
	m := mt.New()
	switch r.Model.Kind {
	case auth.Field:
		setPath(m, strings.Split(r.Model.Path, "."), testModel)
	case auth.RunID:
		setPath(m, strings.Split(r.Model.Path, "."), testRun)
	}
	if r.Plane == auth.DataPlane { // a small announced body
		setUint(m, []string{"blob", "total_bytes"}, 64)
	}
	return m.Interface()
}

func setPath(m protoreflect.Message, path []string, v string) {
	fd := m.Descriptor().Fields().ByName(protoreflect.Name(path[0]))
	switch {
	case fd.IsList():
		l := m.Mutable(fd).List()
		e := l.NewElement()
		setPath(e.Message(), path[1:], v)
		l.Append(e)
	case len(path) == 1:
		m.Set(fd, protoreflect.ValueOfString(v))
	default:
		setPath(m.Mutable(fd).Message(), path[1:], v)
	}
}

func setUint(m protoreflect.Message, path []string, v uint64) {
	fd := m.Descriptor().Fields().ByName(protoreflect.Name(path[0]))
	if fd == nil { // a header without that field (a data-plane pull has no body)
		return
	}
	if len(path) == 1 {
		m.Set(fd, protoreflect.ValueOfUint64(v))
		return
	}
	setUint(m.Mutable(fd).Message(), path[1:], v)
}

func methodDesc(full string) protoreflect.MethodDescriptor {
	svc, method, ok := strings.Cut(strings.TrimPrefix(full, "/"), "/")
	if !ok {
		return nil
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return nil
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil
	}
	return sd.Methods().ByName(protoreflect.Name(method))
}

// call makes r's call once and returns its status code.
func call(ctx context.Context, cfg dial.Config, conn *grpc.ClientConn, addr string, r auth.Rule) codes.Code {
	req := requestFor(r)
	if r.Plane == auth.DataPlane {
		bc := cfg.Bulk()
		defer bc.Close()
		err := bc.Call(ctx, addr, r.Method, req, [][]byte{make([]byte, 64)}, nil)
		return status.Code(grpcStatus(err))
	}
	md := methodDesc(r.Method)
	out, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName())
	if err != nil {
		panic(err)
	}
	resp := out.New().Interface()
	if !md.IsStreamingClient() && !md.IsStreamingServer() {
		return status.Code(conn.Invoke(ctx, r.Method, req, resp))
	}
	s, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: md.IsStreamingClient(), ServerStreams: md.IsStreamingServer()}, r.Method)
	if err != nil {
		return status.Code(err)
	}
	if err := s.SendMsg(req); err != nil && !errors.Is(err, io.EOF) { // EOF: the status is in RecvMsg
		return status.Code(err)
	}
	_ = s.CloseSend()
	return status.Code(s.RecvMsg(resp))
}

// grpcStatus turns an errs condition from the data-plane client back into
// a status for comparison.
func grpcStatus(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errs.ErrUnauthenticated):
		return status.Error(codes.Unauthenticated, err.Error())
	case errors.Is(err, errs.ErrPermission):
		return status.Error(codes.PermissionDenied, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Error(codes.Unknown, err.Error())
}

// TestPolicyTableCoversEveryMethod fails when the hub serves a method the
// policy table does not list (it would be refused to every token), or
// the table lists one the hub does not serve.
func TestPolicyTableCoversEveryMethod(t *testing.T) {
	h, err := New(Config{Listen: "127.0.0.1:0", Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	grpcMethods, bulkMethods := h.Methods()
	served := map[string]bool{}
	for _, m := range grpcMethods {
		served[m] = true
		if _, ok := auth.Lookup(auth.GRPC, m); !ok {
			t.Errorf("gRPC method %s is not in auth.Policy: add its role and model source", m)
		}
	}
	for _, m := range bulkMethods {
		served["bulk:"+m] = true
		if _, ok := auth.Lookup(auth.DataPlane, m); !ok {
			t.Errorf("data-plane method %s is not in auth.Policy: add its role and model source", m)
		}
	}
	for _, r := range auth.Policy {
		k := r.Method
		if r.Plane == auth.DataPlane {
			k = "bulk:" + k
		}
		if !served[k] {
			t.Errorf("auth.Policy lists %s, which the hub does not serve", r.Method)
		}
	}
	if len(grpcMethods) < 30 || len(bulkMethods) < 2 {
		t.Fatalf("walked %d gRPC and %d data-plane methods: the walk is broken", len(grpcMethods), len(bulkMethods))
	}
}

// TestPolicyTableEnforced calls every method in the table, over mutual
// TLS, with no token, an unknown token, a token of each role and tokens
// of the wrong and the right scope, and checks allowed /
// Unauthenticated / PermissionDenied against the table. "Allowed" is any
// answer but those two (the handler then refuses the test's made-up
// model or run, or the stream waits until the call's deadline).
func TestPolicyTableEnforced(t *testing.T) {
	pk := newPKI(t)
	srvTLS, err := dial.ServerTLS(pk.path("server.pem"), pk.path("server-key.pem"), pk.path("ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	cs, v := callers(t)
	h, err := New(Config{Listen: "127.0.0.1:0", TLS: srvTLS, Auth: v, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	addr := h.Addr().String()
	// The group returns once its parallel subtests are done, before the
	// deferred closes run.
	t.Run("callers", func(t *testing.T) { enforce(t, pk, cs, addr) })
}

func enforce(t *testing.T, pk pki, cs []caller, addr string) {
	for _, c := range cs {
		cfg, err := dial.Files{CA: pk.path("ca.pem"), Cert: pk.path("client.pem"), Key: pk.path("client-key.pem"), Token: c.token}.Load()
		if err != nil {
			t.Fatal(err)
		}
		conn, err := cfg.GRPC(addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			for _, r := range auth.Policy {
				want := c.want(r)
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				got := call(ctx, cfg, conn, addr, r)
				cancel()
				denied := got == codes.Unauthenticated || got == codes.PermissionDenied
				switch {
				case want == codes.OK && denied:
					t.Errorf("%s: got %v, want allowed (role %s)", r.Method, got, r.Role)
				case want != codes.OK && got != want:
					t.Errorf("%s: got %v, want %v (role %s, model %s)", r.Method, got, want, r.Role, r.Model)
				}
			}
		})
	}
}

// A TLS hub closes plaintext connections on both planes, and a stream's
// first message is checked on the chunk codec's zero-copy path too (the
// Go reducer client's gRPC push), with the refusal kept as it is.
func TestTLSHubRefusesPlaintextAndChecksZeroCopyStreams(t *testing.T) {
	pk := newPKI(t)
	srvTLS, err := dial.ServerTLS(pk.path("server.pem"), pk.path("server-key.pem"), "")
	if err != nil {
		t.Fatal(err)
	}
	tok, hash, err := auth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	v := auth.NewVerifier(map[string]auth.Principal{hash: {Name: "scoped", Role: auth.Admin, Scopes: []string{"other/"}}})
	h, err := New(Config{Listen: "127.0.0.1:0", TLS: srvTLS, Auth: v, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	addr := h.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	plain, err := dial.Config{Token: tok}.GRPC(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	rule, _ := auth.Lookup(auth.GRPC, "/rlhub.v1.ModelStore/List")
	if got := call(ctx, dial.Config{Token: tok}, plain, addr, rule); got != codes.Unavailable {
		t.Fatalf("plaintext gRPC to a TLS hub: %v, want Unavailable", got)
	}
	bc := dial.Config{Token: tok}.Bulk()
	defer bc.Close()
	if err := bc.Call(ctx, addr, "rlhub.v1.Reducer/Push", requestFor(auth.Rule{Plane: auth.DataPlane, Header: "rlhub.v1.ReducerPushHeader"}), nil, nil); err == nil ||
		errors.Is(err, errs.ErrPermission) || errors.Is(err, errs.ErrUnauthenticated) {
		t.Fatalf("plaintext data plane to a TLS hub: %v", err)
	}

	cfg, err := dial.Files{CA: pk.path("ca.pem"), Token: tok}.Load()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := reducer.NewClient(reducer.ClientConfig{Hub: addr, Dial: cfg, Transport: reducer.TransportGRPC, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	g, err := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{2}, []float32{1, 2}))
	if err != nil {
		t.Fatal(err)
	}
	_, err = rc.PushGrad(ctx, "t/m", 1, g)
	if !errors.Is(err, errs.ErrPermission) || !strings.Contains(err.Error(), "does not cover model") {
		t.Fatalf("zero-copy gRPC push out of scope: %v", err)
	}
}

// A secondary reducer in a hub of its own links to the primary's hub over
// TLS with the admin token (the hub-to-hub seam), and a client with a
// scoped trainer token gets its gradients applied through it. An unscoped
// trainer token may not link one: it would put an address of its choosing
// on every client's list of secondaries, and their gradients would go
// there.
func TestSecondaryHubLinksOverTLSWithToken(t *testing.T) {
	pk := newPKI(t)
	srvTLS, err := dial.ServerTLS(pk.path("server.pem"), pk.path("server-key.pem"), pk.path("ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	trainer, trainerHash, _ := auth.NewToken()
	user, userHash, _ := auth.NewToken()
	admin, adminHash, _ := auth.NewToken()
	v := auth.NewVerifier(map[string]auth.Principal{
		trainerHash: {Name: "unscoped-trainer", Role: auth.Trainer, Scopes: []string{""}},
		userHash:    {Name: "learner", Role: auth.Trainer, Scopes: []string{"t/"}},
		adminHash:   {Name: "admin", Role: auth.Admin, Scopes: []string{""}},
	})
	as := func(tok string) dial.Config {
		c, err := dial.Files{CA: pk.path("ca.pem"), Cert: pk.path("client.pem"), Key: pk.path("client-key.pem"), Token: tok}.Load()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	var applied atomic.Int64
	primary, err := New(Config{Listen: "127.0.0.1:0", TLS: srvTLS, Auth: v, Logger: testkit.Logger(),
		Reducer: reducer.Config{Secondaries: -1, OnApply: func(_ string, _ uint64, m []reduce.ID, _ []float32) { applied.Add(int64(len(m))) }}})
	if err != nil {
		t.Fatal(err)
	}
	if err := primary.Start(); err != nil {
		t.Fatal(err)
	}
	defer primary.Close()
	paddr := primary.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	g, _ := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{2}, []float32{1, 2}))
	blob, _ := safetensors.Encode(g, nil)
	if _, err := primary.Store().Push(ctx, store.PushRequest{Name: "t/m", Version: 1, Blob: blob}); err != nil {
		t.Fatal(err)
	}
	ac, err := reducer.NewClient(reducer.ClientConfig{Hub: paddr, Dial: as(admin)})
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	if _, _, err := ac.Register(ctx, reducer.ModelConfig{Model: "t/m", Optimizer: optim.Config{Kind: optim.SGD, LR: 0.1}, Reduction: reduce.Sum}); err != nil {
		t.Fatal(err)
	}
	conn, err := as(trainer).GRPC(paddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fake := reducer.NewRemotePrimary(conn, "")
	if _, _, err := fake.Attach(ctx, reducer.Secondary{Addr: "203.0.113.9:7470", ID: "fake"}); !errors.Is(err, errs.ErrPermission) {
		t.Fatalf("an unscoped trainer token attached a secondary: %v, want a permission error", err)
	}
	if secs, err := ac.Secondaries(ctx); err != nil || len(secs) != 0 {
		t.Fatalf("after a refused attach the primary lists %v (%v), want none", secs, err)
	}
	secondary, err := New(Config{Listen: "127.0.0.1:0", TLS: srvTLS, Auth: v, Logger: testkit.Logger(),
		Reducer: reducer.Config{Primary: paddr, Dial: as(admin), Secondaries: 1, BatchSize: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := secondary.Start(); err != nil {
		t.Fatal(err)
	}
	defer secondary.Close()
	testkit.Eventually(t, 30*time.Second, "the secondary hub to attach over TLS", func() bool {
		secs, err := ac.Secondaries(ctx)
		return err == nil && len(secs) == 1
	})
	uc, err := reducer.NewClient(reducer.ClientConfig{Hub: paddr, Dial: as(user), ClientID: "learner"})
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	for range 3 {
		if _, err := uc.PushGrad(ctx, "t/m", 1, g); err != nil {
			t.Fatal(err)
		}
	}
	testkit.Eventually(t, 30*time.Second, "3 gradients applied via the secondary hub", func() bool { return applied.Load() == 3 })
}
