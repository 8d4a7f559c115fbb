// Package sim is a deterministic simulation of idem (tests only).
package sim
