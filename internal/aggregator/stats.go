package aggregator

import (
	"context"
	"maps"
	"time"

	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// Stats is the aggregator's one picture: attached learners and task
// counters. The Status RPC (StatsToProto), `rlhub aggregator status`
// (Client.HubStats) and the metrics adapter read it; StatsToProto and
// StatsFromProto convert without loss (leases to the millisecond).
type Stats struct {
	// Learners attached now, in attach order.
	Learners []LearnerStats
	// TaskID is the current task ("" before the first Start).
	TaskID string
	// Attached counts learners that ever said Hello; Removed those that
	// left or whose lease lapsed.
	Attached, Removed uint64
	// LearnOK and LearnFailed count Learn calls by outcome; Resplits the
	// shares re-split after a learner failed mid-task.
	LearnOK, LearnFailed, Resplits uint64
}

// LearnerStats is one attached learner.
type LearnerStats struct {
	ID        string
	Resources map[string]string // owned by the Stats value
	// LeaseLeft is how long until the lease lapses unless renewed.
	LeaseLeft time.Duration
	// StartedTask is the task id it was started with ("" when none).
	StartedTask string
	// TasksDone and TasksFailed count its shares of Learn tasks.
	TasksDone, TasksFailed uint64
}

// Stats returns the attached learners and the counters.
func (s *Service) Stats() Stats {
	conns := s.attached(nil)
	now := s.cfg.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{Attached: s.stats.attached, Removed: s.stats.removed, LearnOK: s.stats.learnOK,
		LearnFailed: s.stats.learnFailed, Resplits: s.stats.resplits, Learners: make([]LearnerStats, 0, len(conns))}
	if s.task != nil {
		st.TaskID = s.task.id
	}
	for _, c := range conns {
		st.Learners = append(st.Learners, LearnerStats{ID: c.id, Resources: maps.Clone(c.resources),
			LeaseLeft: c.leaseUntil.Sub(now), StartedTask: c.started, TasksDone: c.done, TasksFailed: c.failed})
	}
	return st
}

// StatsToProto is the Status RPC's reply for st.
func StatsToProto(st Stats) *rlhubv1.StatusResponse {
	resp := &rlhubv1.StatusResponse{TaskId: st.TaskID, AttachedTotal: st.Attached, RemovedTotal: st.Removed,
		LearnOk: st.LearnOK, LearnFailed: st.LearnFailed, Resplits: st.Resplits,
		Learners: make([]*rlhubv1.LearnerInfo, 0, len(st.Learners))}
	for _, l := range st.Learners {
		resp.Learners = append(resp.Learners, &rlhubv1.LearnerInfo{LearnerId: l.ID, Resources: l.Resources,
			LeaseRemainingMs: l.LeaseLeft.Milliseconds(), StartedTask: l.StartedTask, TasksDone: l.TasksDone, TasksFailed: l.TasksFailed})
	}
	return resp
}

// StatsFromProto is the inverse of StatsToProto.
func StatsFromProto(r *rlhubv1.StatusResponse) Stats {
	st := Stats{TaskID: r.GetTaskId(), Attached: r.GetAttachedTotal(), Removed: r.GetRemovedTotal(),
		LearnOK: r.GetLearnOk(), LearnFailed: r.GetLearnFailed(), Resplits: r.GetResplits()}
	for _, l := range r.GetLearners() {
		st.Learners = append(st.Learners, LearnerStats{ID: l.GetLearnerId(), Resources: maps.Clone(l.GetResources()),
			LeaseLeft: time.Duration(l.GetLeaseRemainingMs()) * time.Millisecond, StartedTask: l.GetStartedTask(),
			TasksDone: l.GetTasksDone(), TasksFailed: l.GetTasksFailed()})
	}
	return st
}

// HubStats is the Status RPC in the Go form Service.Stats returns.
func (c *Client) HubStats(ctx context.Context) (Stats, error) {
	r, err := c.Status(ctx)
	if err != nil {
		return Stats{}, err
	}
	return StatsFromProto(r), nil
}
