// Command grpc_pub is the load generator for the gRPC rows of raftmq's broker benchmark.
//
// It speaks RocketMQ 5's apache.rocketmq.v2.MessagingService to mqproxy with grpc-go and
// hand-encoded protobuf (google.golang.org/protobuf/encoding/protowire), no client library,
// as bench/remoting_pub speaks remoting: what it measures is the proxy and the brokers, not
// a client's bookkeeping.  bench/broker_bench.py builds it (bench/gotools.py GoModule) and
// drives it; it prints one JSON object on stdout (raftmqbench/report).
//
// -mode send: -window SendMessage calls always in flight, over -conns HTTP/2 connections,
// one NORMAL message each to the topic (the proxy picks the queue), its body the born time
// (seconds since the epoch, big-endian float64) then random bytes up to -size.  Prints
// sent, acked, errors, first_error, acked_per_s and the call latency's p50/p99/max in ms.
//
// -mode receive: -window ReceiveMessage long polls always open (-batch messages each,
// -invisible, -poll), every message received acknowledged by its own AckMessage call, as
// Apache's clients acknowledge.  Prints received, acked, errors, empty (polls that found
// nothing in the window), acked_per_s over the window up to its last acknowledgement (a
// backlog that runs out does not dilute the rate) and the AckMessage latency's percentiles.
//
// Calls answered in the -warmup period and after -warmup + -duration are not counted.
// Every call carries the metadata Apache's clients send (x-mq-client-id and the rest), and
// before the first call the generator opens a Telemetry stream and writes its Settings
// (a producer's, or a simple consumer's with its subscription), as Apache's clients do:
// Apache's proxy serves a ReceiveMessage only for a client whose Settings it holds.
package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protowire"

	"raftmqbench/report"
)

const (
	service   = "/apache.rocketmq.v2.MessagingService/"
	codeOK    = 20000 // Code.OK
	notFound  = 40401 // Code.MESSAGE_NOT_FOUND: an empty long poll
	bornBytes = 8
)

type flags struct {
	addr, topic, group, broker, mode string
	size, window, conns, batch       int
	warmup, duration, deadline       time.Duration
	invisible, poll                  time.Duration
}

// tally is what the calls measured; one mutex guards it (the calls are few thousand a second).
type tally struct {
	mu                            sync.Mutex
	sent, received, acked, errors int
	empty                         int
	firstError                    string
	latenciesMs                   []float64
	lastCounted                   time.Time
	measureFrom, stopAt           time.Time
}

func (t *tally) fail(what string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.errors++
	if t.firstError == "" {
		t.firstError = what
	}
}

// done counts one acknowledged call that started at started if it ended in the window.
func (t *tally) done(started, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if now.Before(t.measureFrom) || now.After(t.stopAt) {
		return
	}
	t.acked++
	t.lastCounted = now
	t.latenciesMs = append(t.latenciesMs, float64(now.Sub(started).Nanoseconds())/1e6)
}

// rawCodec hands the bytes this tool encodes to gRPC as they are.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

func main() {
	var f flags
	flag.StringVar(&f.addr, "addr", "127.0.0.1:8081", "mqproxy's gRPC host:port")
	flag.StringVar(&f.mode, "mode", "send", "send or receive")
	flag.StringVar(&f.topic, "topic", "BenchTopic", "topic (it must exist)")
	flag.StringVar(&f.group, "group", "BENCH_CG", "consumer group (receive)")
	flag.StringVar(&f.broker, "broker", "RaftNode00", "broker group to receive from")
	flag.IntVar(&f.size, "size", 1024, "message body bytes (at least the 8-byte born time)")
	flag.IntVar(&f.window, "window", 256, "calls in flight (send) or long polls open (receive)")
	flag.IntVar(&f.conns, "conns", 4, "HTTP/2 connections")
	flag.IntVar(&f.batch, "batch", 32, "messages per ReceiveMessage")
	flag.DurationVar(&f.invisible, "invisible", 30*time.Second, "invisible duration of a receive")
	flag.DurationVar(&f.poll, "poll", time.Second, "long polling timeout of a receive")
	flag.DurationVar(&f.warmup, "warmup", time.Second, "load before measuring")
	flag.DurationVar(&f.duration, "duration", 10*time.Second, "measured load")
	flag.DurationVar(&f.deadline, "deadline", 30*time.Second, "wait this long for the last calls")
	flag.Parse()
	if f.window < 1 || f.conns < 1 || f.batch < 1 || f.duration <= 0 || (f.mode != "send" && f.mode != "receive") {
		report.Fail("grpc_pub", errors.New("-window, -conns, -batch and -duration must be positive, -mode send or receive"))
	}
	out, err := run(f)
	report.Print("grpc_pub", out, err)
}

