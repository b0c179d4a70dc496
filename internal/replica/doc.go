// Package replica is the cluster's replication and roles: a standby hub
// follows the primary's data directory (model versions, reducer
// registrations, journals and optimizer state, ARS run state) into its own
// --data over one gRPC stream, and refuses every call with the standby
// refusal (internal/cluster); the primary's store writes carry the term's
// epoch and wait for the standbys' acknowledgements and a term check
// before they are acknowledged; a standby elected primary opens the hub on
// its copy — the same restart path a hub killed and restarted on its
// --data takes (docs/durability.md) — and a primary whose term ends steps
// down to a standby by itself.
//
// What is replicated is files, not operations: every unit is a cut of the
// primary's ars/, reducer/ and store/ taken with store commits held off, so
// the copy is a state the primary's disk itself passed through and every
// component recovers from it with the code it already has. See
// docs/cluster.md for the contracts and what failover may lose.
//
// Use: NewNode(NodeConfig) then Node.Run(ctx) (what `rlhub serve --etcd`
// does). Source, Follower and Fenced are its parts, usable alone in tests.
package replica
