"""Sum-based BatchNorm: exact BatchNorm over a batch that is the union of several clients.

In Stratify's batch-data mode a global batch is assembled from the samples of several
clients. BatchNorm needs batch statistics, and every batch term it needs is a *sum*:

* forward: each client sends per-channel partial sums ``Σx``, ``Σx²`` and its element
  count; the server adds them and forms the exact global mean and (biased) variance;
* backward: each client sends ``Σdy`` and ``Σdy·x̂``; their sums over clients give the
  exact BatchNorm input gradient ``dx = (γ/σ)(dy − (Σdy + x̂·Σdy·x̂)/n)``.

So ``combine="sum"`` equals ``torch.nn.BatchNorm`` on the union batch, for any client
split. ``combine="client-mean"`` is FedTAN's layer (Wang et al. 2023, as its official code
computes it): the global mean is the *unweighted mean* of the per-client means, and the
variance the unweighted mean of each client's biased variance around that global mean.
With equal client shares that is BatchNorm on the union batch; with unequal shares both
lean towards the small clients.
Keeping both behind one ``combine`` parameter is what makes the comparison fair.

The client split is not an argument of ``forward`` (models call their layers with one
tensor); it is set on every layer of a model for the duration of a forward pass with
:func:`client_split`. Clients are contiguous segments of the batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeAlias

import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.nn import functional as F

COMBINE_MODES: dict[str, str] = {
    "sum": "exact: global statistics from the clients' summed partial sums (Stratify)",
    "client-mean": "unweighted over clients (FedTAN): exact for equal shares, biased otherwise",
}


def combine_statistics(
    sums: torch.Tensor,
    sq_sums: torch.Tensor,
    counts: torch.Tensor | Sequence[float],
    mode: str = "sum",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine per-client partial sums into one mean and biased variance per channel.

    Parameters
    ----------
    sums : torch.Tensor
        ``(K, C, ...)``: client ``k``'s sum of the values of each channel.
    sq_sums : torch.Tensor
        ``(K, C, ...)``: client ``k``'s sum of the squared values of each channel.
    counts : torch.Tensor or sequence of float
        ``(K,)``: how many values each client summed per channel (samples × spatial size).
    mode : {"sum", "client-mean"}
        ``"sum"``: statistics of the union, ``mean = ΣS_k / Σn_k`` and
        ``var = ΣQ_k / Σn_k − mean²``. ``"client-mean"`` (FedTAN): ``mean`` the unweighted
        mean over clients of ``S_k / n_k``, ``var`` the unweighted mean over clients of
        each client's variance around ``mean``, ``Q_k / n_k − 2·mean·S_k / n_k + mean²``.

    Returns
    -------
    tuple of torch.Tensor
        ``(mean, var)``, each ``(C, ...)``; ``var`` is the biased variance, clamped at 0.
    """
    if mode not in COMBINE_MODES:
        raise ValueError(
            f"unknown combine mode {mode!r}; choose one of: {', '.join(COMBINE_MODES)}"
        )
    counts = torch.as_tensor(counts, dtype=sums.dtype, device=sums.device)
    # counts broadcast over every trailing (channel) dimension of the sums
    counts = counts.reshape(-1, *([1] * (sums.dim() - 1)))
    if mode == "sum":
        total = counts.sum(0)
        mean = sums.sum(0) / total
        var = sq_sums.sum(0) / total - mean.square()
    else:
        mean = (sums / counts).mean(0)
        # each client's variance around the *global* mean, averaged: mean_k(Q_k/n_k) − μ²
        # (the client means average to μ, so the cross terms cancel)
        var = (sq_sums / counts).mean(0) - mean.square()
    return mean, var.clamp_min(0.0)


