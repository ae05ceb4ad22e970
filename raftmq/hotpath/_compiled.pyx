# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The compiled twins of Python functions on the data path: the same results, faster.

Each takes its fast path for what clients ordinarily send and hands anything else
(an odd property list, a value out of range, a ROCKETMQ-serialized request, a bad
frame length) to its Python twin, found in TWINS (filled by `hotpath.compiled_or`),
so the two agree on errors as well as on results. This module imports nothing of
raftmq's: the layers that own the twins import it.
"""

from cpython.bytearray cimport (
    PyByteArray_AS_STRING, PyByteArray_FromStringAndSize, PyByteArray_GET_SIZE,
    PyByteArray_Resize,
)
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memset

cdef extern from "<stdint.h>":
    const int64_t INT64_MAX

TWINS = {}  # name -> the Python twin, registered by raftmq.hotpath.compiled_or

cdef extern from "zlib.h":
    unsigned long crc32(unsigned long crc, const unsigned char *buf, unsigned int length) nogil

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    /* CRC-32C (Castagnoli), as the crc32c package computes it: SSE4.2's instruction
       where the CPU has it, else a table. */
    static uint32_t raftmq_crc32c_table[256];
    static int raftmq_crc32c_hw = -1;
    #if defined(__x86_64__) && defined(__GNUC__)
    __attribute__((target("sse4.2")))
    static uint32_t raftmq_crc32c_sse42(uint32_t crc, const uint8_t *p, size_t n) {
        uint64_t c = (uint32_t)~crc;
        while (n >= 8) { uint64_t v; memcpy(&v, p, 8); c = __builtin_ia32_crc32di(c, v); p += 8; n -= 8; }
        uint32_t c32 = (uint32_t)c;
        while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
        return ~c32;
    }
    #endif
    static uint32_t raftmq_crc32c(uint32_t crc, const uint8_t *p, size_t n) {
        if (raftmq_crc32c_hw < 0) {
            for (uint32_t i = 0; i < 256; i++) {
                uint32_t c = i;
                for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
                raftmq_crc32c_table[i] = c;
            }
    #if defined(__x86_64__) && defined(__GNUC__)
            raftmq_crc32c_hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
    #else
            raftmq_crc32c_hw = 0;
    #endif
        }
    #if defined(__x86_64__) && defined(__GNUC__)
        if (raftmq_crc32c_hw) return raftmq_crc32c_sse42(crc, p, n);
    #endif
        crc = ~crc;
        while (n--) crc = raftmq_crc32c_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
        return ~crc;
    }
    """
    uint32_t raftmq_crc32c(uint32_t crc, const uint8_t *p, size_t n) nogil

cdef int _JSON = 0
cdef int _MESSAGE_MAGIC_CODE = -626843481
cdef int _BORN_V6 = 0x1 << 4
cdef int _STORE_V6 = 0x1 << 5
cdef Py_ssize_t _TOPIC_MAX = 127
cdef Py_ssize_t _PROPERTIES_MAX = 0x7FFF
cdef Py_ssize_t _MAX_PROPERTIES = 64  # more than this takes the Python path
cdef bytes _WAIT = b"WAIT"
cdef bytes _CLUSTER = b"CLUSTER"
cdef int64_t _INT32_MIN = -(1 << 31)
cdef int64_t _INT32_MAX = (1 << 31) - 1
cdef const char *_HEX = b"0123456789ABCDEF"


cdef inline void _put32(uint8_t *p, uint32_t v) noexcept nogil:
    p[0] = v >> 24
    p[1] = v >> 16
    p[2] = v >> 8
    p[3] = v


cdef inline void _put64(uint8_t *p, uint64_t v) noexcept nogil:
    _put32(p, <uint32_t>(v >> 32))
    _put32(p + 4, <uint32_t>v)


def split_frames(src, Py_ssize_t max_frame_bytes):
    cdef const uint8_t[::1] view = src
    cdef Py_ssize_t size = view.shape[0]
    cdef Py_ssize_t pos = 0
    cdef uint32_t length
    frames = []
    while pos + 4 <= size:
        length = (<uint32_t>view[pos] << 24 | <uint32_t>view[pos + 1] << 16
                  | <uint32_t>view[pos + 2] << 8 | view[pos + 3])
        if length < 4 or <Py_ssize_t>length + 4 > max_frame_bytes:
            return TWINS["split_frames"](src, max_frame_bytes)  # raises the exact error
        if pos + 4 + <Py_ssize_t>length <= size:
            frames.append((pos + 4, pos + 4 + <Py_ssize_t>length))
            pos += 4 + length
        else:
            break
    return frames, pos


cdef inline bint _int32(object value):
    return type(value) is int and _INT32_MIN <= value <= _INT32_MAX


cdef inline bint _int64(object value):
    return type(value) is int and -(1 << 63) <= value < (1 << 63)


def send_record(store_timestamp_ms, born_host, store_host, cluster, topic, queue_id, flag,
                sysflag, born_timestamp_ms, reconsume_times, properties, body):
    cdef Py_ssize_t starts[64]
    cdef Py_ssize_t seps[64]
    cdef Py_ssize_t ends[64]
    cdef Py_ssize_t count = 0, i, j, pos, item_end, sep, cluster_at = -1
    cdef Py_ssize_t props_len, out_props, total, body_len, born_len, store_len
    cdef const uint8_t *p
    cdef uint8_t *o
    cdef int flags
    if not (type(born_host) is bytes and type(store_host) is bytes and type(body) is bytes
            and type(topic) is str and type(properties) is str and type(cluster) is str
            and _int32(queue_id) and _int32(flag) and _int32(sysflag)
            and _int32(reconsume_times) and _int64(born_timestamp_ms)
            and _int64(store_timestamp_ms)):
        return TWINS["send_record"](store_timestamp_ms, born_host, store_host, cluster, topic,
                                 queue_id, flag, sysflag, born_timestamp_ms, reconsume_times,
                                 properties, body)
    born_len = PyBytes_GET_SIZE(born_host)
    store_len = PyBytes_GET_SIZE(store_host)
    try:
        props = (<str>properties).encode("utf-8")
        topic_bytes = (<str>topic).encode("utf-8")
        cluster_bytes = (<str>cluster).encode("utf-8")
    except UnicodeEncodeError:
        props = None
    if (props is None or born_len not in (8, 20) or store_len not in (8, 20)
            or PyBytes_GET_SIZE(topic_bytes) > _TOPIC_MAX or not cluster_bytes
            or b"\x02" in cluster_bytes
            or (born_len == 20 and memcmp(PyBytes_AS_STRING(born_host),
                                          b"\0\0\0\0\0\0\0\0\0\0\xff\xff", 12) == 0)
            or (store_len == 20 and memcmp(PyBytes_AS_STRING(store_host),
                                           b"\0\0\0\0\0\0\0\0\0\0\xff\xff", 12) == 0)):
        return TWINS["send_record"](store_timestamp_ms, born_host, store_host, cluster, topic,
                                 queue_id, flag, sysflag, born_timestamp_ms, reconsume_times,
                                 properties, body)
    # The client's properties: name \x01 value \x02 ...; only the plain shape (every
    # item named and valued, no name twice, the last item terminated or not) is taken
    # here, the rest by the twin, which follows Java's lenient parser.
    p = <const uint8_t *>PyBytes_AS_STRING(props)
    props_len = PyBytes_GET_SIZE(props)
    pos = 0
    out_props = 0
    while pos < props_len:
        item_end = _property_item(p, pos, props_len, &sep)
        if sep == pos or sep >= item_end - 1 or count == _MAX_PROPERTIES:
            return TWINS["send_record"](store_timestamp_ms, born_host, store_host, cluster,
                                     topic, queue_id, flag, sysflag, born_timestamp_ms,
                                     reconsume_times, properties, body)
        for j in range(count):
            if (seps[j] - starts[j] == sep - pos
                    and memcmp(p + starts[j], p + pos, sep - pos) == 0):
                return TWINS["send_record"](store_timestamp_ms, born_host, store_host, cluster,
                                         topic, queue_id, flag, sysflag, born_timestamp_ms,
                                         reconsume_times, properties, body)
        starts[count] = pos
        seps[count] = sep
        ends[count] = item_end
        if sep - pos == 4 and memcmp(p + pos, <const char *>_WAIT, 4) == 0:
            ends[count] = -1  # dropped
        elif sep - pos == 7 and memcmp(p + pos, <const char *>_CLUSTER, 7) == 0:
            cluster_at = count
        else:
            out_props += item_end - pos + 1
        count += 1
        pos = item_end + 1
    out_props += 9 + PyBytes_GET_SIZE(cluster_bytes)  # CLUSTER \x01 name \x02
    if out_props > _PROPERTIES_MAX:
        return TWINS["send_record"](store_timestamp_ms, born_host, store_host, cluster, topic,
                                 queue_id, flag, sysflag, born_timestamp_ms, reconsume_times,
                                 properties, body)
    body_len = PyBytes_GET_SIZE(body)
    total = (48 + born_len + 8 + store_len + 16 + body_len + 1 + PyBytes_GET_SIZE(topic_bytes)
             + 2 + out_props)
    if total > _INT32_MAX:
        return TWINS["send_record"](store_timestamp_ms, born_host, store_host, cluster, topic,
                                 queue_id, flag, sysflag, born_timestamp_ms, reconsume_times,
                                 properties, body)
    flags = (<int>sysflag) & ~(_BORN_V6 | _STORE_V6)
    if born_len == 20:
        flags |= _BORN_V6
    if store_len == 20:
        flags |= _STORE_V6
    record = PyBytes_FromStringAndSize(NULL, total)
    o = <uint8_t *>PyBytes_AS_STRING(record)
    _put32(o, <uint32_t>total)
    _put32(o + 4, <uint32_t>_MESSAGE_MAGIC_CODE)
    _put32(o + 8, <uint32_t>(crc32(0, <const unsigned char *>PyBytes_AS_STRING(body),
                                   <unsigned int>body_len) & 0x7FFFFFFF))
    _put32(o + 12, <uint32_t><int>queue_id)
    _put32(o + 16, <uint32_t><int>flag)
    _put64(o + 20, 0)  # queue offset: placed by the leader
    _put64(o + 28, 0)  # physical offset: likewise
    _put32(o + 36, <uint32_t>flags)
    _put64(o + 40, <uint64_t><int64_t>born_timestamp_ms)
    o += 48
    memcpy(o, PyBytes_AS_STRING(born_host), born_len)
    o += born_len
    _put64(o, <uint64_t><int64_t>store_timestamp_ms)
    o += 8
    memcpy(o, PyBytes_AS_STRING(store_host), store_len)
    o += store_len
    _put32(o, <uint32_t><int>reconsume_times)
    _put64(o + 4, 0)  # prepared transaction offset
    _put32(o + 12, <uint32_t>body_len)
    o += 16
    memcpy(o, PyBytes_AS_STRING(body), body_len)
    o += body_len
    o[0] = <uint8_t>PyBytes_GET_SIZE(topic_bytes)
    memcpy(o + 1, PyBytes_AS_STRING(topic_bytes), PyBytes_GET_SIZE(topic_bytes))
    o += 1 + PyBytes_GET_SIZE(topic_bytes)
    o[0] = <uint8_t>(out_props >> 8)
    o[1] = <uint8_t>out_props
    o += 2
    for i in range(count):
        if ends[i] < 0:
            continue
        if i == cluster_at:
            memcpy(o, b"CLUSTER\x01", 8)
            memcpy(o + 8, PyBytes_AS_STRING(cluster_bytes), PyBytes_GET_SIZE(cluster_bytes))
            o += 8 + PyBytes_GET_SIZE(cluster_bytes)
        else:
            memcpy(o, p + starts[i], ends[i] - starts[i])
            o += ends[i] - starts[i]
        o[0] = 2
        o += 1
    if cluster_at < 0:
        memcpy(o, b"CLUSTER\x01", 8)
        memcpy(o + 8, PyBytes_AS_STRING(cluster_bytes), PyBytes_GET_SIZE(cluster_bytes))
        o += 8 + PyBytes_GET_SIZE(cluster_bytes)
        o[0] = 2
    return record


