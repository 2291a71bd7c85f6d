"""What the benchmark scripts share, kept out of ``benchmarks/``'s top level so that folder lists only
scripts that answer a question: ``machine`` (the line naming the machine and its load, and the
checkout put on ``sys.path``), ``turns`` (compared measurements taking turns on a noisy machine),
``ring_flash_reference`` (ring-flash-attention's algorithm on torch's CPU flash kernel, the reference
of ``ring_attention_bf16.py`` and ``tests/test_ring_attention_bf16.py``). A script in ``benchmarks/``
imports them as ``from _common.machine import ...``."""
