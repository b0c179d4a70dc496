package auth

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	"github.com/rlhub/rlhub/internal/wire/chunkcodec"
	_ "github.com/rlhub/rlhub/proto/rlhub/v1" // the header types Check looks up by name
)

// TokenHeader is the metadata key of the bearer token (dial.TokenHeader).
const TokenHeader = "authorization"

// Verifier checks tokens against the token file's hashes and calls
// against Policy. Safe for concurrent use; a nil *Verifier admits every
// call.
//
// Tokens change without a restart: Replace (or ReloadFile, WatchFile)
// swaps the set, and a token past its Expires is refused. Both reach calls
// already admitted: every call the interceptors admitted runs under a
// context that is cancelled when its token expires, is removed, or its
// line changes, and the call then ends with Unauthenticated (streams such
// as watches and attaches within the moment of the swap or the expiry).
// Data-plane requests are checked one by one, so the next request on an
// open connection is refused, and each is tracked like a call while it
// runs (Check ties it to the request's context).
type Verifier struct {
	now func() time.Time

	mu     sync.RWMutex
	tokens map[string]Principal // by Hash(token)
	live   map[*liveCall]struct{}
	quota  quotaBook

	rates rates
	stats counters

	loaded    fileStamp // the token file's version loaded last (LoadFile, ReloadFile); guarded by mu
	hasLoaded bool
}

// liveCall is a call in progress under a token (tracked for revocation).
type liveCall struct {
	hash   string
	p      Principal
	cancel context.CancelCauseFunc
}

// NewVerifier returns a verifier for tokens (by Hash).
func NewVerifier(tokens map[string]Principal) *Verifier {
	return &Verifier{now: time.Now, tokens: tokens, live: map[*liveCall]struct{}{}}
}

// SetClock replaces the clock expiry is judged by (tests); call it before
// the verifier is used.
func (v *Verifier) SetClock(now func() time.Time) { v.now = now }

// Replace swaps in a new set of tokens (a reloaded file). Calls in
// progress under a token that is gone, or whose line changed, are
// cancelled and end with Unauthenticated; it returns how many.
func (v *Verifier) Replace(tokens map[string]Principal) (cut int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.tokens = tokens
	v.rates.mu.Lock()
	v.rates.buckets = nil // rates may have changed
	v.rates.mu.Unlock()
	for c := range v.live {
		q, ok := tokens[c.hash]
		switch {
		case !ok:
			c.cancel(fmt.Errorf("%w: token %q was revoked", errs.ErrUnauthenticated, clip(c.p.Name)))
		case !q.equal(c.p):
			c.cancel(fmt.Errorf("%w: token %q was changed in the token file: call again", errs.ErrUnauthenticated, clip(c.p.Name)))
		default:
			continue
		}
		delete(v.live, c)
		cut++
	}
	v.stats.cut.Add(uint64(cut))
	return cut
}

// Len is the number of tokens the verifier knows.
func (v *Verifier) Len() int {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return len(v.tokens)
}

// Authenticate returns the principal holding token.
func (v *Verifier) Authenticate(token string) (Principal, error) {
	p, _, err := v.authenticate(token)
	return p, err
}

func (v *Verifier) authenticate(token string) (Principal, string, error) {
	if token == "" {
		return Principal{}, "", fmt.Errorf("%w: no token: this hub needs one (--token-file, RLHUB_TOKEN_FILE)", errs.ErrUnauthenticated)
	}
	v.stats.lookups.Add(1)
	hash := Hash(token)
	v.mu.RLock()
	p, ok := v.tokens[hash]
	v.mu.RUnlock()
	if !ok {
		return Principal{}, "", fmt.Errorf("%w: unknown token", errs.ErrUnauthenticated)
	}
	if err := v.unexpired(p); err != nil {
		return Principal{}, "", err
	}
	return p, hash, nil
}

// unexpired refuses p once its Expires has passed.
func (v *Verifier) unexpired(p Principal) error {
	if !p.Expires.IsZero() && !v.now().Before(p.Expires) {
		return fmt.Errorf("%w: token %q expired at %s", errs.ErrUnauthenticated, clip(p.Name), p.Expires.UTC().Format(time.RFC3339))
	}
	return nil
}

// track runs a call admitted for p (token hash) under a context that is
// cancelled, with an Unauthenticated cause, when the token expires or is
// revoked or changed (Replace). done must be called when the call ends.
// A token revoked or changed since it was authenticated (a Replace that
// has not seen this call: on gRPC, one while a unary call's message
// arrived after Tap) is refused here, before the call runs: a handler
// that never looks at its context would otherwise still act for it.
func (v *Verifier) track(ctx context.Context, hash string, p Principal) (context.Context, func(), error) {
	c := &liveCall{hash: hash, p: p}
	v.mu.Lock()
	if q, ok := v.tokens[hash]; !ok || !q.equal(p) {
		v.mu.Unlock()
		return nil, nil, fmt.Errorf("%w: token %q was revoked or changed", errs.ErrUnauthenticated, clip(p.Name))
	}
	ctx, cancel := context.WithCancelCause(ctx)
	c.cancel = cancel
	v.live[c] = struct{}{}
	v.mu.Unlock()
	stopTimer := func() bool { return true }
	if !p.Expires.IsZero() {
		t := time.AfterFunc(p.Expires.Sub(v.now()), func() {
			v.stats.cut.Add(1)
			cancel(fmt.Errorf("%w: token %q expired at %s", errs.ErrUnauthenticated, clip(p.Name), p.Expires.UTC().Format(time.RFC3339)))
		})
		stopTimer = t.Stop
	}
	return ctx, func() {
		stopTimer()
		v.mu.Lock()
		delete(v.live, c)
		v.mu.Unlock()
		cancel(nil)
	}, nil
}

