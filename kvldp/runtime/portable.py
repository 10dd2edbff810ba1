"""Beam's portable runners (Flink): which Python SDK / Java job-server pairs
kvldp is tested with, checked before a job is built.

Beam's ``FlinkRunner`` in the Python SDK starts a job server by downloading
``beam-runners-flink-<flink>-job-server-<sdk>.jar``; Maven Central has no
such shaded jars (and no Java artifacts of every SDK release), so that path
dies deep in a download. kvldp's path instead: ``deploy/flink/flink.sh
job-server`` runs ``FlinkJobServerDriver`` on a classpath Maven resolves
from ``beam-runners-flink-<flink>`` (``deploy/flink/pom.xml``), and jobs run
with ``--runner PortableRunner --job_endpoint HOST:PORT``. The portable Job
API carries no version, so the pairing is enforced at both ends: this module
refuses an SDK with no tested pair and a job endpoint that does not answer
or is not a Flink job server, and ``flink.sh`` refuses to start a job server
whose runner version is not paired with the installed SDK
(``python -m kvldp.runtime.portable check RUNNER_VERSION``).
``KVLDP_ALLOW_UNTESTED_RUNNER=1`` lets an operator try an untested pair.
"""
from __future__ import annotations

import dataclasses
import os
import sys

import apache_beam

from kvldp.runtime import extras

ALLOW_UNTESTED = "KVLDP_ALLOW_UNTESTED_RUNNER"
PROBE_TIMEOUT_S = 10.0
START_HINT = ("start one with `deploy/flink/flink.sh job-server --port PORT` (add `--flink-master HOST:8081` for a "
              "Flink cluster) and run with --runner PortableRunner --job_endpoint localhost:PORT "
              "--environment_type LOOPBACK")


@dataclasses.dataclass(frozen=True)
class TestedPair:
    """A Python SDK release line and the Java job server it ran against in
    kvldp's Flink tests (``tests/test_flink.py``)."""

    python_sdk: str           # apache-beam major.minor
    runner: str               # the Maven artifact of the job server
    runner_version: str
    flink: str                # the Flink release the runner is built on (= the cluster's)

    def __str__(self):
        return (f"apache-beam {self.python_sdk}.x with {self.runner}:{self.runner_version} "
                f"(Flink {self.flink})")


# One Beam release on both sides of the runner: Maven Central serves a complete Flink runner only at 2.62.0
# (2.70.0 lacks beam-runners-java-job-service), so the Python SDK is 2.62 too (deploy/flink/constraints.txt).
TESTED = (TestedPair("2.62", "beam-runners-flink-1.19", "2.62.0", "1.19.0"),)


class UnsupportedRunner(ValueError):
    """A runner setup kvldp would only fail on later, deep in Beam."""


def sdk_line(version: str | None = None) -> str:
    return ".".join((version or apache_beam.__version__).split(".")[:2])


def pairs_for_sdk(version: str | None = None) -> list[TestedPair]:
    return [p for p in TESTED if p.python_sdk == sdk_line(version)]


def _untested_allowed() -> bool:
    return os.environ.get(ALLOW_UNTESTED) == "1"


def _tested_list() -> str:
    return "; ".join(map(str, TESTED))


def check_runner(beam_args, version: str | None = None) -> None:
    """Refuse, with what to do instead, a Flink/portable setup that is known
    not to work or was never tested; other runners pass untouched."""
    from apache_beam.options.pipeline_options import FlinkRunnerOptions, PortableOptions, StandardOptions
    options = apache_beam.options.pipeline_options.PipelineOptions(list(beam_args))
    runner = (options.view_as(StandardOptions).runner or "").rsplit(".", 1)[-1]
    if runner in ("DataflowRunner", "TestDataflowRunner"):
        extras.require_gcp("the Dataflow runner")
    if runner not in ("FlinkRunner", "PortableRunner"):
        return
    if _untested_allowed():
        return
    if not pairs_for_sdk(version):
        raise UnsupportedRunner(f"apache-beam {version or apache_beam.__version__} has no tested Flink job server "
                                f"(tested: {_tested_list()}); install a tested SDK or set {ALLOW_UNTESTED}=1")
    if runner == "FlinkRunner":
        if not options.view_as(FlinkRunnerOptions).flink_job_server_jar:
            raise UnsupportedRunner(
                f"--runner FlinkRunner downloads beam-runners-flink-*-job-server-{apache_beam.__version__}.jar, "
                f"which Maven Central does not publish: {START_HINT}")
        return
    endpoint = options.view_as(PortableOptions).job_endpoint
    if not endpoint or endpoint == "embed":
        raise UnsupportedRunner(f"--runner PortableRunner needs --job_endpoint HOST:PORT of a job server: {START_HINT}")
    groups = job_server_option_groups(endpoint)
    if not any(".runners.flink." in g for g in groups):
        raise UnsupportedRunner(f"the job server at {endpoint} is not Flink's (its options: "
                                f"{', '.join(sorted(g.rsplit('.', 1)[-1] for g in groups)) or 'none'}); kvldp is "
                                f"tested on {_tested_list()}; set {ALLOW_UNTESTED}=1 to try it")


def job_server_option_groups(endpoint: str, timeout: float | None = None) -> set[str]:
    """The pipeline-option groups (Java classes) a job server describes: a
    Flink job server lists ``org.apache.beam.runners.flink.FlinkPipelineOptions``."""
    return {option.group for option in _described_options(endpoint, timeout)}


def job_server_flags(endpoint: str, timeout: float | None = None) -> set[str]:
    """The ``--flags`` of the options a job server describes (its runner's,
    e.g. Flink's ``--checkpointing_interval``): Beam's portable runner adds
    them to the pipeline's options, so they are Beam options of that job."""
    return {f"--{option.name}" for option in _described_options(endpoint, timeout)}


def _described_options(endpoint: str, timeout: float | None = None) -> list:
    import grpc
    timeout = PROBE_TIMEOUT_S if timeout is None else timeout
    from apache_beam.portability.api import beam_job_api_pb2, beam_job_api_pb2_grpc
    channel = grpc.insecure_channel(endpoint)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        stub = beam_job_api_pb2_grpc.JobServiceStub(channel)
        reply = stub.DescribePipelineOptions(beam_job_api_pb2.DescribePipelineOptionsRequest(), timeout=timeout)
    except (grpc.FutureTimeoutError, grpc.RpcError):
        raise UnsupportedRunner(f"no job server answers at {endpoint} (waited {timeout:g} s): {START_HINT}") from None
    finally:
        channel.close()
    return list(reply.options)


def check_job_server(runner: str, runner_version: str, version: str | None = None) -> str | None:
    """The reason a job server ``runner:runner_version`` is not tested with
    the installed SDK, or ``None``; ``flink.sh`` calls this before starting one."""
    pairs = pairs_for_sdk(version)
    if any(p.runner == runner and p.runner_version == runner_version for p in pairs):
        return None
    return (f"{runner}:{runner_version} is not tested with apache-beam {version or apache_beam.__version__} "
            f"(tested: {_tested_list()}); set {ALLOW_UNTESTED}=1 to start it anyway")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3 or argv[0] != "check":
        print("usage: python -m kvldp.runtime.portable check RUNNER_ARTIFACT RUNNER_VERSION", file=sys.stderr)
        return 2
    reason = None if _untested_allowed() else check_job_server(argv[1], argv[2])
    if reason:
        print(f"kvldp: {reason}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
