package procs

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
)

// Metrics is a scrape of a service's GET /metrics (Prometheus text format):
// one "name{labels} value" sample per element.
type Metrics []string

// Scrape fetches base + "/metrics".
func Scrape(client *http.Client, base string) (Metrics, error) {
	resp, err := client.Get(base + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	var m Metrics
	for _, l := range strings.Split(string(b), "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			m = append(m, l)
		}
	}
	return m, nil
}

// Sum returns the sum of the samples of the metric name (all labels).
func (m Metrics) Sum(name string) float64 {
	sum := 0.0
	for _, s := range m {
		if strings.HasPrefix(s, name+"{") {
			sum += value(s)
		}
	}
	return sum
}

// Decisions returns idem_decisions_total (idemotel's idem.decisions) summed
// by outcome, e.g. {"acquired": 3, "replayed": 1}.
func (m Metrics) Decisions() map[string]float64 {
	got := map[string]float64{}
	for _, s := range m {
		if !strings.HasPrefix(s, "idem_decisions_total{") {
			continue
		}
		_, rest, _ := strings.Cut(s, `idem_outcome="`)
		outcome, _, _ := strings.Cut(rest, `"`)
		got[outcome] += value(s)
	}
	return got
}

// value returns a sample's value, NaN if it does not parse.
func value(sample string) float64 {
	v, err := strconv.ParseFloat(sample[strings.LastIndexByte(sample, ' ')+1:], 64)
	if err != nil {
		return math.NaN()
	}
	return v
}
