"""The strategy registry: every strategy ``mpkit.train`` runs, by name, with the module that defines
it and what it does in a line.

Plain data, torch-free: the command line lists the strategies in ``mpkit run --help`` without
importing torch (``mpkit.strategies`` re-exports these names and loads a strategy's module on
first use). ARCHITECTURE.md says how to add one.
"""

REGISTRY = {
    "single": ("mpkit.strategies.single", "reference run on one device"),
    "dp": ("mpkit.strategies.dp",
           "data parallel from scratch: broadcast, shard batch, all-reduce gradients (buckets, overlap)"),
    "ddp": ("mpkit.strategies.ddp", "torch.nn.parallel.DistributedDataParallel"),
    "zero1": ("mpkit.strategies.zero1", "data parallel with optimizer state sharded across ranks (ZeRO stage 1)"),
    "fsdp": ("mpkit.strategies.fsdp", "FSDP2 fully_shard: parameters, gradients and optimizer state sharded (ZeRO-3)"),
    "mp": ("mpkit.strategies.mp", "layer-wise model parallel: consecutive layers on different devices"),
    "tp": ("mpkit.strategies.tp", "Megatron tensor parallel: column- then row-parallel linear layers"),
    "pp": ("mpkit.strategies.pp", "pipeline parallel: micro-batches through stages (gpipe, 1f1b, interleaved)"),
    "ps": ("mpkit.strategies.ps", "parameter server over torch.distributed.rpc (mode sync or async)"),
    "sp": ("mpkit.strategies.sp", "tensor parallel with Megatron sequence parallelism: LayerNorms and residuals split along the sequence"),
    "cp": ("mpkit.strategies.cp", "context parallel: the sequence split across ranks, ring or Ulysses (all-to-all) attention"),
    "ep": ("mpkit.strategies.ep", "expert parallel: a mixture of experts spread across ranks, all-to-all dispatch and combine"),
    "3d": ("mpkit.strategies.three_d", "data x pipeline x context x tensor (x expert) parallel on one DeviceMesh, "
                                       "in a rank order you choose (Megatron-LM 3D, Llama 3 4D)"),
}
STRATEGIES = {name: summary for name, (_, summary) in REGISTRY.items()}
# They split a sequence or make experts of a transformer's MLPs: the built-in gpt only (not the
# tour's mlp, which has neither)
SEQUENCE_STRATEGIES = ("sp", "cp", "ep")