cdef inline Py_ssize_t _property_item(const uint8_t *p, Py_ssize_t start, Py_ssize_t n,
                                      Py_ssize_t *sep) noexcept:
    """The end of the property item at `start` of `p[:n]` (its \\x02, or n), and in `sep`
    where its name ends (its first \\x01, or the item's end)."""
    cdef Py_ssize_t end = start
    while end < n and p[end] != 2:
        end += 1
    sep[0] = start
    while sep[0] < end and p[sep[0]] != 1:
        sep[0] += 1
    return end


cdef Py_ssize_t _decimal(char *out, int64_t value) noexcept:
    """Write `value` in decimal at `out`; returns the characters written."""
    cdef char digits[24]
    cdef Py_ssize_t n = 0, i
    cdef uint64_t magnitude = <uint64_t>value
    cdef bint negative = value < 0
    if negative:
        magnitude = <uint64_t>0 - magnitude
    while True:
        digits[n] = <char>(48 + magnitude % 10)
        n += 1
        magnitude //= 10
        if magnitude == 0:
            break
    i = 0
    if negative:
        out[0] = 45  # "-"
        i = 1
    while n > 0:
        n -= 1
        out[i] = digits[n]
        i += 1
    return i


cdef bytes _HEAD = b'{"code":0,"extFields":{"msgId":"'
cdef bytes _QUEUE_ID = b'","queueId":"'
cdef bytes _QUEUE_OFFSET = b'","queueOffset":"'
cdef bytes _TAIL = (b'","MSG_REGION":"DefaultRegion","TRACE_ON":"true"},"flag":1,'
                    b'"language":"PYTHON","opaque":')
cdef bytes _END = b',"serializeTypeCurrentRPC":"JSON","version":409}'


def send_responses(list sends, store_host):
    cdef Py_ssize_t host_len, n, i, length, k
    cdef const uint8_t *host
    cdef char *o
    cdef char *frame
    cdef bytearray out
    cdef uint8_t id_bytes[28]
    if type(store_host) is not bytes or PyBytes_GET_SIZE(store_host) not in (8, 20):
        return TWINS["send_responses"](sends, store_host)
    host = <const uint8_t *>PyBytes_AS_STRING(store_host)
    host_len = PyBytes_GET_SIZE(store_host)
    n = len(sends)
    # The largest frame: 8 + head + msgId (56) + three 20-digit numbers + the rest.
    out = bytearray(n * (8 + len(_HEAD) + 56 + len(_QUEUE_ID) + len(_QUEUE_OFFSET)
                         + len(_TAIL) + len(_END) + 3 * 21))
    o = out
    for i in range(n):
        send = sends[i]
        if not (type(send) is tuple and len(<tuple>send) == 5):
            return TWINS["send_responses"](sends, store_host)
        opaque, serialize_type, queue_id, queue_offset, physical_offset = <tuple>send
        if not (serialize_type == _JSON and _int32(opaque) and _int64(queue_id)
                and _int64(queue_offset) and _int64(physical_offset)):
            return TWINS["send_responses"](sends, store_host)
        frame = o
        o += 8
        memcpy(o, PyBytes_AS_STRING(_HEAD), len(_HEAD))
        o += len(_HEAD)
        memcpy(id_bytes, host, host_len)
        _put64(id_bytes + host_len, <uint64_t><int64_t>physical_offset)
        for k in range(host_len + 8):
            o[0] = _HEX[id_bytes[k] >> 4]
            o[1] = _HEX[id_bytes[k] & 15]
            o += 2
        memcpy(o, PyBytes_AS_STRING(_QUEUE_ID), len(_QUEUE_ID))
        o += len(_QUEUE_ID)
        o += _decimal(o, <int64_t>queue_id)
        memcpy(o, PyBytes_AS_STRING(_QUEUE_OFFSET), len(_QUEUE_OFFSET))
        o += len(_QUEUE_OFFSET)
        o += _decimal(o, <int64_t>queue_offset)
        memcpy(o, PyBytes_AS_STRING(_TAIL), len(_TAIL))
        o += len(_TAIL)
        o += _decimal(o, <int64_t>opaque)
        memcpy(o, PyBytes_AS_STRING(_END), len(_END))
        o += len(_END)
        length = o - frame - 4
        _put32(<uint8_t *>frame, <uint32_t>length)
        _put32(<uint8_t *>frame + 4, <uint32_t>(length - 4))  # JSON: serialize type 0
    return bytes(out[: o - <char *>out])


# ---------------------------------------------------------------------- DLedger entries

cdef int _ENTRY_HEADER = 48
cdef int _CHAIN_OFFSET = 36
cdef int _MIN_BLANK = 8


