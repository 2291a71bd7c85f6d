"""An rpc world beside the rank's process group, for the code that uses ``torch.distributed.rpc``
(the parameter server ``ps`` and the rpc model-parallel cross-check)."""
import torch.distributed as dist
from torch.distributed import rpc


def join_rpc(ctx):
    """Join an rpc world next to the process group. Under torchrun, its agent's store (env://)
    serves rpc too (rpc prefixes its keys). In our own worlds rank 0 starts the rpc store on a
    port the OS picks as it binds (port 0: nobody can take it in between, as with a port chosen
    free and bound later), tells the others over the process group, and rpc's rendezvous on rank
    0 then shares that server: multi-tenant TCPStores in one process share one server per port."""
    server = None
    if ctx.launcher == "torchrun":
        init_method = "env://"
    else:
        if ctx.rank == 0:
            server = dist.TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True, wait_for_workers=False)
        port = [server.port if server is not None else None]
        dist.broadcast_object_list(port, src=0)
        init_method = f"tcp://127.0.0.1:{port[0]}"
    rpc.init_rpc(f"rank{ctx.rank}", rank=ctx.rank, world_size=ctx.world_size,
                 rpc_backend_options=rpc.TensorPipeRpcBackendOptions(init_method=init_method))
    # ``server`` may go now: rpc's own store on rank 0 holds the shared server from here on
