// Package reducer is the push-pull gradient server: secondaries take
// gradient pushes from clients, reduce them into batches and forward each
// batch to the primary, which owns the model and its optimizer, steps, and
// publishes version+1 to the model store. The pure rules (batching,
// staleness, exactly-once, counting) live in package reduce; the
// optimizers in package optim. docs/reducer.md is the user's guide.
//
// To run it:
//  1. A hub hosts a Service (New): the primary (Config.Store set,
//     Config.Primary "") and/or Config.Secondaries secondaries, which
//     attach to the in-process primary or to a remote one at
//     Config.Primary.
//  2. A model is pushed to the store (its initial weights), then registered
//     with the primary (Register RPC / Client.Register / Primary.Register)
//     with its optimizer, reduction, clipping and staleness rule.
//  3. Clients call Client.PushGrad; they pull new versions from the store.
//
// Exactly-once: before a secondary reduces a gradient it claims (client id,
// seq) at the primary under its session (reduce.Ledger). A claim is
// refused while that id is applied or pending anywhere, so a retry that
// lands on another secondary is never reduced twice; a session that ends
// (the secondary died) has its pending claims released, and the primary
// refuses any later forward from it.
//
// Counting: every push a secondary receives counts as pushed there, and
// ends as reduced then applied, or dropped with a reason (reduce.Reason),
// counted exactly once by whoever decided it. Summed over a primary and its
// secondaries once nothing is in flight, pushed = applied + dropped.
package reducer
