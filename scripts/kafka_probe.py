"""Kafka-protocol broker checks with confluent-kafka (librdkafka), run by scripts/kafka-probe.

  probe   [--bootstrap B] [--topic T] [--timeout S]
          produce one message (acks=all), fetch it back and ask for the high watermark; exit 0
          when the bytes match and the watermark is past the message.
  produce --topic T --count N --acked FILE [--partitions P] [--rate R] [--timeout S]
          produce N keyed messages (idempotent, acks=all) at about R/s; every acknowledged one is
          appended at once to FILE as "partition offset key value unixtime"; ends when all are
          acknowledged or have failed (failures are counted, not retried by this tool).
  verify  --topic T --acked FILE [--isolation read_committed|read_uncommitted] [--timeout S]
          read every partition of T from the start and check that each acknowledged message is
          there with its key and value (at the offset its ack named, or, when the ack named a wrong
          one, anywhere in its partition) and that none is stored twice; exit 1 on any loss.

Every wait is bounded; a failure prints one line "kafka-probe: <reason>" on stderr and exits 1.
"""

import argparse
import logging
import os
import socket
import sys
import time
import uuid

try:
    from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic
except ImportError as err:  # the venv is made by scripts/kafka-probe
    print(f"kafka-probe: confluent-kafka is not importable ({err})", file=sys.stderr)
    sys.exit(3)


class ProbeError(Exception):
    pass


class LastLog(logging.Handler):
    """Keeps librdkafka's last log line (instead of printing each retry) to explain a failure."""

    last = None

    def emit(self, record):
        LastLog.last = record.getMessage()


_logger = logging.getLogger("librdkafka")
_logger.addHandler(LastLog())
_logger.propagate = False


def base_conf(args):
    ms = max(1000, int(args.timeout * 1000))
    return {
        "bootstrap.servers": args.bootstrap,
        "socket.timeout.ms": ms,
        "socket.connection.setup.timeout.ms": ms,
        "reconnect.backoff.max.ms": 500,
        "logger": _logger,
    }


STARTED = time.monotonic()


def why(prefix, err):
    last = f"; client log: {LastLog.last}" if LastLog.last else ""
    return ProbeError(f"{prefix} after {time.monotonic() - STARTED:.1f} s: {err}{last}")


def tcp_check(bootstrap, deadline):
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=min(2.0, remaining(deadline))).close()
    except OSError as err:
        raise ProbeError(f"nothing answers on {host}:{port} ({err.strerror or err})") from None


def remaining(deadline):
    left = deadline - time.monotonic()
    if left <= 0:
        raise ProbeError("timed out")
    return left


def ensure_topic(args, topic, partitions, deadline):
    tcp_check(args.bootstrap, deadline)
    admin = AdminClient(base_conf(args))
    try:
        md = admin.list_topics(timeout=remaining(deadline))
    except KafkaException as err:
        raise why("metadata request failed", err.args[0].str()) from None
    if not md.brokers:
        raise ProbeError("metadata lists no broker")
    if topic in md.topics and md.topics[topic].error is None:
        return len(md.topics[topic].partitions)
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1)],
        request_timeout=remaining(deadline),
    )
    try:
        futures[topic].result(timeout=remaining(deadline))
    except KafkaException as err:
        if err.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise why(f"create topic {topic}", err.args[0].str()) from None
    # wait (bounded) until the metadata shows the topic with a leader for each partition
    while True:
        md = admin.list_topics(topic=topic, timeout=remaining(deadline))
        t = md.topics.get(topic)
        if t is not None and t.error is None and t.partitions and all(
            p.leader >= 0 for p in t.partitions.values()
        ):
            return len(t.partitions)
        time.sleep(0.1)


