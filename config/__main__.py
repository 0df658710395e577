"""`python -m config [--preset cpu] [--set ...]` prints the resolved config; `--help` lists every key."""

import argparse
import sys

from config.cli import (
    add_config_arguments,
    config_from_args,
    config_help_text,
    exit_on_config_error,
    format_config,
    parse_args_suggesting,
    preliminary_config,
    split_trl_flags,
)
from config.compat import normalize_config_mapping
from config.sections import ConfigError

cli = argparse.ArgumentParser(
    description="Print the resolved tgrpo configuration.",
    epilog=config_help_text(preliminary_config(None)),
    formatter_class=argparse.RawDescriptionHelpFormatter,
)
add_config_arguments(cli)
cli_argv, cli_trl = split_trl_flags(cli, sys.argv[1:])
cli_args = parse_args_suggesting(cli, cli_argv)
try:
    cli_extra = normalize_config_mapping(cli_trl, "command-line flag") if cli_trl else None
    print(format_config(config_from_args(cli_args, cli_extra)))
except ConfigError as error:
    exit_on_config_error(error)
