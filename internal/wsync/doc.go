// Package wsync is weight sync: it gets the newest version of a model to
// every collector (actor, inference worker), fast, never torn, with each
// collector's version visible so lag can be measured.
//
// One interface, two sides. A sender publishes whole versions; a Receiver
// applies the newest one to a collector's weights, either by asking "the
// newest if newer than mine" (Poll) or by following a stream of versions
// (Run). Both sides know versions, and applying a version the receiver
// already runs is a no-op. The transports differ only in the Source a
// Receiver reads from:
//
//   - Board: in-process; readers get the publisher's *store.Snapshot, no
//     byte is copied per reader.
//   - Shm (package wsync/shm: shm.Writer / shm.Reader): a same-host segment in /dev/shm, a
//     double buffer (or more slots) of seqlocked slots with a CRC-32C per
//     version, layout in docs/shm-layout.md, readable from Python with
//     numpy. Readers copy a version out, or lease its slot and use it in
//     place (shm.ReaderConfig.Lease) while the writer writes around it.
//   - StoreSource: pull / watch a store.Store (in process, or a client of
//     the store service that has the same methods).
//   - Service + Client: the hub's push fan-out (proto/rlhub/v1/sync.proto);
//     one goroutine per attached collector, each sends the newest version
//     when it is ready, so a slow collector skips versions and never delays
//     the others.
//   - Relay (package wsync/relay): subscribes to an upstream hub once and serves the host's
//     collectors from shared memory and its own stream; Failover makes
//     collectors fall back to the upstream when the relay dies.
//
// To receive:
//  1. Build a Source for the transport (NewBoard, shm.Open, StoreSource,
//     Dial, NewFailover).
//  2. NewReceiver(ReceiverConfig{Source: src, Apply: ...}).
//  3. Call Poll between episodes, or run Run(ctx) in a goroutine you own.
//  4. Report Receiver.Version() to the hub (Client does it on its stream;
//     Reporter for other transports) so the hub can show lag.
package wsync