def probe(args):
    start = time.monotonic()
    deadline = start + args.timeout
    ensure_topic(args, args.topic, 1, deadline)
    key = b"probe"
    value = f"probe {uuid.uuid4()} {time.time():.3f}".encode()
    conf = base_conf(args) | {
        "acks": "all",
        "enable.idempotence": False,
        "message.timeout.ms": max(1000, int(remaining(deadline) * 1000)),
        "retries": 2,
    }
    producer = Producer(conf)
    result = {}

    def on_delivery(err, msg):
        result["err"], result["msg"] = err, msg

    producer.produce(args.topic, key=key, value=value, partition=0, on_delivery=on_delivery)
    while not result:
        producer.poll(min(0.1, remaining(deadline)))
    if result["err"] is not None:
        raise why(f"produce to {args.topic} failed", result["err"].str())
    offset = result["msg"].offset()
    produced_ms = (time.monotonic() - start) * 1000

    consumer = Consumer(base_conf(args) | {
        "group.id": "waitroom-kafka-probe",  # never joined: partitions are assigned by hand
        "enable.auto.commit": False,
        "fetch.wait.max.ms": 100,
    })
    try:
        consumer.assign([TopicPartition(args.topic, 0, offset)])
        while True:
            msg = consumer.poll(min(0.5, remaining(deadline)))
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise why(f"fetch from {args.topic} failed", msg.error().str())
            if msg.offset() == offset:
                if msg.value() != value or msg.key() != key:
                    raise ProbeError(
                        f"fetched offset {offset} of {args.topic} but its bytes differ from those produced"
                    )
                break
        # ListOffsets (latest, read_committed) as rdkafka's fetch_watermarks sends it (the ledger's
        # lag): tansu 0.6.0 on PostgreSQL < 16 fails it and drops the connection
        try:
            _, high = consumer.get_watermark_offsets(
                TopicPartition(args.topic, 0), timeout=remaining(deadline)
            )
        except KafkaException as err:
            raise why("list offsets (high watermark) failed", err.args[0].str()) from None
        if high <= offset:
            raise ProbeError(f"high watermark {high} of {args.topic}/0 is not past offset {offset}")
    finally:
        consumer.close()
    total_ms = (time.monotonic() - start) * 1000
    print(
        f"kafka: ok ({args.bootstrap}: produced {args.topic}/0@{offset} in {produced_ms:.0f} ms, "
        f"fetched it back and listed offsets in {total_ms:.0f} ms)"
    )


