// Package metrics is rlhub's observability endpoint: a Prometheus adapter
// over each service's Stats() and a small live dashboard, served on one
// HTTP address (`--metrics-listen`).
//
// Nothing is counted for it: every metric is read from a Stats() struct
// when /metrics is scraped (or the dashboard polls /api/state), so a
// process started without --metrics-listen pays nothing, and one with it
// pays only per scrape and per dashboard reading. gRPC server metrics are
// the exception: they come from interceptors (GRPCServerMetrics) that are
// installed only when the endpoint is on.
//
// What it pays follows time, not the number of clients (shared):
// scrapes that arrive while a gather is in progress share it, and a
// finished gather is never reused, so a scrape shows figures read after
// it arrived or since the start of the gather it joined. Dashboard
// requests share a reading in progress too, and one that arrives within
// Config.StateReuse (500ms) of the last reading's start is answered from
// it: its figures are at most that old (State.Time says when they were
// read). docs/metrics.md, "What a request costs".
//
// To use it:
//  1. Fill Sources with the Stats functions of the services this process
//     hosts (nil fields are left out).
//  2. Optionally create GRPCServerMetrics and pass its ServerOptions to
//     grpc.NewServer, and the value as Config.GRPC.
//  3. New(cfg) listens; Run(ctx) serves until ctx is done, then shuts the
//     HTTP server down and returns.
//
// The metric names, types, labels and meanings are the table in
// docs/metrics.md (a test keeps the two in step: Families).
package metrics
