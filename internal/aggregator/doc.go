// Package aggregator is the learner aggregator: one coordinator drives many
// data-parallel learners that attach, fail and rejoin at any time.
//
// The pure core (core.go) splits a batch along its first dimension by each
// learner's declared demand (Split, Resplit, SliceRows), follows a task's
// shares through learner failures (Plan), and merges demands (MergeDemand)
// and infos (MergeInfo); it has no goroutines or clocks. The
// Service (service.go) is the thin concurrent shell hosted by the hub:
//
//  1. Learners open the Attach stream, send a Hello and then anything
//     (heartbeats, replies) at least once per lease. A broken stream or an
//     expired lease removes the learner; the event is logged and counted.
//  2. The coordinator calls Start(task_info) (every attached learner must
//     accept), GetDataDemand (merged demand; the learner order and batch
//     sizes are recorded with the task) and Learn(batch) (split in the
//     recorded order, fanned out, info merged in row order).
//  3. Every wait for a learner is bounded by Config.TaskTimeout and the
//     caller's deadline. A learner that fails, times out or vanishes during
//     a task is excluded: by Config.OnFailure its rows are re-split over the
//     remaining learners, or the task fails with an error naming it. A
//     learner that times out or whose share was interrupted mid-send is
//     also detached (its stream is no longer usable); it may re-attach.
//  4. If membership changed since GetDataDemand (a recorded learner left),
//     Learn recomputes the split over the recorded learners still present:
//     every row is processed exactly once or the task fails. Learners that
//     attached after GetDataDemand are used from the next GetDataDemand.
//
// Client is the coordinator's Go client; package learner is the learner's.
package aggregator
