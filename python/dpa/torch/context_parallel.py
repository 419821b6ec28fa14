"""Context parallelism over a torch.distributed process group (DESIGN.md §8, docs/python.md).

Each rank passes its shard of the sequence in dpa's dual-chunk layout (``shard_sequence``):
the sequence is cut into 2 * cp chunks and rank r holds chunks r and 2 * cp - 1 - r. The
communicator is dpa's NCCL one, bootstrapped through the group (rank 0's unique id is
broadcast over it), for CUDA tensors when dpa was built with NCCL; otherwise the group's own
collectives carry dpa's messages through host buffers (gloo, or any backend that takes CPU
tensors).
"""

import ctypes

import torch
import torch.distributed as dist

from .. import _dpa, errors
from .. import ops as _ops

_DTYPES = {2: torch.float32, 3: torch.float64}  # dpa::DType codes reductions take

COMM_TYPES = {"p2p": "p2p", "all_gather": "all_gather", "a2a": "a2a", "a2a+p2p": "a2a_p2p",
              "a2a_p2p": "a2a_p2p"}


def dual_chunk_positions(seqlen, cp, rank):
    """The unsharded positions of rank `rank`'s local rows, in local order."""
    if seqlen % (2 * cp) != 0:
        raise errors.invalid("seqlen", f"{seqlen} is not a multiple of 2 * cp = {2 * cp}")
    chunk = seqlen // (2 * cp)
    first = torch.arange(rank * chunk, (rank + 1) * chunk)
    second = torch.arange((2 * cp - 1 - rank) * chunk, (2 * cp - rank) * chunk)
    return torch.cat([first, second])


def shard_sequence(tensor, cp, rank, seq_dim):
    """This rank's shard of a full-sequence tensor (a copy), along `seq_dim`."""
    index = dual_chunk_positions(tensor.shape[seq_dim], cp, rank).to(tensor.device)
    return tensor.index_select(seq_dim, index)


class TorchDistributedCommunicator:
    """dpa's Communicator operations on a torch.distributed group, over host buffers: the C++
    side calls these methods with raw host addresses (the extension's PythonCommunicator).
    Every method returns a handle with wait() or None."""

    def __init__(self, group, global_ranks):
        self.group = group
        self.global_ranks = list(global_ranks)
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)

    @staticmethod
    def _bytes(address, nbytes):
        if nbytes == 0:
            return torch.empty(0, dtype=torch.uint8)
        return torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(address),
                                dtype=torch.uint8)

    def _typed(self, address, count, dtype):
        if dtype not in _DTYPES:
            raise errors.invalid("communicator", f"reductions take fp32 or fp64, got {dtype}")
        return self._bytes(address, count * _DTYPES[dtype].itemsize).view(_DTYPES[dtype])

    def send(self, address, nbytes, peer, tag):
        if nbytes == 0:
            return None
        return dist.isend(self._bytes(address, nbytes), dst=self.global_ranks[peer],
                          group=self.group, tag=tag)

    def recv(self, address, nbytes, peer, tag):
        if nbytes == 0:
            return None
        return dist.irecv(self._bytes(address, nbytes), src=self.global_ranks[peer],
                          group=self.group, tag=tag)

    def all_reduce(self, address, count, dtype):
        return dist.all_reduce(self._typed(address, count, dtype), group=self.group,
                               async_op=True)

    def all_gather(self, send, recv, nbytes):
        blocks = [self._bytes(recv + r * nbytes, nbytes) for r in range(self.size)]
        return dist.all_gather(blocks, self._bytes(send, nbytes), group=self.group,
                               async_op=True)

    def reduce_scatter(self, send, recv, count, dtype):
        # Not every backend has reduce_scatter (gloo has none): an all-reduce of a copy, then
        # this rank's block. Completes before returning.
        total = self._typed(send, count * self.size, dtype).clone()
        dist.all_reduce(total, group=self.group)
        self._typed(recv, count, dtype).copy_(total[self.rank * count:(self.rank + 1) * count])
        return None

    def all_to_all(self, send, recv, nbytes):
        return dist.all_to_all_single(self._bytes(recv, nbytes * self.size),
                                      self._bytes(send, nbytes * self.size), group=self.group,
                                      async_op=True)


def nccl_communicator(group, global_ranks, device_index, stream=None, timeout_ms=60000):
    """dpa's NCCL communicator for this rank of `group`: rank 0's unique id is broadcast
    through the group itself. `stream` (a torch.cuda.Stream) is the one it enqueues on; None
    gives it a stream of its own."""
    rank = dist.get_rank(group)
    unique_id = [_dpa.nccl_unique_id() if rank == 0 else None]
    dist.broadcast_object_list(unique_id, src=global_ranks[0], group=group)
    return _dpa.NcclCommunicator(unique_id[0], rank, dist.get_world_size(group), device_index,
                                 timeout_ms, 0 if stream is None else stream.cuda_stream)


