//go:build !race

package quorumlock_test

// reviewNScale: see review_n_race_test.go.
const reviewNScale = 1