cdef inline uint32_t _get32(const uint8_t *p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline uint64_t _get64(const uint8_t *p) noexcept nogil:
    return (<uint64_t>_get32(p) << 32) | _get32(p + 4)


cdef inline uint32_t _chain(uint32_t prev_chain, const uint8_t *header, uint32_t body_crc) noexcept nogil:
    cdef uint8_t crc_bytes[4]
    _put32(crc_bytes, body_crc)
    return raftmq_crc32c(raftmq_crc32c(prev_chain, header, _CHAIN_OFFSET), crc_bytes, 4)


def encode_entry(entry_type, index, term, pos, body, prev_chain):
    cdef const uint8_t[::1] view
    cdef Py_ssize_t body_len
    cdef uint8_t *o
    cdef uint32_t body_crc, chain
    if not (type(body) is bytes or type(body) is bytearray) or not (
            isinstance(entry_type, int) and _INT32_MIN <= entry_type <= _INT32_MAX
            and _int64(index) and _int64(term) and _int64(pos)
            and type(prev_chain) is int and 0 <= prev_chain <= 0xFFFFFFFF):
        return TWINS["encode_entry"](entry_type, index, term, pos, body, prev_chain)
    body_len = len(body)
    if body_len + _ENTRY_HEADER > _INT32_MAX:
        return TWINS["encode_entry"](entry_type, index, term, pos, body, prev_chain)
    view = body
    blob = PyBytes_FromStringAndSize(NULL, _ENTRY_HEADER + body_len)
    o = <uint8_t *>PyBytes_AS_STRING(blob)
    _put32(o, <uint32_t><int>entry_type)
    _put32(o + 4, <uint32_t>(_ENTRY_HEADER + body_len))
    _put64(o + 8, <uint64_t><int64_t>index)
    _put64(o + 16, <uint64_t><int64_t>term)
    _put64(o + 24, <uint64_t><int64_t>pos)
    _put32(o + 32, 0)  # channel
    if body_len:
        memcpy(o + _ENTRY_HEADER, &view[0], body_len)
    body_crc = raftmq_crc32c(0, o + _ENTRY_HEADER, body_len)
    chain = _chain(<uint32_t>prev_chain, o, body_crc)
    _put32(o + 36, chain)
    _put32(o + 40, body_crc)
    _put32(o + 44, <uint32_t>body_len)
    return blob, chain


def encode_entries(entry_type, bodies, index, term, pos, prev_chain):
    cdef Py_ssize_t n, k, body_len, total = 0
    cdef int64_t e_index, e_term, e_pos
    cdef uint32_t body_crc, chain
    cdef int32_t etype
    cdef uint8_t *o
    cdef uint8_t *x
    cdef const char *src
    if not (type(bodies) is list and isinstance(entry_type, int)
            and _INT32_MIN <= entry_type <= _INT32_MAX
            and _int64(index) and _int64(term) and _int64(pos)
            and type(prev_chain) is int and 0 <= prev_chain <= 0xFFFFFFFF):
        return TWINS["encode_entries"](entry_type, bodies, index, term, pos, prev_chain)
    n = len(<list>bodies)
    for k in range(n):
        body = (<list>bodies)[k]
        if type(body) is bytes:
            body_len = PyBytes_GET_SIZE(body)
        elif type(body) is bytearray:
            body_len = PyByteArray_GET_SIZE(body)
        else:
            return TWINS["encode_entries"](entry_type, bodies, index, term, pos, prev_chain)
        if body_len + _ENTRY_HEADER > _INT32_MAX:
            return TWINS["encode_entries"](entry_type, bodies, index, term, pos, prev_chain)
        total += _ENTRY_HEADER + body_len
    if index > (1 << 62) or pos > (1 << 62) or total > (1 << 40):  # no int64 overflow
        return TWINS["encode_entries"](entry_type, bodies, index, term, pos, prev_chain)
    etype = <int32_t><int>entry_type
    e_index = index
    e_term = term
    e_pos = pos
    chain = <uint32_t>prev_chain
    blob = PyBytes_FromStringAndSize(NULL, total)
    index_bytes = PyBytes_FromStringAndSize(NULL, n * 32)
    o = <uint8_t *>PyBytes_AS_STRING(blob)
    x = <uint8_t *>PyBytes_AS_STRING(index_bytes)
    for k in range(n):
        body = (<list>bodies)[k]
        if type(body) is bytes:
            src = PyBytes_AS_STRING(body)
            body_len = PyBytes_GET_SIZE(body)
        else:
            src = PyByteArray_AS_STRING(body)
            body_len = PyByteArray_GET_SIZE(body)
        _put32(o, <uint32_t>etype)
        _put32(o + 4, <uint32_t>(_ENTRY_HEADER + body_len))
        _put64(o + 8, <uint64_t>e_index)
        _put64(o + 16, <uint64_t>e_term)
        _put64(o + 24, <uint64_t>e_pos)
        _put32(o + 32, 0)  # channel
        if body_len:
            memcpy(o + _ENTRY_HEADER, src, body_len)
        body_crc = raftmq_crc32c(0, o + _ENTRY_HEADER, body_len)
        chain = _chain(chain, o, body_crc)
        _put32(o + 36, chain)
        _put32(o + 40, body_crc)
        _put32(o + 44, <uint32_t>body_len)
        # the index entry: magic 4, pos 8, size 4, index 8, term 8
        _put32(x, <uint32_t>etype)
        _put64(x + 4, <uint64_t>e_pos)
        _put32(x + 12, <uint32_t>(_ENTRY_HEADER + body_len))
        _put64(x + 16, <uint64_t>e_index)
        _put64(x + 24, <uint64_t>e_term)
        o += _ENTRY_HEADER + body_len
        x += 32
        e_index += 1
        e_pos += _ENTRY_HEADER + body_len
    return blob, index_bytes, chain


def index_entries(blob):
    cdef const uint8_t[::1] view
    cdef const uint8_t *p
    cdef uint8_t *x
    cdef Py_ssize_t total, offset = 0, count = 0
    cdef int32_t size
    try:
        view = blob
    except (TypeError, ValueError, BufferError):
        return TWINS["index_entries"](blob)
    total = view.shape[0]
    if total == 0:
        return b""
    p = &view[0]
    while offset < total:  # count them, and leave anything odd to the twin
        if total - offset < _ENTRY_HEADER:
            view = None
            return TWINS["index_entries"](blob)
        size = <int32_t>_get32(p + offset + 4)
        if size < _ENTRY_HEADER:
            view = None
            return TWINS["index_entries"](blob)
        offset += size
        count += 1
    out = PyBytes_FromStringAndSize(NULL, count * 32)
    x = <uint8_t *>PyBytes_AS_STRING(out)
    offset = 0
    while offset < total:
        # the index entry: magic 4, pos 8, size 4, index 8, term 8
        memcpy(x, p + offset, 4)
        memcpy(x + 4, p + offset + 24, 8)
        memcpy(x + 12, p + offset + 4, 4)
        memcpy(x + 16, p + offset + 8, 16)
        offset += <int32_t>_get32(p + offset + 4)
        x += 32
    return out


def validate_continuation(blob, next_index, end_pos, end_term, prev_chain, segment_size):
    cdef const uint8_t[::1] view
    cdef const uint8_t *p
    cdef Py_ssize_t total, offset = 0
    cdef int64_t index, position, term, seg, e_index, e_term, e_pos, expected
    cdef int32_t magic, size, body_len
    cdef uint32_t chain = 0, e_chain, body_crc
    cdef bint known_chain = prev_chain is not None
    try:
        view = blob
        index = next_index
        position = end_pos
        term = end_term
        seg = segment_size
        if known_chain:
            chain = prev_chain
    except (TypeError, ValueError, OverflowError, BufferError):
        return TWINS["validate_continuation"](
            blob, next_index, end_pos, end_term, prev_chain, segment_size)
    total = view.shape[0]
    p = &view[0] if total else NULL
    rows = []
    while offset < total:
        if total - offset < _ENTRY_HEADER:
            break
        magic = <int32_t>_get32(p + offset)
        size = <int32_t>_get32(p + offset + 4)
        e_index = <int64_t>_get64(p + offset + 8)
        e_term = <int64_t>_get64(p + offset + 16)
        e_pos = <int64_t>_get64(p + offset + 24)
        e_chain = _get32(p + offset + 36)
        body_crc = _get32(p + offset + 40)
        body_len = <int32_t>_get32(p + offset + 44)
        if size < _ENTRY_HEADER or e_index != index or size + _MIN_BLANK > seg or seg <= 0:
            break
        expected = position
        if position % seg + size + _MIN_BLANK > seg:
            expected = position - position % seg + seg
        if (e_pos != expected or e_term < term or (magic != 1 and magic != 2)
                or size != _ENTRY_HEADER + body_len or body_len < 0
                or offset + size > total):
            break
        if e_chain == 0 and body_crc == 0:  # as DLedger writes it: nothing to check
            pass
        elif raftmq_crc32c(0, p + offset + _ENTRY_HEADER, body_len) != body_crc:
            break
        elif known_chain and e_chain != _chain(chain, p + offset, body_crc):
            break
        chain = e_chain
        known_chain = True
        rows.append((offset, magic, size, e_index, e_term, e_pos, e_chain))
        index += 1
        position = e_pos + size
        term = e_term
        offset += size
    else:
        return rows
    # something is wrong: the twin finds it and raises what it raises
    return TWINS["validate_continuation"](
        blob, next_index, end_pos, end_term, prev_chain, segment_size)


# ---------------------------------------------------------------------- records in place


cdef int _MIN_RECORD_SIZE = 91
cdef int _TRANSACTION_MASK = 0x3 << 2
cdef int _TRANSACTION_PREPARED = 0x1 << 2
cdef int _TRANSACTION_ROLLBACK = 0x3 << 2


cdef struct _Layout:
    Py_ssize_t ts_pos, topic_pos, topic_end, properties_len  # from the record's start


cdef bint _layout(const uint8_t *p, Py_ssize_t n, _Layout *at) noexcept:
    """Where the V1 record at `p` (`n` bytes from it) holds what read_dispatch_fields
    reads; False for anything its twin would refuse or find odd (a short buffer, a
    bad magic). The topic's UTF-8 is not checked here."""
    cdef Py_ssize_t body_len_pos
    cdef int32_t sysflag, body_len
    cdef int born_len, store_len
    cdef int properties_len
    if n < 40 or <int32_t>_get32(p + 4) != _MESSAGE_MAGIC_CODE:
        return False
    sysflag = <int32_t>_get32(p + 36)
    born_len = 16 if sysflag & _BORN_V6 else 4
    store_len = 16 if sysflag & _STORE_V6 else 4
    at.ts_pos = 48 + born_len + 4
    body_len_pos = at.ts_pos + 8 + store_len + 4 + 4 + 8
    if body_len_pos + 4 > n:
        return False
    body_len = <int32_t>_get32(p + body_len_pos)
    if body_len < 0:
        return False
    at.topic_pos = body_len_pos + 4 + body_len
    if at.topic_pos + 1 > n:
        return False
    at.topic_end = at.topic_pos + 1 + p[at.topic_pos]
    if at.topic_end + 2 > n:
        return False
    properties_len = <int16_t>((p[at.topic_end] << 8) | p[at.topic_end + 1])
    if properties_len < 0 or at.topic_end + 2 + properties_len > n:
        return False
    at.properties_len = properties_len
    return True


cdef Py_ssize_t _topic_at(const uint8_t *p, Py_ssize_t n) noexcept:
    """Where the topic (its length byte) of the record at `p`, `n` bytes on, lies, or -1
    for anything read_dispatch_fields's twin would refuse or find odd (see _layout)."""
    cdef _Layout at
    if not _layout(p, n, &at):
        return -1
    return at.topic_pos


cdef tuple _dispatch_fields(const uint8_t *p, Py_ssize_t n, Py_ssize_t offset):
    """read_dispatch_fields's tuple, or None for anything its twin would refuse or
    find odd (a short buffer, a bad magic, a topic that is not UTF-8)."""
    cdef _Layout at
    if offset < 0 or not _layout(p + offset, n - offset, &at):
        return None
    p += offset
    try:
        topic = (<const char *>p)[at.topic_pos + 1:at.topic_end].decode("utf-8")
    except UnicodeDecodeError:
        return None
    return (
        <int32_t>_get32(p),
        <int32_t>_get32(p + 12),
        <int64_t>_get64(p + 20),
        <int32_t>_get32(p + 36),
        <int64_t>_get64(p + at.ts_pos),
        topic,
        (<const char *>p)[at.topic_end + 2:at.topic_end + 2 + at.properties_len],
    )


cdef bytes _properties(const uint8_t *p, Py_ssize_t n):
    """read_dispatch_fields(record)[6] for the record at `p` (`n` bytes), or None where
    `_dispatch_fields` gives None, without building the rest."""
    cdef _Layout at
    cdef Py_ssize_t k
    if not _layout(p, n, &at):
        return None
    for k in range(at.topic_pos + 1, at.topic_end):
        if p[k] >= 0x80:  # not ASCII: whether it is UTF-8 is the decoder's to say
            try:
                (<const char *>p)[at.topic_pos + 1:at.topic_end].decode("utf-8")
            except UnicodeDecodeError:
                return None
            break
    return (<const char *>p)[at.topic_end + 2:at.topic_end + 2 + at.properties_len]


def read_dispatch_fields(buf, offset=0):
    cdef const uint8_t[::1] view
    cdef tuple fields = None
    if type(offset) is int and (type(buf) is bytes or type(buf) is bytearray
                                or type(buf) is memoryview):
        try:
            view = buf
        except (TypeError, ValueError, BufferError):
            pass
        else:
            if view.shape[0]:
                fields = _dispatch_fields(&view[0], view.shape[0], offset)
    if fields is None:
        return TWINS["read_dispatch_fields"](buf, offset)
    return fields


cdef inline bint _placeable(const uint8_t *p, Py_ssize_t n) noexcept:
    """Whether place_record's fast path takes the record at `p` (n bytes, which
    _topic_at read): what patch_offsets checks before it writes (_locate)."""
    cdef int32_t total = <int32_t>_get32(p)
    cdef int32_t sysflag = <int32_t>_get32(p + 36)
    cdef int born_len = 16 if sysflag & _BORN_V6 else 4
    cdef int store_len = 16 if sysflag & _STORE_V6 else 4
    return (_MIN_RECORD_SIZE <= total <= n
            and total >= 48 + born_len + 4 + 8 + store_len + 4 + 16 + 1 + 2)


cdef inline bint _transactional(const uint8_t *p) noexcept:
    """A half or rolled-back transactional message: no queue offset."""
    cdef int transaction = (<int32_t>_get32(p + 36)) & _TRANSACTION_MASK
    return transaction == _TRANSACTION_PREPARED or transaction == _TRANSACTION_ROLLBACK


cdef bytearray _placed(bytes body, int64_t queue_offset, int64_t body_pos):
    """The record with its queue and physical offsets written in."""
    record = PyByteArray_FromStringAndSize(PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body))
    cdef uint8_t *o = <uint8_t *>PyByteArray_AS_STRING(record)
    _put64(o + 20, <uint64_t>queue_offset)
    _put64(o + 28, <uint64_t>body_pos)
    return record


def place_record(body, body_pos, dict next_offsets):
    cdef const uint8_t *p
    cdef tuple fields = None
    if type(body) is bytes and type(body_pos) is int and 0 <= body_pos < (1 << 62):
        p = <const uint8_t *>PyBytes_AS_STRING(body)
        fields = _dispatch_fields(p, PyBytes_GET_SIZE(body), 0)
        if fields is not None and not _placeable(p, PyBytes_GET_SIZE(body)):
            fields = None
    if fields is None:  # the twin raises, or takes the odd case, as it always has
        return TWINS["place_record"](body, body_pos, next_offsets)
    if _transactional(p):
        queue_offset = 0
    else:
        key = (fields[5], fields[1])
        queue_offset = next_offsets.get(key, 0)
        if not (_int64(queue_offset) and queue_offset < (1 << 62)):
            return TWINS["place_record"](body, body_pos, next_offsets)
        next_offsets[key] = queue_offset + 1
    return _placed(body, queue_offset, body_pos), queue_offset


def place_records(bodies, body_positions, dict next_offsets):
    cdef Py_ssize_t n, k, size, topic_pos, topic_len, cached_len = -1
    cdef const uint8_t *p
    cdef const uint8_t *cached = NULL
    cdef list keys
    if (type(bodies) is not list or type(body_positions) is not list
            or len(<list>bodies) != len(<list>body_positions)):
        return TWINS["place_records"](bodies, body_positions, next_offsets)
    n = len(<list>bodies)
    keys = []
    topic = None
    # Every record is checked before any queue offset is taken: the twin then takes them
    # all, from the same table, when one is odd. A batch's records mostly share a topic:
    # its name is decoded once.
    for k in range(n):
        body = (<list>bodies)[k]
        body_pos = (<list>body_positions)[k]
        if not (type(body) is bytes and type(body_pos) is int and 0 <= body_pos < (1 << 62)):
            return TWINS["place_records"](bodies, body_positions, next_offsets)
        p = <const uint8_t *>PyBytes_AS_STRING(body)
        size = PyBytes_GET_SIZE(body)
        topic_pos = _topic_at(p, size)
        if topic_pos < 0 or not _placeable(p, size):
            return TWINS["place_records"](bodies, body_positions, next_offsets)
        topic_len = p[topic_pos]
        if topic_len != cached_len or memcmp(cached, p + topic_pos + 1, topic_len) != 0:
            try:
                topic = (<const char *>p)[topic_pos + 1:topic_pos + 1 + topic_len].decode("utf-8")
            except UnicodeDecodeError:
                return TWINS["place_records"](bodies, body_positions, next_offsets)
            cached = p + topic_pos + 1  # in `body`, which `bodies` keeps alive
            cached_len = topic_len
        if _transactional(p):
            keys.append(None)
            continue
        key = (topic, <int32_t>_get32(p + 12))
        queue_offset = next_offsets.get(key, 0)
        if not (_int64(queue_offset) and queue_offset < (1 << 62)):
            return TWINS["place_records"](bodies, body_positions, next_offsets)
        keys.append(key)
    records = []
    queue_offsets = []
    for k in range(n):
        key = keys[k]
        if key is None:
            queue_offset = 0
        else:
            queue_offset = next_offsets.get(key, 0)
            next_offsets[key] = queue_offset + 1
        records.append(_placed((<list>bodies)[k], queue_offset, (<list>body_positions)[k]))
        queue_offsets.append(queue_offset)
    return records, queue_offsets


# ---------------------------------------------------------------------- send headers

