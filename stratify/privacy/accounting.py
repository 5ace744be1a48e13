"""The accounting of differential privacy for the updates, without torch: the options'
checks, :class:`DPSettings`, and the (ε, δ) of a run from Opacus's RDP accountant
(docs/architecture.md, "Differential privacy").

The accounting is stated, not hoped for. Stratify's schedules and the baselines' local
epochs use each sample a fixed number of times per epoch in a fixed partition, with no
Poisson subsampling, so there is no amplification by sampling: a sample that is used
``uses`` times over a run is in ``uses`` Gaussian mechanisms of sensitivity ``C``
(``sample_rate = 1``, ``steps = uses``), under add/remove adjacency where a removed
sample's step still adds its noise. The ε of a run is that composition's, at δ.

The accountant is imported only when a run asks for privacy: ``pip install -e
'.[privacy]'`` (Opacus) provides it. Nothing here imports torch until then, so
``stratify stream`` checks its options without loading it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from stratify.errors import ConfigError
from stratify.options import option
from stratify.validation import check_seed

#: δ when none is given: well below 1/N for the toolkit's datasets (N ≤ 70,000)
DEFAULT_DELTA = 1e-5
#: per-sample clipping norm C when none is given
DEFAULT_CLIP = 1.0


def load_accountant() -> tuple[type, object]:
    """Opacus's ``RDPAccountant`` and ``get_noise_multiplier``, or one line naming the
    extra that installs them."""
    try:
        from opacus.accountants import RDPAccountant
        from opacus.accountants.utils import get_noise_multiplier
    except ImportError:
        raise ConfigError(
            "differential privacy needs Opacus's accountant: "
            "pip install -e '.[privacy]' in the checkout"
        ) from None
    return RDPAccountant, get_noise_multiplier


def epsilon_spent(noise_multiplier: float, delta: float, uses: int) -> float:
    """The ε at ``delta`` of ``uses`` Gaussian mechanisms of noise multiplier σ on every
    sample, without subsampling (Opacus's RDP accountant, ``sample_rate = 1``).

    Parameters
    ----------
    noise_multiplier : float
        σ: the noise's standard deviation over the clipping norm.
    delta : float
        δ in (0, 1).
    uses : int
        How many noised steps each sample is in (0: nothing spent, ε = 0).
    """
    return composed_epsilon({noise_multiplier: uses}, delta)


def composed_epsilon(spent: Mapping[float, int], delta: float) -> float:
    """The ε at ``delta`` of ``spent[σ]`` unsubsampled Gaussian mechanisms of noise
    multiplier σ, for every σ, composed (Opacus's RDP accountant; Rényi DP adds over
    mechanisms).

    Parameters
    ----------
    spent : mapping of float to int
        Noise multiplier σ → how many mechanisms at that σ. σ = 0 with any use: ε = ∞.
    delta : float
        δ in (0, 1).
    """
    history = [(float(noise), 1.0, int(uses)) for noise, uses in spent.items() if uses > 0]
    if not history:
        return 0.0
    if any(noise <= 0 for noise, _, _ in history):
        return math.inf
    accountant_class, _ = load_accountant()
    accountant = accountant_class()
    accountant.history = history
    return float(accountant.get_epsilon(delta=delta))


def calibrate_noise(epsilon: float, delta: float, uses: int) -> float:
    """The smallest σ (to Opacus's search tolerance) whose ``uses`` unsubsampled Gaussian
    steps spend at most ``epsilon`` at ``delta``: ``epsilon_spent(σ, δ, uses) ≤ ε``.

    Parameters
    ----------
    epsilon : float
        Target ε > 0.
    delta : float
        δ in (0, 1).
    uses : int
        The run's planned uses of each sample (at least 1).
    """
    _, get_noise_multiplier = load_accountant()
    return float(
        get_noise_multiplier(  # type: ignore[operator]
            target_epsilon=epsilon,
            target_delta=delta,
            sample_rate=1.0,
            steps=max(1, int(uses)),
            accountant="rdp",
        )
    )


def check_epsilon(value: object, flag: str) -> float:
    """A finite ε > 0."""
    number = check_number(value, flag)
    if not (math.isfinite(number) and number > 0):
        raise ConfigError(f"{flag} takes a finite ε > 0 (e.g. 3), got {value!r}")
    return number


def check_delta(value: object, flag: str) -> float:
    """A δ in (0, 1)."""
    number = check_number(value, flag)
    if not 0 < number < 1:
        raise ConfigError(f"{flag} takes a δ in (0, 1) (e.g. 1e-5), got {value!r}")
    return number


def check_noise(value: object, flag: str) -> float:
    """A finite noise multiplier σ > 0."""
    number = check_number(value, flag)
    if not (math.isfinite(number) and number > 0):
        raise ConfigError(f"{flag} takes a finite noise multiplier σ > 0 (e.g. 1.0), got {value!r}")
    return number


def check_clip(value: object, flag: str) -> float:
    """A finite clipping norm C > 0."""
    number = check_number(value, flag)
    if not (math.isfinite(number) and number > 0):
        raise ConfigError(f"{flag} takes a finite clipping norm C > 0 (e.g. 1.0), got {value!r}")
    return number


def check_number(value: object, flag: str) -> float:
    """``value`` as a float, or one line."""
    if isinstance(value, bool):
        raise ConfigError(f"{flag} takes a number, got {value!r}")
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"{flag} takes a number, got {value!r}") from None


@dataclass(frozen=True)
class DPSettings:
    """What a run asks of differential privacy for its updates.

    Every gradient a client computes is clipped per sample to norm ``clip`` and the
    client adds ``N(0, σ²C²)`` to what leaves it (one step's gradient in single-sample
    mode, a share's sum in batch mode, each local mini-batch step's sum for the
    averaging baselines). Each sample is used a fixed number of times (no Poisson
    subsampling, so no amplification): the run's ε is that of ``uses`` unsubsampled
    Gaussian mechanisms at ``delta``, from Opacus's RDP accountant.

    Parameters
    ----------
    epsilon : float, optional
        Target ε: σ is calibrated for the run's planned uses of each sample
        (:func:`calibrate_noise`). Give this or ``noise_multiplier``.
    noise_multiplier : float, optional
        σ given directly; the ε spent is reported.
    delta : float
        δ in (0, 1) (default 1e-5).
    clip : float
        Per-sample clipping norm C > 0 (default 1.0).
    seed : int, optional
        Seeds the noise generator; ``None`` (the default): a seed from the operating
        system's entropy, so that no one who knows the run's settings can subtract the
        noise (a given seed makes a simulation reproducible, and the noise removable by
        whoever reads it).
    """

    epsilon: float | None = None
    noise_multiplier: float | None = None
    delta: float = DEFAULT_DELTA
    clip: float = DEFAULT_CLIP
    seed: int | None = None

    def __post_init__(self) -> None:
        if (self.epsilon is None) == (self.noise_multiplier is None):
            raise ConfigError("differential privacy takes --dp-epsilon or --dp-noise, one of them")
        if self.epsilon is not None:
            check_epsilon(self.epsilon, "--dp-epsilon")
        if self.noise_multiplier is not None:
            check_noise(self.noise_multiplier, "--dp-noise")
        check_delta(self.delta, "--dp-delta")
        check_clip(self.clip, "--dp-clip")

    def sigma(self, uses: int) -> float:
        """σ for a run whose samples are each used ``uses`` times: the given one, or the
        one calibrated for the target ε."""
        if self.noise_multiplier is not None:
            return float(self.noise_multiplier)
        assert self.epsilon is not None
        return calibrate_noise(self.epsilon, self.delta, uses)


#: the settings that turn differential privacy on, any of which asks for it
DP_FIELDS = ("dp_epsilon", "dp_noise", "dp_delta", "dp_clip", "dp_seed")


@dataclass
class DPOptions:
    """The declarations of the DP options ``train`` and ``stream`` share, never made into
    an instance: :class:`~stratify.config.TrainConfig` and
    :class:`~stratify.stream.config.StreamConfig` take each with
    :func:`~stratify.options.option_of` (docs/architecture.md, "Options")."""

    dp_epsilon: float | None = option(
        None,
        "Differential privacy for the updates: per-sample clipping and Gaussian noise on "
        "the clients, the noise calibrated so that the run spends this ε at --dp-delta "
        "(Opacus's RDP accountant; needs the privacy extra). Default: no DP.",
        check=check_epsilon,
        cli_type=float,
    )
    dp_noise: float | None = option(
        None,
        "Differential privacy with this noise multiplier σ (noise N(0, σ²C²) per step); "
        "the ε spent is reported. Give it or --dp-epsilon.",
        check=check_noise,
        cli_type=float,
    )
    dp_delta: float | None = option(
        None,
        f"δ of the differential privacy [default: {DEFAULT_DELTA:g}].",
        check=check_delta,
        cli_type=float,
    )
    dp_clip: float | None = option(
        None,
        f"Per-sample clipping norm C of the differential privacy [default: {DEFAULT_CLIP:g}].",
        check=check_clip,
        cli_type=float,
    )
    dp_seed: int | None = option(
        None,
        "Seed of the DP noise, for a reproducible simulation only: whoever reads it (it is "
        "in config.json) can subtract the noise [default: drawn from the OS's entropy, "
        "so a resumed run draws fresh noise].",
        check=check_seed,
        cli_type=int,
    )


def dp_settings_of(config: object) -> DPSettings | None:
    """The :class:`DPSettings` of a run's or a stream's config (its :data:`DP_FIELDS`),
    ``None`` when it asks for no DP; options given without a noise level, or both, are
    refused in one line."""
    values = {name: getattr(config, name) for name in DP_FIELDS}
    if all(value is None for value in values.values()):
        return None
    if values["dp_epsilon"] is None and values["dp_noise"] is None:
        raise ConfigError(
            "--dp-delta, --dp-clip and --dp-seed need --dp-epsilon E or --dp-noise SIGMA"
        )
    if values["dp_epsilon"] is not None and values["dp_noise"] is not None:
        raise ConfigError("give --dp-epsilon (σ calibrated) or --dp-noise (σ given), not both")
    return DPSettings(
        epsilon=values["dp_epsilon"],
        noise_multiplier=values["dp_noise"],
        delta=DEFAULT_DELTA if values["dp_delta"] is None else values["dp_delta"],
        clip=DEFAULT_CLIP if values["dp_clip"] is None else values["dp_clip"],
        seed=values["dp_seed"],
    )
