"""Flex Template entry point: template parameters arrive as --name=value
flags (the names of deploy/dataflow/metadata.json or stream-metadata.json,
generated from the CLI); turn them back into the CLI's flags and run
``kvldp collect``, or the command the image names in KVLDP_TEMPLATE_COMMAND
(``stream`` for the streaming template)."""
import os
import sys

from kvldp.cli.commands import main
from kvldp.cli.template import COMMAND, template_argv

if __name__ == "__main__":
    sys.exit(main(template_argv(sys.argv[1:], os.environ.get("KVLDP_TEMPLATE_COMMAND", COMMAND))))