# SendMessageRequestHeaderV2's letters for the fields send_fields reads, and the long
# names they stand for (raftmq.protocol.headers holds the whole table).
cdef tuple _SEND_LETTERS = ("b", "e", "h", "f", "g", "j", "i", "m")
cdef tuple _SEND_NAMES = (
    "topic", "queueId", "flag", "sysFlag", "bornTimestamp", "reconsumeTimes", "properties",
    "batch",
)


cdef object _number(object value, object default):
    """A header's integer as headers.integer reads it, or NotImplemented for the twin."""
    cdef Py_ssize_t n, i = 0
    cdef Py_UCS4 c
    cdef long digit
    cdef int64_t result = 0
    cdef bint negative = False
    if value is None:
        return default
    if type(value) is not str:
        return NotImplemented
    n = len(<str>value)
    if n == 0:
        return default
    if (<str>value)[0] == "-":
        negative = True
        i = 1
    if n - i == 0 or n - i > 18:
        return NotImplemented
    while i < n:
        c = (<str>value)[i]
        digit = <long>c - 48
        if digit < 0 or digit > 9:
            return NotImplemented
        result = result * 10 + digit
        i += 1
    return -result if negative else result


cdef object _send_tuple(topic, queue_id, flag, sysflag, born, reconsume, properties, batch):
    """send_fields's tuple of a header's values (None: absent), or NotImplemented for
    the twin (a number or a batch flag it must read)."""
    queue_id = _number(queue_id, -1)
    flag = _number(flag, 0)
    sysflag = _number(sysflag, 0)
    born = _number(born, 0)
    reconsume = _number(reconsume, 0)
    if batch is None or batch == "false":
        batch = False
    elif batch == "true":
        batch = True
    else:
        return NotImplemented
    if (queue_id is NotImplemented or flag is NotImplemented or sysflag is NotImplemented
            or born is NotImplemented or reconsume is NotImplemented):
        return NotImplemented
    return topic, queue_id, flag, sysflag, born, reconsume, properties, batch


def send_fields(dict ext_fields):
    cdef tuple keys
    cdef Py_ssize_t k
    if "b" in ext_fields and "topic" not in ext_fields:  # the V2 letters
        for k in range(1, 8):
            if _SEND_NAMES[k] in ext_fields:  # a long name among the letters: rare
                return TWINS["send_fields"](ext_fields)
        keys = _SEND_LETTERS
    else:
        keys = _SEND_NAMES
    topic = ext_fields.get(keys[0])
    if topic is not None and type(topic) is not str:
        return TWINS["send_fields"](ext_fields)
    fields = _send_tuple(topic, ext_fields.get(keys[1]), ext_fields.get(keys[2]),
                         ext_fields.get(keys[3]), ext_fields.get(keys[4]),
                         ext_fields.get(keys[5]), ext_fields.get(keys[6], ""),
                         ext_fields.get(keys[7]))
    if fields is NotImplemented:
        return TWINS["send_fields"](ext_fields)
    return fields


def send_values(values):
    cdef Py_ssize_t k, base = 0
    cdef tuple v
    if type(values) is not tuple or len(<tuple>values) != 16:
        return TWINS["send_values"](values)
    v = <tuple>values
    for k in range(16):
        if v[k] is not None and type(v[k]) is not str:
            return TWINS["send_values"](values)
    if v[8] is not None and v[0] is None:  # the V2 letters
        for k in range(1, 8):
            if v[k] is not None:  # a long name among them: the header is decoded
                return None
        base = 8
    fields = _send_tuple(v[base], v[base + 1], v[base + 2], v[base + 3], v[base + 4],
                         v[base + 5], "" if v[base + 6] is None else v[base + 6], v[base + 7])
    if fields is NotImplemented:
        return TWINS["send_values"](values)
    return fields


# ---------------------------------------------------------------------- JSON headers

from cpython.dict cimport PyDict_Next
from cpython.object cimport PyObject


cdef inline bint _java_int(object value):
    return type(value) is int and _INT32_MIN <= value <= _INT32_MAX


def plain_json_fields(dict header):
    cdef Py_ssize_t pos = 0
    cdef PyObject *key
    cdef PyObject *value
    ext = header.get("extFields")
    if ext is None:
        ext = {}
    elif type(ext) is not dict:
        return None
    else:
        while PyDict_Next(ext, &pos, &key, &value):
            if type(<object>value) is not str:
                return None
    code = header.get("code", 0)
    version = header.get("version", 0)
    opaque = header.get("opaque", 0)
    flag = header.get("flag", 0)
    if not (_java_int(code) and _java_int(version) and _java_int(opaque) and _java_int(flag)):
        return None
    language = header.get("language")
    remark = header.get("remark")
    if type(language) is not str or (remark is not None and type(remark) is not str):
        return None
    return code, version, opaque, flag, language, remark, ext


# ---------------------------------------------------------------------- dispatch

cdef bytes _TAGS = b"TAGS\x01"


cdef object _tags_code(bytes properties):
    """properties_tags_code: Java's String.hashCode of the TAGS value (0 without one),
    or NotImplemented for the twin (a value that is not UTF-8)."""
    cdef const uint8_t *p = <const uint8_t *>PyBytes_AS_STRING(properties)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(properties)
    cdef Py_ssize_t at = 0, start, end
    while True:
        while at + 5 <= n and memcmp(p + at, <const char *>_TAGS, 5) != 0:
            at += 1
        if at + 5 > n:
            return 0
        if at == 0 or p[at - 1] == 2:
            break
        at += 1
    start = at + 5
    end = start
    while end < n and p[end] != 2:
        end += 1
    try:
        value = (<const char *>p)[start:end].decode("utf-8")
    except UnicodeDecodeError:
        return NotImplemented
    return _java_hash(value)


cdef int32_t _java_hash(str value):
    """Java's String.hashCode: over UTF-16 code units, wrapping at 32 bits."""
    cdef uint32_t h = 0, cp
    for ch in value:
        cp = <uint32_t><Py_UCS4>ch
        if cp > 0xFFFF:  # a surrogate pair in Java's UTF-16
            cp -= 0x10000
            h = 31 * h + (0xD800 + (cp >> 10))
            h = 31 * h + (0xDC00 + (cp & 0x3FF))
        else:
            h = 31 * h + cp
    return <int32_t>h


cdef bytes _UNIQ_KEY_NAME = b"UNIQ_KEY"
cdef bytes _KEYS_NAME = b"KEYS"
cdef tuple _NO_KEYS = ("", "")


cdef tuple _index_keys(bytes properties):
    """properties_index_keys: the last non-empty UNIQ_KEY and KEYS values, one walk
    over the items; a malformed UTF-8 byte decodes to U+FFFD as in the twin."""
    cdef const char *p = PyBytes_AS_STRING(properties)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(properties)
    cdef Py_ssize_t start = 0, end, sep
    cdef Py_ssize_t uniq_at = -1, uniq_end = 0, keys_at = -1, keys_end = 0
    while start <= n:
        end = _property_item(<const uint8_t *>p, start, n, &sep)
        if sep + 1 < end:  # a separator and a value after it
            if sep - start == 8 and memcmp(p + start, <const char *>_UNIQ_KEY_NAME, 8) == 0:
                uniq_at = sep + 1
                uniq_end = end
            elif sep - start == 4 and memcmp(p + start, <const char *>_KEYS_NAME, 4) == 0:
                keys_at = sep + 1
                keys_end = end
        start = end + 1
    if uniq_at < 0 and keys_at < 0:
        return _NO_KEYS
    return (
        p[uniq_at:uniq_end].decode("utf-8", "replace") if uniq_at >= 0 else "",
        p[keys_at:keys_end].decode("utf-8", "replace") if keys_at >= 0 else "",
    )


def java_string_hash(text):
    if type(text) is not str:
        return TWINS["java_string_hash"](text)
    return _java_hash(<str>text)


def properties_index_keys(properties):
    if type(properties) is not bytes:
        return TWINS["properties_index_keys"](properties)
    return _index_keys(properties)


def dispatch_rows(blob, last_index):
    cdef const uint8_t[::1] view
    cdef const uint8_t *p
    cdef Py_ssize_t total, offset = 0
    cdef int32_t magic, size
    cdef int64_t e_index, last, pos
    try:
        view = blob
        last = last_index
    except (TypeError, ValueError, OverflowError, BufferError):
        return TWINS["dispatch_rows"](blob, last_index)
    total = view.shape[0]
    if total == 0:
        return TWINS["dispatch_rows"](blob, last_index)
    p = &view[0]
    rows = []
    while offset < total:
        if total - offset < _ENTRY_HEADER:
            return TWINS["dispatch_rows"](blob, last_index)
        magic = <int32_t>_get32(p + offset)
        size = <int32_t>_get32(p + offset + 4)
        e_index = <int64_t>_get64(p + offset + 8)
        pos = <int64_t>_get64(p + offset + 24)
        if size < _ENTRY_HEADER or offset + size > total:
            return TWINS["dispatch_rows"](blob, last_index)
        if e_index > last:
            break
        if magic == 2:  # a NOOP
            rows.append((e_index, None))
        else:
            fields = _dispatch_fields(p, total, offset + _ENTRY_HEADER)
            if fields is None:
                return TWINS["dispatch_rows"](blob, last_index)
            properties = fields[6]
            tags = _tags_code(properties) if properties else 0
            if tags is NotImplemented:
                return TWINS["dispatch_rows"](blob, last_index)
            keys = _index_keys(properties) if properties else _NO_KEYS
            rows.append((e_index, (fields[5], fields[1], fields[2], pos + _ENTRY_HEADER,
                                   fields[0], fields[3], tags, fields[4], keys[0], keys[1])))
        offset += size
    return rows, None


cdef int _NO_QUEUE_OFFSET_BIT = 1 << 2  # TRANSACTION_PREPARED_TYPE: half and rolled back


def queue_runs(rows, start, queues, special_topics, indexed):
    cdef Py_ssize_t pos, n, first_pos
    cdef int64_t queue_offset, physical, tags
    cdef int32_t size
    cdef bint index_keys
    cdef bytearray entries
    cdef Py_ssize_t used
    cdef uint8_t *o
    if (type(rows) is not list or type(queues) is not dict
            or type(special_topics) is not frozenset):
        return TWINS["queue_runs"](rows, start, queues, special_topics, indexed)
    try:
        first_pos = start
    except (TypeError, OverflowError):
        return TWINS["queue_runs"](rows, start, queues, special_topics, indexed)
    index_keys = bool(indexed)
    n = len(rows)
    if first_pos < 0:
        return TWINS["queue_runs"](rows, start, queues, special_topics, indexed)
    runs = {}
    for pos in range(first_pos, n):
        row = rows[pos]
        if type(row) is not tuple or len(<tuple>row) != 2:
            return TWINS["queue_runs"](rows, start, queues, special_topics, indexed)
        fields = (<tuple>row)[1]
        if fields is None:
            continue
        if type(fields) is not tuple or len(<tuple>fields) != 10:
            return TWINS["queue_runs"](rows, start, queues, special_topics, indexed)
        topic = (<tuple>fields)[0]
        queue_id = (<tuple>fields)[1]
        sysflag = (<tuple>fields)[5]
        if (type(topic) is not str or type(queue_id) is not int or type(sysflag) is not int
                or type((<tuple>fields)[2]) is not int or type((<tuple>fields)[3]) is not int
                or type((<tuple>fields)[4]) is not int or type((<tuple>fields)[6]) is not int):
            return TWINS["queue_runs"](rows, start, queues, special_topics, indexed)
        key = (topic, queue_id)
        if (topic in <frozenset>special_topics or sysflag & _NO_QUEUE_OFFSET_BIT
                or (index_keys and ((<tuple>fields)[8] or (<tuple>fields)[9]))
                or key not in <dict>queues):
            return runs, pos
        try:
            queue_offset = (<tuple>fields)[2]
            physical = (<tuple>fields)[3]
            size = (<tuple>fields)[4]
            tags = (<tuple>fields)[6]
        except OverflowError:
            return TWINS["queue_runs"](rows, start, queues, special_topics, indexed)
        if queue_offset == INT64_MAX:
            return TWINS["queue_runs"](rows, start, queues, special_topics, indexed)
        run = (<dict>runs).get(key)
        if run is None:
            entries = PyByteArray_FromStringAndSize(NULL, 20)
            run = [queue_offset, queue_offset + 1, entries, size]
            (<dict>runs)[key] = run
            used = 0
        elif (<list>run)[1] != queue_offset:
            return runs, pos
        else:
            entries = <bytearray>(<list>run)[2]
            used = PyByteArray_GET_SIZE(entries)
            PyByteArray_Resize(entries, used + 20)
            (<list>run)[1] = queue_offset + 1
            (<list>run)[3] = (<list>run)[3] + size
        o = <uint8_t *>PyByteArray_AS_STRING(entries) + used
        _put64(o, <uint64_t>physical)
        _put32(o + 8, <uint32_t>size)
        _put64(o + 12, <uint64_t>tags)
    return runs, n


