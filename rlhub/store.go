package rlhub

import (
	"context"
	"errors"
	"time"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
)

// StoreConfig configures a StoreClient.
type StoreConfig struct {
	// Addr is the hub's address ("127.0.0.1:7470"), or a cluster's
	// (ClusterTarget, or "h1:p1,h2:p2"); required.
	Addr string
	// CallTimeout bounds a call whose context has no deadline; 0 means 2
	// minutes (waits for a newer version are exempt).
	CallTimeout time.Duration
	// MaxAttempts bounds tries of a call that fails with Unavailable; 0
	// means 5, 1 disables retries.
	MaxAttempts int
	// MaxModelBytes bounds a pulled version; 0 means 4 GiB.
	MaxModelBytes int64
	// Security is TLS and the token; the zero value is plaintext.
	Security Security
}

func (c *StoreConfig) validate() error {
	if c.Addr == "" {
		return errors.New("rlhub: StoreConfig.Addr is required")
	}
	return nil
}

// StoreClient pushes and pulls model versions. Safe for concurrent use.
type StoreClient struct{ c *storerpc.Client }

// DialStore connects (lazily) to the hub's model store.
func DialStore(cfg StoreConfig) (*StoreClient, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c, err := storerpc.NewClient(storerpc.ClientConfig{Addr: cfg.Addr, Dial: cfg.Security.dial(), CallTimeout: cfg.CallTimeout,
		MaxAttempts: cfg.MaxAttempts, MaxModelBytes: cfg.MaxModelBytes})
	if err != nil {
		return nil, err
	}
	return &StoreClient{c: c}, nil
}

// Push stores sd as version of model. expect is the version you believe is
// current (0: the model must not exist yet; ExpectAny: no check); a push
// that loses fails with ErrStaleVersion and changes nothing.
func (s *StoreClient) Push(ctx context.Context, model string, version, expect uint64, sd *StateDict) (ModelInfo, error) {
	blob, err := Encode(sd, nil)
	if err != nil {
		return ModelInfo{}, err
	}
	return s.PushBlob(ctx, model, version, expect, blob)
}

// PushBlob is Push with safetensors bytes (checked by the hub); the
// client may read blob until PushBlob returns.
func (s *StoreClient) PushBlob(ctx context.Context, model string, version, expect uint64, blob []byte) (ModelInfo, error) {
	return s.c.Push(ctx, store.PushRequest{Name: model, Version: version, Expect: expect, Blob: blob})
}

// Pull returns a version of model (0: the newest).
func (s *StoreClient) Pull(ctx context.Context, model string, version uint64) (*Snapshot, error) {
	return s.c.Get(ctx, model, version)
}

// PullIfNewer returns the newest version if it is newer than than, else
// (nil, nil).
func (s *StoreClient) PullIfNewer(ctx context.Context, model string, than uint64) (*Snapshot, error) {
	return s.c.GetIfNewer(ctx, model, than)
}

// WaitNewer blocks until a version newer than after exists and returns it.
func (s *StoreClient) WaitNewer(ctx context.Context, model string, after uint64) (*Snapshot, error) {
	return s.c.WaitNewer(ctx, model, after)
}

// List describes every stored model.
func (s *StoreClient) List(ctx context.Context) ([]ModelInfo, error) { return s.c.List(ctx) }

// Close releases the connection; safe to call twice.
func (s *StoreClient) Close() error { return s.c.Close() }
