// Package e2e holds only tests: the deployments the docs describe, run
// for real on a testkit.Lab (network namespaces: each "machine" its own
// address, loopback and hostname), with real etcd members, `rlhub serve`,
// `serve --role reducer` and `rlhub relay` processes, and learners and
// collectors that run on their own lab hosts (this test binary re-executed
// there, e2e_child_test.go). A machine dies by having its link cut and
// every process on it SIGKILLed at once, as a power loss does: nothing it
// held is closed cleanly, its connections stall rather than reset.
//
// The tests need root and iproute2 (as testkit.NewLab); elsewhere they
// skip with the reason.
package e2e
