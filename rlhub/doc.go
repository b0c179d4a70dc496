// Package rlhub is the public Go client of an rlhub hub: the model store,
// gradients to the reducer, weight sync for collectors, learners for the
// aggregator and ARS workers. It is a thin layer over the clients the
// rlhub binary itself uses (under internal/), with its own Config types,
// so that a Go program outside this module can import it:
//
//	import "github.com/rlhub/rlhub/rlhub"
//
// It lives in a directory of its own rather than at the module root so the
// root stays a repository (cmd/, internal/, python/, docs/) and the import
// path names what it is; the types it shares with the hub (StateDict,
// Snapshot, ModelInfo, …) are aliases of the internal ones, so values pass
// between this package and the hub's code without copies.
//
// A program:
//
//  1. Dials the store (DialStore) and pushes version 1 of a model
//     (StoreClient.Push; versions only grow, and Expect makes a push a
//     compare-and-set).
//  2. Keeps a collector's weights current with NewCollector (the hub's
//     push stream, the same fan-out on its data plane, or store pulls) and
//     Collector.Poll or Collector.Run; the collector reports the version it
//     runs, so `rlhub sync status` shows its lag.
//  3. Trains through the hub: RegisterModel once (the optimizer runs on
//     the hub), then GradClient.Push for each gradient.
//  4. Serves the aggregator's learn tasks with RunLearner, or the hub's
//     ARS run with RunARSWorker.
//
// Every Config has a Security field (TLS, mutual TLS, a bearer token:
// LoadSecurity, SecurityFromEnv), and every client connects through the
// same seam as the rlhub binary. Every hub address may name a cluster
// instead ("h1:p1,h2:p2", or ClusterTarget for etcd): the client then
// finds the primary and follows it across failovers (docs/cluster.md,
// Clients).
//
// Errors match the sentinels below with errors.Is (ErrStaleVersion,
// ErrNotFound, …), whichever transport carried them.
package rlhub
