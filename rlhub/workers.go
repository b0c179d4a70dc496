package rlhub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/rlhub/rlhub/internal/arsrpc"
	"github.com/rlhub/rlhub/internal/learner"
)

// Learner types, shared with the hub's aggregator.
type (
	// Demand is what a learner wants per learn task (BatchSize rows …).
	Demand = learner.Demand
	// LearnTask is one learner's share of a batch.
	LearnTask = learner.LearnTask
)

// LearnerConfig configures RunLearner.
type LearnerConfig struct {
	// Hub is the hub's address; required.
	Hub string
	// ID is the learner's unique id; required.
	ID string
	// Resources are declared to the aggregator as they are.
	Resources map[string]string
	// OnDemand reports the learner's demand for a task; required.
	OnDemand func(ctx context.Context, taskID string) (Demand, error)
	// OnLearn learns on one share and returns its info (values protobuf's
	// Struct can hold); required.
	OnLearn func(ctx context.Context, t *LearnTask) (map[string]any, error)
	// Logger; nil means one that discards.
	Logger *slog.Logger
	// Security is TLS and the token; the zero value is plaintext.
	Security Security
}

// RunLearner attaches to the hub's aggregator and serves learn tasks until
// ctx ends, re-attaching after every break; it returns ctx's cause, or a
// configuration error at once.
func RunLearner(ctx context.Context, cfg LearnerConfig) error {
	if cfg.Hub == "" || cfg.ID == "" || cfg.OnDemand == nil || cfg.OnLearn == nil {
		return errors.New("rlhub: LearnerConfig needs Hub, ID, OnDemand and OnLearn")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return learner.Run(ctx, learner.Config{Hub: cfg.Hub, Dial: cfg.Security.dial(), ID: cfg.ID, Resources: cfg.Resources,
		OnDemand: cfg.OnDemand, OnLearn: cfg.OnLearn, Logger: cfg.Logger})
}

// ARSWorkerConfig configures RunARSWorker.
type ARSWorkerConfig struct {
	// Hub is the hub's address; required.
	Hub string
	// Name identifies the worker in the hub's logs; "" means "worker".
	Name string
	// MaxTasks bounds one lease; 0 means 8.
	MaxTasks int
	// Wait is the long poll asked of the hub; 0 means 1s.
	Wait time.Duration
	// RetryFor is how long an unreachable hub is retried; 0 means 30s.
	RetryFor time.Duration
	// Logger; nil means one that discards.
	Logger *slog.Logger
	// Security is TLS and the token; the zero value is plaintext.
	Security Security
}

// ARSWorkerStats counts what an ARS worker did.
type ARSWorkerStats = arsrpc.WorkerStats

// RunARSWorker serves the hub's ARS runs (on the built-in environments)
// until ctx ends, then detaches and returns its counts; it returns an error
// when the hub stays unreachable for RetryFor.
func RunARSWorker(ctx context.Context, cfg ARSWorkerConfig) (ARSWorkerStats, error) {
	if cfg.Hub == "" {
		return ARSWorkerStats{}, errors.New("rlhub: ARSWorkerConfig.Hub is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	conn, err := cfg.Security.dial().GRPC(cfg.Hub)
	if err != nil {
		return ARSWorkerStats{}, fmt.Errorf("rlhub: dial %s: %w", cfg.Hub, err)
	}
	defer conn.Close()
	return arsrpc.RunWorker(ctx, arsrpc.WorkerConfig{Conn: conn, Name: cfg.Name, MaxTasks: cfg.MaxTasks,
		Wait: cfg.Wait, RetryFor: cfg.RetryFor, Logger: cfg.Logger})
}
