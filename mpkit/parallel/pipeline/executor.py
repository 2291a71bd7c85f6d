"""Runs any instruction list from ``schedules.schedule`` on one rank, for real.

The executor knows nothing about GPipe or 1F1B: the order is all in the list. Communication
instructions between two computations are one batch, posted together with ``isend``/``irecv``;
its receives are waited at once, its sends at the next batch (or before the optimizer step), so
a send overlaps the next computation as in torch's schedules. ``schedules.validate`` and the
cost model's simulator prove these semantics deadlock-free; a rank blocked on its neighbour shows
as recv/send time in the trace.

Activation shapes are not known in advance for a user's model, so before the first step the
ranks pass each stage boundary's shape down the pipeline once (a small untraced message per
boundary, computed on the meta device where the stage allows it).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from mpkit.observe import active
from mpkit.parallel.pipeline.schedules import Backward, Forward, OptimizerStep, RecvAct, SendAct, SendGrad, batches

_MAX_DIMS = 8
_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32)


class _FromPreviousStage(torch.autograd.Function):
    """The received activation entering this stage's graph. Its backward hands the gradient
    w.r.t. that activation — the message for the previous stage — to ``sink``.

    Why not a leaf with ``requires_grad``: torch 2.13's MemTracker registers a hook on every
    module input whose closure holds the input's autograd node, and a leaf's node holds the
    leaf, so every received activation (and its .grad) would stay alive for good. Here the
    node holds only ``anchor``, one scalar per rank."""

    @staticmethod
    def forward(ctx, anchor, x, sink):
        ctx.sink = sink
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.sink.append(grad)
        return None, None, None


def _out_meta(stage, shape, dtype):
    """(shape, dtype) of ``stage``'s output for an input of ``shape``/``dtype``: on the meta device
    (no compute) where the stage's code allows it, else one real forward without gradients."""
    try:
        params = {k: torch.empty_like(v, device="meta") for k, v in stage.state_dict(keep_vars=True).items()}
        out = torch.func.functional_call(stage, params, (torch.empty(shape, dtype=dtype, device="meta"),))
    except (RuntimeError, NotImplementedError, TypeError):
        device = next((p.device for p in stage.parameters()), torch.device("cpu"))
        with torch.no_grad():
            out = stage(torch.zeros(shape, dtype=dtype, device=device))
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"a pipeline stage must return one tensor (what the next stage takes); got "
                        f"{type(out).__name__}")
    return tuple(out.shape), out.dtype


