// Package report is how the benchmarks' Go tools (bench/nats_pub, bench/remoting_pub) hand
// their figures to Python: one JSON object on stdout and exit status 0, or the reason on
// stderr and exit status 1; latency percentiles taken as the Python benchmarks take them.
package report

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"time"
)

// Print writes out as the tool's whole output, or fails with err if there is one.
func Print(tool string, out any, err error) {
	if err == nil {
		err = json.NewEncoder(os.Stdout).Encode(out)
	}
	if err != nil {
		Fail(tool, err)
	}
}

// Fail ends the tool with err as its reason.
func Fail(tool string, err error) {
	fmt.Fprintf(os.Stderr, "%s: %v\n", tool, err)
	os.Exit(1)
}

// AddLatencies sorts latenciesMs and sets out's p50_ms, p99_ms and max_ms (null when empty).
func AddLatencies(out map[string]any, latenciesMs []float64) {
	sort.Float64s(latenciesMs)
	out["p50_ms"] = percentile(latenciesMs, 0.50)
	out["p99_ms"] = percentile(latenciesMs, 0.99)
	out["max_ms"] = percentile(latenciesMs, 1)
}

// percentile is sorted[min(n-1, int(q*n))], as bench/dledger_bench.py's percentile.
func percentile(sorted []float64, q float64) any {
	n := len(sorted)
	if n == 0 {
		return nil
	}
	i := int(q * float64(n))
	if i > n-1 {
		i = n - 1
	}
	return sorted[i]
}

// Tally is what a load generator's connection measured in its window; Add sums them.
type Tally struct {
	Sent, Acked, Errors int
	FirstError          string
	LatenciesMs         []float64
}

// Add counts o into t; t's first error stays first.
func (t *Tally) Add(o Tally) {
	t.Sent += o.Sent
	t.Acked += o.Acked
	t.Errors += o.Errors
	if t.FirstError == "" {
		t.FirstError = o.FirstError
	}
	t.LatenciesMs = append(t.LatenciesMs, o.LatenciesMs...)
}

// Out is the tool's output for t measured over duration: sent, acked, errors, acked_per_s,
// the latency percentiles, and first_error when there was one.
func (t Tally) Out(duration time.Duration) map[string]any {
	out := map[string]any{
		"sent":        t.Sent,
		"acked":       t.Acked,
		"errors":      t.Errors,
		"acked_per_s": float64(t.Acked) / duration.Seconds(),
	}
	AddLatencies(out, t.LatenciesMs)
	if t.FirstError != "" {
		out["first_error"] = t.FirstError
	}
	return out
}

// Share is connection k's share of window requests in flight over conns connections: the
// first ones one more when conns does not divide window.
func Share(window, conns, k int) int {
	share := window / conns
	if k < window%conns {
		share++
	}
	return share
}
