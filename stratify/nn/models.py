"""The models of the papers, built by name, all drawing their norm layers from one factory.

* ``cnn`` — NIID-Bench's ``simple-cnn`` (the Stratify paper's "simple CNN"): conv 5×5 → 6,
  ReLU, max-pool 2, conv 5×5 → 16, ReLU, max-pool 2, fc 120, fc 84, fc classes. Images
  smaller than 16 px (e.g. 8×8 digits) get ``padding=2`` so both pools still have pixels;
  tabular ``(F,)`` inputs get the same network in 1-D (a length-``F`` one-channel signal).
* ``mlp`` — ``F → 200 → 200 → classes`` with ReLU; images are flattened.
* ``resnet9`` — the DAWNBench ResNet-9 (Page 2018): prep 64, layer1 128 + residual,
  layer2 256, layer3 512 + residual, global max-pool, fc.
* ``resnet18`` — CIFAR-style ResNet-18: 3×3 stem, no stem pool, BasicBlocks [2, 2, 2, 2].
* ``resnet20`` — CIFAR ResNet-20 (He et al. 2016): 3 stages × 3 BasicBlocks of 16/32/64
  channels with parameter-free (option A) shortcuts, 0.27 M parameters — FedTAN's model.

Every model is ``head(embed(x))``: :meth:`embed` gives the penultimate representation
``(N, d)`` and ``head`` is the final linear classifier, a settable attribute, so methods
that work on features (FedBR's projection, LfD's cosine classifier) use any model alike;
assigning ``model.head = module`` replaces the classifier.

``cnn`` and ``mlp`` are the papers' norm-free networks; the ResNets take ``norm`` from
:data:`NORMS`. Because every norm comes from :func:`make_norm` with the same module
names, a ``bn`` model's state dict loads into the ``sumbn`` model and vice versa.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from stratify.errors import ConfigError
from stratify.nn.catalog import MLP_HIDDEN, MODELS, NORMS, check_model_norm, default_norm
from stratify.nn.norm import SumBatchNorm

#: Smallest image side the ResNets take: ResNet-9's three max-pools halve it to 1.
MIN_RESNET_SIDE = 8


def _choices(names) -> str:
    return ", ".join(names)


def group_count(channels: int, max_groups: int = 32) -> int:
    """The largest number of GroupNorm groups ``≤ min(max_groups, channels)`` dividing ``channels``.

    Parameters
    ----------
    channels : int
        Number of channels to split into groups.
    max_groups : int
        Upper bound on the group count.
    """
    groups = min(max_groups, channels)
    while channels % groups:
        groups -= 1
    return groups


def make_norm(norm: str, channels: int, dims: int = 2) -> nn.Module:
    """The normalisation layer named ``norm`` for ``channels`` channels.

    Parameters
    ----------
    norm : str
        One of :data:`NORMS`.
    channels : int
        Number of channels ``C`` of the input.
    dims : int
        1 for ``(N, C)``/``(N, C, L)`` inputs, 2 for ``(N, C, H, W)``.

    Returns
    -------
    torch.nn.Module
        ``BatchNorm{1,2}d``, ``GroupNorm``, ``SumBatchNorm`` or ``Identity``.
    """
    if norm == "bn":
        return nn.BatchNorm1d(channels) if dims == 1 else nn.BatchNorm2d(channels)
    if norm == "gn":
        return nn.GroupNorm(group_count(channels), channels)
    if norm == "sumbn":
        return SumBatchNorm(channels, dims=dims, combine="sum")
    if norm == "sumbn-client-mean":
        return SumBatchNorm(channels, dims=dims, combine="client-mean")
    if norm == "none":
        return nn.Identity()
    raise ConfigError(f"unknown norm {norm!r}; choose one of: {_choices(NORMS)}")


NormFactory = Callable[[int], nn.Module]


def conv_norm_relu(in_channels: int, out_channels: int, norm: NormFactory) -> nn.Sequential:
    """3×3 convolution (no bias: the norm or the next layer absorbs it), norm, ReLU.

    Parameters
    ----------
    in_channels, out_channels : int
        Channels in and out.
    norm : callable
        ``norm(channels)`` builds the normalisation layer.
    """
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
        norm(out_channels),
        nn.ReLU(inplace=True),
    )


# -- simple CNN and MLP --------------------------------------------------------------------


class SimpleCNN(nn.Module):
    """NIID-Bench's simple CNN for ``(C, H, W)`` images or ``(F,)``/``(C, L)`` signals.

    Parameters
    ----------
    input_shape : tuple of int
        Shape of one sample: ``(C, H, W)`` builds the 2-D network, ``(F,)`` or ``(C, L)``
        the 1-D one (tabular features read as a one-channel signal).
    num_classes : int
        Number of outputs.
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        self.flat_input = len(input_shape) == 1
        two_d = len(input_shape) == 3
        in_channels = 1 if self.flat_input else input_shape[0]
        # below 16 px two unpadded 5×5 convs and two pools leave nothing; pad to keep size
        padding = 2 if min(input_shape[-2 if two_d else -1 :]) < 16 else 0
        conv = nn.Conv2d if two_d else nn.Conv1d
        pool = nn.MaxPool2d if two_d else nn.MaxPool1d
        self.features = nn.Sequential(
            conv(in_channels, 6, 5, padding=padding),
            nn.ReLU(inplace=True),
            pool(2),
            conv(6, 16, 5, padding=padding),
            nn.ReLU(inplace=True),
            pool(2),
            nn.Flatten(),
        )
        with torch.no_grad():
            sample_shape = input_shape if self.flat_input else input_shape[1:]
            sample = torch.zeros(1, in_channels, *sample_shape)
            flat_size = self.features(sample).shape[1]
        self.classifier = nn.Sequential(
            nn.Linear(flat_size, 120),
            nn.ReLU(inplace=True),
            nn.Linear(120, 84),
            nn.ReLU(inplace=True),
        )
        self.head = nn.Linear(84, num_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """The 84-wide penultimate representation."""
        if self.flat_input:
            x = x.unsqueeze(1)
        return self.classifier(self.features(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x))


class MLP(nn.Module):
    """Fully connected network ``F → hidden → … → classes`` with ReLU; flattens its input.

    Parameters
    ----------
    input_shape : tuple of int
        Shape of one sample; its product is the input width ``F``.
    num_classes : int
        Number of outputs.
    hidden : tuple of int
        Widths of the hidden layers.
    """

    def __init__(
        self, input_shape: tuple[int, ...], num_classes: int, hidden: tuple[int, ...] = MLP_HIDDEN
    ) -> None:
        super().__init__()
        widths = (math.prod(input_shape), *hidden)
        layers: list[nn.Module] = [nn.Flatten()]
        for width_in, width_out in zip(widths[:-1], widths[1:]):
            layers += [nn.Linear(width_in, width_out), nn.ReLU(inplace=True)]
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(widths[-1], num_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """The last hidden layer's activations."""
        return self.layers(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x))


# -- ResNet-9 ------------------------------------------------------------------------------


class Residual(nn.Module):
    """``x + f(x)``.

    Parameters
    ----------
    body : torch.nn.Module
        The residual branch ``f``; keeps the shape of its input.
    """

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class ResNet9(nn.Module):
    """The DAWNBench ResNet-9 (David Page, "How to train your ResNet", 2018).

    Parameters
    ----------
    in_channels : int
        Image channels.
    num_classes : int
        Number of outputs.
    norm : str
        One of :data:`NORMS`.

    Notes
    -----
    The original's final ``× 0.125`` logit scale is left out (it is a learning-rate
    trick tied to its training schedule); the global pool is adaptive so any image side
    ≥ 8 works.
    """

    def __init__(self, in_channels: int, num_classes: int, norm: str = "bn") -> None:
        super().__init__()

        def norm2d(channels: int) -> nn.Module:
            return make_norm(norm, channels, 2)

        def stage(channels_in: int, channels_out: int) -> nn.Sequential:
            return nn.Sequential(conv_norm_relu(channels_in, channels_out, norm2d), nn.MaxPool2d(2))

        self.prep = conv_norm_relu(in_channels, 64, norm2d)
        self.layer1 = stage(64, 128)
        self.residual1 = Residual(
            nn.Sequential(conv_norm_relu(128, 128, norm2d), conv_norm_relu(128, 128, norm2d))
        )
        self.layer2 = stage(128, 256)
        self.layer3 = stage(256, 512)
        self.residual3 = Residual(
            nn.Sequential(conv_norm_relu(512, 512, norm2d), conv_norm_relu(512, 512, norm2d))
        )
        self.pool = nn.AdaptiveMaxPool2d(1)
        self.head = nn.Linear(512, num_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """The globally pooled 512 features."""
        x = self.residual1(self.layer1(self.prep(x)))
        x = self.residual3(self.layer3(self.layer2(x)))
        return torch.flatten(self.pool(x), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x))


# -- ResNet-18 / ResNet-20 -----------------------------------------------------------------


class BasicBlock(nn.Module):
    """Two 3×3 conv-norm layers with a shortcut (He et al. 2016).

    Parameters
    ----------
    in_channels, out_channels : int
        Channels in and out.
    stride : int
        Stride of the first convolution (2 halves the image).
    norm : str
        One of :data:`NORMS`.
    shortcut : {"projection", "pad"}
        How the shortcut changes shape when needed: a 1×1 conv + norm ("projection",
        option B, ResNet-18) or stride-2 subsampling with zero-padded channels ("pad",
        the parameter-free option A of the CIFAR ResNets).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        stride: int = 1,
        norm: str = "bn",
        shortcut: str = "projection",
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, padding=1, bias=False)
        self.norm1 = make_norm(norm, out_channels, 2)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, padding=1, bias=False)
        self.norm2 = make_norm(norm, out_channels, 2)
        if shortcut not in ("projection", "pad"):
            raise ValueError(f"shortcut must be 'projection' or 'pad', got {shortcut!r}")
        if shortcut == "pad" and out_channels < in_channels:
            raise ValueError("a zero-padding shortcut cannot reduce the channel count")
        self.stride = stride
        self.pad_channels = out_channels - in_channels
        self.pad_shortcut = False
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            if shortcut == "projection":
                self.shortcut = nn.Sequential(
                    nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                    make_norm(norm, out_channels, 2),
                )
            else:
                self.pad_shortcut = True

    def _shortcut(self, x: torch.Tensor) -> torch.Tensor:
        if not self.pad_shortcut:
            return self.shortcut(x)
        # option A: subsample spatially, zero-pad the new channels on both sides
        subsampled = x[:, :, :: self.stride, :: self.stride]
        half = self.pad_channels // 2
        return F.pad(subsampled, (0, 0, 0, 0, half, self.pad_channels - half))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return F.relu(out + self._shortcut(x))


class ResNet(nn.Module):
    """A CIFAR-style ResNet of BasicBlocks: 3×3 stem, no stem pool, stages, average pool, fc.

    Parameters
    ----------
    in_channels : int
        Image channels.
    num_classes : int
        Number of outputs.
    stage_widths : tuple of int
        Channels of each stage; every stage after the first halves the image.
    blocks_per_stage : tuple of int
        BasicBlocks in each stage.
    norm : str
        One of :data:`NORMS`.
    shortcut : {"projection", "pad"}
        Shortcut type of the shape-changing blocks (see :class:`BasicBlock`).
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        stage_widths: tuple[int, ...],
        blocks_per_stage: tuple[int, ...],
        norm: str = "bn",
        shortcut: str = "projection",
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, stage_widths[0], 3, padding=1, bias=False),
            make_norm(norm, stage_widths[0], 2),
            nn.ReLU(inplace=True),
        )
        stages = []
        channels = stage_widths[0]
        for index, (width, blocks) in enumerate(zip(stage_widths, blocks_per_stage)):
            stride = 1 if index == 0 else 2
            layers = []
            for block in range(blocks):
                layers.append(
                    BasicBlock(channels, width, stride if block == 0 else 1, norm, shortcut)
                )
                channels = width
            stages.append(nn.Sequential(*layers))
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(channels, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """The globally averaged features of the last stage."""
        return torch.flatten(self.pool(self.stages(self.stem(x))), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x))


