"""PyTorch's own implementations of mechanisms mpkit writes out by hand, run on the same models
and data so the tests can compare them: ``parallelize_module`` for tensor parallel,
``torch.distributed.pipelining`` for the pipeline schedules, ``torch.distributed.rpc`` for the
layer-wise split. Not registered strategies."""
