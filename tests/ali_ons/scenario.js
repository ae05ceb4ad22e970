'use strict';
// Drives the npm package ali-ons (an independent RocketMQ 4.x client) against a name
// server, for tests/test_ali_ons.py. One process is one client role:
//
//   node scenario.js produce   sends COUNT messages, or fewer if stdin closes first
//   node scenario.js consume   push-consumes until stdin closes
//
// Settings come from the environment (NAMESRV, TOPIC, GROUP, COUNT, INTERVAL_MS,
// BODY_PREFIX, LARGE_EVERY, PROPS, SUBSCRIPTION, SQL92, FAIL_BODIES, and ACCESS_KEY with
// SECRET_KEY to sign every request for a broker with aclEnable). PROPS=1 gives
// message i the user properties n=i and kind=red|blue|green (i % 3); SQL92 subscribes
// with that expression (ali-ons' `{expressionType: 'SQL92', subString}`) instead of
// the tag expression SUBSCRIPTION. Everything that happens is
// printed as one JSON object per line on stdout, with `t` = Date.now(), so the test can
// line events up with the faults it injects. ALI_ONS_DEBUG=1 sends ali-ons' own log to
// stderr.

const { Producer, Consumer, Message } = require('ali-ons');

const env = process.env;
const role = process.argv[2];
const common = {
  // ali-ons asserts an httpclient even when nameSrv makes the HTTP address lookup moot.
  httpclient: {},
  nameSrv: env.NAMESRV,
  // ali-ons learns of a new master only from this poll (30 s by default), and finds a
  // %RETRY% route created after its start only then or at a rebalance (10 s).
  pollNameServerInteval: 1000,
  rebalanceInterval: 1000,
  // Consumed offsets go to the (new) master every second instead of every 5 s.
  persistConsumerOffsetInterval: 1000,
  // ali-ons signs every request when it has both (lib/channel.js beforeRequest).
  accessKeyId: env.ACCESS_KEY,
  accessKeySecret: env.SECRET_KEY,
  // ali-ons prints a stack trace for every emitted error unless given a logger.
  logger: env.ALI_ONS_DEBUG ?
    { info: console.error, warn: console.error, error: console.error, debug() {} } :
    { info() {}, warn() {}, error() {}, debug() {} },
};

// Every LARGE_EVERY-th body is padded past ali-ons' 4 KiB compression threshold, so the
// broker stores a zlib body with sysFlag 0x1 and the consumer has to inflate it. Events
// carry the text before the padding as `body`.
const PADDING = '|' + '.'.repeat(5000);
const KINDS = [ 'red', 'blue', 'green' ];

function emit(event, fields) {
  process.stdout.write(JSON.stringify({ event, t: Date.now(), ...fields }) + '\n');
}

function reportErrors(client) {
  client.on('error', err => emit('error', { name: err.name, code: err.code, message: err.message }));
}

// Resolves when the test closes our stdin: the signal to finish and exit cleanly.
const stdinClosed = new Promise(resolve => {
  process.stdin.on('end', resolve);
  process.stdin.on('close', resolve);
  process.stdin.resume();
});

async function produce() {
  const count = Number(env.COUNT || 10);
  const intervalMs = Number(env.INTERVAL_MS || 0);
  const prefix = env.BODY_PREFIX || 'msg';
  const largeEvery = Number(env.LARGE_EVERY || 0);
  let stopping = false;
  stdinClosed.then(() => { stopping = true; });
  const producer = new Producer({ ...common, producerGroup: env.GROUP });
  reportErrors(producer);
  await producer.ready();
  emit('ready', {});
  for (let i = 0; i < count && !stopping; i++) {
    const body = `${prefix}-${i}`;
    const large = largeEvery > 0 && i % largeEvery === largeEvery - 1;
    const text = large ? body + PADDING : body;
    const msg = new Message(env.TOPIC, `tag${i % 3}`, text);
    msg.keys = [ `key-${i}` ];
    if (env.PROPS) {
      msg.properties.n = String(i);
      msg.properties.kind = KINDS[i % 3];
    }
    const start = Date.now();
    try {
      const result = await producer.send(msg);
      emit('sent', {
        i, body, bytes: text.length, sentBytes: msg.body.length, // ali-ons compressed it in place
        status: result.sendStatus, msgId: result.msgId,
        queueId: Number(result.messageQueue.queueId), queueOffset: result.queueOffset,
        start, ms: Date.now() - start,
      });
    } catch (err) {
      emit('send_failed', { i, body, start, ms: Date.now() - start, message: err.message });
    }
    if (intervalMs) await new Promise(resolve => setTimeout(resolve, intervalMs));
  }
  await producer.close();
  emit('done', {});
}

async function consume() {
  const failOnce = new Set((env.FAIL_BODIES || '').split(',').filter(Boolean));
  const consumer = new Consumer({
    ...common,
    consumerGroup: env.GROUP,
    consumeFromWhere: 'CONSUME_FROM_FIRST_OFFSET',
    // How long a pull waits after an error (the connection to a killed master); 3 s by default.
    pullTimeDelayMillsWhenException: 500,
  });
  reportErrors(consumer);
  const selector = env.SQL92 ?
    { expressionType: 'SQL92', subString: env.SQL92 } :
    env.SUBSCRIPTION || '*';
  consumer.subscribe(env.TOPIC, selector, async msg => {
    const body = msg.body.toString().split('|')[0];
    // Only the first delivery fails, so the retry (reconsumeTimes 1) succeeds.
    const fail = failOnce.has(body) && msg.reconsumeTimes === 0;
    emit('received', {
      body, bytes: msg.body.length, compressed: (msg.sysFlag & 1) === 1,
      msgId: msg.msgId, topic: msg.topic, tags: msg.tags, keys: msg.keys,
      queueId: msg.queueId, queueOffset: Number(msg.queueOffset),
      reconsumeTimes: msg.reconsumeTimes, originMsgId: msg.originMessageId || null,
      n: msg.properties.n, kind: msg.properties.kind,
      storeTimestamp: Number(msg.storeTimestamp), fail,
    });
    if (fail) throw new Error(`scripted failure of ${body}`);
  });
  await consumer.ready();
  emit('ready', {});
  await stdinClosed;
  await consumer.close();
  emit('done', {});
}

const roles = { produce, consume };
if (!roles[role]) {
  console.error(`usage: node scenario.js ${Object.keys(roles).join('|')}`);
  process.exit(2);
}
roles[role]().then(
  () => process.exit(0),
  err => {
    emit('fatal', { name: err.name, message: err.message, stack: err.stack });
    process.exit(1);
  });