@functools.lru_cache(maxsize=8)
def _segment_tensors(
    client_sizes: tuple[int, ...], device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(K, N)`` one-hot client membership and ``(K,)`` client sizes, built once per split.

    Per-client sums are a matrix product with the membership matrix: deterministic on
    every device (unlike atomic scatter-adds), free of Python loops over clients, and
    shared by every layer of the model for the same split.
    """
    sizes = torch.tensor(client_sizes, device=device)
    client_ids = torch.arange(len(client_sizes), device=device)
    client_of_sample = torch.repeat_interleave(client_ids, sizes)
    membership = client_of_sample.unsqueeze(0) == client_ids[:, None]
    return membership.to(dtype), sizes.to(dtype)


def _stats_dtype(x: torch.Tensor) -> torch.dtype:
    # Partial sums are combined in float64 (they are tiny (K, C) tensors, so it costs
    # nothing) so the server-side combination adds no rounding of its own; MPS has no f64.
    return torch.float32 if x.device.type == "mps" else torch.float64


def _partial_sums(
    x_flat: torch.Tensor, membership: torch.Tensor | None, stats_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-client ``Σ(x − shift)``, ``Σ(x − shift)²`` of ``(N, C, M)`` input, and the shift.

    The shift is a per-channel constant subtracted before squaring so that
    ``Σx²/n − mean²`` does not cancel catastrophically when ``|mean| ≫ std``. Any
    constant gives the same statistics in exact arithmetic (it is added back to the mean
    and cancels in the variance) and no gradient flows through it. In a deployment it
    would be a broadcast value (e.g. the running mean); here it is the first sample's
    channel mean, which is close to the batch mean and costs one tiny kernel.
    """
    shift = x_flat[0].mean(1).detach()
    centered = x_flat - shift[:, None]
    per_sample_sums = centered.sum(2).to(stats_dtype)
    per_sample_sq_sums = centered.square().sum(2).to(stats_dtype)
    if membership is None:
        return per_sample_sums.sum(0, keepdim=True), per_sample_sq_sums.sum(0, keepdim=True), shift
    return membership @ per_sample_sums, membership @ per_sample_sq_sums, shift


def _client_counts(
    x_flat: torch.Tensor, client_counts: torch.Tensor | None, stats_dtype: torch.dtype
) -> torch.Tensor:
    elements_per_sample = x_flat.shape[2]
    if client_counts is None:
        # a fill on the device, not a host-to-device copy of a Python list
        return x_flat.new_full((1,), x_flat.shape[0] * elements_per_sample, dtype=stats_dtype)
    return client_counts * elements_per_sample


def _affine(
    normalized: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None
) -> torch.Tensor:
    if weight is not None:
        normalized = normalized * weight[:, None]
    if bias is not None:
        normalized = normalized + bias[:, None]
    return normalized


class _SumBatchNormFunction(torch.autograd.Function):
    """Exact BatchNorm whose batch terms are per-client sums added over clients.

    Inputs: ``x (N, C, M)``, ``weight``/``bias`` ``(C,)`` or None, ``membership (K, N)``
    or None (one client), ``client_counts (K,)`` or None, ``eps``. Outputs ``y`` and the
    (non-differentiable) batch ``mean`` and biased ``var`` for the running statistics.
    Written with ``setup_context`` and plain tensor ops so ``torch.func`` transforms
    (``vmap`` over independent runs, ``grad``) work on it.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(x, weight, bias, membership, client_counts, eps):
        stats_dtype = _stats_dtype(x)
        sums, sq_sums, shift = _partial_sums(x, membership, stats_dtype)
        counts = _client_counts(x, client_counts, stats_dtype)
        centered_mean, var = combine_statistics(sums, sq_sums, counts, "sum")
        mean = centered_mean + shift.to(stats_dtype)
        invstd = torch.rsqrt(var + eps)
        normalized = (x - mean.to(x.dtype)[:, None]) * invstd.to(x.dtype)[:, None]
        return _affine(normalized, weight, bias), mean, var

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, bias, membership, client_counts, eps = inputs
        _, mean, var = output
        ctx.mark_non_differentiable(mean, var)
        ctx.save_for_backward(x, weight, membership, mean, var)
        ctx.eps = eps

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output, _grad_mean, _grad_var):
        x, weight, membership, mean, var = ctx.saved_tensors
        count = x.shape[0] * x.shape[2]
        invstd = torch.rsqrt(var + ctx.eps).to(x.dtype)
        normalized = (x - mean.to(x.dtype)[:, None]) * invstd[:, None]
        # the two batch terms, per sample first, then per client, then summed over clients
        per_sample_dy = grad_output.sum(2)
        per_sample_dy_xhat = (grad_output * normalized).sum(2)
        if membership is None:
            sum_dy, sum_dy_xhat = per_sample_dy.sum(0), per_sample_dy_xhat.sum(0)
        else:
            stats_dtype = membership.dtype
            client_dy = membership @ per_sample_dy.to(stats_dtype)
            client_dy_xhat = membership @ per_sample_dy_xhat.to(stats_dtype)
            sum_dy = client_dy.sum(0).to(x.dtype)
            sum_dy_xhat = client_dy_xhat.sum(0).to(x.dtype)
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            scale = invstd if weight is None else weight * invstd
            grad_x = scale[:, None] * (
                grad_output - (sum_dy[:, None] + normalized * sum_dy_xhat[:, None]) / count
            )
        if weight is not None and ctx.needs_input_grad[1]:
            grad_weight = sum_dy_xhat
        if ctx.needs_input_grad[2]:
            grad_bias = sum_dy
        return grad_x, grad_weight, grad_bias, None, None, None


def _autograd_forward(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    membership: torch.Tensor | None,
    client_counts: torch.Tensor | None,
    eps: float,
    mode: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same forward in plain tensor ops, differentiated by autograd.

    Used for ``client-mean``, whose backward is whatever the derivative of its forward is
    (the mean over clients of each client's statistic gradients); for ``sum`` it is an
    independent reference implementation for the tests.
    """
    stats_dtype = _stats_dtype(x)
    sums, sq_sums, shift = _partial_sums(x, membership, stats_dtype)
    counts = _client_counts(x, client_counts, stats_dtype)
    centered_mean, var = combine_statistics(sums, sq_sums, counts, mode)
    mean = centered_mean + shift.to(stats_dtype)
    invstd = torch.rsqrt(var + eps)
    normalized = (x - mean.to(x.dtype)[:, None]) * invstd.to(x.dtype)[:, None]
    return _affine(normalized, weight, bias), mean.detach(), var.detach()


class SumBatchNorm(nn.Module):
    """BatchNorm over a batch made of several clients' samples, from per-client sums.

    Parameters
    ----------
    num_features : int
        Number of channels ``C``.
    dims : int
        Spatial dimensions: 1 for ``(N, C)`` or ``(N, C, L)`` inputs (like
        ``nn.BatchNorm1d``), 2 for ``(N, C, H, W)`` (``nn.BatchNorm2d``), 3 for
        ``(N, C, D, H, W)``.
    eps : float
        Added to the variance before the square root.
    momentum : float or None
        Running-statistics update factor; None for a cumulative average, as in torch.
    affine : bool
        Learn a per-channel scale ``weight`` and shift ``bias``.
    track_running_stats : bool
        Keep ``running_mean``/``running_var``/``num_batches_tracked`` and use them in
        eval mode; otherwise batch statistics are used in both modes.
    combine : {"sum", "client-mean"}
        How the clients' partial sums become the batch statistics: ``"sum"`` is exact
        BatchNorm on the union batch; ``"client-mean"`` averages per-client statistics
        (FedTAN), which is biased when client shares differ.

    Notes
    -----
    Set the client split with :func:`client_split`; with none the whole batch is one
    client. Parameter and buffer names equal ``nn.BatchNorm``'s, so state dicts move
    between the two. With a single client both combine modes *are* plain BatchNorm, so
    ``native_single_client`` (default True) hands that case to ``F.batch_norm`` — the
    latency-bound single-sample loop then pays nothing for the sum-based layer.
    """

    client_sizes: tuple[int, ...] | None
    # registered as buffers (None without track_running_stats), so declared as torch does
    running_mean: torch.Tensor | None
    running_var: torch.Tensor | None
    num_batches_tracked: torch.Tensor | None

    def __init__(
        self,
        num_features: int,
        dims: int = 2,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        combine: str = "sum",
    ) -> None:
        super().__init__()
        if combine not in COMBINE_MODES:
            raise ValueError(
                f"unknown combine mode {combine!r}; choose one of: {', '.join(COMBINE_MODES)}"
            )
        if dims not in (1, 2, 3):
            raise ValueError(f"dims must be 1, 2 or 3, got {dims}")
        self.num_features = num_features
        self.dims = dims
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        self.combine = combine
        self.client_sizes = None
        self.native_single_client = True
        #: set by :mod:`stratify.nn.norm_exchange` for one party's pass: computes the
        #: layer's output in place of the batch's own statistics
        self.external: Callable[[SumBatchNorm, torch.Tensor], torch.Tensor] | None = None
        if affine:
            self.weight = nn.Parameter(torch.ones(num_features))
            self.bias = nn.Parameter(torch.zeros(num_features))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", torch.zeros(num_features))
            self.register_buffer("running_var", torch.ones(num_features))
            self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)

    def reset_running_stats(self) -> None:
        """Zero the running mean, set the running variance to one, and the count to zero."""
        if self.track_running_stats:
            assert self.running_mean is not None and self.running_var is not None
            assert self.num_batches_tracked is not None
            self.running_mean.zero_()
            self.running_var.fill_(1.0)
            self.num_batches_tracked.zero_()

    def reset_parameters(self) -> None:
        """Reset running statistics and the affine parameters to ``γ = 1``, ``β = 0``."""
        self.reset_running_stats()
        if self.affine:
            nn.init.ones_(self.weight)
            nn.init.zeros_(self.bias)

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, dims={self.dims}, eps={self.eps}, momentum={self.momentum}, "
            f"affine={self.affine}, track_running_stats={self.track_running_stats}, "
            f"combine={self.combine!r}"
        )

    def _check_input(self, x: torch.Tensor) -> None:
        allowed = (2, 3) if self.dims == 1 else (self.dims + 2,)
        if x.dim() not in allowed or x.shape[1] != self.num_features:
            raise ValueError(
                f"SumBatchNorm(dims={self.dims}, num_features={self.num_features}) expects "
                f"input of {' or '.join(f'{d}D' for d in allowed)} with "
                f"{self.num_features} channels, got shape {tuple(x.shape)}"
            )

    def _update_factor(self) -> float:
        assert self.num_batches_tracked is not None  # called only when tracking running stats
        self.num_batches_tracked.add_(1)
        if self.momentum is None:
            return 1.0 / float(self.num_batches_tracked)
        return self.momentum

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        if self.external is not None:
            return self.external(self, x)
        use_batch_stats = self.training or not self.track_running_stats
        if not use_batch_stats:
            return F.batch_norm(
                x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps
            )
        batch_size = x.shape[0]
        client_sizes = self.client_sizes
        if client_sizes is not None and sum(client_sizes) != batch_size:
            raise ValueError(
                f"client sizes {list(client_sizes)} sum to {sum(client_sizes)} "
                f"but the batch has {batch_size} samples"
            )
        if client_sizes is not None and len(client_sizes) == 1:
            client_sizes = None
        x_flat = x.reshape(batch_size, self.num_features, -1)
        count = x_flat.shape[0] * x_flat.shape[2]
        if self.training and count <= 1:
            # the same refusal as nn.BatchNorm: one value per channel has no variance
            raise ValueError(
                "Expected more than 1 value per channel when training, "
                f"got input size {tuple(x.shape)}"
            )
        update_stats = self.training and self.track_running_stats
        if client_sizes is None and self.native_single_client:
            factor = self._update_factor() if update_stats else 0.0
            return F.batch_norm(
                x,
                self.running_mean if update_stats else None,
                self.running_var if update_stats else None,
                self.weight,
                self.bias,
                True,
                factor,
                self.eps,
            )
        if client_sizes is None:
            membership = client_counts = None
        else:
            membership, client_counts = _segment_tensors(
                tuple(client_sizes), x.device, _stats_dtype(x)
            )
        if self.combine == "sum":
            y, mean, var = _SumBatchNormFunction.apply(
                x_flat, self.weight, self.bias, membership, client_counts, self.eps
            )
        else:
            y, mean, var = _autograd_forward(
                x_flat, self.weight, self.bias, membership, client_counts, self.eps, self.combine
            )
        if update_stats:
            update_running_stats(self, mean, var, count)
        return y.reshape(x.shape)


