"""Runs any instruction list from ``schedules.schedule`` on one rank, for real.

The executor knows nothing about GPipe or 1F1B: the order is all in the list. Communication
instructions between two computations are one batch, posted together with ``isend``/``irecv``;
its receives are waited at once, its sends at the next batch (or before the optimizer step), so
a send overlaps the next computation as in torch's schedules. ``schedules.simulate`` proves
these semantics deadlock-free; a rank blocked on its neighbour shows as recv/send time.
"""
from __future__ import annotations

import torch

from mpkit.models import loss_fn
from mpkit.strategies.common import shard
from mpkit.strategies.pp.schedules import (
    Backward, Forward, OptimizerStep, RecvAct, SendAct, SendGrad, batches,
)
from mpkit.strategies.pp.split import StageInput, boundary_shape


class PipelineExecutor:
    """The stages of one rank (``{global stage: module}``), run micro-batch by micro-batch."""

    def __init__(self, ctx, cfg, stages, num_stages, micro_batches, optimizer):
        self.ctx, self.cfg, self.stages = ctx, cfg, stages
        self.last = num_stages - 1
        self.m = micro_batches
        self.optimizer = optimizer
        self.shape = boundary_shape(cfg.model, cfg.batch_size // micro_batches)
        self.stage_input = StageInput(ctx.device)

    def step(self, program, x, y):
        """One optimizer step; returns the loss (a float) if this rank holds the last stage."""
        self.inputs = {}   # (mb, stage) -> received activation, then the sink of its gradient
        self.outputs = {}  # (mb, stage) -> output (the scaled loss on the last stage), kept for backward
        self.grads = {}    # (mb, stage) -> received gradient of the output
        self.dx = {}       # (mb, stage) -> gradient of the input, to send back
        self.x, self.y = x, y
        self.sending = []  # (work, tensor) of the last batch's sends, waited at the next batch
        self.loss = None
        for item in batches(program):
            if isinstance(item, list):
                self._communicate(item)
            elif isinstance(item, Forward):
                self._forward(item.mb, item.stage)
            elif isinstance(item, Backward):
                self._backward(item.mb, item.stage)
            elif isinstance(item, OptimizerStep):
                self._wait_sends()
                with self.ctx.trace.span("optimizer"):
                    self.optimizer.step()
                    self.optimizer.zero_grad(set_to_none=True)
        return None if self.loss is None else self.loss.item()

    def _forward(self, mb, stage):
        if stage == 0:
            x = shard(self.x, mb, self.m)
        else:
            x, self.inputs[(mb, stage)] = self.stage_input.attach(self.inputs[(mb, stage)])
        with self.ctx.trace.span("forward", stage=stage, micro_batch=mb):
            out = self.stages[stage](x)
            if stage == self.last:  # mean over micro-batches = the global batch's mean loss
                out = loss_fn(self.cfg.model, out, shard(self.y, mb, self.m)) / self.m
                self.loss = out.detach() if self.loss is None else self.loss + out.detach()
        self.outputs[(mb, stage)] = out

    def _backward(self, mb, stage):
        out, grad = self.outputs.pop((mb, stage)), self.grads.pop((mb, stage), None)
        with self.ctx.trace.span("backward", stage=stage, micro_batch=mb):
            torch.autograd.backward(out, grad)  # accumulates into the parameters' .grad
        if stage > 0:
            self.dx[(mb, stage)] = self.inputs.pop((mb, stage)).pop()

    def _wait_sends(self):
        for work, _ in self.sending:
            work.wait()
        self.sending = []

    def _communicate(self, batch):
        comm, device = self.ctx.comm, self.ctx.device
        sends, receives = [], []  # (work, tensor): a buffer must outlive its message
        for ins in batch:
            tags = dict(stage=ins.stage, micro_batch=ins.mb)
            key = (ins.mb, ins.stage)
            if isinstance(ins, SendAct):
                tensor = self.outputs[key].detach()
                sends.append((comm.isend(tensor, ins.to, **tags), tensor))
            elif isinstance(ins, SendGrad):
                tensor = self.dx.pop(key)
                sends.append((comm.isend(tensor, ins.to, **tags), tensor))
            else:
                buffer = torch.empty(self.shape, device=device)
                receives.append((comm.irecv(buffer, ins.frm, **tags), buffer, ins))
        self._wait_sends()  # the previous batch's: they had a computation's time to be received
        self.sending = sends
        for work, buffer, ins in receives:
            work.wait()
            if isinstance(ins, RecvAct):
                self.inputs[(ins.mb, ins.stage)] = buffer
            else:
                self.grads[(ins.mb, ins.stage)] = buffer
