package aggregator

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/wire"
	"github.com/rlhub/rlhub/internal/wire/chunkcodec"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// Client is the coordinator's Go client for the aggregator. Errors match
// the errs sentinels with errors.Is. Safe for concurrent use (the
// aggregator runs one coordinator operation at a time).
type Client struct {
	rpc rlhubv1.LearnerAggregatorClient
}

// NewClient wraps a connection to a hub.
func NewClient(conn grpc.ClientConnInterface) *Client {
	return &Client{rpc: rlhubv1.NewLearnerAggregatorClient(conn)}
}

// Resources lists the attached learners.
func (c *Client) Resources(ctx context.Context) ([]*rlhubv1.LearnerInfo, error) {
	r, err := c.rpc.Resources(ctx, &rlhubv1.ResourcesRequest{})
	if err != nil {
		return nil, grpcerr.FromStatus(err)
	}
	return r.Learners, nil
}

// Resource is DI-engine's resource task: {"gpu": world_size}, world_size
// being the number of attached learners (one per device).
func (c *Client) Resource(ctx context.Context) (map[string]int64, error) {
	r, err := c.rpc.Resources(ctx, &rlhubv1.ResourcesRequest{})
	if err != nil {
		return nil, grpcerr.FromStatus(err)
	}
	return map[string]int64{"gpu": r.WorldSize}, nil
}

// Status returns learners, leases and counters.
func (c *Client) Status(ctx context.Context) (*rlhubv1.StatusResponse, error) {
	r, err := c.rpc.Status(ctx, &rlhubv1.StatusRequest{})
	return r, grpcerr.FromStatus(err)
}

// Start starts a task on every attached learner; taskID "" lets the
// aggregator choose. info is converted with structpb.NewStruct.
func (c *Client) Start(ctx context.Context, taskID string, info map[string]any) (*rlhubv1.StartResponse, error) {
	return c.StartWith(ctx, taskID, info, nil)
}

// StartWith is Start with the task's merge options (nil: the hub's rule
// and homogeneous keys).
func (c *Client) StartWith(ctx context.Context, taskID string, info map[string]any, merge *rlhubv1.MergeOptions) (*rlhubv1.StartResponse, error) {
	st, err := structpb.NewStruct(info)
	if err != nil {
		return nil, fmt.Errorf("%w: task info: %v", errs.ErrInvalid, err)
	}
	r, err := c.rpc.Start(ctx, &rlhubv1.StartRequest{TaskId: taskID, TaskInfo: st, Merge: merge})
	return r, grpcerr.FromStatus(err)
}

// GetDataDemand returns the merged demand and records the learner order.
func (c *Client) GetDataDemand(ctx context.Context, taskID string) (*rlhubv1.DemandResponse, error) {
	r, err := c.rpc.GetDataDemand(ctx, &rlhubv1.DemandRequest{TaskId: taskID})
	return r, grpcerr.FromStatus(err)
}

// Learn sends a batch (every tensor with the same first dimension) and
// returns the merged result. metadata travels to every learner's share.
// The tensors' bytes are streamed without copying (the chunk codec hands
// them to the transport as they are): they must not change until Learn
// returns.
func (c *Client) Learn(ctx context.Context, taskID string, batch *tensor.StateDict, metadata map[string]string) (*rlhubv1.LearnResponse, error) {
	layout, err := safetensors.Plan(batch, metadata)
	if err != nil {
		return nil, fmt.Errorf("%w: batch: %v", errs.ErrInvalid, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.rpc.Learn(ctx, grpc.CallContentSubtype(chunkcodec.Name))
	if err != nil {
		return nil, grpcerr.FromStatus(err)
	}
	err = stream.Send(&rlhubv1.LearnRequest{Body: &rlhubv1.LearnRequest_Header{Header: &rlhubv1.LearnHeader{
		TaskId: taskID,
		Blob:   &rlhubv1.BlobInfo{TotalBytes: uint64(layout.Size), ChunkBytes: wire.DefaultChunkBytes},
	}}})
	if err == nil {
		err = wire.Chunks(layout, wire.DefaultChunkBytes, func(b []byte) error {
			return stream.Send(&rlhubv1.LearnRequest{Body: &rlhubv1.LearnRequest_Chunk{Chunk: &rlhubv1.Chunk{Data: b}}})
		})
	}
	// On a send error the server has answered (io.EOF); CloseAndRecv
	// returns its status.
	resp, rerr := stream.CloseAndRecv()
	if rerr != nil {
		return nil, grpcerr.FromStatus(rerr)
	}
	if err != nil {
		return nil, grpcerr.FromStatus(err)
	}
	return resp, nil
}
