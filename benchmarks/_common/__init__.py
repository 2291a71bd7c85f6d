"""What the benchmark scripts share, kept out of ``benchmarks/``'s top level so that folder lists only
scripts that answer a question: ``machine`` (the line naming the machine and its load, and the
checkout put on ``sys.path``), ``turns`` (compared measurements taking turns on a noisy machine).
A script in ``benchmarks/`` imports them as ``from _common.machine import ...``."""
