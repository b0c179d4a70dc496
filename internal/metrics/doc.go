// Package metrics is rlhub's observability endpoint: a Prometheus adapter
// over each service's Stats() and a small live dashboard, served on one
// HTTP address (`--metrics-listen`).
//
// Nothing is counted for it: every metric is read from a Stats() struct
// when /metrics is scraped (or the dashboard polls /api/state), so a
// process started without --metrics-listen pays nothing, and one with it
// pays only per scrape. gRPC server metrics are the exception: they come
// from interceptors (GRPCServerMetrics) that are installed only when the
// endpoint is on.
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