func run(f flags) (map[string]any, error) {
	conns := make([]*grpc.ClientConn, f.conns)
	for k := range conns {
		// One ClientConn is one HTTP/2 connection; the calls take them in turn.
		cc, err := grpc.NewClient(f.addr,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
		if err != nil {
			return nil, err
		}
		defer cc.Close()
		conns[k] = cc
	}
	hostname, _ := os.Hostname()
	start := time.Now()
	t := &tally{measureFrom: start.Add(f.warmup)}
	t.stopAt = t.measureFrom.Add(f.duration)
	ctx := metadata.NewOutgoingContext(context.Background(), metadata.Pairs(
		"x-mq-client-id", fmt.Sprintf("%s@%d@0@%s", hostname, os.Getpid(), strconv.FormatInt(start.UnixNano(), 36)),
		// Apache's proxy takes this for one of remoting's LanguageCode names, where Go is
		// GO: its Telemetry fails on "GOLANG" (Language.GOLANG's name in the protobuf).
		"x-mq-language", "GO",
		"x-mq-protocol", "v2",
		"x-mq-client-version", "5.0.0",
		"x-mq-namespace", "",
		"x-mq-date-time", start.Format("20060102T150405Z"),
	))
	ctx, cancel := context.WithDeadline(ctx, t.stopAt.Add(f.deadline))
	defer cancel()
	if err := telemetry(ctx, conns[0], f); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	var padding []byte
	if f.size > bornBytes {
		padding = make([]byte, f.size-bornBytes)
	}
	// Random bytes, as the remoting generator sends: nothing on the way may compress them.
	if _, err := rand.Read(padding); err != nil {
		return nil, err
	}
	var wg sync.WaitGroup
	for k := 0; k < f.window; k++ {
		wg.Add(1)
		cc := conns[k%f.conns]
		go func() {
			defer wg.Done()
			if f.mode == "send" {
				sender(ctx, cc, f, t, k, padding)
			} else {
				receiver(ctx, cc, f, t)
			}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return nil, fmt.Errorf("calls still unanswered %s after the window", f.deadline)
	}
	elapsed := f.duration
	if f.mode == "receive" && t.lastCounted.After(t.measureFrom) {
		elapsed = t.lastCounted.Sub(t.measureFrom)
	}
	out := map[string]any{
		"sent":        t.sent,
		"received":    t.received,
		"acked":       t.acked,
		"errors":      t.errors,
		"empty":       t.empty,
		"acked_per_s": float64(t.acked) / elapsed.Seconds(),
	}
	report.AddLatencies(out, t.latenciesMs)
	if t.firstError != "" {
		out["first_error"] = t.firstError
	}
	return out, nil
}

// telemetry opens the Telemetry stream, writes this client's Settings and waits for the
// proxy's answer (status OK); the stream stays open until ctx ends. Settings: client_type=1
// PRODUCER(1) or SIMPLE_CONSUMER(3), access_point=2 {scheme=1 IPv4(1), addresses=2 {host=1,
// port=2}}, request_timeout=4 3 s, publishing=5 {topics=1} or subscription=6 {group=1,
// subscriptions=2 {topic=1, expression=2 {type=1 TAG(1), expression=2 "*"}},
// long_polling_timeout=5}, user_agent=7 {language=1 GOLANG(4), version=2}.
func telemetry(ctx context.Context, cc *grpc.ClientConn, f flags) error {
	host, portText, err := net.SplitHostPort(f.addr)
	if err != nil {
		return err
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return err
	}
	address := varintField(bytesField(nil, 1, []byte(host)), 2, port)
	settings := varintField(nil, 1, 1)
	if f.mode == "receive" {
		settings = varintField(nil, 1, 3)
	}
	settings = bytesField(settings, 2, bytesField(varintField(nil, 1, 1), 2, address))
	settings = bytesField(settings, 4, duration(3*time.Second))
	if f.mode == "receive" {
		filter := bytesField(varintField(nil, 1, 1), 2, []byte("*"))
		entry := bytesField(bytesField(nil, 1, resource(f.topic)), 2, filter)
		subscription := bytesField(bytesField(nil, 1, resource(f.group)), 2, entry)
		settings = bytesField(settings, 6, bytesField(subscription, 5, duration(f.poll)))
	} else {
		settings = bytesField(settings, 5, bytesField(nil, 1, resource(f.topic)))
	}
	settings = bytesField(settings, 7, bytesField(varintField(nil, 1, 4), 2, []byte("5.0.0")))
	command := bytesField(nil, 2, settings)
	desc := &grpc.StreamDesc{StreamName: "Telemetry", ServerStreams: true, ClientStreams: true}
	stream, err := cc.NewStream(ctx, desc, service+"Telemetry")
	if err != nil {
		return err
	}
	if err := stream.SendMsg(&command); err != nil {
		return err
	}
	var answer []byte
	if err := stream.RecvMsg(&answer); err != nil {
		return err
	}
	if s := field(answer, 1); s != nil {
		if code, message := status(s); code != codeOK {
			return fmt.Errorf("code %d: %s", code, message)
		}
	}
	return nil
}

// sender keeps one SendMessage call in flight until the window ends.
func sender(ctx context.Context, cc *grpc.ClientConn, f flags, t *tally, id int, padding []byte) {
	for n := 0; time.Now().Before(t.stopAt); n++ {
		t.mu.Lock()
		t.sent++
		t.mu.Unlock()
		started := time.Now()
		call(ctx, cc, t, "SendMessage", sendRequest(f.topic, fmt.Sprintf("%08X%08X", id, n), started, padding))
	}
}

// receiver keeps one ReceiveMessage long poll open until the window ends and acknowledges
// every message it receives, each by its own AckMessage call.
func receiver(ctx context.Context, cc *grpc.ClientConn, f flags, t *tally) {
	desc := &grpc.StreamDesc{StreamName: "ReceiveMessage", ServerStreams: true}
	request := receiveRequest(f)
	for time.Now().Before(t.stopAt) {
		stream, err := cc.NewStream(ctx, desc, service+"ReceiveMessage")
		if err == nil {
			err = stream.SendMsg(&request)
		}
		if err == nil {
			err = stream.CloseSend()
		}
		if err != nil {
			t.fail(err.Error())
			continue
		}
		var handles [][2][]byte // message id, receipt handle
		for {
			var response []byte
			if err := stream.RecvMsg(&response); err != nil {
				if !errors.Is(err, io.EOF) {
					t.fail(err.Error())
				}
				break
			}
			if s := field(response, 1); s != nil {
				code, message := status(s)
				switch {
				case code == notFound:
					t.mu.Lock()
					if time.Now().After(t.measureFrom) {
						t.empty++
					}
					t.mu.Unlock()
				case code != codeOK:
					t.fail(fmt.Sprintf("code %d: %s", code, message))
				}
			}
			if m := field(response, 2); m != nil {
				system := field(m, 3)
				handles = append(handles, [2][]byte{field(system, 3), field(system, 12)})
			}
		}
		t.mu.Lock()
		t.received += len(handles)
		t.mu.Unlock()
		var acks sync.WaitGroup
		for _, h := range handles {
			acks.Add(1)
			go func() {
				defer acks.Done()
				call(ctx, cc, t, "AckMessage", ackRequest(f, h[0], h[1]))
			}()
		}
		acks.Wait()
	}
}

// call makes one unary call and counts it: done when its response's status=1 is OK, else
// an error naming the method and the code.
func call(ctx context.Context, cc *grpc.ClientConn, t *tally, method string, request []byte) {
	started := time.Now()
	var response []byte
	if err := cc.Invoke(ctx, service+method, &request, &response); err != nil {
		t.fail(err.Error())
		return
	}
	if code, message := status(field(response, 1)); code != codeOK {
		t.fail(fmt.Sprintf("%s: code %d: %s", method, code, message))
		return
	}
	t.done(started, time.Now())
}

// sendRequest is a SendMessageRequest of one NORMAL message:
//
//	messages=1 { topic=1 {name=2}, system_properties=3 {message_id=3, body_encoding=5
//	IDENTITY(1), message_type=6 NORMAL(1), born_timestamp=7 {seconds=1, nanos=2},
//	born_host=8}, body=4 }
func sendRequest(topic, messageID string, born time.Time, padding []byte) []byte {
	system := bytesField(nil, 3, []byte(messageID))
	system = varintField(system, 5, 1)
	system = varintField(system, 6, 1)
	system = bytesField(system, 7, secondsNanos(uint64(born.Unix()), uint64(born.Nanosecond())))
	system = bytesField(system, 8, []byte("127.0.0.1"))
	body := make([]byte, bornBytes, bornBytes+len(padding))
	binary.BigEndian.PutUint64(body, math.Float64bits(float64(born.UnixNano())/1e9))
	body = append(body, padding...)
	message := bytesField(nil, 1, resource(topic))
	message = bytesField(message, 3, system)
	message = bytesField(message, 4, body)
	return bytesField(nil, 1, message)
}

// receiveRequest is a ReceiveMessageRequest: group=1, message_queue=2 {topic=1, broker=4
// {name=1}} (the proxy pops every queue of the broker group), filter_expression=3 {type=1
// TAG(1), expression=2 "*"}, batch_size=4, invisible_duration=5, long_polling_timeout=7.
func receiveRequest(f flags) []byte {
	queue := bytesField(nil, 1, resource(f.topic))
	queue = bytesField(queue, 4, bytesField(nil, 1, []byte(f.broker)))
	filter := varintField(nil, 1, 1)
	filter = bytesField(filter, 2, []byte("*"))
	request := bytesField(nil, 1, resource(f.group))
	request = bytesField(request, 2, queue)
	request = bytesField(request, 3, filter)
	request = varintField(request, 4, uint64(f.batch))
	request = bytesField(request, 5, duration(f.invisible))
	return bytesField(request, 7, duration(f.poll))
}

// ackRequest is an AckMessageRequest of one entry: group=1, topic=2, entries=3
// {message_id=1, receipt_handle=2}.
func ackRequest(f flags, messageID, handle []byte) []byte {
	entry := bytesField(bytesField(nil, 1, messageID), 2, handle)
	request := bytesField(nil, 1, resource(f.group))
	request = bytesField(request, 2, resource(f.topic))
	return bytesField(request, 3, entry)
}

// resource is a Resource {name=2}.
func resource(name string) []byte { return bytesField(nil, 2, []byte(name)) }

// duration is a google.protobuf.Duration {seconds=1, nanos=2}.
func duration(d time.Duration) []byte {
	return secondsNanos(uint64(d/time.Second), uint64(d%time.Second))
}

// secondsNanos is a google.protobuf.Timestamp or Duration {seconds=1, nanos=2}.
func secondsNanos(seconds, nanos uint64) []byte {
	return varintField(varintField(nil, 1, seconds), 2, nanos)
}

// bytesField appends a length-delimited field (a string, bytes or a message).
func bytesField(out []byte, number protowire.Number, value []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(out, number, protowire.BytesType), value)
}

// varintField appends a varint field (an integer or an enum).
func varintField(out []byte, number protowire.Number, value uint64) []byte {
	return protowire.AppendVarint(protowire.AppendTag(out, number, protowire.VarintType), value)
}

// status is a Status's code=1 and message=2 (code 0 when status is absent or malformed).
func status(s []byte) (int, string) {
	code, message := 0, ""
	walk(s, func(number protowire.Number, typ protowire.Type, value []byte, varint uint64) {
		switch {
		case number == 1 && typ == protowire.VarintType:
			code = int(varint)
		case number == 2 && typ == protowire.BytesType:
			message = string(value)
		}
	})
	return code, message
}

// field is the last length-delimited field number of a message (nil when absent).
func field(m []byte, number protowire.Number) []byte {
	var found []byte
	walk(m, func(n protowire.Number, typ protowire.Type, value []byte, _ uint64) {
		if n == number && typ == protowire.BytesType {
			found = value
		}
	})
	return found
}

// walk calls visit for each field of a message, stopping at the first malformed byte.
func walk(m []byte, visit func(protowire.Number, protowire.Type, []byte, uint64)) {
	for len(m) > 0 {
		number, typ, n := protowire.ConsumeTag(m)
		if n < 0 {
			return
		}
		m = m[n:]
		var value []byte
		var varint uint64
		switch typ {
		case protowire.VarintType:
			varint, n = protowire.ConsumeVarint(m)
		case protowire.BytesType:
			value, n = protowire.ConsumeBytes(m)
		default:
			n = protowire.ConsumeFieldValue(number, typ, m)
		}
		if n < 0 {
			return
		}
		visit(number, typ, value, varint)
		m = m[n:]
	}
}
