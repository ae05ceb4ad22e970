// Command nats_pub is the load generator for the NATS JetStream peer of the raftmq benchmarks.
//
// It is Go on the official client (nats.go, as Debian packages it) so that the figures are
// the server's, not a Python client's.  bench/nats_jetstream.py builds it on demand and
// drives it; each mode prints one JSON object on stdout.
//
//	create:   add the replicated stream (retrying while the cluster forms)
//	pub:      keep -window asynchronous publishes in flight for -warmup + -duration seconds,
//	          split over -conns connections (as bench/remoting_pub splits its window)
//	failover: kill -9 a server process, then time the first acknowledged publish
package main

import (
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"raftmqbench/report"
)

type flags struct {
	mode     string
	url      string
	stream   string
	subject  string
	replicas int
	size     int
	window   int
	conns    int
	warmup   time.Duration
	duration time.Duration
	killPid  int
	probe    time.Duration
	deadline time.Duration
}

func main() {
	var f flags
	flag.StringVar(&f.mode, "mode", "", "create | pub | failover")
	flag.StringVar(&f.url, "url", nats.DefaultURL, "server(s) to connect to, comma separated")
	flag.StringVar(&f.stream, "stream", "BENCH", "stream name")
	flag.StringVar(&f.subject, "subject", "bench.msgs", "subject the stream captures")
	flag.IntVar(&f.replicas, "replicas", 3, "stream replicas (create)")
	flag.IntVar(&f.size, "size", 1024, "payload bytes")
	flag.IntVar(&f.window, "window", 256, "publishes in flight (pub)")
	flag.IntVar(&f.conns, "conns", 1, "connections the window is split over (pub)")
	flag.DurationVar(&f.warmup, "warmup", time.Second, "load before measuring (pub)")
	flag.DurationVar(&f.duration, "duration", 10*time.Second, "measured load (pub)")
	flag.IntVar(&f.killPid, "kill-pid", 0, "process to kill -9 (failover)")
	flag.DurationVar(&f.probe, "probe", 5*time.Millisecond, "interval between probes (failover)")
	flag.DurationVar(&f.deadline, "deadline", 60*time.Second, "give up after this long")
	flag.Parse()

	nc, err := nats.Connect(f.url, nats.Name("raftmq-bench"), nats.MaxReconnects(-1))
	if err != nil {
		fail(err)
	}
	defer nc.Close()
	var out any
	switch f.mode {
	case "create":
		out, err = create(nc, f)
	case "pub":
		out, err = pubOver(nc, f)
	case "failover":
		out, err = failover(nc, f)
	default:
		err = fmt.Errorf("unknown -mode %q", f.mode)
	}
	report.Print("nats_pub", out, err)
}

func fail(err error) {
	report.Fail("nats_pub", err)
}

func payload(size int) []byte {
	// Random bytes, as the raftmq benchmark sends: nothing on the way may compress them.
	b := make([]byte, size)
	if _, err := rand.Read(b); err != nil {
		fail(err)
	}
	return b
}

