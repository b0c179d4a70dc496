// Package storerpc is the model store's transport: the gRPC service that
// serves a store.Store (the ModelStore service in
// proto/rlhub/v1/store.proto, hosted by the hub) and the Go client of that
// service. The store's rules live in the transport-free core,
// internal/store; this package only carries them over the network.
//
// # Service
//
// Pulls and watches stream the stored snapshot's bytes with
// wire.ChunksOf: every chunk is a slice of the shared immutable
// Snapshot.Blob, so no reader causes a copy or re-encode on rlhub's side
// (gRPC's marshalling into its frame buffer is the one copy). Pushes are
// checked for name and announced size before any receive buffer is
// allocated, then assembled with wire.Assembler and handed to the store,
// which decides; a truncated or malformed stream changes nothing.
//
// # Client
//
// A *Client implements store.Store, so code written against the store runs
// unchanged against a remote hub (the storetest suite checks exactly that).
//
// Every call runs under a deadline (the caller's, or
// ClientConfig.CallTimeout when the caller set none). Calls that fail with
// Unavailable are retried with jittered exponential backoff up to
// ClientConfig.MaxAttempts; Watch reconnects and resumes after the last
// version it delivered. Errors come back through errs.FromStatus, so
// errors.Is(err, errs.ErrNotFound) and errors.As(err, &*errs.StaleError)
// work as they do in-process.
//
// A retried Push whose first attempt landed but whose reply was lost fails
// with a *errs.StaleError whose CurrentVersion is the pushed version.
//
// Pulls (Get, GetIfNewer, their Into forms) and WaitNewer go over the
// hub's data plane when the client dialed ClientConfig.Addr itself
// (docs/wire.md, "Pulls on the data plane"): the version is read from the
// socket straight into its destination, and a connection that breaks
// inside it is errs.ErrUnavailable (retried), never a short snapshot.
// Against a hub without the data plane, or without the methods, they use
// gRPC. ClientConfig.Transport "grpc" forces gRPC.
package storerpc
