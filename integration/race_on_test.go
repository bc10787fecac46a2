//go:build race

package integration

// raceDetector is set when the tests run with -race.
const raceDetector = true
