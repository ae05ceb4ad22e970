// Apache RocketMQ's Go client (github.com/apache/rocketmq-client-go/v2) driven from a
// test, one role a process, as bench/java/Peer.java drives the Java one:
//
//	rocketmq_go produce NAMESRV TOPIC INTERVAL_S
//	rocketmq_go consume NAMESRV TOPIC GROUP
//
// produce: a Producer sends bodies "0", "1", ... with SendSync, one every INTERVAL_S at
// most, and prints {"event": "sent" or "failed", "n", "start", "end", "msg_id",
// "queue_id", "queue_offset" or "error"} per message. consume: a PushConsumer (clustering,
// from the first offset) prints {"event": "started"} once started, then {"event":
// "consumed", "body", "t", "msg_id", "queue_id", "queue_offset", "reconsume_times"} per
// delivery. Both run until stdin closes. Times are CLOCK_MONOTONIC seconds, the clock
// Python's time.monotonic() reads.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/apache/rocketmq-client-go/v2/rlog"
	"golang.org/x/sys/unix"
)

var printLock sync.Mutex

func emit(event map[string]any) {
	line, err := json.Marshal(event)
	if err != nil {
		panic(err)
	}
	printLock.Lock()
	defer printLock.Unlock()
	os.Stdout.Write(append(line, '\n'))
}

func now() float64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return float64(ts.Sec) + float64(ts.Nsec)/1e9
}

// untilStdinCloses sets done when the test closes our stdin.
func untilStdinCloses(done *atomic.Bool) {
	io.Copy(io.Discard, os.Stdin)
	done.Store(true)
}

func produce(namesrv, topic string, intervalS float64, done *atomic.Bool) error {
	p, err := rocketmq.NewProducer(
		producer.WithNameServer([]string{namesrv}),
		producer.WithGroupName("GoPeerProducer"),
		producer.WithRetry(2),
	)
	if err != nil {
		return err
	}
	if err := p.Start(); err != nil {
		return err
	}
	defer p.Shutdown()
	for n := 0; !done.Load(); n++ {
		start := now()
		result, err := p.SendSync(context.Background(), primitive.NewMessage(topic, []byte(strconv.Itoa(n))))
		switch {
		case err != nil:
			emit(map[string]any{"event": "failed", "n": n, "start": start, "end": now(), "error": err.Error()})
		case result.Status != primitive.SendOK:
			emit(map[string]any{"event": "failed", "n": n, "start": start, "end": now(), "error": fmt.Sprint(result.Status)})
		default:
			emit(map[string]any{
				"event": "sent", "n": n, "start": start, "end": now(), "msg_id": result.MsgID,
				"queue_id": result.MessageQueue.QueueId, "queue_offset": result.QueueOffset,
			})
		}
		if wait := start + intervalS - now(); wait > 0 {
			time.Sleep(time.Duration(wait * float64(time.Second)))
		}
	}
	return nil
}

func consume(namesrv, topic, group string, done *atomic.Bool) error {
	c, err := rocketmq.NewPushConsumer(
		consumer.WithGroupName(group),
		consumer.WithNsResolver(primitive.NewPassthroughResolver([]string{namesrv})),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
	)
	if err != nil {
		return err
	}
	err = c.Subscribe(topic, consumer.MessageSelector{}, func(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		for _, m := range msgs {
			emit(map[string]any{
				"event": "consumed", "body": string(m.Body), "t": now(), "msg_id": m.MsgId,
				"queue_id": m.Queue.QueueId, "queue_offset": m.QueueOffset, "reconsume_times": m.ReconsumeTimes,
			})
		}
		return consumer.ConsumeSuccess, nil
	})
	if err != nil {
		return err
	}
	if err := c.Start(); err != nil {
		return err
	}
	defer c.Shutdown()
	emit(map[string]any{"event": "started"})
	for !done.Load() {
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

func main() {
	rlog.SetLogLevel("error")
	var done atomic.Bool
	go untilStdinCloses(&done)
	var err error
	switch role := os.Args[1]; role {
	case "produce":
		intervalS, perr := strconv.ParseFloat(os.Args[4], 64)
		if perr != nil {
			fmt.Fprintln(os.Stderr, "INTERVAL_S:", perr)
			os.Exit(2)
		}
		err = produce(os.Args[2], os.Args[3], intervalS, &done)
	case "consume":
		err = consume(os.Args[2], os.Args[3], os.Args[4], &done)
	default:
		fmt.Fprintf(os.Stderr, "unknown role %q: produce or consume\n", role)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
