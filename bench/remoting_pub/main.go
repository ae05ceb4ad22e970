// Command remoting_pub is the load generator for raftmq's broker benchmark.
//
// It speaks RocketMQ's remoting protocol over TCP with the standard library alone, so that
// its CPU on the cores the brokers share is that of a compiled generator, as NATS's Go
// publisher (bench/nats_pub) is in the same run.  bench/broker_bench.py builds it on
// demand (bench/gotools.py) and drives it; it prints one JSON object on stdout.
//
// The load: -window SEND_MESSAGE_V2 requests always in flight, split over -conns
// connections to one broker.  Each request carries one message to the next of the topic's
// -queues queues in turn; every read's responses are answered with as many new requests
// in one write.  With -topics N above 1 the messages go to N topics, <topic>-0 to
// <topic>-(N-1), each with -queues queues, every (topic, queue) in turn, so the load is
// spread over N x -queues queues.  A frame is
//
//	int32 length | int32 (serialize type << 24 | header length) | JSON header | body
//
// all big-endian, the length counting everything after itself.  The header is the one a
// RocketMQ 4.9 Java producer sends (SendMessageRequestHeaderV2's one-letter fields, every
// value a string), encoded once per queue; only the opaque (the request id a response
// echoes) is written per request.  The body is the born time, seconds since the epoch as a
// big-endian float64 (the benchmark's consumers subtract it for the end-to-end latency),
// then random bytes up to -size.  Of a response only the header's code and opaque are read.
//
// Responses in the -warmup period and after the -warmup + -duration window are not
// counted; latency is the time from the write of a request to the read of its response.
package main

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"time"

	"raftmqbench/report"
)

const (
	sendMessageV2 = 310 // RequestCode.SEND_MESSAGE_V2
	success       = 0   // ResponseCode.SUCCESS
	flagResponse  = 1   // bit 0 of a command's flag: a response, not a request
	jsonSerialize = 0   // serialize type byte of a JSON header
	bornBytes     = 8
	readBytes     = 1 << 16
)

type flags struct {
	addr     string
	topic    string
	topics   int
	group    string
	queues   int
	size     int
	window   int
	conns    int
	warmup   time.Duration
	duration time.Duration
	deadline time.Duration
}

func main() {
	var f flags
	flag.StringVar(&f.addr, "addr", "127.0.0.1:10911", "broker host:port")
	flag.StringVar(&f.topic, "topic", "BenchTopic", "topic to send to (it must exist)")
	flag.IntVar(&f.topics, "topics", 1, "spread the load over this many topics, <topic>-0 ... (above 1)")
	flag.StringVar(&f.group, "group", "BENCH_PG", "producer group")
	flag.IntVar(&f.queues, "queues", 8, "the topic's queues, sent to in turn")
	flag.IntVar(&f.size, "size", 1024, "message body bytes (at least the 8-byte born time)")
	flag.IntVar(&f.window, "window", 256, "requests in flight over all connections")
	flag.IntVar(&f.conns, "conns", 4, "connections")
	flag.DurationVar(&f.warmup, "warmup", time.Second, "load before measuring")
	flag.DurationVar(&f.duration, "duration", 10*time.Second, "measured load")
	flag.DurationVar(&f.deadline, "deadline", 30*time.Second, "wait this long for the last responses")
	flag.Parse()
	if f.queues < 1 || f.topics < 1 || f.window < 1 || f.conns < 1 || f.duration <= 0 {
		report.Fail("remoting_pub", errors.New("-queues, -topics, -window, -conns and -duration must be positive"))
	}
	if f.conns > f.window {
		f.conns = f.window
	}
	out, err := run(f)
	report.Print("remoting_pub", out, err)
}

