// Package repocheck holds tests about the repository itself: every package
// documents its role.
package repocheck
