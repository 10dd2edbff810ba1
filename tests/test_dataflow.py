"""Dataflow without a cloud bill: the Flex Template metadata validated
against the Dataflow API's own message types, and each job's graph built for
``DataflowRunner`` offline (``--dry_run``: the runner translates the whole
pipeline, pickling every DoFn, and submits nothing), so a wrong option, a
duplicated label or an unpicklable DoFn shows here, not on a customer's bill."""
from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import apache_beam as beam
import pytest

from kvldp.cli import commands as cli
from kvldp.cli import template
from kvldp.pipelines import split
from kvldp.runtime import beam_flags

ROOT = Path(__file__).resolve().parents[1]
OFFLINE = ["--runner", "DataflowRunner", "--dry_run=True", "--no_auth", "--project", "kvldp-offline",
           "--region", "europe-west1", "--temp_location", "gs://kvldp-offline/tmp", "--sdk_location", "container"]


@pytest.mark.parametrize("command", sorted(template.TEMPLATES))
def test_flex_template_metadata_is_valid(command):
    # the Dataflow API's client: in apache-beam[gcp] since 2.6x (not in 2.62's)
    TemplateMetadata = pytest.importorskip("google.cloud.dataflow_v1beta3").TemplateMetadata  # noqa: N806
    text = (ROOT / "deploy" / "dataflow" / template.TEMPLATES[command][0]).read_text()
    parsed = TemplateMetadata.from_json(text, ignore_unknown_fields=False)    # unknown or mistyped keys raise
    assert parsed.name and parsed.description
    assert parsed.streaming == (command == "stream")
    beam_options = {s.lstrip("-").replace("-", "_") for s in beam_flags.flags()}
    names = [p.name for p in parsed.parameters]
    assert len(names) == len(set(names))
    for p in parsed.parameters:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", p.name), p.name
        assert p.label and p.help_text, p.name
        assert p.name not in beam_options, f"{p.name} would shadow Beam's pipeline option"
        for regex in p.regexes:
            re.compile(regex)
    required = {p.name for p in parsed.parameters if not p.is_optional}
    assert required == {"mechanism", "epsilon", *({"input", "output"} if command == "collect" else
                                                  {"subscription", "window"})}


def test_a_template_launch_is_a_valid_command_line():
    """What the launcher does with a run's parameters parses as the job's flags."""
    argv = template.template_argv(["--mechanism=pckv-ue", "--epsilon=4", "--input=gs://b/R-*.avro",
                                   "--key_dictionary=gs://b/R.keys.txt", "--output=gs://b/est.avro",
                                   "--temp_location=gs://b/tmp"])
    command, config, beam_args = cli.configure(argv)
    assert command == "collect" and config.key_dictionary == "gs://b/R.keys.txt"
    assert beam_args == ["--temp_location=gs://b/tmp"]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out = tmp_path_factory.mktemp("reports")
    for mechanism in ("pckv-ue", "ioh-oue"):
        assert cli.main(["perturb", "--mechanism", mechanism, "--epsilon", "2", "--users", "3000", "--keys", "8",
                         "--seed", "1", "--output", str(out / mechanism / "R.avro")]) == 0
    return out


def _offline(argv, tmp_path, capsys):
    job_file = tmp_path / "job.json"
    assert cli.main([*argv, *OFFLINE, "--dataflow_job_file", str(job_file)]) == 0
    said = capsys.readouterr().out
    assert "dry run: the DataflowRunner job was built" in said and "not submitted" in said
    request = json.loads(job_file.read_text())
    return request, said


@pytest.mark.parametrize("mechanism", ["pckv-ue", "ioh-oue"])
def test_collect_builds_for_dataflow(mechanism, reports, tmp_path, capsys):
    request, _ = _offline(["collect", "--mechanism", mechanism, "--epsilon", "2",
                           "--input", str(reports / mechanism / "R-*.avro"),
                           "--key-dictionary", str(reports / mechanism / "R.keys.txt"),
                           "--output", "gs://kvldp-offline/est.avro"], tmp_path, capsys)
    labels = {t["uniqueName"] for t in request["pipeline"]["components"]["transforms"].values()}
    assert any(label.startswith("WriteEstimates") for label in labels)
    assert request["job"]["name"]


