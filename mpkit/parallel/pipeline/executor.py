"""Runs any instruction list from ``schedules.schedule`` on one rank, for real.

The mechanism in ~20 lines (``PipelineExecutor.step``; the order is all in the list, so the
executor knows nothing about GPipe or 1F1B):

    for item in batches(program):                  # a computation, or a batch of messages
        Forward(mb, s):   x = micro-batch mb of the input (stage 0), else the activation received
                          outputs[mb, s] = stages[s](x)          # the last stage: the loss / m
        [messages]:       post every isend/irecv of the batch together:
            SendAct:      isend(outputs[mb, s])      -> the rank holding stage s+1
            RecvAct:      irecv(inputs[mb, s])       <- the rank holding stage s-1
            SendGrad:     isend(dx[mb, s])           -> the rank holding stage s-1
            RecvGrad:     irecv(grads[mb, s])        <- the rank holding stage s+1
                          wait for the receives now, for the sends at the next batch
        Backward(mb, s):  outputs[mb, s].backward(grads[mb, s])  # .grad accumulates
                          dx[mb, s] = the gradient w.r.t. the stage's input x
        OptimizerStep():  wait for the last sends; the caller steps its optimizer

A send thus overlaps the next computation, as in torch's schedules; ``simulation.validate`` and
the cost model's simulator prove these semantics deadlock-free, and a rank blocked on its
neighbour shows as recv/send time in the trace. Zero-bubble lists split a Backward into B (the
input gradient only) and W (the weight gradients, later; ``split_backward.py``).

Activation shapes are not known in advance for a user's model, so before the first step the
ranks pass each stage boundary's shape down the pipeline once (``_handshake``: a small untraced
message per boundary, computed on the meta device where the stage allows it).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from mpkit.observe import active
from mpkit.parallel.pipeline.split_backward import backward_input, backward_weight
from mpkit.parallel.pipeline.instructions import (Backward, BackwardInput, BackwardWeight, Forward, OptimizerStep,
                                                  RecvAct, SendAct, SendGrad, batches)

_MAX_DIMS = 8
_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32)


class PipelineExecutor:
    """The stages of one rank (``{global stage: module}``), run micro-batch by micro-batch.

    ``peers[r]`` is the global rank of pipeline rank r (the group's members); ``where[s]`` the
    pipeline rank of stage s; ``loss_fn(output, target)`` the loss of one micro-batch, on the rank
    holding the last stage, divided by m where ``scale_grads`` (a mean loss: the batch's mean).
    """

    def __init__(self, stages, num_stages, micro_batches, loss_fn, peers, group=None, where=None, scale_grads=True):
        self.stages, self.last, self.m = stages, num_stages - 1, micro_batches
        self.loss_fn, self.peers, self.group = loss_fn, peers, group
        self.where = where or [s % len(peers) for s in range(num_stages)]
        self.scale = micro_batches if scale_grads else 1
        self.shapes = None  # stage -> (input shape, dtype) of one micro-batch, from the handshake
        self.device = self.anchor = None  # where the stages are at the first step (after any .to())

    # ---- one step: the mechanism ----
    def step(self, program, x=None, y=None, losses=None, outputs=None):
        """Forward and backward of every micro-batch; gradients accumulate in the stages'
        parameters. Returns the batch's loss (a float: the sum of the micro-batch losses, each
        divided by m under ``scale_grads``) on the rank with the last stage, else None; there
        ``losses``/``outputs``, lists, receive each micro-batch's loss and last-stage output."""
        self._check_batch(x, y)
        if self.shapes is None:
            self._first_step(x)
        self.inputs, self.outputs, self.grads, self.dx = {}, {}, {}, {}
        self.x, self.y, self.sending, self.loss = x, y, [], None
        self.losses, self.results, self.pending_w = {}, ({} if outputs is not None else None), {}
        trace = active.trace()
        for item in batches(program):
            if isinstance(item, list):
                self._communicate(item)
            elif isinstance(item, Forward):
                with trace.span("forward", stage=item.stage, micro_batch=item.mb):
                    self._forward(item.mb, item.stage)
            elif isinstance(item, (Backward, BackwardInput)):
                with trace.span("backward", stage=item.stage, micro_batch=item.mb,
                                name="B" if isinstance(item, BackwardInput) else ""):
                    self._backward(item.mb, item.stage, split=isinstance(item, BackwardInput))
            elif isinstance(item, BackwardWeight):
                with trace.span("backward", stage=item.stage, micro_batch=item.mb, name="W"):
                    self._backward_weight(item.mb, item.stage)
            elif isinstance(item, OptimizerStep):
                self._wait_sends()  # the caller's optimizer step comes next
        if losses is not None:
            losses.extend(self.losses[mb] for mb in sorted(self.losses))
        if outputs is not None:
            outputs.extend(self.results[mb] for mb in sorted(self.results))
        return None if self.loss is None else self.loss.item()

    def _forward(self, mb, stage):
        if stage == 0:
            x = self._micro(self.x, mb)
        else:
            received = self.inputs.pop((mb, stage), None)
            if received is None:  # the previous stage is on this rank: its output, handed over
                received = self.outputs[(mb, stage - 1)].detach()
            sink = []
            x = _FromPreviousStage.apply(self.anchor, received, sink)
            self.inputs[(mb, stage)] = (sink, x)
        out = self.stages[stage](x)
        if stage == self.last:  # divided by m: mean over micro-batches = the global batch's mean loss
            if self.results is not None:  # kept only when asked: m outputs alive for the whole step
                self.results[mb] = out.detach()
            loss = self.loss_fn(out, self._micro(self.y, mb))
            self.losses[mb] = loss.detach()
            out = loss / self.scale
            self.loss = out.detach() if self.loss is None else self.loss + out.detach()
        self.outputs[(mb, stage)] = out

    def _backward(self, mb, stage, split=False):
        """The whole backward, or with ``split`` only B: the gradient w.r.t. the stage's input,
        the graph kept for W (``_backward_weight``)."""
        out, grad = self.outputs.pop((mb, stage)), self.grads.pop((mb, stage), None)
        sink, x = self.inputs.pop((mb, stage), ([], None))
        weights = [q for q in self.stages[stage].parameters() if q.requires_grad]
        if split and x is not None and out.requires_grad:
            dx, groups = backward_input(out, grad, x, weights)
            sink.append(dx)
            self.pending_w[(mb, stage)] = (out, groups)  # ``out`` keeps the graph alive until W
        elif split:  # the first stage: no input gradient to hurry, W runs the whole backward
            self.pending_w[(mb, stage)] = (out, grad)
        elif out.requires_grad:  # else a frozen first stage: nothing before it to compute a gradient for
            torch.autograd.backward(out, grad)  # accumulates into the parameters' .grad
        if stage > 0:
            dx = sink.pop()
            if stage - 1 in self.stages:  # the previous stage is here: its output's gradient, handed over
                self.grads[(mb, stage - 1)] = dx
            else:
                self.dx[(mb, stage)] = dx

    def _backward_weight(self, mb, stage):
        """W: the weight gradients, accumulated into ``.grad`` (``split_backward``)."""
        out, rest = self.pending_w.pop((mb, stage))
        if isinstance(rest, list):
            backward_weight(rest)
        elif out.requires_grad:
            torch.autograd.backward(out, rest)

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

    def _wait_sends(self):
        for work, _ in self.sending:
            work.wait()
        self.sending = []

    def _micro(self, t, mb):
        return t.tensor_split(self.m)[mb]

    # ---- the first step: where the stages are, and every boundary's shape ----
    def _first_step(self, x):
        self.device = next((p.device for s in self.stages.values() for p in s.parameters()), torch.device("cpu"))
        self.anchor = torch.zeros((), device=self.device, requires_grad=True)
        self.shapes = self._handshake(x)

    def _handshake(self, x):
        """Every boundary's activation shape, passed from stage to stage in pipeline order."""
        shapes = {}
        for s in sorted(self.stages):
            if s == 0:
                if x is None:
                    raise ValueError("the rank holding the first stage needs the input batch: call step(x, y)")
                shape, dtype = (x.shape[0] // self.m, *x.shape[1:]), x.dtype
            elif s - 1 in self.stages:  # the previous stage is here (the turn of a V)
                shape, dtype = shapes[("out", s - 1)]
            else:
                header = torch.zeros(2 + _MAX_DIMS, dtype=torch.int64, device=self.device)  # nccl: on the GPU
                dist.recv(header, self.peers[self.where[s - 1]], self.group)
                ndim, code, *dims = header.tolist()
                shape, dtype = tuple(dims[:ndim]), _DTYPES[code]
            shapes[s] = (shape, dtype)
            with active.quiet():  # a tensor-parallel stage all-reduces in its forward
                out_shape, out_dtype = _out_meta(self.stages[s], shape, dtype, s)
            if s < self.last:
                shapes[("out", s)] = (out_shape, out_dtype)
                if s + 1 in self.stages:
                    continue
                if len(out_shape) > _MAX_DIMS or out_dtype not in _DTYPES:
                    raise TypeError(f"stage {s} returns a {out_dtype} tensor of shape {out_shape}; a pipeline "
                                    f"boundary carries floating or integer tensors of up to {_MAX_DIMS} dimensions")
                header = torch.tensor([len(out_shape), _DTYPES.index(out_dtype), *out_shape,
                                       *[0] * (_MAX_DIMS - len(out_shape))], dtype=torch.int64, device=self.device)
                dist.send(header, self.peers[self.where[s + 1]], self.group)
        return shapes

    def _check_batch(self, x, y):
        """A batch the micro-batches can cut, with the targets where the loss is, in the first step's shape."""
        if self.last in self.stages and y is None:
            raise ValueError("the rank holding the last stage needs the targets: call step(x, y)")
        for name, t in (("x", x), ("y", y)):
            if t is not None and t.shape[0] % self.m:
                raise ValueError(f"micro_batches={self.m} does not divide batch_size={t.shape[0]} of {name}; "
                                 f"choose a batch size that is a multiple of micro_batches")
        if self.shapes is not None and 0 in self.stages and (x.shape[0] // self.m, *x.shape[1:]) != self.shapes[0][0]:
            raise ValueError(f"this batch's micro-batch shape {(x.shape[0] // self.m, *x.shape[1:])} differs from the "
                             f"first step's {self.shapes[0][0]}: every step of a pipeline takes batches of one shape")


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


def describe(index, stage) -> str:
    """'stage 1 (layers [2, 3]: Linear, ReLU)' — how errors name a stage."""
    layers = getattr(stage, "layer_ids", None)
    kinds = ", ".join(type(m).__name__ for m in stage) if isinstance(stage, nn.Sequential) else type(stage).__name__
    return f"stage {index} (" + (f"layers {layers}: " if layers is not None else "") + f"{kinds})"


def _out_meta(stage, shape, dtype, index=None):
    """(shape, dtype) of ``stage``'s output for an input of ``shape``/``dtype``: on the meta device
    (no compute) where the stage's code allows it, else one real forward without gradients. An
    input the stage cannot take is a ValueError naming the stage and the shape it was given."""
    try:
        params = {k: torch.empty_like(v, device="meta") for k, v in stage.state_dict(keep_vars=True).items()}
        out = torch.func.functional_call(stage, params, (torch.empty(shape, dtype=dtype, device="meta"),))
    except (RuntimeError, NotImplementedError, TypeError):
        device = next((p.device for p in stage.parameters()), torch.device("cpu"))
        try:
            with torch.no_grad():
                out = stage(torch.zeros(shape, dtype=dtype, device=device))
        except (RuntimeError, ValueError, IndexError) as exc:
            given = "the batch" if index == 0 else f"stage {index - 1}'s output"
            raise ValueError(f"{describe(index, stage)} cannot take {given}, a {dtype} tensor of shape "
                             f"{tuple(shape)} per micro-batch ({type(exc).__name__}: {exc}); make that stage's first "
                             f"layer fit it (its in_features), or move the cut (split_points)") from None
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"a pipeline stage must return one tensor (what the next stage takes); got "
                        f"{type(out).__name__}")
    return tuple(out.shape), out.dtype