// create adds the stream, retrying while the cluster has no meta leader yet or too few
// servers with JetStream to place the replicas on.
func create(nc *nats.Conn, f flags) (any, error) {
	js, err := nc.JetStream(nats.MaxWait(5 * time.Second))
	if err != nil {
		return nil, err
	}
	cfg := &nats.StreamConfig{
		Name:     f.stream,
		Subjects: []string{f.subject},
		Storage:  nats.FileStorage,
		Replicas: f.replicas,
	}
	end := time.Now().Add(f.deadline)
	for {
		info, err := js.AddStream(cfg)
		if err == nil && info.Cluster != nil && info.Cluster.Leader != "" {
			return map[string]any{"leader": info.Cluster.Leader}, nil
		}
		if err == nil {
			err = errors.New("stream has no leader yet")
		}
		if time.Now().After(end) {
			return nil, fmt.Errorf("create stream: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

type pending struct {
	sent time.Time
	ok   <-chan *nats.PubAck
	err  <-chan error
}

// pubOver runs pub on nc and -conns - 1 further connections at once, the window split
// between them (the first ones one more when it does not divide), all measuring the same
// -warmup and -duration, and sums what they measured.
func pubOver(nc *nats.Conn, f flags) (any, error) {
	if f.conns < 1 || f.conns > f.window {
		return nil, fmt.Errorf("-conns %d: between 1 and -window", f.conns)
	}
	conns := []*nats.Conn{nc}
	for len(conns) < f.conns {
		c, err := nats.Connect(f.url, nats.Name("raftmq-bench"), nats.MaxReconnects(-1))
		if err != nil {
			return nil, err
		}
		defer c.Close()
		conns = append(conns, c)
	}
	start := time.Now()
	measureFrom := start.Add(f.warmup)
	stopAt := measureFrom.Add(f.duration)
	tallies := make([]report.Tally, len(conns))
	errs := make([]error, len(conns))
	done := make(chan int)
	for k, c := range conns {
		window := report.Share(f.window, len(conns), k)
		go func(k int, c *nats.Conn) {
			tallies[k], errs[k] = pub(c, f, window, measureFrom, stopAt)
			done <- k
		}(k, c)
	}
	var total report.Tally
	for range conns {
		k := <-done
		if errs[k] != nil {
			return nil, errs[k]
		}
		total.Add(tallies[k])
	}
	return total.Out(f.duration), nil
}

// pub keeps exactly window publishes in flight on one connection: a slot is taken before
// PublishAsync and given back when the ack (or an error) for that publish arrives.  The
// acks of one stream come back in order, so one goroutine waits on the futures in the
// order they were sent and times each; a late ack would only make its successors' times
// late, never early.  Completions before measureFrom or after stopAt are not counted.
func pub(nc *nats.Conn, f flags, window int, measureFrom, stopAt time.Time) (report.Tally, error) {
	var t report.Tally
	// The library's own limit stays above the window so it never stalls a publish itself.
	js, err := nc.JetStream(nats.PublishAsyncMaxPending(window + 1))
	if err != nil {
		return t, err
	}
	data := payload(f.size)
	slots := make(chan struct{}, window)
	inflight := make(chan pending, window)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for p := range inflight {
			var e error
			select {
			case <-p.ok:
			case e = <-p.err:
			}
			now := time.Now()
			<-slots
			switch {
			case e != nil:
				t.Errors++
				if t.FirstError == "" {
					t.FirstError = e.Error()
				}
			case now.Before(measureFrom), now.After(stopAt):
			default:
				t.Acked++
				t.LatenciesMs = append(t.LatenciesMs, float64(now.Sub(p.sent).Nanoseconds())/1e6)
			}
		}
	}()
	for time.Now().Before(stopAt) {
		slots <- struct{}{}
		t0 := time.Now()
		paf, err := js.PublishAsync(f.subject, data)
		if err != nil {
			close(inflight)
			return t, err
		}
		t.Sent++
		inflight <- pending{sent: t0, ok: paf.Ok(), err: paf.Err()}
	}
	close(inflight)
	select {
	case <-done:
	case <-time.After(f.deadline):
		return t, errors.New("acks for the last publishes never came")
	}
	return t, nil
}

// failover proves the stream takes writes, kills -9 the process -kill-pid (the stream
// leader), then sends an asynchronous probe publish every -probe interval and reports the
// time from the kill to the first acknowledged one.  Probes rather than a synchronous loop:
// a publish swallowed by the dead leader or sent before a new leader exists would hold a
// synchronous loop for a whole timeout, so its resolution would be the timeout, not the
// probe interval.  Only probes sent after the kill count.
func failover(nc *nats.Conn, f flags) (any, error) {
	if f.killPid <= 0 {
		return nil, errors.New("-kill-pid is required")
	}
	js, err := nc.JetStream(nats.PublishAsyncMaxPending(1 << 20))
	if err != nil {
		return nil, err
	}
	data := payload(f.size)
	for i := 0; i < 20; i++ {
		if _, err := js.Publish(f.subject, data, nats.AckWait(5*time.Second)); err != nil {
			return nil, fmt.Errorf("before the kill: %w", err)
		}
		time.Sleep(15 * time.Millisecond)
	}
	killed := time.Now()
	if err := syscall.Kill(f.killPid, syscall.SIGKILL); err != nil {
		return nil, err
	}
	acked := make(chan time.Time, 1)
	probes, errs := 0, 0
	errCh := make(chan error, 1<<16)
	ticker := time.NewTicker(f.probe)
	defer ticker.Stop()
	giveUp := time.After(f.deadline)
	for {
		paf, err := js.PublishAsync(f.subject, data)
		if err != nil {
			return nil, err
		}
		probes++
		go func(paf nats.PubAckFuture) {
			select {
			case <-paf.Ok():
				select {
				case acked <- time.Now():
				default:
				}
			case e := <-paf.Err():
				errCh <- e
			}
		}(paf)
		select {
		case at := <-acked:
			for len(errCh) > 0 {
				<-errCh
				errs++
			}
			return map[string]any{
				"first_ack_ms": float64(at.Sub(killed).Nanoseconds()) / 1e6,
				"probes":       probes,
				"probe_errors": errs,
			}, nil
		case <-giveUp:
			return nil, fmt.Errorf("no publish acknowledged within %v of the kill", f.deadline)
		case <-ticker.C:
		}
	}
}