@pytest.mark.parametrize("mechanism", [["pckv-ue"], ["privkvm", "--rounds", "3"], ["ks-grr"], ["kvue"]])
def test_simulate_builds_for_dataflow(mechanism, tmp_path, capsys):
    _, said = _offline(["simulate", "--mechanism", *mechanism, "--epsilon", "2", "--users", "2000", "--keys", "8",
                        "--seed", "1", "--output", "gs://kvldp-offline/est.avro"], tmp_path, capsys)
    assert "transforms" in said


def test_perturb_builds_for_dataflow(tmp_path, capsys):
    _offline(["perturb", "--mechanism", "pckv-grr", "--epsilon", "2", "--users", "2000", "--keys", "8",
              "--output", "gs://kvldp-offline/rep/R.avro"], tmp_path, capsys)


class _DuplicateLabels(beam.PTransform):
    def expand(self, pcoll):
        pcoll | "Same" >> beam.Map(str)
        return pcoll | "Same" >> beam.Map(str)


class _UnpicklableDoFn(beam.PTransform):
    def expand(self, pcoll):
        connection = sqlite3.connect(":memory:")      # e.g. a client opened at graph construction
        return pcoll | "HoldsAConnection" >> beam.Map(lambda x: (connection, x)[1])


@pytest.mark.parametrize("defect, error", [(_DuplicateLabels, "already exists"),
                                           (_UnpicklableDoFn, "pickle")])
def test_the_offline_build_catches_a_defective_graph(defect, error, reports, monkeypatch, capsys):
    real = split.WriteEstimates
    monkeypatch.setattr(split, "WriteEstimates", lambda *a, **k: _Chain(defect(), real(*a, **k)))
    argv = ["collect", "--mechanism", "pckv-ue", "--epsilon", "2", "--input", str(reports / "pckv-ue" / "R-*.avro"),
            "--key-dictionary", str(reports / "pckv-ue" / "R.keys.txt"), "--output", "gs://kvldp-offline/est.avro",
            *OFFLINE]
    assert cli.main(argv) == 1
    assert error in capsys.readouterr().err
    monkeypatch.setenv("KVLDP_DEBUG", "1")
    with pytest.raises(Exception, match=error):
        cli.main(argv)


class _Chain(beam.PTransform):
    def __init__(self, first, second):
        super().__init__()
        self._first, self._second = first, second

    def expand(self, pcoll):
        return pcoll | "Defect" >> self._first | "Then" >> self._second


@pytest.mark.parametrize("mechanism", [["pckv-ue"], ["privkvm", "--rounds", "3", "--collection-id",
                                                     "0123456789abcdef0123456789abcdef",
                                                     "--broadcast-topic", "projects/kvldp-offline/topics/broadcast"]])
def test_stream_builds_for_dataflow_streaming(mechanism, tmp_path, capsys):
    """The continuous collector's graph (Pub/Sub source, windows, stateful
    round chaining, Pub/Sub sinks) as Dataflow's streaming job."""
    keys = tmp_path / "keys.txt"
    keys.write_text("a\nb\nc\n")
    request, _ = _offline(["stream", "--mechanism", *mechanism, "--epsilon", "2", "--key-dictionary", str(keys),
                              "--subscription", "projects/kvldp-offline/subscriptions/reports", "--window", "1m",
                              "--output-dir", "gs://kvldp-offline/panes"], tmp_path, capsys)
    assert request["job"]["type"] == "JOB_TYPE_STREAMING"
    labels = {t["uniqueName"] for t in request["pipeline"]["components"]["transforms"].values()}
    assert any("ReadFromPubSub" in label or "Read" in label for label in labels)