# -- factory -------------------------------------------------------------------------------


def _image_channels(name: str, input_shape: tuple[int, ...], min_side: int) -> int:
    if len(input_shape) != 3 or min(input_shape[1:]) < min_side or input_shape[0] < 1:
        raise ConfigError(
            f"model {name!r} needs image inputs (C, H, W) with H, W ≥ {min_side}; "
            f"got {tuple(input_shape)}"
        )
    return input_shape[0]


def default_model(input_shape: tuple[int, ...]) -> str:
    """The model a run trains when none is given: ``cnn`` for ``(C, H, W)`` images,
    ``mlp`` for the rest (tabular features)."""
    return "cnn" if len(input_shape) == 3 else "mlp"


def build_model(
    name: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    norm: str | None = None,
    hidden: tuple[int, ...] | None = None,
) -> nn.Module:
    """Build the model ``name`` for samples of ``input_shape`` and ``num_classes`` outputs.

    Parameters
    ----------
    name : str
        One of :data:`MODELS`.
    input_shape : tuple of int
        Shape of one sample: ``(C, H, W)`` images (any channel count), ``(F,)`` tabular.
    num_classes : int
        Number of output logits.
    norm : str, optional
        One of :data:`NORMS` (default: :func:`default_norm`, ``"bn"`` for the ResNets,
        ``"none"`` for ``cnn`` and ``mlp``). ``cnn`` and ``mlp`` are the papers'
        norm-free networks: they refuse any norm but ``"none"`` rather than ignore it.
    hidden : tuple of int, optional
        Hidden-layer widths of ``mlp`` (default ``(200, 200)``; the Stratify paper's
        COVTYPE model is ``(32, 16, 8)``). Refused for the other models.

    Returns
    -------
    torch.nn.Module
        The model, on the CPU, in train mode; it maps ``(N, *input_shape)`` to
        ``(N, num_classes)``.

    Raises
    ------
    stratify.errors.ConfigError
        Unknown name or norm, a norm the model has no layers for, a bad class count, or an
        input shape the model cannot take.
    """
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; choose one of: {_choices(MODELS)}")
    if norm is None:
        norm = default_norm(name)
    if norm not in NORMS:
        raise ConfigError(f"unknown norm {norm!r}; choose one of: {_choices(NORMS)}")
    input_shape = tuple(int(size) for size in input_shape)
    if isinstance(num_classes, bool) or int(num_classes) < 1:
        raise ConfigError(f"num_classes must be a positive integer, got {num_classes!r}")
    num_classes = int(num_classes)
    if not input_shape or any(size < 1 for size in input_shape):
        raise ConfigError(f"model {name!r} got an empty input shape {input_shape}")
    check_model_norm(name, norm)
    if hidden is not None and name != "mlp":
        raise ConfigError(f"--mlp-hidden applies to --model mlp, not {name!r}")
    if name == "cnn":
        if len(input_shape) not in (1, 2, 3) or min(input_shape[1:] or input_shape) < 4:
            raise ConfigError(
                f"model 'cnn' needs (C, H, W) images, (C, L) signals or (F,) features with "
                f"sizes ≥ 4; got {input_shape}"
            )
        return SimpleCNN(input_shape, num_classes)
    if name == "mlp":
        return (
            MLP(input_shape, num_classes)
            if hidden is None
            else MLP(input_shape, num_classes, hidden)
        )
    in_channels = _image_channels(name, input_shape, MIN_RESNET_SIDE)
    if name == "resnet9":
        return ResNet9(in_channels, num_classes, norm)
    if name == "resnet18":
        return ResNet(in_channels, num_classes, (64, 128, 256, 512), (2, 2, 2, 2), norm)
    return ResNet(in_channels, num_classes, (16, 32, 64), (3, 3, 3), norm, shortcut="pad")


def parameter_bytes(model: nn.Module) -> int:
    """Bytes of the trainable parameters: the size of one gradient upload.

    Parameters
    ----------
    model : torch.nn.Module
        The model; shared parameters count once.
    """
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def model_bytes(model: nn.Module) -> int:
    """Bytes that travel when the model is sent: all parameters plus persistent buffers.

    Parameters
    ----------
    model : torch.nn.Module
        The model. Counts what its ``state_dict`` holds (BatchNorm running statistics and
        counters included), each shared tensor once; non-persistent buffers stay home.
    """
    seen: set[int] = set()
    total = 0
    for parameter in model.parameters():
        seen.add(id(parameter))
        total += parameter.numel() * parameter.element_size()
    for module in model.modules():
        for buffer_name, buffer in module.named_buffers(recurse=False):
            if buffer is None or id(buffer) in seen:
                continue
            if buffer_name in module._non_persistent_buffers_set:
                continue
            seen.add(id(buffer))
            total += buffer.numel() * buffer.element_size()
    return total
