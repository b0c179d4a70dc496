// Package shm is weight sync's same-host transport: a Writer publishes
// whole versions of one model into a segment in /dev/shm (seqlocked slots,
// a CRC-32C per version, a futex wake-up; docs/shm-layout.md is the
// layout), and a Reader on the same host gets the newest whole version,
// copying it out or leasing its slot to use in place while the writer
// writes around it. A Writer is a wsync.Publisher and a Reader a
// wsync.Source (the wsync package checks both), so the relay and the
// Failover use them like every other transport. Linux only; elsewhere
// Create and Open fail with errors.ErrUnsupported.
package shm
