"""Flex Template entry point: template parameters arrive as --name=value
flags; translate the template's underscore names into the CLI's and run."""
import sys

from kvldp.pipelines.cli import main

if __name__ == "__main__":
    args = [a.replace("--key_dictionary", "--key-dictionary") for a in sys.argv[1:]]
    sys.exit(main(["collect", *args]))