// cutCause is the Unauthenticated cause a tracked call was cancelled
// with, or nil when it was not.
func cutCause(ctx context.Context) error {
	if c := context.Cause(ctx); c != nil && errors.Is(c, errs.ErrUnauthenticated) {
		return c
	}
	return nil
}

// LiveCalls is the number of calls in progress under a token (tests and
// metrics).
func (v *Verifier) LiveCalls() int {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return len(v.live)
}

// Allow checks that p may call r touching models.
func Allow(p Principal, r Rule, models []string) error {
	if p.Role < r.Role {
		return fmt.Errorf("%w: %s needs role %s; token %q has %s", errs.ErrPermission, r.Method, r.Role, clip(p.Name), p.Role)
	}
	for _, m := range models {
		if !p.Covers(m) {
			what := fmt.Sprintf("model %q", clip(m))
			if m == "" || r.Model.Kind == Namespace {
				what = "every model"
				if m != "" {
					what += " under " + fmt.Sprintf("%q", m)
				}
			}
			return fmt.Errorf("%w: %s: token %q (scope %s) does not cover %s", errs.ErrPermission, r.Method, clip(p.Name), scopeString(p.Scopes), what)
		}
	}
	return nil
}

func scopeString(scopes []string) string {
	out := make([]string, len(scopes))
	for i, s := range scopes {
		if s == "" {
			s = "*"
		}
		out[i] = clip(s)
	}
	return strings.Join(out, ",")
}

type principalKey struct{}

// FromContext returns the caller a handler serves, when tokens are on.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// WithPrincipal returns ctx carrying p (what the interceptors do).
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// admit runs the checks that need no request message: the rule exists,
// the token is known and unexpired (unless the method is public) and its
// role suffices. hash is the token's (for track). A gRPC call that Tap
// admitted on its headers is not looked up again: only its expiry can
// have changed since (track catches a revocation).
func (v *Verifier) admit(ctx context.Context, plane Plane, method, token string) (Rule, Principal, string, error) {
	r, ok := Lookup(plane, method)
	if !ok {
		return r, Principal{}, "", fmt.Errorf("%w: %s is not in the policy table", errs.ErrPermission, clip(method))
	}
	if r.Role == Public {
		return r, Principal{}, "", nil
	}
	if a, ok := ctx.Value(admissionKey{}).(admission); ok && plane == GRPC && a.method == method {
		return r, a.p, a.hash, errors.Join(v.unexpired(a.p), v.allowRate(a.p))
	}
	p, hash, err := v.authenticate(token)
	if err != nil {
		return r, p, "", err
	}
	if err := Allow(p, r, nil); err != nil {
		return r, p, "", err
	}
	return r, p, hash, v.allowRate(p)
}

// admission is a gRPC call Tap admitted on its headers, kept in the
// call's context for the interceptors.
type admission struct {
	method, hash string
	p            Principal
}

type admissionKey struct{}

// Tap runs, on a gRPC call's headers (grpc.InTapHandle: before grpc-go
// starts its handler or buffers its request message), the checks that
// need no message: the method is in the policy table, and unless it is
// public the token is known, unexpired and of a role that may call it.
// A unary call waits for its whole request message before any unary
// interceptor runs, so without this a caller with no token held a
// handler goroutine and the bytes it sent for as long as it liked. It
// returns ctx carrying the admission, so the interceptors, which check
// again with the model and the rate quota once the message is there, do
// not hash and look the token up a second time.
func (v *Verifier) Tap(ctx context.Context, method string, md metadata.MD) (context.Context, error) {
	if v == nil {
		return ctx, nil
	}
	r, ok := Lookup(GRPC, method)
	if !ok {
		return nil, fmt.Errorf("%w: %s is not in the policy table", errs.ErrPermission, clip(method))
	}
	if r.Role == Public {
		return ctx, nil
	}
	p, hash, err := v.authenticate(bearer(md))
	if err != nil {
		return nil, err
	}
	if err := Allow(p, r, nil); err != nil {
		return nil, err
	}
	return context.WithValue(ctx, admissionKey{}, admission{method: method, hash: hash, p: p}), nil
}

func tokenOf(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	return bearer(md)
}

// bearer is the token a call's metadata carries ("" for none).
func bearer(md metadata.MD) string {
	for _, v := range md.Get(TokenHeader) {
		if t, ok := strings.CutPrefix(v, "Bearer "); ok {
			return strings.TrimSpace(t)
		}
	}
	return ""
}

