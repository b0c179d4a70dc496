package rlhub

import (
	"context"
	"errors"
	"time"

	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/reducer"
)

// Optimizer configures the optimizer the hub runs for a model (SGD, Adam,
// AdamW, RMSprop and their schedules, checked against torch.optim).
type Optimizer = optim.Config

// Optimizer kinds, for Optimizer.Kind.
const (
	SGD     = optim.SGD
	Adam    = optim.Adam
	AdamW   = optim.AdamW
	RMSprop = optim.RMSprop
)

// GradReceipt says what the reducer admitted: the model version at
// admission, the staleness weight and the (client id, seq) used.
type GradReceipt = reducer.Receipt

// ModelTraining configures how the hub trains a model from gradients.
type ModelTraining struct {
	// Model to train; it must be in the store. Required.
	Model string
	// Optimizer the hub runs; required.
	Optimizer Optimizer
	// Sum reduces each step's gradients by sum; false means mean.
	Sum bool
	// GradientMax clips the reduced gradient's global L2 norm; 0 disables.
	GradientMax float64
}

// GradConfig configures a GradClient.
type GradConfig struct {
	// Hub hosting the primary reducer; required.
	Hub string
	// ClientID names this client in (client id, seq), the key that makes a
	// retried push count once; "" means a random id.
	ClientID string
	// MaxAttempts bounds tries per push; 0 means until the context ends.
	MaxAttempts int
	// CallTimeout bounds a push whose context has no deadline; 0 means 2
	// minutes (reducer.DefaultCallTimeout).
	CallTimeout time.Duration
	// Security is TLS and the token; the zero value is plaintext.
	Security Security
}

// GradClient pushes gradients to the hub's reducer, failing over between
// secondaries. Safe for concurrent use.
type GradClient struct{ c *reducer.Client }

// DialGrads connects (lazily) to the hub's reducer.
func DialGrads(cfg GradConfig) (*GradClient, error) {
	if cfg.Hub == "" {
		return nil, errors.New("rlhub: GradConfig.Hub is required")
	}
	c, err := reducer.NewClient(reducer.ClientConfig{Hub: cfg.Hub, Dial: cfg.Security.dial(), ClientID: cfg.ClientID, MaxAttempts: cfg.MaxAttempts, CallTimeout: cfg.CallTimeout})
	if err != nil {
		return nil, err
	}
	return &GradClient{c: c}, nil
}

// RegisterModel makes the hub train m.Model; it returns the model's
// version (and, for a restarted hub, the step its optimizer resumed at).
func (g *GradClient) RegisterModel(ctx context.Context, m ModelTraining) (version, restored uint64, err error) {
	mc := reducer.ModelConfig{Model: m.Model, Optimizer: m.Optimizer, GradientMax: m.GradientMax}
	if m.Sum {
		mc.Reduction = reduce.Sum
	}
	return g.c.Register(ctx, mc)
}

// Push sends grads computed on version base of model (names, dtypes and
// shapes as the model's; NaN/Inf are refused) with the next sequence number.
func (g *GradClient) Push(ctx context.Context, model string, base uint64, grads *StateDict) (GradReceipt, error) {
	return g.c.PushGrad(ctx, model, base, grads)
}

// PushLife is Push naming the life of version base (the Snapshot.Life of
// the version pulled; 0: unknown, as Push): once model was deleted and
// pushed again since that version was pulled, the gradient is refused
// with ErrStaleVersion and changes nothing, though the new model may have
// reached the same version number (docs/reducer.md).
func (g *GradClient) PushLife(ctx context.Context, model string, base, life uint64, grads *StateDict) (GradReceipt, error) {
	return g.c.PushGradLife(ctx, model, base, life, grads)
}

// ID is the client id in (client id, seq).
func (g *GradClient) ID() string { return g.c.ID() }

// Close releases the connections; safe to call twice.
func (g *GradClient) Close() error { return g.c.Close() }
