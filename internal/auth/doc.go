// Package auth decides who may call what on a hub: bearer tokens, each
// with a role and model-name scopes, checked on every gRPC call (unary and
// stream interceptors), at each data-plane connection's hello and on each
// of its requests (a bulk.HelloGuard), against one policy table (Policy)
// that docs/security.md renders.
//
// To use it:
//  1. Issue tokens with NewToken; put each one's Line in the hub's token
//     file (only SHA-256 hashes are stored).
//  2. LoadFile (or NewVerifier) reads the file into a *Verifier.
//  3. Serve gRPC with v.UnaryInterceptor() and v.StreamInterceptor(), and
//     set the data plane's Guard to v.
//  4. Handlers read the caller with FromContext.
//
// A nil *Verifier admits every call (the loopback default with no token
// file): every method treats the caller as an unscoped admin.
//
// Roles are ordered: reader < worker < trainer < admin; a role may do what
// every lower role may. A scope is a model-name prefix; a token covers a
// model when one of its scopes is a prefix of the name ("" or "*" covers
// every model). An empty or absent model name in a request means every
// model, so only an unscoped token may send one.
package auth
