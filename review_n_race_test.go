//go:build race

package quorumlock_test

// reviewNScale divides the sizes of review N's long-run and overload tests
// under the race detector, which runs them several times slower and
// allows at most 8,128 live goroutines.
const reviewNScale = 4
