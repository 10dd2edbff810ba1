"""How late the streaming DirectRunner closes a window on an idle Pub/Sub
subscription (stock apache-beam, no kvldp; ``direct-pubsub-pull.md``).

Needs the Pub/Sub emulator and its host::

    gcloud beta emulators pubsub start --host-port=127.0.0.1:8085 &
    PUBSUB_EMULATOR_HOST=127.0.0.1:8085 python docs/upstream/repro_direct_pubsub_pull.py --windows 3

It publishes one message in each of ``--windows`` fixed windows of
``--size`` seconds, then nothing, and prints for every window how long after
its end (wall clock) the on-time pane came out. With the evaluator's 30 s pull deadline an on-time pane
comes 0-30 s after its window's end, whereas the watermark could pass it as
soon as an idle pull returned.
"""
from __future__ import annotations

import argparse
import os
import threading
import time
import uuid

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import trigger, window

PROJECT = "beam-repro"
TIMING = {0: "EARLY", 1: "ON_TIME", 2: "LATE"}


class _Clock(beam.DoFn):
    """Prints each on-time pane's lateness against its window's end."""

    def process(self, kv, win=beam.DoFn.WindowParam, pane=beam.DoFn.PaneInfoParam):
        late, timing = time.time() - float(win.end), TIMING.get(pane.timing, pane.timing)
        print(f"window ending {float(win.end):.0f}: {timing} pane {late:5.1f} s after its end ({kv[1]} message(s))",
              flush=True)
        yield late


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--size", type=float, default=2.0, help="window size, seconds")
    args = parser.parse_args()
    if "PUBSUB_EMULATOR_HOST" not in os.environ:
        raise SystemExit("set PUBSUB_EMULATOR_HOST to a running emulator (see the docstring)")
    from google.cloud import pubsub

    publisher, subscriber = pubsub.PublisherClient(), pubsub.SubscriberClient()
    topic = publisher.topic_path(PROJECT, f"t-{uuid.uuid4().hex[:8]}")
    sub = subscriber.subscription_path(PROJECT, f"s-{uuid.uuid4().hex[:8]}")
    publisher.create_topic(name=topic)
    subscriber.create_subscription(name=sub, topic=topic)

    p = beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner", "--streaming"]))
    (p | beam.io.ReadFromPubSub(subscription=sub)
       | beam.WindowInto(window.FixedWindows(args.size), trigger=trigger.AfterWatermark(),
                         accumulation_mode=trigger.AccumulationMode.DISCARDING)
       | beam.Map(lambda body: (None, 1))
       | beam.CombinePerKey(sum)
       | beam.ParDo(_Clock()))
    result = p.run()

    def publish():
        first = (int(time.time() / args.size) + 2) * args.size
        for w in range(args.windows):
            time.sleep(max(first + w * args.size + args.size / 2 - time.time(), 0))
            publisher.publish(topic, b"x").result()

    threading.Thread(target=publish, daemon=True).start()
    time.sleep(args.size * (args.windows + 2) + 35)
    result.cancel()


if __name__ == "__main__":
    main()