BatchNormLayer: TypeAlias = nn.modules.batchnorm._BatchNorm | SumBatchNorm


def is_batch_norm(module: nn.Module) -> bool:
    """Whether ``module`` normalises with batch statistics, coupling the samples of a batch:
    torch's BatchNorm layers and :class:`SumBatchNorm` (not instance or group norm)."""
    return isinstance(module, (nn.modules.batchnorm._BatchNorm, SumBatchNorm))


def has_batch_norm(model: nn.Module) -> bool:
    """Whether any layer of ``model`` is a batch-statistics norm (:func:`is_batch_norm`)."""
    return any(is_batch_norm(module) for module in model.modules())


@torch.no_grad()
def update_running_stats(
    module: BatchNormLayer, mean: torch.Tensor, biased_var: torch.Tensor, count: int
) -> None:
    """Fold one training batch's statistics into a BN layer's running statistics.

    As ``torch.nn.BatchNorm`` does: ``num_batches_tracked`` grows by one, the factor is
    ``momentum`` (or ``1 / num_batches_tracked`` when momentum is ``None``), and the
    running variance tracks the *unbiased* variance ``var · n / (n − 1)`` of the ``count``
    values per channel.
    """
    assert module.running_mean is not None and module.running_var is not None
    assert module.num_batches_tracked is not None
    module.num_batches_tracked.add_(1)
    if module.momentum is None:
        factor = 1.0 / float(module.num_batches_tracked)
    else:
        factor = module.momentum
    unbiased_var = biased_var * (count / (count - 1))
    module.running_mean.lerp_(mean.to(module.running_mean.dtype), factor)
    module.running_var.lerp_(unbiased_var.to(module.running_var.dtype), factor)