def produce(args):
    deadline = time.monotonic() + args.timeout
    partitions = ensure_topic(args, args.topic, args.partitions, deadline)
    producer = Producer(base_conf(args) | {
        "acks": "all",
        "enable.idempotence": True,
        "message.timeout.ms": int(args.message_timeout * 1000),
        "linger.ms": 5,
    })
    out = open(args.acked, "a", buffering=1)  # one line per ack, written at once
    counts = {"acked": 0, "failed": 0}
    first_err = []
    run = uuid.uuid4().hex[:8]

    def on_delivery(err, msg):
        if err is None:
            counts["acked"] += 1
            out.write(f"{msg.partition()} {msg.offset()} {msg.key().decode()} {msg.value().decode()} "
                      f"{time.time():.3f}\n")
        else:
            counts["failed"] += 1
            if not first_err:
                first_err.append(str(err))

    t0 = time.monotonic()
    for i in range(args.count):
        due = t0 + i / args.rate
        while time.monotonic() < due:
            producer.poll(max(0.0, min(0.01, due - time.monotonic())))
        key = f"k{i % 997:03d}"
        value = f"{run}-{i:07d}"
        while True:
            try:
                producer.produce(args.topic, key=key, value=value, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 1000 == 999:
            print(f"[{time.strftime('%H:%M:%S')}] produced {i + 1}, acked {counts['acked']}, "
                  f"failed {counts['failed']}", flush=True)
    left = producer.flush(max(1.0, deadline - time.monotonic()))
    out.close()
    print(f"[{time.strftime('%H:%M:%S')}] done: topic {args.topic} ({partitions} partitions), "
          f"sent {args.count}, acked {counts['acked']}, failed {counts['failed']}, "
          f"unresolved {left}, first error: {first_err[0] if first_err else 'none'}", flush=True)


def verify(args):
    deadline = time.monotonic() + args.timeout
    acked = []  # (partition, reported offset or None, key, value)
    with open(args.acked) as f:
        for line in f:
            p, o, k, v = line.split()[:4]
            acked.append((int(p), None if o == "None" else int(o), k, v))
    consumer = Consumer(base_conf(args) | {
        "group.id": "waitroom-kafka-verify",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        # read_committed as rdkafka's default; read_uncommitted gets past tansu 0.6.0 on PostgreSQL
        # < 16, which fails ListOffsets(latest, read_committed) (docs/reliability-broker.md)
        "isolation.level": args.isolation,
    })
    md = consumer.list_topics(topic=args.topic, timeout=remaining(deadline))
    t = md.topics.get(args.topic)
    if t is None or t.error is not None:
        raise ProbeError(f"topic {args.topic} not found: {t.error if t else 'absent'}")
    parts = sorted(t.partitions)
    highs = {}
    for p in parts:
        _, hi = consumer.get_watermark_offsets(TopicPartition(args.topic, p), timeout=remaining(deadline))
        highs[p] = hi
    consumer.assign([TopicPartition(args.topic, p, 0) for p in parts])
    seen = {}
    done = {p for p in parts if highs[p] == 0}
    while len(done) < len(parts):
        msg = consumer.poll(min(0.5, remaining(deadline)))
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                if msg.offset() >= highs[msg.partition()]:
                    done.add(msg.partition())
                continue
            raise ProbeError(f"fetch failed: {msg.error()}")
        pos = (msg.partition(), msg.offset())
        if pos in seen:
            raise ProbeError(f"offset {pos} fetched twice")
        seen[pos] = (msg.key().decode(), msg.value().decode())
        if msg.offset() + 1 >= highs[msg.partition()]:
            done.add(msg.partition())
    consumer.close()
    where = {}  # (partition, key, value) -> offsets it is stored at
    for (p, o), (k, v) in seen.items():
        where.setdefault((p, k, v), []).append(o)
    exact = elsewhere = 0
    missing = []
    for p, o, k, v in acked:
        if o is not None and seen.get((p, o)) == (k, v):
            exact += 1
        elif (p, k, v) in where:
            # stored, but the delivery report named another offset: after the restart, tansu
            # answers a retried batch it already had with base offset -1 (librdkafka then reports
            # None, 0, 1, …); the message itself is there
            elsewhere += 1
        else:
            missing.append((p, o, v))
    dups = sum(len(offsets) - 1 for offsets in where.values())
    acked_set = {(p, k, v) for p, _, k, v in acked}
    unacked_stored = sum(1 for pkv in where if pkv not in acked_set)
    print(f"verify {args.topic}: acknowledged {len(acked)}, stored {len(seen)} "
          f"(high watermarks {dict(sorted(highs.items()))}); acknowledged and stored at the reported "
          f"offset {exact}, stored at another offset {elsewhere}, MISSING {len(missing)}; "
          f"stored twice {dups}; stored but never acknowledged {unacked_stored}")
    if missing or dups:
        raise ProbeError(f"{len(missing)} acknowledged messages missing (first: {missing[:3]}), "
                         f"{dups} stored twice")


def main():
    ap = argparse.ArgumentParser(prog="kafka-probe")
    ap.add_argument("--bootstrap", default=os.environ.get("WAITROOM_KAFKA_BROKERS", "127.0.0.1:9092"))
    ap.add_argument("--timeout", type=float, default=10.0, help="overall bound in seconds")
    sub = ap.add_subparsers(dest="cmd")
    p = sub.add_parser("probe")
    p.add_argument("--topic", default="waitroom-probe")
    p = sub.add_parser("produce")
    p.add_argument("--topic", required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--acked", required=True)
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--rate", type=float, default=1000.0)
    p.add_argument("--message-timeout", type=float, default=30.0)
    p = sub.add_parser("verify")
    p.add_argument("--topic", required=True)
    p.add_argument("--isolation", default="read_committed", choices=["read_committed", "read_uncommitted"])
    p.add_argument("--acked", required=True)
    args = ap.parse_args()
    if args.cmd is None:
        args.cmd, args.topic = "probe", "waitroom-probe"
    try:
        {"probe": probe, "produce": produce, "verify": verify}[args.cmd](args)
    except ProbeError as err:
        print(f"kafka-probe: {err}", file=sys.stderr)
        sys.exit(1)
    except KafkaException as err:
        print(f"kafka-probe: {why('client error', err.args[0].str())}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