func run(f flags) (map[string]any, error) {
	var padding []byte
	if f.size > bornBytes {
		padding = make([]byte, f.size-bornBytes)
	}
	// Random bytes, as NATS's publisher sends: nothing on the way may compress them.
	if _, err := rand.Read(padding); err != nil {
		return nil, err
	}
	start := time.Now()
	measureFrom := start.Add(f.warmup)
	stopAt := measureFrom.Add(f.duration)
	type outcome struct {
		t   report.Tally
		err error
	}
	done := make(chan outcome, f.conns)
	for k := 0; k < f.conns; k++ {
		share := report.Share(f.window, f.conns, k)
		// The connections start apart, so that a short run reaches every queue.
		first := k * f.topics * f.queues / f.conns
		c := &connection{f: f, padding: padding, queue: first, measureFrom: measureFrom, stopAt: stopAt}
		go func() {
			t, err := c.run(share)
			done <- outcome{t, err}
		}()
	}
	var all report.Tally
	var firstErr error
	for k := 0; k < f.conns; k++ {
		o := <-done
		if o.err != nil && firstErr == nil {
			firstErr = o.err
		}
		all.Add(o.t)
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return all.Out(f.duration), nil
}

// connection is one TCP connection's share of the window, run by one goroutine.
type connection struct {
	f           flags
	padding     []byte
	queue       int // the (topic, queue) the next request goes to: an index of headers
	measureFrom time.Time
	stopAt      time.Time
	headers     [][2][]byte // per queue: the JSON header before and after the opaque
	opaque      int32
	sentAt      map[int32]time.Time
	t           report.Tally
}

// header is what a response's JSON header is read for.
type header struct {
	Code   int    `json:"code"`
	Opaque int32  `json:"opaque"`
	Flag   int    `json:"flag"`
	Remark string `json:"remark"`
}

func (c *connection) run(share int) (report.Tally, error) {
	nc, err := net.Dial("tcp", c.f.addr)
	if err != nil {
		return c.t, err
	}
	defer nc.Close()
	if err := nc.SetDeadline(c.stopAt.Add(c.f.deadline)); err != nil {
		return c.t, err
	}
	c.headers = make([][2][]byte, 0, c.f.topics*c.f.queues)
	for _, topic := range topicNames(c.f) {
		for q := 0; q < c.f.queues; q++ {
			c.headers = append(c.headers, requestHeader(c.f, topic, q))
		}
	}
	c.sentAt = make(map[int32]time.Time, share)
	out := c.requests(nil, share, time.Now())
	if _, err := nc.Write(out); err != nil {
		return c.t, err
	}
	in := make([]byte, 0, readBytes)
	for len(c.sentAt) > 0 {
		if len(in) == cap(in) {
			in = append(in, make([]byte, cap(in))...)[:len(in)]
		}
		n, err := nc.Read(in[len(in):cap(in)])
		if n == 0 && err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("the broker closed the connection")
			}
			return c.t, err
		}
		in = in[:len(in)+n]
		now := time.Now()
		used, answered, err := c.responses(in, now)
		if err != nil {
			return c.t, err
		}
		in = in[:copy(in, in[used:])]
		if answered > 0 && now.Before(c.stopAt) {
			out = c.requests(out[:0], answered, now)
			if _, err := nc.Write(out); err != nil {
				return c.t, err
			}
		}
	}
	return c.t, nil
}