# ---------------------------------------------------------------------- key index

cdef Py_ssize_t _INDEX_HEADER = 40
cdef Py_ssize_t _INDEX_ENTRY = 20


def recover_slots(buf, slot_num, count):
    cdef uint8_t[::1] view
    cdef uint8_t *p
    cdef Py_ssize_t size, n_slots, n_count, slots_end, number, used = 0
    cdef int64_t slot
    cdef int32_t value
    cdef uint8_t *slot_at
    cdef bint kept = True
    try:
        view = buf
        n_slots = slot_num
        n_count = count
    except (TypeError, ValueError, OverflowError, BufferError):
        return TWINS["recover_slots"](buf, slot_num, count)
    size = view.shape[0]
    if (n_slots <= 0 or n_slots > (size - _INDEX_HEADER) // 4
            or n_count > (size - _INDEX_HEADER - n_slots * 4 - 4) // _INDEX_ENTRY + 1):
        view = None  # released: the twin may resize a bytearray
        return TWINS["recover_slots"](buf, slot_num, count)  # out of bounds
    p = &view[0]
    slots_end = _INDEX_HEADER + n_slots * 4
    for slot in range(n_slots):
        value = <int32_t>_get32(p + _INDEX_HEADER + slot * 4)
        if value < 0 or value >= n_count:
            kept = False
            break
        if value != 0:
            used += 1
    if kept:
        return used
    used = 0
    memset(p + _INDEX_HEADER, 0, n_slots * 4)
    for number in range(1, n_count):
        # Python's modulo (cdivision is off): a hash read from a damaged entry may be
        # negative, and its slot is the twin's
        slot = (<int32_t>_get32(p + slots_end + number * _INDEX_ENTRY)) % n_slots
        slot_at = p + _INDEX_HEADER + slot * 4
        if _get32(slot_at) == 0:
            used += 1
        _put32(slot_at, <uint32_t>number)
    return used


# ---------------------------------------------------------------------- pulls

cimport cython
import random
from cpython.mem cimport PyMem_Free, PyMem_Malloc

cdef int _CQ_ENTRY = 20  # a ConsumeQueue entry: physical offset 8, size 4, tags code 8
cdef int64_t _POSITION_LIMIT = 1 << 62  # positions beyond are the twin's (no overflow here)


@cython.final
cdef class _Segments:
    """Where a pull's records lie in the log's mapped segments (`maps`: segment start ->
    buffer, segments of `size` bytes, usable inside [low, high)), the last segment's
    buffer held between records."""

    cdef dict maps
    cdef int64_t size, low, high, start
    cdef bint cached, mapped  # `start` names the segment `buffer` is for; mapped: it has one
    cdef const uint8_t[::1] buffer
    cdef const uint8_t *data  # the buffer's bytes, for the per-record path
    cdef Py_ssize_t length
    cdef const uint8_t[::1] got  # what `read` gave for the record at hand

    @cython.cdivision(True)  # size > 0; the sign of the remainder is fixed below
    cdef inline int64_t offset(self, int64_t phys) noexcept:
        """Where `phys` lies in its segment."""
        cdef int64_t off = phys % self.size
        return off + self.size if off < 0 else off

    cdef inline int find(self, int64_t phys, int32_t size, const uint8_t **at) noexcept:
        """1 with the record's first byte in `at` when it lies whole in a mapped
        segment, 0 when `read` is to give it, 2 when its segment is not the one held
        (`hold` it and ask again)."""
        cdef int64_t off
        if not (self.low <= phys and size >= 0 and phys <= self.high - size):
            return 0
        off = self.offset(phys)
        if not self.cached or phys - off != self.start:
            return 2
        if self.mapped and off + size <= self.length:
            at[0] = self.data + off
            return 1
        return 0

    cdef int hold(self, int64_t phys) noexcept:
        """Hold the buffer of the segment of `phys`, if mapped; -1 when that fails (not
        a byte buffer, say), for the twin to do it and raise what it raises."""
        self.start = phys - self.offset(phys)
        self.cached = True
        try:
            buffer = self.maps.get(self.start)
            self.mapped = buffer is not None
            if self.mapped:
                self.buffer = buffer
                self.length = self.buffer.shape[0]
                self.data = &self.buffer[0]
        except Exception:
            self.release()
            return -1
        return 0

    cdef void release(self):
        """Hold no buffer of the log while its Python code (`read`) runs."""
        if self.cached:
            self.cached = self.mapped = False
            self.buffer = None

    cdef const uint8_t *bytes_read(self, object record, Py_ssize_t size):
        """The first byte of `record` (what `read` gave), held until the next call; NULL
        when it is not `size` bytes (the twin says what is wrong)."""
        try:
            self.got = record
        except (TypeError, ValueError, BufferError):
            return NULL
        if self.got.shape[0] != size:
            return NULL
        return &self.got[0]


def pull_body(entries, codes, max_count, max_bytes, maps, segment_size, low, high, read,
              matches=None):
    cdef const uint8_t[::1] view
    cdef const uint8_t *p
    cdef const uint8_t *at = NULL
    cdef char *out
    cdef Py_ssize_t n, k, taken = 0, scanned = 0, written = 0
    cdef int64_t count_limit, bytes_limit, seg, lo, hi, phys, total = 0, last = -1
    cdef int32_t size
    cdef Py_ssize_t *chosen
    cdef bint negative = False
    cdef int where
    cdef _Segments segments
    cdef list held = None  # with `matches`: what `read` gave for each record taken, or None
    cdef bytes properties
    if type(maps) is not dict:
        return TWINS["pull_body"](entries, codes, max_count, max_bytes, maps, segment_size,
                                  low, high, read, matches)
    try:
        view = entries
        count_limit = max_count
        bytes_limit = max_bytes
        seg = segment_size
        lo = low
        hi = high
    except (TypeError, ValueError, OverflowError, BufferError):
        return TWINS["pull_body"](entries, codes, max_count, max_bytes, maps, segment_size,
                                  low, high, read, matches)
    n = view.shape[0]
    if (n % _CQ_ENTRY or seg <= 0 or not -_POSITION_LIMIT < lo < _POSITION_LIMIT
            or not -_POSITION_LIMIT < hi < _POSITION_LIMIT):
        return TWINS["pull_body"](entries, codes, max_count, max_bytes, maps, segment_size,
                                  low, high, read, matches)
    n //= _CQ_ENTRY
    if n == 0:
        return b"", 0, 0, -1
    segments = _Segments.__new__(_Segments)
    segments.maps, segments.size, segments.low, segments.high = maps, seg, lo, hi
    if matches is not None:
        held = []
    p = &view[0]
    chosen = <Py_ssize_t *>PyMem_Malloc(n * sizeof(Py_ssize_t))
    if chosen == NULL:
        raise MemoryError()
    try:
        # which records the pull takes: decided by the entries, and with `matches` by
        # each candidate's properties, read in place (`read` only outside the segments)
        for k in range(n):
            size = <int32_t>_get32(p + k * _CQ_ENTRY + 8)
            if taken >= count_limit or (taken and total + size > bytes_limit):
                break
            scanned += 1
            if codes is not None:
                tags = <int64_t>_get64(p + k * _CQ_ENTRY + 12)
                if tags not in codes:
                    continue
            phys = <int64_t>_get64(p + k * _CQ_ENTRY)
            if matches is not None:
                if size < 0:  # the twin reads it, and `read` says what is wrong
                    return TWINS["pull_body"](entries, codes, max_count, max_bytes, maps,
                                              segment_size, low, high, read, matches)
                where = segments.find(phys, size, &at)
                if where == 2:
                    where = -1 if segments.hold(phys) < 0 else segments.find(phys, size, &at)
                record = None
                if where == 0:
                    segments.release()
                    record = read(phys, size)
                    at = segments.bytes_read(record, size)
                if where < 0 or at == NULL:
                    return TWINS["pull_body"](entries, codes, max_count, max_bytes, maps,
                                              segment_size, low, high, read, matches)
                properties = _properties(at, size)
                if properties is None:  # not a record this reads: the twin's error
                    return TWINS["pull_body"](entries, codes, max_count, max_bytes, maps,
                                              segment_size, low, high, read, matches)
                if not matches(properties):
                    continue
                held.append(record)
            chosen[taken] = k
            taken += 1
            total += size
            negative = negative or size < 0
            last = phys
        if negative:  # the twin reads it, and `read` says what is wrong
            return TWINS["pull_body"](entries, codes, max_count, max_bytes, maps, segment_size,
                                      low, high, read, matches)
        body = PyBytes_FromStringAndSize(NULL, total)
        out = PyBytes_AS_STRING(body)
        # their bytes, from the mapped segments where they lie, else from `read`
        for k in range(taken):
            phys = <int64_t>_get64(p + chosen[k] * _CQ_ENTRY)
            size = <int32_t>_get32(p + chosen[k] * _CQ_ENTRY + 8)
            where = segments.find(phys, size, &at)
            if where == 2:
                where = -1 if segments.hold(phys) < 0 else segments.find(phys, size, &at)
            if where == 0:
                segments.release()
                record = read(phys, size) if held is None else held[k]
                at = segments.bytes_read(record, size)
            if where < 0 or at == NULL:
                return TWINS["pull_body"](entries, codes, max_count, max_bytes, maps,
                                          segment_size, low, high, read, matches)
            if size:
                memcpy(out + written, at, size)
            written += size
    finally:
        PyMem_Free(chosen)
    assert written == total, (written, total)
    return body, taken, scanned, last


# ---------------------------------------------------------------------- plain requests

from cpython.unicode cimport PyUnicode_DecodeASCII

cdef int _KEY_OTHER = 0
cdef int _KEY_CODE = 1
cdef int _KEY_EXT = 2
cdef int _KEY_FLAG = 3
cdef int _KEY_LANGUAGE = 4
cdef int _KEY_OPAQUE = 5
cdef int _KEY_REMARK = 6
cdef int _KEY_VERSION = 7
cdef int _FLAG_RESPONSE = 1
cdef Py_ssize_t _MAX_NAMES = 32  # more ext field names asked for takes the Python path


cdef inline Py_ssize_t _skip_space(const uint8_t *p, Py_ssize_t i, Py_ssize_t n) noexcept:
    while i < n and (p[i] == 32 or p[i] == 9 or p[i] == 10 or p[i] == 13):
        i += 1
    return i


cdef inline int _hex_digit(uint8_t c) noexcept:
    if 48 <= c <= 57:
        return c - 48
    if 97 <= c <= 102:
        return c - 87
    if 65 <= c <= 70:
        return c - 55
    return -1


cdef Py_ssize_t _json_string(const uint8_t *p, Py_ssize_t i, Py_ssize_t n,
                             bint *escaped) noexcept:
    """The end (past its closing quote) of the JSON string whose opening quote is p[i],
    or -1 for what the twin decides: a byte outside printable ASCII, an escape other
    than the one-letter ones and \\u0000-\\u007F, no closing quote."""
    cdef uint8_t c
    escaped[0] = False
    i += 1
    while i < n:
        c = p[i]
        if c == 34:  # "
            return i + 1
        if c == 92:  # a backslash
            escaped[0] = True
            if i + 1 >= n:
                return -1
            c = p[i + 1]
            if c == 117:  # \uXXXX
                if (i + 5 >= n or p[i + 2] != 48 or p[i + 3] != 48
                        or not 48 <= p[i + 4] <= 55 or _hex_digit(p[i + 5]) < 0):
                    return -1
                i += 6
            elif c == 34 or c == 92 or c == 47 or c == 98 or c == 102 or c == 110 \
                    or c == 114 or c == 116:
                i += 2
            else:
                return -1
        elif c < 32 or c >= 128:
            return -1
        else:
            i += 1
    return -1


cdef str _json_text_of(const uint8_t *p, Py_ssize_t start, Py_ssize_t end, bint escaped):
    """The text of the string p[start - 1:end + 1] that _json_string accepted."""
    cdef Py_ssize_t i = start, k = 0
    cdef char *out
    cdef uint8_t c
    if not escaped:
        return PyUnicode_DecodeASCII(<const char *>p + start, end - start, NULL)
    buffer = PyBytes_FromStringAndSize(NULL, end - start)
    out = PyBytes_AS_STRING(buffer)
    while i < end:
        c = p[i]
        if c == 92:
            c = p[i + 1]
            if c == 117:
                c = <uint8_t>(((p[i + 4] - 48) << 4) | _hex_digit(p[i + 5]))
                i += 6
            else:
                if c == 98:
                    c = 8
                elif c == 102:
                    c = 12
                elif c == 110:
                    c = 10
                elif c == 114:
                    c = 13
                elif c == 116:
                    c = 9
                i += 2
        else:
            i += 1
        out[k] = <char>c
        k += 1
    return PyUnicode_DecodeASCII(out, k, NULL)


cdef Py_ssize_t _json_integer(const uint8_t *p, Py_ssize_t i, Py_ssize_t n,
                              int64_t *value) noexcept:
    """The end of the JSON integer at p[i] (its value in `value`), or -1 for the twin:
    not an integer, a fraction or exponent, more than 18 digits."""
    cdef Py_ssize_t first
    cdef bint negative = False
    cdef int64_t result = 0
    if i < n and p[i] == 45:
        negative = True
        i += 1
    first = i
    while i < n and 48 <= p[i] <= 57:
        result = result * 10 + (p[i] - 48)
        i += 1
        if i - first > 18:
            return -1
    if i == first or (p[first] == 48 and i - first > 1):
        return -1
    if i < n and (p[i] == 46 or p[i] == 101 or p[i] == 69):
        return -1
    value[0] = -result if negative else result
    return i


cdef inline bint _literal(const uint8_t *p, Py_ssize_t i, Py_ssize_t n, const char *word,
                          Py_ssize_t size) noexcept:
    return n - i >= size and memcmp(p + i, word, size) == 0


# The header fields plain_json_fields reads, numbered _KEY_CODE.. in this order.
cdef tuple _HEADER_KEYS = (b"code", b"extFields", b"flag", b"language", b"opaque", b"remark",
                           b"version")


cdef int _header_key(const uint8_t *p, Py_ssize_t size):
    cdef Py_ssize_t k
    for k in range(len(_HEADER_KEYS)):
        key = <bytes>_HEADER_KEYS[k]
        if PyBytes_GET_SIZE(key) == size and memcmp(p, PyBytes_AS_STRING(key), size) == 0:
            return <int>k + 1
    return _KEY_OTHER


cdef class RawRequest:
    """A request left undecoded for a server's hot path (remoting.codec.RawRequest,
    whose fields and meaning it has): its frame, what the hot path reads of it."""

    cdef readonly object src
    cdef readonly Py_ssize_t start
    cdef readonly Py_ssize_t end
    cdef readonly object code
    cdef readonly object opaque
    cdef readonly object flag
    cdef readonly bytes body
    cdef readonly tuple values

    def __init__(self, src, start, end, code, opaque, flag, body, values):
        self.src = src
        self.start = start
        self.end = end
        self.code = code
        self.opaque = opaque
        self.flag = flag
        self.body = body
        self.values = values

    def fields(self):
        """Its fields, in order: what equality compares."""
        return (self.src, self.start, self.end, self.code, self.opaque, self.flag, self.body,
                self.values)

    def __eq__(self, other):
        fields = getattr(other, "fields", None)
        return NotImplemented if fields is None else self.fields() == fields()

    def __repr__(self):
        return ("RawRequest(code=%r, opaque=%r, flag=%r, body=%d bytes, values=%r)"
                % (self.code, self.opaque, self.flag, len(self.body), self.values))

# ------------------------------------------------------------- the inline sends of a read

cdef int _MULTI_TAGS_FLAG = 1 << 1
cdef int _TRANSACTION_BITS = 3 << 2


cdef object _plain_record(tuple fields, bytes body, dict topics, tuple stamps, object cluster,
                          Py_ssize_t max_message_size, frozenset not_allowed, str retry_prefix,
                          tuple properties_for_send, object perm_write, object format_error):
    """plain_record (broker.send) for fields send_values read: the same checks, in order."""
    topic = fields[0]
    queue_id = fields[1]
    sysflag = fields[3]
    properties = fields[6]
    config = topics.get(topic)
    sysflag = sysflag & ~_MULTI_TAGS_FLAG
    if config is None or topic.startswith(retry_prefix):
        return None
    if fields[7] or type(properties) is not str:
        return None
    for name in properties_for_send:
        if name in <str>properties:
            return None
    if len(body) > max_message_size or sysflag & _TRANSACTION_BITS:
        return None
    if topic in not_allowed or not config.perm & perm_write:
        return None
    write_queues = config.write_queue_nums
    if queue_id < 0:
        queue_id = random.randrange(write_queues)
    elif queue_id >= max(write_queues, config.read_queue_nums):
        return None
    try:
        record = send_record(stamps[0], stamps[1], stamps[2], cluster, topic, queue_id,
                             fields[2], sysflag, fields[4], fields[5], properties, body)
    except format_error:
        return None
    return queue_id, record


def take_raw_sends(requests, start, topics, stamps, cluster, max_message_size, rules):
    cdef Py_ssize_t pos, first, n, max_size
    cdef RawRequest request
    if (type(requests) is not list or type(topics) is not dict or type(stamps) is not tuple
            or len(<tuple>stamps) != 3 or type(rules) is not tuple or len(<tuple>rules) != 5
            or type((<tuple>rules)[0]) is not frozenset or type((<tuple>rules)[1]) is not str
            or type((<tuple>rules)[2]) is not tuple or type(max_message_size) is not int
            or type(start) is not int or start < 0):
        return TWINS["take_raw_sends"](requests, start, topics, stamps, cluster,
                                       max_message_size, rules)
    for name in (<tuple>rules)[2]:
        if type(name) is not str:
            return TWINS["take_raw_sends"](requests, start, topics, stamps, cluster,
                                           max_message_size, rules)
    try:
        max_size = max_message_size
    except OverflowError:
        return TWINS["take_raw_sends"](requests, start, topics, stamps, cluster,
                                       max_message_size, rules)
    not_allowed, retry_prefix, properties_for_send, perm_write, format_error = <tuple>rules
    taken = []
    records = []
    left = []
    n = len(<list>requests)
    first = start
    for pos in range(first, n):
        item = (<list>requests)[pos]
        if type(item) is not RawRequest:
            return taken, records, left, pos
        request = <RawRequest>item
        fields = send_values(request.values)
        if fields is None:
            return taken, records, left, pos
        placed = _plain_record(<tuple>fields, request.body, <dict>topics, <tuple>stamps, cluster,
                               max_size, not_allowed, retry_prefix, properties_for_send,
                               perm_write, format_error)
        if placed is None:
            left.append(request)
        else:
            taken.append((request.code, (<tuple>placed)[0], request.opaque, 0, request.flag))
            records.append((<tuple>placed)[1])
    return taken, records, left, n



cdef object _plain_request(object src, const uint8_t *p, Py_ssize_t start, Py_ssize_t end,
                           object codes, tuple names):
    """plain_request of the frame p[start:end], or NotImplemented where the twin decides
    (anything but the compact, ASCII, duplicate-free shape clients send)."""
    cdef Py_ssize_t i, n, key_end
    cdef uint32_t ori
    cdef int key, seen = 0
    cdef int64_t number, code = 0, opaque = 0, flag = 0
    cdef bint escaped, have_language = False
    cdef RawRequest raw
    cdef list values
    if end - start < 4:
        return None
    ori = _get32(p + start)
    n = start + 4 + <Py_ssize_t>(ori & 0xFFFFFF)
    if ori >> 24 != _JSON or n > end:
        return None
    values = [None] * len(names)
    i = _skip_space(p, start + 4, n)
    if i >= n or p[i] != 123:  # {
        return NotImplemented
    i = _skip_space(p, i + 1, n)
    if i < n and p[i] == 125:  # }: no language, not plain
        return NotImplemented
    while True:
        if i >= n or p[i] != 34:
            return NotImplemented
        key_end = _json_string(p, i, n, &escaped)
        if key_end < 0 or escaped:
            return NotImplemented
        key = _header_key(p + i + 1, key_end - i - 2)
        if key != _KEY_OTHER:
            if seen & (1 << key):  # a key twice: the twin takes the last
                return NotImplemented
            seen |= 1 << key
        i = _skip_space(p, key_end, n)
        if i >= n or p[i] != 58:  # :
            return NotImplemented
        i = _skip_space(p, i + 1, n)
        if i >= n:
            return NotImplemented
        if key == _KEY_CODE or key == _KEY_FLAG or key == _KEY_OPAQUE or key == _KEY_VERSION:
            i = _json_integer(p, i, n, &number)
            if i < 0 or number < _INT32_MIN or number > _INT32_MAX:
                return NotImplemented
            if key == _KEY_CODE:
                code = number
            elif key == _KEY_FLAG:
                flag = number
            elif key == _KEY_OPAQUE:
                opaque = number
        elif key == _KEY_LANGUAGE or key == _KEY_REMARK:
            if p[i] == 34:
                i = _json_string(p, i, n, &escaped)
                if i < 0:
                    return NotImplemented
                have_language = have_language or key == _KEY_LANGUAGE
            elif key == _KEY_REMARK and _literal(p, i, n, b"null", 4):
                i += 4
            else:
                return NotImplemented
        elif key == _KEY_EXT:
            if _literal(p, i, n, b"null", 4):
                i += 4
            elif p[i] == 123:
                i = _ext_values(p, i, n, names, values)
                if i < 0:
                    return NotImplemented
            else:
                return NotImplemented
        elif p[i] == 34:
            i = _json_string(p, i, n, &escaped)
            if i < 0:
                return NotImplemented
        elif _literal(p, i, n, b"true", 4) or _literal(p, i, n, b"null", 4):
            i += 4
        elif _literal(p, i, n, b"false", 5):
            i += 5
        else:
            i = _json_integer(p, i, n, &number)
            if i < 0:
                return NotImplemented
        i = _skip_space(p, i, n)
        if i < n and p[i] == 44:  # ,
            i = _skip_space(p, i + 1, n)
            continue
        if i < n and p[i] == 125:
            break
        return NotImplemented
    if _skip_space(p, i + 1, n) != n or not have_language:
        return NotImplemented
    if flag & _FLAG_RESPONSE or code not in codes:
        return None
    raw = RawRequest.__new__(RawRequest)
    raw.src = src
    raw.start = start
    raw.end = end
    raw.code = code
    raw.opaque = opaque
    raw.flag = flag
    raw.body = PyBytes_FromStringAndSize(<const char *>p + n, end - n)
    raw.values = tuple(values)
    return raw


cdef Py_ssize_t _ext_values(const uint8_t *p, Py_ssize_t i, Py_ssize_t n, tuple names,
                            list values):
    """Past the extFields object at p[i], the values of `names` (ASCII bytes) put in
    `values`; -1 for the twin (a value that is not a string, a key escaped, a name
    given twice)."""
    cdef Py_ssize_t key_start, key_size, value_start, value_end, k
    cdef bint escaped
    i = _skip_space(p, i + 1, n)
    if i < n and p[i] == 125:
        return i + 1
    while True:
        if i >= n or p[i] != 34:
            return -1
        key_start = i + 1
        i = _json_string(p, i, n, &escaped)
        if i < 0 or escaped:
            return -1
        key_size = i - 1 - key_start
        i = _skip_space(p, i, n)
        if i >= n or p[i] != 58:
            return -1
        i = _skip_space(p, i + 1, n)
        if i >= n or p[i] != 34:
            return -1
        value_start = i + 1
        i = _json_string(p, i, n, &escaped)
        if i < 0:
            return -1
        value_end = i - 1
        for k in range(len(names)):
            name = <bytes>names[k]
            if (PyBytes_GET_SIZE(name) == key_size
                    and memcmp(PyBytes_AS_STRING(name), p + key_start, key_size) == 0):
                if values[k] is not None:
                    return -1
                values[k] = _json_text_of(p, value_start, value_end, escaped)
                break
        i = _skip_space(p, i, n)
        if i < n and p[i] == 44:
            i = _skip_space(p, i + 1, n)
            continue
        if i < n and p[i] == 125:
            return i + 1
        return -1


cdef tuple _ascii_names(object names):
    """`names` (a tuple of str) as ASCII bytes, or None for the twin."""
    if type(names) is not tuple or len(<tuple>names) > _MAX_NAMES:
        return None
    try:
        return tuple([(<str>name).encode("ascii") for name in <tuple>names
                      if type(name) is str])
    except UnicodeEncodeError:
        return None


def plain_request(src, start, end, codes, names):
    cdef const uint8_t[::1] view
    cdef tuple name_bytes = _ascii_names(names)
    cdef Py_ssize_t s, e
    result = NotImplemented
    if (name_bytes is not None and len(name_bytes) == len(<tuple>names)
            and (type(src) is bytes or type(src) is bytearray)
            and type(start) is int and type(end) is int
            and 0 <= start <= end <= len(src) and end > 0):
        view = src
        s = start
        e = end
        result = _plain_request(src, &view[0], s, e, codes, name_bytes)
        view = None
    if result is NotImplemented:
        return TWINS["plain_request"](src, start, end, codes, names)
    return result


def split_requests(src, Py_ssize_t max_frame_bytes, codes, names):
    cdef const uint8_t[::1] view
    cdef const uint8_t *p
    cdef tuple name_bytes = _ascii_names(names)
    cdef Py_ssize_t size, pos = 0
    cdef uint32_t length
    if (name_bytes is None or len(name_bytes) != len(<tuple>names)
            or not (type(src) is bytes or type(src) is bytearray)):
        return TWINS["split_requests"](src, max_frame_bytes, codes, names)
    view = src
    size = view.shape[0]
    p = &view[0] if size else NULL
    items = []
    while pos + 4 <= size:
        length = _get32(p + pos)
        if length < 4 or <Py_ssize_t>length + 4 > max_frame_bytes:
            view = None
            return TWINS["split_requests"](src, max_frame_bytes, codes, names)  # the error
        if pos + 4 + <Py_ssize_t>length > size:
            break
        item = _plain_request(src, p, pos + 4, pos + 4 + length, codes, name_bytes)
        if item is NotImplemented:
            item = TWINS["plain_request"](src, pos + 4, pos + 4 + length, codes, names)
        items.append((pos + 4, pos + 4 + <Py_ssize_t>length) if item is None else item)
        pos += 4 + length
    return items, pos


# ------------------------------------------------ decode_columns: records as Arrow buffers

cdef int _COMPRESSED = 0x1
cdef Py_ssize_t _MAX_PAIRS = 64  # more properties than this take the Python path
cdef int64_t _TIMESTAMP_MS_LIMIT = 9223372036854775  # (1 << 63) // 1000
cdef Py_ssize_t _RECORD_HEAD = 48  # TOTALSIZE .. BORNTIMESTAMP


cdef struct _Record:
    Py_ssize_t start, store_host, store_host_len, body, body_len, topic, topic_len
    Py_ssize_t props, props_len


cdef struct _Pair:
    Py_ssize_t name, name_len, value, value_len  # positions in the buffer


cdef Py_ssize_t _pairs(const uint8_t *p, Py_ssize_t start, Py_ssize_t end, _Pair *out) noexcept:
    """The properties text p[start:end] as string_to_properties reads it: items split at
    \\x02, each at its first \\x01, those with an empty name or value skipped, a later
    duplicate replacing the value in the first one's place; -1 past _MAX_PAIRS pairs."""
    cdef Py_ssize_t count = 0, i = start, item_end, sep, j
    while i <= end:
        item_end = i
        while item_end < end and p[item_end] != 2:
            item_end += 1
        sep = i
        while sep < item_end and p[sep] != 1:
            sep += 1
        if i < sep < item_end - 1:
            for j in range(count):
                if out[j].name_len == sep - i and memcmp(p + out[j].name, p + i, sep - i) == 0:
                    break
            else:
                if count == _MAX_PAIRS:
                    return -1
                out[count].name = i
                out[count].name_len = sep - i
                j = count
                count += 1
            out[j].value = sep + 1
            out[j].value_len = item_end - sep - 1
        i = item_end + 1
    return count


cdef Py_ssize_t _named(const uint8_t *p, _Pair *pairs, Py_ssize_t count, const char *name,
                       Py_ssize_t name_len) noexcept:
    """The index of the pair called `name`, or -1."""
    cdef Py_ssize_t j
    for j in range(count):
        if pairs[j].name_len == name_len and memcmp(p + pairs[j].name, name, name_len) == 0:
            return j
    return -1


cdef bint _utf8(const uint8_t *p, Py_ssize_t start, Py_ssize_t end):
    """Whether p[start:end] is UTF-8 as Python's decoder (the twin's) takes it."""
    cdef Py_ssize_t k
    for k in range(start, end):
        if p[k] >= 0x80:
            try:
                (<const char *>p)[start:end].decode("utf-8")
            except UnicodeDecodeError:
                return False
            return True
    return True


cdef bint _column_record(const uint8_t *p, Py_ssize_t n, Py_ssize_t start, _Record *r) noexcept:
    """Read the V1 record at p[start:] into `r`; False for anything the twin would refuse
    or treat apart (another magic, a compressed body, a bad length, port or text, a
    timestamp a microsecond column cannot hold)."""
    cdef Py_ssize_t remaining = n - start, pos, end
    cdef const uint8_t *q = p + start
    cdef int32_t total, sysflag, port, body_len
    cdef int born_len, store_len, props_len
    cdef int64_t born_ms, store_ms
    if remaining < 8 or <int32_t>_get32(q + 4) != _MESSAGE_MAGIC_CODE:
        return False
    total = <int32_t>_get32(q)
    if total < _MIN_RECORD_SIZE or total > remaining:
        return False
    sysflag = <int32_t>_get32(q + 36)
    if sysflag & _COMPRESSED:
        return False
    born_len = 16 if sysflag & _BORN_V6 else 4
    store_len = 16 if sysflag & _STORE_V6 else 4
    if total < _RECORD_HEAD + born_len + 4 + 8 + store_len + 4 + 16 + 1 + 2:
        return False
    end = total
    pos = _RECORD_HEAD
    port = <int32_t>_get32(q + pos + born_len)
    if port < 0 or port > 0xFFFF:
        return False
    pos += born_len + 4
    store_ms = <int64_t>_get64(q + pos)
    born_ms = <int64_t>_get64(q + 40)
    if not (-_TIMESTAMP_MS_LIMIT <= born_ms < _TIMESTAMP_MS_LIMIT
            and -_TIMESTAMP_MS_LIMIT <= store_ms < _TIMESTAMP_MS_LIMIT):
        return False
    pos += 8
    r.store_host = start + pos
    r.store_host_len = store_len + 4
    port = <int32_t>_get32(q + pos + store_len)
    if port < 0 or port > 0xFFFF:
        return False
    pos += store_len + 4 + 12
    body_len = <int32_t>_get32(q + pos)
    pos += 4
    if body_len < 0 or pos + body_len + 1 + 2 > end:
        return False
    r.body = start + pos
    r.body_len = body_len
    pos += body_len
    r.topic_len = q[pos]  # a signed byte in the twin: 128 and over is refused there
    pos += 1
    if r.topic_len > 127 or pos + r.topic_len + 2 > end:
        return False
    r.topic = start + pos
    pos += r.topic_len
    props_len = <int16_t>((q[pos] << 8) | q[pos + 1])
    pos += 2
    if props_len < 0 or pos + props_len != end:
        return False
    r.props = start + pos
    r.props_len = props_len
    r.start = start
    return (_utf8(p, r.topic, r.topic + r.topic_len)
            and _utf8(p, r.props, r.props + r.props_len))


cdef inline void _put_i32(char *buf, Py_ssize_t i, int32_t v) noexcept:
    memcpy(buf + 4 * i, &v, 4)


cdef inline void _put_i64(char *buf, Py_ssize_t i, int64_t v) noexcept:
    memcpy(buf + 8 * i, &v, 8)


cdef inline void _hex(char *out, const uint8_t *src, Py_ssize_t n) noexcept:
    cdef Py_ssize_t k
    for k in range(n):
        out[2 * k] = _HEX[src[k] >> 4]
        out[2 * k + 1] = _HEX[src[k] & 0xF]


cdef Py_ssize_t _put_property(const uint8_t *p, _Pair *pairs, Py_ssize_t count, const char *name,
                              Py_ssize_t name_len, Py_ssize_t row, bytes data, bytes offsets,
                              bytes valid, Py_ssize_t at):
    """Row `row` of the text column of property `name` (null where it is absent), its
    value written at `at` of `data`; returns where the next row's value goes."""
    cdef Py_ssize_t k = _named(p, pairs, count, name, name_len)
    if k >= 0:
        memcpy(PyBytes_AS_STRING(data) + at, p + pairs[k].value, pairs[k].value_len)
        at += pairs[k].value_len
        PyBytes_AS_STRING(valid)[row >> 3] |= 1 << (row & 7)
    _put_i32(PyBytes_AS_STRING(offsets), row + 1, at)
    return at


cdef tuple _columns(const uint8_t *p, Py_ssize_t n):
    """decode_columns's tuple, or None for anything its twin should read."""
    cdef Py_ssize_t cap = n // _MIN_RECORD_SIZE + 1, rows = 0, start = 0, k, j, c, pairs_total = 0
    cdef Py_ssize_t topic_bytes = 0, id_bytes = 0, keys_bytes = 0, tags_bytes = 0
    cdef Py_ssize_t body_bytes = 0, name_bytes = 0, value_bytes = 0
    cdef Py_ssize_t at_topic = 0, at_id = 0, at_keys = 0, at_tags = 0, at_body = 0
    cdef Py_ssize_t at_name = 0, at_value = 0, pair = 0, u, kk, t
    cdef _Pair pairs[64]
    cdef _Record *recs = <_Record *>PyMem_Malloc(cap * sizeof(_Record))
    cdef const uint8_t *q
    if recs == NULL:
        raise MemoryError()
    try:
        if n > _INT32_MAX:  # int32 offsets throughout, as the twin's arrays hold
            return None
        while start < n:
            if rows == cap or not _column_record(p, n, start, &recs[rows]):
                return None
            c = _pairs(p, recs[rows].props, recs[rows].props + recs[rows].props_len, pairs)
            if c < 0:
                return None
            pairs_total += c
            for j in range(c):
                name_bytes += pairs[j].name_len
                value_bytes += pairs[j].value_len
            topic_bytes += recs[rows].topic_len
            body_bytes += recs[rows].body_len
            u = _named(p, pairs, c, b"UNIQ_KEY", 8)
            id_bytes += pairs[u].value_len if u >= 0 else 2 * (recs[rows].store_host_len + 8)
            k = _named(p, pairs, c, b"KEYS", 4)
            keys_bytes += pairs[k].value_len if k >= 0 else 0
            t = _named(p, pairs, c, b"TAGS", 4)
            tags_bytes += pairs[t].value_len if t >= 0 else 0
            start += <int32_t>_get32(p + start)
            rows += 1
        queue_ids = PyBytes_FromStringAndSize(NULL, 4 * rows)
        queue_offsets = PyBytes_FromStringAndSize(NULL, 8 * rows)
        born_us = PyBytes_FromStringAndSize(NULL, 8 * rows)
        store_us = PyBytes_FromStringAndSize(NULL, 8 * rows)
        topic_offsets = PyBytes_FromStringAndSize(NULL, 4 * (rows + 1))
        topic_data = PyBytes_FromStringAndSize(NULL, topic_bytes)
        id_offsets = PyBytes_FromStringAndSize(NULL, 4 * (rows + 1))
        id_data = PyBytes_FromStringAndSize(NULL, id_bytes)
        keys_valid = PyBytes_FromStringAndSize(NULL, (rows + 7) // 8)
        keys_offsets = PyBytes_FromStringAndSize(NULL, 4 * (rows + 1))
        keys_data = PyBytes_FromStringAndSize(NULL, keys_bytes)
        tags_valid = PyBytes_FromStringAndSize(NULL, (rows + 7) // 8)
        tags_offsets = PyBytes_FromStringAndSize(NULL, 4 * (rows + 1))
        tags_data = PyBytes_FromStringAndSize(NULL, tags_bytes)
        body_offsets = PyBytes_FromStringAndSize(NULL, 4 * (rows + 1))
        body_data = PyBytes_FromStringAndSize(NULL, body_bytes)
        property_offsets = PyBytes_FromStringAndSize(NULL, 4 * (rows + 1))
        name_offsets = PyBytes_FromStringAndSize(NULL, 4 * (pairs_total + 1))
        name_data = PyBytes_FromStringAndSize(NULL, name_bytes)
        value_offsets = PyBytes_FromStringAndSize(NULL, 4 * (pairs_total + 1))
        value_data = PyBytes_FromStringAndSize(NULL, value_bytes)
        record_starts = PyBytes_FromStringAndSize(NULL, 4 * (rows + 1))
        _put_i32(PyBytes_AS_STRING(record_starts), rows, n)
        memset(PyBytes_AS_STRING(keys_valid), 0, (rows + 7) // 8)
        memset(PyBytes_AS_STRING(tags_valid), 0, (rows + 7) // 8)
        for o in (topic_offsets, id_offsets, keys_offsets, tags_offsets, body_offsets,
                  property_offsets, name_offsets, value_offsets):
            _put_i32(PyBytes_AS_STRING(o), 0, 0)
        for j in range(rows):
            q = p + recs[j].start
            _put_i32(PyBytes_AS_STRING(record_starts), j, recs[j].start)
            _put_i32(PyBytes_AS_STRING(queue_ids), j, <int32_t>_get32(q + 12))
            _put_i64(PyBytes_AS_STRING(queue_offsets), j, <int64_t>_get64(q + 20))
            _put_i64(PyBytes_AS_STRING(born_us), j, <int64_t>_get64(q + 40) * 1000)
            _put_i64(PyBytes_AS_STRING(store_us), j,
                     <int64_t>_get64(p + recs[j].store_host - 8) * 1000)
            memcpy(PyBytes_AS_STRING(topic_data) + at_topic, p + recs[j].topic, recs[j].topic_len)
            at_topic += recs[j].topic_len
            _put_i32(PyBytes_AS_STRING(topic_offsets), j + 1, at_topic)
            memcpy(PyBytes_AS_STRING(body_data) + at_body, p + recs[j].body, recs[j].body_len)
            at_body += recs[j].body_len
            _put_i32(PyBytes_AS_STRING(body_offsets), j + 1, at_body)
            c = _pairs(p, recs[j].props, recs[j].props + recs[j].props_len, pairs)
            for kk in range(c):
                memcpy(PyBytes_AS_STRING(name_data) + at_name, p + pairs[kk].name,
                       pairs[kk].name_len)
                at_name += pairs[kk].name_len
                memcpy(PyBytes_AS_STRING(value_data) + at_value, p + pairs[kk].value,
                       pairs[kk].value_len)
                at_value += pairs[kk].value_len
                pair += 1
                _put_i32(PyBytes_AS_STRING(name_offsets), pair, at_name)
                _put_i32(PyBytes_AS_STRING(value_offsets), pair, at_value)
            _put_i32(PyBytes_AS_STRING(property_offsets), j + 1, pair)
            u = _named(p, pairs, c, b"UNIQ_KEY", 8)
            if u >= 0:
                memcpy(PyBytes_AS_STRING(id_data) + at_id, p + pairs[u].value, pairs[u].value_len)
                at_id += pairs[u].value_len
            else:
                _hex(PyBytes_AS_STRING(id_data) + at_id, p + recs[j].store_host,
                     recs[j].store_host_len)
                at_id += 2 * recs[j].store_host_len
                _hex(PyBytes_AS_STRING(id_data) + at_id, q + 28, 8)
                at_id += 16
            _put_i32(PyBytes_AS_STRING(id_offsets), j + 1, at_id)
            at_keys = _put_property(p, pairs, c, b"KEYS", 4, j, keys_data, keys_offsets,
                                    keys_valid, at_keys)
            at_tags = _put_property(p, pairs, c, b"TAGS", 4, j, tags_data, tags_offsets,
                                    tags_valid, at_tags)
    finally:
        PyMem_Free(recs)
    return (rows, queue_ids, queue_offsets, born_us, store_us, topic_offsets, topic_data,
            id_offsets, id_data, keys_valid, keys_offsets, keys_data, tags_valid, tags_offsets,
            tags_data, body_offsets, body_data, property_offsets, name_offsets, name_data,
            value_offsets, value_data, record_starts)


def decode_columns(buf):
    """Fast for bytes (what a pull reply's body and joined records are); anything else
    is the twin's."""
    cdef tuple columns = None
    if type(buf) is bytes and PyBytes_GET_SIZE(buf):
        columns = _columns(<const uint8_t *>PyBytes_AS_STRING(buf), PyBytes_GET_SIZE(buf))
    if columns is None:
        return TWINS["decode_columns"](buf)
    return columns


# -- group commit's fsync thread (twin: raftmq.disk.fsync_thread.FsyncThread) ----------

from libc.errno cimport errno, EINTR
from libc.stdlib cimport free, malloc, realloc

cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_t:
        pass
    int pthread_create(pthread_t *thread, const void *attr,
                       void *(*start)(void *) noexcept nogil, void *arg)
    int pthread_detach(pthread_t thread)

cdef extern from "<sys/eventfd.h>" nogil:
    int eventfd(unsigned int initval, int flags)
    enum:
        EFD_CLOEXEC
        EFD_NONBLOCK

cdef extern from "<unistd.h>" nogil:
    ssize_t _sys_read "read"(int fd, void *buf, size_t count)
    ssize_t _sys_write "write"(int fd, const void *buf, size_t count)
    int _sys_close "close"(int fd)
    int _sys_fsync "fsync"(int fd)
    int _sys_fdatasync "fdatasync"(int fd)

cdef extern from "<time.h>" nogil:
    ctypedef long time_t
    cdef struct timespec:
        time_t tv_sec
        long tv_nsec
    int clock_gettime(int clock, timespec *ts)
    enum:
        CLOCK_MONOTONIC


cdef struct _FsyncState:
    # Written by the owner only while no batch runs, read by the thread only between
    # its read of `requests` and its write to `done`: the two system calls order them.
    int requests  # eventfd the owner writes a batch (or the stop) to
    int done  # eventfd the thread writes each finished batch to
    int count
    int capacity
    int *fds
    int *data_only
    int error
    double took_s
    int stop


cdef double _monotonic_s() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef void *_fsync_loop(void *arg) noexcept nogil:
    """The thread: fsync each batch, never touching the GIL; on the stop, free the
    state it owns from then on."""
    cdef _FsyncState *st = <_FsyncState *>arg
    cdef uint64_t value = 0
    cdef uint64_t one = 1
    cdef int i, rc, first_error
    cdef double started
    while True:
        if _sys_read(st.requests, &value, 8) != 8:
            continue  # EINTR: an eventfd read returns 8 bytes or fails
        if st.stop:
            break
        started = _monotonic_s()
        first_error = 0
        for i in range(st.count):
            rc = _sys_fdatasync(st.fds[i]) if st.data_only[i] else _sys_fsync(st.fds[i])
            if rc != 0 and first_error == 0:
                first_error = errno
        st.error = first_error
        st.took_s = _monotonic_s() - started
        while _sys_write(st.done, &one, 8) != 8 and errno == EINTR:
            pass
    _sys_close(st.requests)
    _sys_close(st.done)
    free(st.fds)
    free(st.data_only)
    free(st)
    return NULL


cdef class FsyncThread:
    cdef _FsyncState *_st
    cdef bint _busy
    cdef bint _closed

    def __cinit__(self):
        cdef pthread_t thread
        cdef _FsyncState *st = <_FsyncState *>malloc(sizeof(_FsyncState))
        if st == NULL:
            raise MemoryError()
        memset(st, 0, sizeof(_FsyncState))
        st.requests = eventfd(0, EFD_CLOEXEC)
        st.done = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)
        if st.requests < 0 or st.done < 0 or pthread_create(&thread, NULL, _fsync_loop, st) != 0:
            if st.requests >= 0:
                _sys_close(st.requests)
            if st.done >= 0:
                _sys_close(st.done)
            free(st)
            raise OSError(errno, "cannot start the fsync thread")
        pthread_detach(thread)
        self._st = st

    @property
    def done_fd(self):
        if self._closed:
            raise RuntimeError("the fsync thread is closed")
        return self._st.done

    def submit(self, fds, data_only):
        cdef uint64_t one = 1
        cdef Py_ssize_t n = len(fds), i
        cdef _FsyncState *st = self._st
        cdef int *grown
        if self._busy:
            raise RuntimeError("a batch is being synced: wait for its result first")
        if self._closed:
            raise RuntimeError("the fsync thread is closed")
        if len(data_only) != n:
            raise ValueError("one data_only flag per file descriptor")
        values = [int(fd) for fd in fds]  # TypeError before anything changes
        flags = [bool(flag) for flag in data_only]
        if n > st.capacity:
            grown = <int *>realloc(st.fds, n * sizeof(int))
            if grown == NULL:
                raise MemoryError()
            st.fds = grown
            grown = <int *>realloc(st.data_only, n * sizeof(int))
            if grown == NULL:
                raise MemoryError()
            st.data_only = grown
            st.capacity = <int>n
        for i in range(n):
            st.fds[i] = values[i]
            st.data_only[i] = flags[i]
        st.count = <int>n
        self._busy = True
        _sys_write(st.requests, &one, 8)

    def result(self):
        cdef uint64_t value = 0
        if self._closed or _sys_read(self._st.done, &value, 8) != 8:
            return None
        self._busy = False
        return self._st.error, self._st.took_s

    def close(self):
        cdef uint64_t one = 1
        if not self._closed:
            self._closed = True
            self._st.stop = 1
            _sys_write(self._st.requests, &one, 8)  # the thread frees the state

    def __dealloc__(self):
        if self._st != NULL:
            self.close()
