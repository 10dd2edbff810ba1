"""Flex Template entry point: template parameters arrive as --name=value
flags (the names of deploy/dataflow/metadata.json, generated from the CLI);
turn them back into the CLI's flags and run ``kvldp collect``."""
import sys

from kvldp.pipelines.cli import main
from kvldp.pipelines.template import template_argv

if __name__ == "__main__":
    sys.exit(main(template_argv(sys.argv[1:])))
