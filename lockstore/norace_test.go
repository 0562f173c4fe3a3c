//go:build !race

package lockstore

const raceEnabled = false