// responses reads the whole frames at the start of in, returns the bytes they take and
// how many of this connection's requests they answered.
func (c *connection) responses(in []byte, now time.Time) (used, answered int, err error) {
	for len(in)-used >= 8 {
		length := int(binary.BigEndian.Uint32(in[used:]))
		if length < 4 || len(in)-used < 4+length {
			break
		}
		typeAndLength := binary.BigEndian.Uint32(in[used+4:])
		headerLength := int(typeAndLength & 0xFFFFFF)
		if typeAndLength>>24 != jsonSerialize || headerLength > length-4 {
			return used, answered, fmt.Errorf("a frame with serialize type %d and header length %d of %d",
				typeAndLength>>24, headerLength, length)
		}
		var h header
		if err := json.Unmarshal(in[used+8:used+8+headerLength], &h); err != nil {
			return used, answered, err
		}
		used += 4 + length
		if h.Flag&flagResponse == 0 {
			continue // a request from the broker: a producer that registered nothing ignores it
		}
		sent, ok := c.sentAt[h.Opaque]
		if !ok {
			return used, answered, fmt.Errorf("a response to opaque %d, which is not in flight", h.Opaque)
		}
		delete(c.sentAt, h.Opaque)
		answered++
		switch {
		case h.Code != success:
			c.t.Errors++
			if c.t.FirstError == "" {
				c.t.FirstError = fmt.Sprintf("code %d: %s", h.Code, h.Remark)
			}
		case now.Before(c.measureFrom) || now.After(c.stopAt):
		default:
			c.t.Acked++
			c.t.LatenciesMs = append(c.t.LatenciesMs, float64(now.Sub(sent).Nanoseconds())/1e6)
		}
	}
	return used, answered, nil
}

// requests appends count requests to out, each to the next queue in turn, sent at now.
func (c *connection) requests(out []byte, count int, now time.Time) []byte {
	var born [bornBytes]byte
	binary.BigEndian.PutUint64(born[:], math.Float64bits(float64(now.UnixNano())/1e9))
	for i := 0; i < count; i++ {
		c.opaque++
		h := c.headers[c.queue]
		c.queue = (c.queue + 1) % len(c.headers)
		frame := len(out)
		out = append(out, 0, 0, 0, 0, 0, 0, 0, 0)
		out = append(out, h[0]...)
		out = strconv.AppendInt(out, int64(c.opaque), 10)
		out = append(out, h[1]...)
		headerLength := len(out) - frame - 8
		out = append(out, born[:]...)
		out = append(out, c.padding...)
		binary.BigEndian.PutUint32(out[frame:], uint32(len(out)-frame-4))
		binary.BigEndian.PutUint32(out[frame+4:], jsonSerialize<<24|uint32(headerLength))
		c.sentAt[c.opaque] = now
		c.t.Sent++
	}
	return out
}

// topicNames is the topics the load goes to: -topic, or <topic>-0 ... with -topics above 1.
func topicNames(f flags) []string {
	if f.topics == 1 {
		return []string{f.topic}
	}
	names := make([]string, f.topics)
	for k := range names {
		names[k] = f.topic + "-" + strconv.Itoa(k)
	}
	return names
}

// requestHeader is a SEND_MESSAGE_V2 request's JSON header to queue q of topic, split where its
// opaque goes.  The fields are those a RocketMQ 4.9 Java producer sends for one message:
//
//	a producerGroup  b topic  c defaultTopic  d defaultTopicQueueNums  e queueId
//	f sysFlag  g bornTimestamp (ms)  h flag  i properties  j reconsumeTimes
//	k unitMode  m batch
//
// (l, maxReconsumeTimes, is null for a plain send, so Java leaves it out).  The
// properties are empty, as NATS's publishes carry no headers.
func requestHeader(f flags, topic string, q int) [2][]byte {
	ext := map[string]string{
		"a": f.group,
		"b": topic,
		"c": "TBW102",
		"d": strconv.Itoa(f.queues),
		"e": strconv.Itoa(q),
		"f": "0",
		"g": strconv.FormatInt(time.Now().UnixMilli(), 10),
		"h": "0",
		"i": "",
		"j": "0",
		"k": "false",
		"m": "false",
	}
	fields, err := json.Marshal(ext) // a map's keys are written sorted
	if err != nil {
		panic(err)
	}
	before := fmt.Sprintf(`{"code":%d,"extFields":%s,"flag":0,"language":"JAVA","opaque":`,
		sendMessageV2, fields)
	after := `,"serializeTypeCurrentRPC":"JSON","version":409}`
	return [2][]byte{[]byte(before), []byte(after)}
}
