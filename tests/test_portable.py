"""Runner setups known not to work are refused before a job is built, with
what to do instead (kvldp/runtime/portable.py), not a stack trace or a
hang deep in Beam. The Flink runs themselves are tests/test_flink.py."""
from __future__ import annotations

from concurrent import futures

import grpc
import pytest
from apache_beam.portability.api import beam_job_api_pb2, beam_job_api_pb2_grpc

from kvldp.cli import commands as cli
from kvldp.runtime import portable
from ports import free_port

SIM = ["simulate", "--mechanism", "pckv-ue", "--epsilon", "2", "--users", "1000", "--keys", "5"]


@pytest.fixture
def tested_sdk(monkeypatch):
    """The installed SDK as if it were the tested one (the default suite runs
    the newest Beam; the Flink pair is 2.62's): the checks after the SDK's."""
    pair = portable.TESTED[0]
    monkeypatch.setattr(portable, "TESTED", (portable.TestedPair(portable.sdk_line(), pair.runner,
                                                                 pair.runner_version, pair.flink),))



def test_flink_runner_without_a_job_server_jar_is_refused_with_the_way_that_works(capsys, tested_sdk):
    assert cli.main([*SIM, "--runner", "FlinkRunner", "--flink_master", "localhost:8081"]) == 2
    err = capsys.readouterr().err
    assert "Maven Central does not publish" in err and "deploy/flink/flink.sh job-server" in err
    assert "Traceback" not in err


def test_a_job_endpoint_nobody_answers_is_an_error_not_a_hang(monkeypatch, capsys, tested_sdk):
    monkeypatch.setattr(portable, "PROBE_TIMEOUT_S", 1.0)
    port = free_port()
    assert cli.main([*SIM, "--runner", "PortableRunner", "--job_endpoint", f"localhost:{port}"]) == 2
    assert f"no job server answers at localhost:{port}" in capsys.readouterr().err
    assert cli.main([*SIM, "--runner", "PortableRunner"]) == 2
    assert "needs --job_endpoint" in capsys.readouterr().err


class _SparkLikeJobService(beam_job_api_pb2_grpc.JobServiceServicer):
    def DescribePipelineOptions(self, request, context):  # noqa: N802 (the gRPC method name)
        option = beam_job_api_pb2.PipelineOptionDescriptor(
            name="spark_master_url", group="org.apache.beam.runners.spark.SparkPipelineOptions")
        return beam_job_api_pb2.DescribePipelineOptionsResponse(options=[option])


def test_a_job_server_of_another_runner_is_refused(capsys, monkeypatch, tested_sdk):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    beam_job_api_pb2_grpc.add_JobServiceServicer_to_server(_SparkLikeJobService(), server)
    port = server.add_insecure_port("localhost:0")
    server.start()
    try:
        assert cli.main([*SIM, "--runner", "PortableRunner", "--job_endpoint", f"localhost:{port}"]) == 2
        assert "is not Flink's (its options: SparkPipelineOptions)" in capsys.readouterr().err
        # an operator may still try it: the check steps aside
        monkeypatch.setenv(portable.ALLOW_UNTESTED, "1")
        portable.check_runner(["--runner", "PortableRunner", "--job_endpoint", f"localhost:{port}"])
    finally:
        server.stop(None)


def test_an_sdk_without_a_tested_job_server_is_refused():
    with pytest.raises(portable.UnsupportedRunner, match=r"apache-beam 2\.99\.0 has no tested Flink job server"):
        portable.check_runner(["--runner", "PortableRunner", "--job_endpoint", "localhost:1"], version="2.99.0")
    portable.check_runner(["--runner", "DataflowRunner"], version="2.99.0")      # other runners: not ours to judge
    portable.check_runner([], version="2.99.0")


def test_flink_sh_refuses_a_job_server_the_sdk_was_not_tested_with():
    pair = portable.TESTED[0]
    assert portable.check_job_server(pair.runner, pair.runner_version, pair.python_sdk + ".0") is None
    assert "is not tested with apache-beam" in portable.check_job_server(pair.runner, "2.61.0",
                                                                         pair.python_sdk + ".0")
    assert portable.main(["check", pair.runner, "2.61.0"]) == 1
    assert portable.main(["check", pair.runner, pair.runner_version]) == (
        0 if portable.pairs_for_sdk() else 1)