class SumBatchNorm1d(SumBatchNorm):
    """:class:`SumBatchNorm` for ``(N, C)`` or ``(N, C, L)`` inputs.

    Parameters
    ----------
    num_features : int
        Number of channels ``C``.
    **kwargs
        The other :class:`SumBatchNorm` options.
    """

    def __init__(self, num_features: int, **kwargs) -> None:
        super().__init__(num_features, dims=1, **kwargs)


class SumBatchNorm2d(SumBatchNorm):
    """:class:`SumBatchNorm` for ``(N, C, H, W)`` inputs.

    Parameters
    ----------
    num_features : int
        Number of channels ``C``.
    **kwargs
        The other :class:`SumBatchNorm` options.
    """

    def __init__(self, num_features: int, **kwargs) -> None:
        super().__init__(num_features, dims=2, **kwargs)


@contextmanager
def client_split(model: nn.Module, client_sizes: Sequence[int] | None) -> Iterator[nn.Module]:
    """Tell every :class:`SumBatchNorm` in ``model`` how the next batches split into clients.

    Parameters
    ----------
    model : torch.nn.Module
        A model (or a single layer); every ``SumBatchNorm`` inside it gets the split.
    client_sizes : sequence of int or None
        Sizes of the clients' contiguous segments of the batch, in batch order; they must
        sum to the batch size of every forward pass inside the block. None: one client.

    Yields
    ------
    torch.nn.Module
        ``model``. On exit every layer gets back the split it had before.
    """
    if client_sizes is not None:
        sizes = tuple(int(size) for size in client_sizes)
        if not sizes or any(size < 1 for size in sizes):
            raise ValueError(f"client sizes must be positive and non-empty, got {list(sizes)}")
    else:
        sizes = None
    layers = [module for module in model.modules() if isinstance(module, SumBatchNorm)]
    previous = [layer.client_sizes for layer in layers]
    for layer in layers:
        layer.client_sizes = sizes
    try:
        yield model
    finally:
        for layer, sizes_before in zip(layers, previous):
            layer.client_sizes = sizes_before
