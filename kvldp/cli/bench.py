"""``kvldp bench``'s flags; the job is ``kvldp.bench.command``."""
from __future__ import annotations

import argparse

from kvldp.brokers import kafka as kafka_admin
from kvldp.cli import data_args, mechanism_args
from kvldp.cli.units import path_arg, positive_int

SYNTHETIC = ("synthetic-uu", "synthetic-gg", "synthetic-multi", "synthetic-corr")


def add_arguments(parser: argparse.ArgumentParser):
    mechanism_args.add_mechanism_args(parser, epsilon=4.0, mechanism="pckv-ue")
    parser.add_argument("--users", type=positive_int, default=1_000_000,
                        help="simulated users (default 1,000,000)")
    parser.add_argument("--keys", type=positive_int, default=100, help="keys, d (default 100)")
    parser.add_argument("--dataset", default="synthetic-uu", choices=SYNTHETIC,
                        help="the synthetic users (default synthetic-uu)")
    data_args.add_batch_args(parser)
    parser.add_argument("--seed", type=int, default=1, help="the data's and the noise's seed (default 1)")
    data_args.add_fast_rng_arg(parser)
    parser.add_argument("--repeats", type=positive_int, default=3,
                        help="timed runs of each path (each point of a sweep); the best is reported (the first "
                             "pays one-off warm-up; runs on shared cores vary)")
    sweep = parser.add_argument_group("a sweep: every mechanism at several sizes (bench.csv + bench.png)")
    sweep.add_argument("--sweep", default=None, type=path_arg, metavar="DIR",
                       help="run the sweep into DIR: each (mechanism, users, path) in a process of its own")
    sweep.add_argument("--mechanisms", default="all", help="comma-separated, or all (default)")
    sweep.add_argument("--sizes", default="100000,1000000,10000000", help="user counts (default 1e5,1e6,1e7)")
    sweep.add_argument("--stock", action="store_true",
                       help="also time each point's Beam job on stock Beam (KVLDP_STOCK_BEAM=1: Beam's own "
                            "runner, none of kvldp.runtime's tweaks), path beam-stock in bench.csv")
    live = parser.add_argument_group("the streaming collector (kvldp stream): throughput and latency "
                                     "(bench_stream.py); the runner is the Beam arguments'")
    live.add_argument("--stream", default=None, type=path_arg, metavar="DIR",
                      help="benchmark kvldp stream into DIR (stream_bench.csv): a backlog of --users reports in "
                           "batches of --batch-size, then --stream-rate batches/s for --stream-seconds")
    live.add_argument("--stream-rate", type=float, default=2.0, help="batches per second in the latency phase (2)")
    live.add_argument("--stream-seconds", type=float, default=30.0, help="length of the latency phase (30 s)")
    live.add_argument("--stream-kafka-bootstrap", default=None, type=kafka_admin.bootstrap_arg,
                      help="HOST:PORT of a Kafka broker to stream from (default: Pub/Sub, the emulator of "
                           "PUBSUB_EMULATOR_HOST)")
    live.add_argument("--stream-expansion-service", default="localhost:8097",
                      help="the expansion service for KafkaIO (flink.sh job-server's; default localhost:8097)")
    sweep.add_argument("--kernels", action="store_true",
                       help="also the GRR/OUE/OLH kernels against the plain NumPy floor, and the peer libraries "
                            "when installed (pip install 'kvldp[bench]')")
