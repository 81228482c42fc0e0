"""``rolloutcore``: command-line entry point.

Every command exits with one of:

* 0: the checked property holds (or the command did what it was asked);
* 1: a negative verdict on valid input (rejected, broken, mismatch, stale; another
  controller leads the fleet);
* 2: bad input: a usage error, an option out of range, a file that is missing, a
  directory, unreadable or not of the kind the command reads, a bad engine or store
  URL, an engine that cannot be reached;
* 3: the command could not run for another reason: a tool it needs is missing, the
  control store (etcd) cannot be used, a controller was deposed in mid-command, or an
  unexpected internal error (a bug: please report it);
* 130: interrupted (Ctrl-C); 141: the reader of standard output went away.

Errors are reported as exactly one line on stderr (``error: FILE:LINE: what``), never a
traceback; verdicts go to stdout. With ``--json``, bad input a command meets (not a
usage error) is also reported on stdout, as the JSON object's ``error`` field. Commands
that read records or journals stream them, in memory that does not grow with the file.

One module per command group: :mod:`.entry` (the parser and the single-engine commands:
spec, simulate, trace, journal, records, report, demo, conformance), :mod:`.fleet_commands`
(``fleet ...``), :mod:`.serve` (``serve``, the gateway), :mod:`.control_support` (the
control store's campaign and leader view); :mod:`.exits` states the exit codes once.
"""

from rolloutcore.cli.entry import commands, main
from rolloutcore.cli.exits import BAD_INPUT, BROKEN_PIPE, CANNOT_RUN, INTERRUPTED, NEGATIVE, OK

__all__ = ["BAD_INPUT", "BROKEN_PIPE", "CANNOT_RUN", "INTERRUPTED", "NEGATIVE", "OK",
           "commands", "main"]
