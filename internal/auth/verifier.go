package auth

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	_ "github.com/rlhub/rlhub/proto/rlhub/v1" // the header types Check looks up by name
)

// TokenHeader is the metadata key of the bearer token (dial.TokenHeader).
const TokenHeader = "authorization"

// Verifier checks tokens against the token file's hashes and calls
// against Policy. Safe for concurrent use; a nil *Verifier admits every
// call.
type Verifier struct {
	mu     sync.RWMutex
	tokens map[string]Principal // by Hash(token)
}

// NewVerifier returns a verifier for tokens (by Hash).
func NewVerifier(tokens map[string]Principal) *Verifier {
	return &Verifier{tokens: tokens}
}

// Replace swaps in a new set of tokens (a reloaded file); calls already
// admitted are not affected.
func (v *Verifier) Replace(tokens map[string]Principal) {
	v.mu.Lock()
	v.tokens = tokens
	v.mu.Unlock()
}

// Authenticate returns the principal holding token.
func (v *Verifier) Authenticate(token string) (Principal, error) {
	if token == "" {
		return Principal{}, fmt.Errorf("%w: no token: this hub needs one (--token-file, RLHUB_TOKEN_FILE)", errs.ErrUnauthenticated)
	}
	v.mu.RLock()
	p, ok := v.tokens[Hash(token)]
	v.mu.RUnlock()
	if !ok {
		return Principal{}, fmt.Errorf("%w: unknown token", errs.ErrUnauthenticated)
	}
	return p, nil
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
// the token is known (unless the method is public) and its role suffices.
func (v *Verifier) admit(ctx context.Context, plane Plane, method, token string) (Rule, Principal, error) {
	r, ok := Lookup(plane, method)
	if !ok {
		return r, Principal{}, fmt.Errorf("%w: %s is not in the policy table", errs.ErrPermission, clip(method))
	}
	if r.Role == Public {
		return r, Principal{}, nil
	}
	p, err := v.Authenticate(token)
	if err != nil {
		return r, p, err
	}
	return r, p, Allow(p, r, nil)
}

func tokenOf(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
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
		r, p, err := v.admit(ctx, GRPC, info.FullMethod, tokenOf(ctx))
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
		return handler(WithPrincipal(ctx, p), req)
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
		r, p, err := v.admit(ctx, GRPC, info.FullMethod, tokenOf(ctx))
		if err != nil {
			return grpcerr.ToStatus(err)
		}
		if r.Role == Public {
			return handler(srv, ss)
		}
		cs := &checkedStream{ServerStream: ss, ctx: WithPrincipal(ctx, p), p: p, r: r, check: r.Model.Kind != NoModel}
		err = handler(srv, cs)
		if cs.denied != nil {
			// Handlers wrap a failed first receive in their own words
			// ("push: …" as InvalidArgument); the caller must see the
			// refusal as it is.
			return cs.denied
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
		var msg proto.Message
		switch m := m.(type) {
		case interface{ Message() proto.Message }: // chunkcodec.Msg: the zero-copy codec
			msg = m.Message()
		case proto.Message:
			msg = m
		}
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
	r, p, err := v.admit(ctx, DataPlane, method, token)
	if err != nil {
		return nil, err
	}
	if r.Model.Kind == NoModel || r.Role == Public {
		return WithPrincipal(ctx, p), nil
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
	return WithPrincipal(ctx, p), nil
}

var _ bulk.Guard = (*Verifier)(nil)
