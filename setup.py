"""kvldp: key-value data under local differential privacy, on Apache Beam."""
from setuptools import find_packages, setup

setup(
    name="kvldp",
    version="0.1.0",
    description="Key-value local differential privacy mechanisms as Apache Beam pipelines",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    # One top-level package: nothing generic ("pipelines", "schemas") lands in site-packages.
    packages=find_packages(include=["kvldp", "kvldp.*"]),
    package_data={"kvldp.schemas": ["*.avsc"]},
    install_requires=[
        # Beam without its gcp extra: that extra's clients (BigQuery, Pub/Sub, Dataflow, apitools) are
        # imported by `import apache_beam` whenever installed, 0.45 of its 0.95 s at every command's
        # start; gs:// needs only google-cloud-storage (below). Pub/Sub and Dataflow: the gcp extra.
        # The range CI runs (.ci/run): the floor (2.62, the Flink route's release: deploy/flink/constraints.txt)
        # and the newest; kvldp.runtime tunes the local runner on exactly these two (tweaks.TESTED_BEAM).
        "apache-beam>=2.62,<2.78",
        "numpy>=1.24",
        "scipy>=1.10",
        "fastavro>=1.13",
        # report files' codec, Avro's "zstandard" (fastavro reads it through this before Python 3.14's compression.zstd)
        "backports.zstd>=1.0; python_version < '3.14'",
        # columnar text IO: ratings CSV blocks, estimate files read back as columns (Beam depends on it too)
        "pyarrow>=14",
        # the clients' noise: AES-CTR / ChaCha20 bit generators for numpy (mechanisms/privacy/randomness.py)
        "randomgen>=2.1",
        # memoised reports: AES-ECB over every device's blocks at once (mechanisms/privacy/memo.py)
        "cryptography>=41",
        "google-cloud-storage>=2.10",
        "matplotlib>=3.7",
        "tqdm>=4.60",
    ],
    extras_require={
        # kvldp stream / publish (Pub/Sub) and --runner DataflowRunner (the Flex Template image installs it)
        "gcp": ["apache-beam[gcp]>=2.62,<2.78"],
        # the tests cover Pub/Sub (emulator) and the Dataflow template too
        # (pytest-xdist: the suite runs its files on every core, ``-n auto --dist loadfile``)
        # kvldp publish --kafka-bootstrap (the collector reads Kafka with Beam's KafkaIO on Flink)
        "kafka": ["confluent-kafka>=2.6,<3"],
        "test": ["pytest>=7", "pytest-xdist>=3.5", "gcp-storage-emulator>=2026.7.18", "apache-beam[gcp]>=2.62,<2.78",
                 "confluent-kafka>=2.6,<3", "radon>=6", "hypothesis>=6.100"],
        # kvldp bench --sweep --kernels: the peer LDP libraries, timed next to kvldp
        "bench": ["pure-ldp==1.2.0", "multi-freq-ldpy==0.2.5", "scikit-learn", "statsmodels"],   # pure-LDP imports both
        # the docs site: mkdocs.yml, `mkdocs build --strict` (API reference by mkdocstrings, pages made by docs/hooks.py)
        "docs": ["mkdocs>=1.6,<2", "mkdocstrings[python]>=0.27", "mkdocs-material>=9.5"],
    },
    entry_points={"console_scripts": ["kvldp = kvldp.runtime.start:main"]},
)