// UnaryInterceptor checks every unary call.
func (v *Verifier) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if v == nil {
			return handler(ctx, req)
		}
		r, p, hash, err := v.admit(ctx, GRPC, info.FullMethod, tokenOf(ctx))
		if err != nil {
			return nil, grpcerr.ToStatus(err)
		}
		if r.Role == Public {
			return handler(ctx, req)
		}
		if msg, ok := req.(proto.Message); ok && r.Model.Kind != NoModel {
			if err := Allow(p, r, r.Model.Models(msg)); err != nil {
				return nil, grpcerr.ToStatus(err)
			}
		}
		// Long polls (ARS leases, learner tasks) end when the token goes.
		tctx, done, err := v.track(ctx, hash, p)
		if err != nil {
			return nil, grpcerr.ToStatus(err)
		}
		defer done()
		resp, err := handler(WithPrincipal(tctx, p), req)
		if cause := cutCause(tctx); cause != nil && err != nil {
			return nil, grpcerr.ToStatus(cause)
		}
		return resp, err
	}
}

// StreamInterceptor checks every stream: the token and role before the
// handler runs, the model on the first message received.
func (v *Verifier) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if v == nil {
			return handler(srv, ss)
		}
		ctx := ss.Context()
		r, p, hash, err := v.admit(ctx, GRPC, info.FullMethod, tokenOf(ctx))
		if err != nil {
			return grpcerr.ToStatus(err)
		}
		if r.Role == Public {
			return handler(srv, ss)
		}
		// The stream runs until the token expires or is revoked.
		tctx, done, err := v.track(ctx, hash, p)
		if err != nil {
			return grpcerr.ToStatus(err)
		}
		defer done()
		cs := &checkedStream{ServerStream: ss, ctx: WithPrincipal(tctx, p), p: p, r: r, check: r.Model.Kind != NoModel}
		err = handler(srv, cs)
		if cs.denied != nil {
			// Handlers wrap a failed first receive in their own words
			// ("push: …" as InvalidArgument); the caller must see the
			// refusal as it is.
			return cs.denied
		}
		if cause := cutCause(tctx); cause != nil {
			return grpcerr.ToStatus(cause)
		}
		return err
	}
}

// checkedStream checks the model of the first message a handler receives.
type checkedStream struct {
	grpc.ServerStream
	ctx    context.Context
	p      Principal
	r      Rule
	check  bool  // the first message is still to be checked
	denied error // the first message's refusal, returned in place of the handler's error
}

func (s *checkedStream) Context() context.Context { return s.ctx }

func (s *checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if s.check {
		s.check = false
		msg := chunkcodec.Received(m)
		if msg == nil {
			s.denied = grpcerr.ToStatus(fmt.Errorf("%w: %s: cannot read the model of a %T", errs.ErrPermission, s.r.Method, m))
			return s.denied
		}
		if err := Allow(s.p, s.r, s.r.Model.Models(msg)); err != nil {
			s.denied = grpcerr.ToStatus(err)
			return s.denied
		}
	}
	return nil
}

// Check is the data plane's bulk.Guard: the handshake's token, the
// method's role, the header's model.
func (v *Verifier) Check(ctx context.Context, token string, _ *tls.ConnectionState, method string, header []byte) (context.Context, error) {
	r, p, hash, err := v.admit(ctx, DataPlane, method, token)
	if err != nil {
		return nil, err
	}
	if r.Role == Public {
		return ctx, nil
	}
	if r.Model.Kind == NoModel {
		return v.trackRequest(ctx, hash, p)
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(r.Header)
	if err != nil {
		return nil, fmt.Errorf("auth: policy header %s: %v", r.Header, err)
	}
	msg := mt.New().Interface()
	if err := proto.Unmarshal(header, msg); err != nil {
		return nil, fmt.Errorf("%w: %s header: %v", errs.ErrInvalid, method, err)
	}
	if err := Allow(p, r, r.Model.Models(msg)); err != nil {
		return nil, err
	}
	return v.trackRequest(ctx, hash, p)
}

// CheckHello is the data plane's bulk.HelloGuard: a connection whose
// hello carries no token, an unknown or an expired one is refused before
// the server reads a request from it. Every data-plane method needs a
// token (none is Public), so such a connection could only be refused
// request by request. A nil verifier admits every hello.
func (v *Verifier) CheckHello(token string, _ *tls.ConnectionState) error {
	if v == nil {
		return nil
	}
	_, _, err := v.authenticate(token)
	return err
}

// trackRequest tracks a data-plane request (a long-poll watch, a body
// being read) like a gRPC call: a revocation or expiry cuts it. The
// tracking ends with the request's context (bulk cancels it at the end).
func (v *Verifier) trackRequest(ctx context.Context, hash string, p Principal) (context.Context, error) {
	tctx, done, err := v.track(ctx, hash, p)
	if err != nil {
		return nil, err
	}
	context.AfterFunc(ctx, done)
	return WithPrincipal(tctx, p), nil
}

var _ bulk.HelloGuard = (*Verifier)(nil)
