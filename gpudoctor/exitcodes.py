"""gpudoctor's exit codes: the one table (docs/cli.md "Exit codes"); every module takes its codes from here.

Judgments use Nagios's numbers (0 ok, 1 warning, 2 failure, 3 unknown or bad input); a signal's code is the shell's
128 + the signal's number; `bench job` has one code of its own; the node-problem-detector plugin mode reads NPD's
three. Stdlib only, imports nothing: every floor may use it. tests/core/test_one_exit_table.py checks this table
against docs/cli.md and fails on an exit code written as a number anywhere else in the package.
"""

EXIT_OK = 0  # ok; a command that is not a judgment did its job
EXIT_WARN = 1  # warning; a dry run with changes planned
EXIT_FAIL = 2  # failure, critical
EXIT_UNKNOWN = 3  # could not judge, or bad input
EXIT_JOB_REFUSED = 4  # `bench job` (a Slurm campaign's job): the gate refused this node
EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT
EXIT_PIPE = 141  # the reader of stdout went away: 128 + SIGPIPE
EXIT_TERMINATED = 143  # SIGTERM (a Slurm campaign cancelled): 128 + SIGTERM

# `gate --npd` (Kubernetes node-problem-detector's custom plugin protocol): 0 OK, 1 NonOK, anything else Unknown.
NPD_OK, NPD_PROBLEM, NPD_UNKNOWN = 0, 1, 2

# name -> code, as docs/cli.md's table of codes lists them
TABLE = {"EXIT_OK": EXIT_OK, "EXIT_WARN": EXIT_WARN, "EXIT_FAIL": EXIT_FAIL, "EXIT_UNKNOWN": EXIT_UNKNOWN,
         "EXIT_JOB_REFUSED": EXIT_JOB_REFUSED, "EXIT_INTERRUPTED": EXIT_INTERRUPTED, "EXIT_PIPE": EXIT_PIPE,
         "EXIT_TERMINATED": EXIT_TERMINATED}