class ContextParallelGroup:
    """What set_context_parallel_group stores: the group, its communicator (made on first use,
    for the device of the first call) and one engine per attention config."""

    def __init__(self, group, global_ranks, comm_type, stream=None, a2a_group_size=0,
                 communicator="auto"):
        if comm_type not in COMM_TYPES:
            raise errors.invalid("cp_comm_type", f"must be one of {', '.join(COMM_TYPES)}, "
                                 f"got {comm_type!r}")
        if communicator not in ("auto", "nccl", "torch"):
            raise errors.invalid("communicator", "must be 'auto', 'nccl' or 'torch', "
                                 f"got {communicator!r}")
        self.group = group
        self.global_ranks = list(global_ranks)
        if len(self.global_ranks) != dist.get_world_size(group):
            raise errors.invalid("cp_global_ranks", f"has {len(self.global_ranks)} ranks, the "
                                 f"group {dist.get_world_size(group)}")
        self.comm_type = COMM_TYPES[comm_type]
        self.stream = stream
        self.a2a_group_size = a2a_group_size
        self.choice = communicator
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self._communicator = None
        self._engines = {}

    def _make_communicator(self, device):
        use_nccl = self.choice == "nccl" or (
            self.choice == "auto" and device.type == "cuda" and _dpa.nccl_built())
        if use_nccl:
            if device.type != "cuda":
                raise errors.invalid("communicator", "nccl needs CUDA tensors")
            if not _dpa.nccl_built():
                raise errors.invalid("communicator", "this dpa was built without NCCL",
                                     errors.NotSupportedError)
            return nccl_communicator(self.group, self.global_ranks, device.index or 0,
                                     self.stream)
        if self.stream is not None:
            raise errors.invalid("cp_stream", "is used by the NCCL communicator only; the "
                                 "torch.distributed one moves host buffers")
        return TorchDistributedCommunicator(self.group, self.global_ranks)

    def engine(self, config, device):
        engine = self._engines.get(config)
        if engine is None:
            if self._communicator is None:
                self._communicator = self._make_communicator(device)
            engine = _dpa.ContextParallel(
                _ops.make_config(config), self.comm_type, self.a2a_group_size,
                False, False, self._communicator, self.rank, self.size)
            self._engines[config] = engine
        return engine

    def synchronize(self):
        for engine in self._engines.values():
            engine.synchronize()


class ContextParallelAttention(torch.autograd.Function):
    """Eager autograd over the CP engine: dpa::forward's inputs, then the engine (last, so that
    needs_input_grad lines up with the inputs' indices)."""

    @staticmethod
    def forward(*inputs_and_engine):
        *inputs, engine = inputs_and_engine
        return _ops.forward_impl(*inputs, engine=engine)

    @staticmethod
    def setup_context(ctx, inputs_and_engine, output):
        ctx.engine = inputs_and_engine[-1]
        _ops._setup_context(ctx, inputs_and_engine[:-1], output)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_o, d_lse):
        engine = ctx.engine
        grads = _ops._gradients(
            ctx, d_o, lambda *args: _ops.backward_impl(*args, engine=engine))
        return tuple(grads) + (None,)


# One ContextParallelGroup per (group, ranks, comm type, a2a size, communicator choice,
# stream): TE calls set_context_parallel_group on every layer, and each layer must not bring
# its own NCCL communicator and device-ring buffers.
_GROUPS = {}


def context_parallel_group(group, global_ranks, comm_type, stream=None, a2a_group_size=0,
                           communicator="auto"):
    key = (group, tuple(global_ranks), comm_type, a2a_group_size, communicator,
           None if stream is None else stream.cuda_stream)
    state = _GROUPS.get(key)
    if state is None:
        state = ContextParallelGroup(group, global_ranks, comm_type, stream, a2a_group_size,
                                     communicator)
        _GROUPS[key] = state
    return state


def synchronize_context_parallel():
    """Waits until every context-parallel call made so far is complete, its transfers included.
    Over the NCCL communicator a call returns once its work is enqueued on the current stream,
    as any CUDA call does, and a transfer that fails or times out (a peer that died) raises at a
    later call of the same group and config, or here (docs/context_parallel.md)."""
    for state in _GROUPS.values():
        state.synchronize()


def release_context_parallel_groups():
    """Waits for their calls (a failed transfer raises), then drops the shared communicators and
    engines (before destroying the process groups)."""
    try:
        synchronize_context_parallel()
    finally:
        _GROUPS.clear()


def cp_attention(group_state, inputs):
    """o, lse of this rank's shard."""
    if torch.compiler.is_compiling():
        raise errors.invalid("cp_group", "context parallelism runs in eager mode; call the "
                             "module outside torch.compile", errors.NotSupportedError)
    q = inputs[0]
    config = tuple(inputs[12:])
    engine = group_state.engine(config, q.device)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                       for t in (inputs[0], inputs[1], inputs[2], inputs[7],
                                                 inputs[9])):
        return ContextParallelAttention.apply(*inputs, engine)
    return _ops.forward_impl(*inputs, engine=engine)