class PipelineExecutor:
    """The stages of one rank (``{global stage: module}``), run micro-batch by micro-batch.

    ``peers[r]`` is the global rank of pipeline rank r (the group's members); ``loss_fn(output,
    target)`` the mean loss of one micro-batch, on the rank holding the last stage.
    """

    def __init__(self, stages, num_stages, micro_batches, loss_fn, peers, group=None):
        self.stages, self.last, self.m = stages, num_stages - 1, micro_batches
        self.loss_fn, self.peers, self.group = loss_fn, peers, group
        self.shapes = None  # stage -> (input shape, dtype) of one micro-batch, from the handshake
        self.device = self.anchor = None  # where the stages are at the first step (after any .to())

    # ---- shapes, once ----
    def _handshake(self, x):
        """Every boundary's activation shape, passed from stage to stage in pipeline order."""
        p = len(self.peers)
        shapes = {}
        for s in sorted(self.stages):
            if s == 0:
                if x is None:
                    raise ValueError("the rank holding the first stage needs the input batch: call step(x, y)")
                shape, dtype = (x.shape[0] // self.m, *x.shape[1:]), x.dtype
            else:
                header = torch.zeros(2 + _MAX_DIMS, dtype=torch.int64, device=self.device)  # nccl: on the GPU
                dist.recv(header, self.peers[(s - 1) % p], self.group)
                ndim, code, *dims = header.tolist()
                shape, dtype = tuple(dims[:ndim]), _DTYPES[code]
            shapes[s] = (shape, dtype)
            if s < self.last:
                with active.quiet():  # a tensor-parallel stage all-reduces in its forward
                    out_shape, out_dtype = _out_meta(self.stages[s], shape, dtype)
                if len(out_shape) > _MAX_DIMS or out_dtype not in _DTYPES:
                    raise TypeError(f"stage {s} returns a {out_dtype} tensor of shape {out_shape}; a pipeline "
                                    f"boundary carries floating or integer tensors of up to {_MAX_DIMS} dimensions")
                header = torch.tensor([len(out_shape), _DTYPES.index(out_dtype), *out_shape,
                                       *[0] * (_MAX_DIMS - len(out_shape))], dtype=torch.int64, device=self.device)
                dist.send(header, self.peers[(s + 1) % p], self.group)
                shapes[("out", s)] = (out_shape, out_dtype)
        return shapes

    def _micro(self, t, mb):
        return t.tensor_split(self.m)[mb]

    # ---- one step ----
    def step(self, program, x=None, y=None):
        """Forward and backward of every micro-batch; gradients accumulate in the stages'
        parameters. Returns the batch's mean loss (a float) on the rank with the last stage."""
        if self.last in self.stages and y is None:
            raise ValueError("the rank holding the last stage needs the targets: call step(x, y)")
        for name, t in (("x", x), ("y", y)):
            if t is not None and t.shape[0] % self.m:
                raise ValueError(f"micro_batches={self.m} does not divide batch_size={t.shape[0]} of {name}; "
                                 f"choose a batch size that is a multiple of micro_batches")
        if self.shapes is None:
            self.device = next((p.device for s in self.stages.values() for p in s.parameters()), torch.device("cpu"))
            self.anchor = torch.zeros((), device=self.device, requires_grad=True)
            self.shapes = self._handshake(x)
        elif 0 in self.stages and (x.shape[0] // self.m, *x.shape[1:]) != self.shapes[0][0]:
            raise ValueError(f"this batch's micro-batch shape {(x.shape[0] // self.m, *x.shape[1:])} differs from the "
                             f"first step's {self.shapes[0][0]}: every step of a pipeline takes batches of one shape")
        self.inputs, self.outputs, self.grads, self.dx = {}, {}, {}, {}
        self.x, self.y, self.sending, self.loss = x, y, [], None
        trace = active.trace()
        for item in batches(program):
            if isinstance(item, list):
                self._communicate(item)
            elif isinstance(item, Forward):
                with trace.span("forward", stage=item.stage, micro_batch=item.mb):
                    self._forward(item.mb, item.stage)
            elif isinstance(item, Backward):
                with trace.span("backward", stage=item.stage, micro_batch=item.mb):
                    self._backward(item.mb, item.stage)
            elif isinstance(item, OptimizerStep):
                self._wait_sends()  # the caller's optimizer step comes next
        return None if self.loss is None else self.loss.item()

    def _forward(self, mb, stage):
        if stage == 0:
            x = self._micro(self.x, mb)
        else:
            sink = []
            x = _FromPreviousStage.apply(self.anchor, self.inputs.pop((mb, stage)), sink)
            self.inputs[(mb, stage)] = sink
        out = self.stages[stage](x)
        if stage == self.last:  # mean over micro-batches = the global batch's mean loss
            out = self.loss_fn(out, self._micro(self.y, mb)) / self.m
            self.loss = out.detach() if self.loss is None else self.loss + out.detach()
        self.outputs[(mb, stage)] = out

    def _backward(self, mb, stage):
        out, grad = self.outputs.pop((mb, stage)), self.grads.pop((mb, stage), None)
        if out.requires_grad:  # else a frozen first stage: nothing before it to compute a gradient for
            torch.autograd.backward(out, grad)  # accumulates into the parameters' .grad
        if stage > 0:
            self.dx[(mb, stage)] = self.inputs.pop((mb, stage)).pop()

    def _wait_sends(self):
        for work, _ in self.sending:
            work.wait()
        self.sending = []

    def _communicate(self, batch):
        comm = active.comm()
        sends, receives = [], []  # (work, tensor): a buffer must outlive its message
        for ins in batch:
            tags = dict(stage=ins.stage, micro_batch=ins.mb, group=self.group)
            key = (ins.mb, ins.stage)
            if isinstance(ins, SendAct):
                tensor = self.outputs[key].detach()
                sends.append((comm.isend(tensor, self.peers[ins.to], **tags), tensor))
            elif isinstance(ins, SendGrad):
                tensor = self.dx.pop(key)
                sends.append((comm.isend(tensor, self.peers[ins.to], **tags), tensor))
            else:
                shape, dtype = self.shapes[ins.stage] if isinstance(ins, RecvAct) else self.shapes[("out", ins.stage)]
                buffer = torch.empty(shape, dtype=dtype, device=self.device)
                receives.append((comm.irecv(buffer, self.peers[ins.frm], **tags), buffer, ins))
        self._wait_sends()  # the previous batch's: they had a computation's time to be received
        self.sending = sends
        for work, buffer, ins in receives:
            work.wait()
            if isinstance(ins, RecvAct):
                self.inputs[(ins.mb, ins.stage)] = buffer
            else:
                self.grads[(ins.mb, ins.stage)] = buffer
