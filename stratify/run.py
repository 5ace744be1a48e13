"""A training run: set-up, epochs, evaluation, metrics files, checkpoint and resume.

Files written to the run folder (docs/architecture.md, "Run folder"): ``config.json``,
``metrics.jsonl`` (one object per epoch), ``summary.json``, ``checkpoint.pt`` and, for a
secure run, the clients' registry secrets (``client_secrets.json``, mode 0600: the shared
secret and each client's own order key, the parties this process plays).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from stratify.backend import Timer
from stratify.checkpoints import checkpoint_problem
from stratify.client import private_trainer
from stratify.config import RESUMABLE_CHANGES, TrainConfig, resolved_differences, run_complete
from stratify.data.datasets import Dataset
from stratify.errors import (
    CheckpointError,
    ConfigError,
    CorruptRunError,
    StratifyError,
    TrainingError,
)
from stratify.experiment import build_experiment
from stratify.measures import accuracy_summary
from stratify.method import EpochStats
from stratify.privacy.accounting import DPSettings, epsilon_spent
from stratify.registry import SECRETS_FILE, RegistrySecrets, make_registry
from stratify.registry.client_secrets import SECRETS_MODE
from stratify.runfiles import RUN_FILES, read_json_object
from stratify.runfolder import (
    RunFolder,
    check_same_settings,
    checkpoint_bytes,
    read_checkpoint,
    read_file,
    software_versions,
    strict_json,
)


@dataclass
class EpochRecord:
    epoch: int
    test_accuracy: float
    test_loss: float
    train_loss: float
    steps: int
    transfers: int
    bytes_sent: int
    skipped: int
    wall_seconds: float
    # after wall_seconds, with a default: checkpoints written before it existed still load
    reused: int = 0
    # the lowest accuracy over the test set's (label, attribute) groups; None without
    # attributes (and in records written before it existed)
    worst_group_accuracy: float | None = None
    # on the held-out validation split (--validation); None without one
    validation_accuracy: float | None = None
    validation_loss: float | None = None
    # training samples whose gradient a step used (None in records written before it existed)
    sample_gradients: int | None = None
    # the clients that returned an update this epoch, sorted (empty for Stratify's plans)
    clients_trained: list[int] = field(default_factory=list)
    # the method's own diagnostics of the epoch (Strategy.epoch_info)
    info: dict[str, Any] = field(default_factory=dict)


class Run:
    """Builds a run's parts with :func:`~stratify.experiment.build_experiment` and trains
    epoch by epoch, writing the run folder.

    With ``config.out`` set, the folder is held (:class:`~stratify.runfolder.RunFolder`)
    from construction until :meth:`train` returns or raises, or until :meth:`close`: a
    second run on the same folder is refused meanwhile.

    Parameters
    ----------
    config : TrainConfig
        The run's configuration.
    resume : bool
        Continue from ``config.out``'s checkpoint.
    overwrite : bool
        Replace a run already in ``config.out``; the old run stays until the new one has
        finished its first epoch.
    on_epoch : callable, optional
        Called with each :class:`EpochRecord` (progress display).
    on_steps : callable, optional
        Called with the number of steps done, every few thousand steps.
    dataset : Dataset, optional
        ``config.dataset`` already loaded (a worker running many runs loads it once);
        default: load it.
    secrets : RegistrySecrets, optional
        The clients' registry secrets (a plain run given them registers as a secure run
        with them would). Default: a secure run draws fresh ones, or reads those saved in
        ``config.out`` on ``--resume``; a plain run needs none.
    """

    def __init__(
        self,
        config: TrainConfig,
        resume: bool = False,
        overwrite: bool = False,
        on_epoch: Callable[[EpochRecord], None] | None = None,
        on_steps: Callable[[int], None] | None = None,
        dataset: Dataset | None = None,
        secrets: RegistrySecrets | None = None,
    ) -> None:
        if resume and overwrite:
            raise ConfigError("--resume and --overwrite contradict each other; give one")
        if resume and config.out is None:
            raise ConfigError("--resume needs --out DIR pointing at the run to continue")
        self.config = config
        self.on_epoch = on_epoch or (lambda record: None)
        self.records: list[EpochRecord] = []
        self.start_epoch = 0
        self.folder: RunFolder | None = None
        if config.out is not None:
            mode = "resume" if resume else "overwrite" if overwrite else "new"
            self.folder = RunFolder.open(
                config.out, RUN_FILES, mode=mode, checkpoint="checkpoint.pt"
            )
        self.out = Path(config.out) if config.out is not None else None
        try:
            self._set_up(resume, on_steps, dataset, secrets)
        except BaseException:
            self.close()
            raise

    def _set_up(
        self,
        resume: bool,
        on_steps: Callable[[int], None] | None,
        dataset: Dataset | None,
        secrets: RegistrySecrets | None,
    ) -> None:
        checkpoint = self._read_checkpoint() if resume else None
        if secrets is None and self.config.secure:
            secrets = self._read_secrets() if resume else RegistrySecrets.draw(self.config.clients)
        if secrets is not None:
            check_order_keys(secrets, self.config.clients)
        registry = make_registry(
            self.config.secure, self.config.seed, self.config.protocol, secrets=secrets
        )
        self.experiment = build_experiment(self.config, dataset=dataset, registry=registry)
        self.device = self.experiment.device
        self.dataset = self.experiment.dataset
        self.federation = self.experiment.federation
        self.placeholders = self.experiment.placeholders
        self.strategy = self.experiment.strategy
        self.engine = self.experiment.engine
        self.engine.on_steps = on_steps
        if checkpoint is not None:
            self._load_checkpoint(checkpoint)
        if self.folder is not None:
            # only now that every part is built: a failed set-up leaves --out untouched
            self.folder.start()
            if secrets is not None and not resume:
                self.folder.write_bytes(SECRETS_FILE, secrets.to_bytes(), SECRETS_MODE)
            self.folder.write_json("config.json", self._config_record())
            self._write_progress()

    # -- run folder ---------------------------------------------------------------------

    def _read_checkpoint(self) -> dict:
        assert self.out is not None  # --resume needs --out
        path = self.out / "checkpoint.pt"
        checkpoint = read_checkpoint(path)
        used = self._settings_used()
        # the rate, schedule and options count as the run used them: naming a value it
        # took as a default continues it, a default that moved since does not
        as_used = ("lr", "lr_schedule", "options") if used is not None else ()
        check_same_settings(
            checkpoint.get("config"),
            self.config.comparable(),
            (*RESUMABLE_CHANGES, *as_used),
            path,
        )
        moved = resolved_differences(used, self.config) if used is not None else []
        if moved:
            raise ConfigError(
                f"--resume: the run in {self.out} trained with other settings than these "
                f"resolve to today ({'; '.join(moved)}); give the values it used (e.g. "
                "--lr, --lr-schedule) to continue it as it was"
            )
        epoch = checkpoint.get("epoch")
        if isinstance(epoch, int) and not isinstance(epoch, bool) and epoch >= self.config.epochs:
            raise ConfigError(
                f"--resume: the checkpoint already has {epoch} epochs; "
                f"ask for more than {epoch} with --epochs"
            )
        return checkpoint

    def _settings_used(self) -> dict[str, Any] | None:
        """The rate, schedule and options the run in ``config.out`` recorded as used
        (``config.json``'s ``"resolved"``); ``None`` where the file cannot tell."""
        assert self.out is not None  # --resume needs --out
        try:
            used = read_json_object(self.out / "config.json").get("resolved")
        except (CorruptRunError, OSError):
            return None
        return used if isinstance(used, dict) else None

    def _read_secrets(self) -> RegistrySecrets:
        """The registry secrets the secure run in ``config.out`` drew (``--resume``)."""
        assert self.out is not None  # --resume needs --out
        return read_secrets(
            self.out / SECRETS_FILE,
            "--resume",
            "a secure run resumes only with the registry secrets it drew "
            "(start a new run with --overwrite)",
        )

    def _config_record(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self.config),
            "resolved": {
                "device": str(self.device),
                "lr": self.experiment.lr,
                "lr_schedule": self.experiment.lr_schedule,
                "options": self.strategy.options.to_dict(),
                "model": self.engine.model.__class__.__name__,
                "num_placeholders": self.placeholders.num_placeholders,
                "num_classes": self.dataset.num_classes,
                "model_bytes": self.engine.model_bytes,
                "evaluated_on": "validation and test" if self.config.validation else "test",
                "evaluation_samples": len(self.dataset.y_test),
                "validation_samples": (
                    0 if self.experiment.validation is None else len(self.experiment.validation)
                ),
            },
            "versions": software_versions(),
        }

    def _write_progress(self) -> None:
        """metrics.jsonl and summary.json for the epochs done so far, each replaced whole."""
        assert self.folder is not None  # run files are written only with --out
        self.folder.write_text("metrics.jsonl", "".join(map(record_line, self.records)))
        self.folder.write_json("summary.json", self.summary())

    def _save_checkpoint(self, epoch: int) -> None:
        state = {
            "epoch": epoch,
            "config": self.config.comparable(),
            "model": self.engine.model.state_dict(),
            "strategy": self.strategy.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "records": [dataclasses.asdict(record) for record in self.records],
        }
        assert self.folder is not None  # checkpoints are saved only with --out
        self.folder.write_bytes("checkpoint.pt", checkpoint_bytes(state))

    def _load_checkpoint(self, checkpoint: dict) -> None:
        assert self.out is not None  # a checkpoint is read only from --out
        model = self.engine.model
        problem = checkpoint_problem(
            checkpoint,
            model.state_dict(),
            list(model.parameters()),
            self.strategy.state_dict(),
            EpochRecord,
        )
        if problem is None:
            try:
                records = [EpochRecord(**record) for record in checkpoint["records"]]
                self.strategy.load_state_dict(checkpoint["strategy"])
            except (TypeError, KeyError, ValueError, RuntimeError, AttributeError) as error:
                problem = f"strategy: {type(error).__name__} while restoring the method state"
        if problem is not None:
            path = self.out / "checkpoint.pt"
            raise CheckpointError(
                f"checkpoint refused: {problem} ({path} is left as it is; start a new run "
                "with --overwrite)",
                f"checkpoint refused: {problem}",
            )
        model.load_state_dict(checkpoint["model"])
        torch.set_rng_state(checkpoint["torch_rng"])
        # metrics written after the checkpoint's epoch belong to an interrupted epoch and
        # are dropped when the files are rewritten from these records
        self.records = records
        self.start_epoch = checkpoint["epoch"]

    def close(self) -> None:
        """Release the run folder (:meth:`train` does it when it ends)."""
        if self.folder is not None:
            self.folder.close()

    # -- training -----------------------------------------------------------------------

    def _step_flags(self) -> str:
        """The flags that set this run's step sizes: what a diverging loss points to."""
        steps = self.strategy.card.bench.step_size_options
        flags = ["--lr"] + [
            "--" + entry.name.replace("_", "-")
            for entry in self.strategy.options_class.option_fields()
            if entry.name in steps
        ]
        return " / ".join(flags)

    def train(self) -> dict[str, Any]:
        """Run the remaining epochs; returns the summary. Releases the run folder."""
        try:
            while not self.done:
                self._train_epoch(self.epochs_done + 1)
        finally:
            self.close()
        return self.summary()

    def _train_epoch(self, epoch: int) -> None:
        trainer = private_trainer(self.engine.context.trainer)
        if trainer is not None:
            trainer.start_epoch(epoch)
        with Timer(self.device) as timer:
            try:
                stats = self.engine.run_epoch(epoch)
            except TrainingError as error:
                raise self.stopped(error, epoch) from None
        self.end_epoch(epoch, stats, timer.seconds)

    @property
    def epochs_done(self) -> int:
        return len(self.records)

    @property
    def done(self) -> bool:
        """Every epoch run, or (``--stop-on-plateau``) the validation accuracy plateaued."""
        accuracies = [r.validation_accuracy for r in self.records]
        return run_complete(self.config, accuracies, self.dataset.num_classes)

    def stopped(self, error: TrainingError, epoch: int) -> TrainingError:
        """A diverged epoch's error, saying what the run keeps and which flags to lower."""
        return TrainingError(
            f"{error}; stopped, {self._what_is_kept(epoch)}; try lower values of "
            f"{self._step_flags()}"
        )

    def end_epoch(self, epoch: int, stats: EpochStats, seconds: float) -> None:
        """Evaluate the trained epoch, record it, checkpoint and write the run's files.

        ``seconds`` is the epoch's training time: a run stepped with others
        (:mod:`stratify.vectorize`) gives its share of the group's.
        """
        metrics = self.engine.test_metrics()
        validation = self.engine.validation_metrics()
        record = EpochRecord(
            epoch=epoch,
            test_accuracy=metrics.accuracy,
            test_loss=metrics.loss,
            train_loss=stats.train_loss,
            steps=stats.steps,
            transfers=stats.transfers,
            bytes_sent=stats.bytes_sent,
            skipped=stats.skipped,
            reused=stats.reused,
            wall_seconds=round(seconds, 4),
            worst_group_accuracy=metrics.worst_group_accuracy,
            validation_accuracy=None if validation is None else validation.accuracy,
            validation_loss=None if validation is None else validation.loss,
            sample_gradients=stats.sample_gradients,
            clients_trained=stats.clients,
            info=stats.info,
        )
        self.records.append(record)
        if self.folder is not None:
            # the checkpoint first: metrics ahead of it would be dropped on resume anyway
            self._save_checkpoint(epoch)
            self._write_progress()
            self.folder.commit()
        self.on_epoch(record)

    def _what_is_kept(self, epoch: int) -> str:
        if self.folder is None:
            return "nothing was written (no --out)"
        if epoch > 1:
            return f"the last good checkpoint (epoch {epoch - 1}) is kept in {self.folder.given}"
        if self.folder.mode == "overwrite" and not self.folder.committed:
            return f"the run already in {self.folder.given} is left as it was"
        return f"no checkpoint was written and {self.folder.given} is left as it was"

    def summary(self) -> dict[str, Any]:
        """The run so far (:func:`~stratify.measures.accuracy_summary`): the final
        accuracy, the mean ± std over the last rounds, the epoch chosen on the validation
        split with the test accuracy there, and the best test accuracy (chosen on test);
        budgets per epoch; the method's own entries under ``method``. Entries that cannot
        be computed yet are ``None``."""
        records = [dataclasses.asdict(record) for record in self.records]
        trained = set().union(*(record.clients_trained for record in self.records))
        gradients = [r.sample_gradients for r in self.records if r.sample_gradients is not None]
        return {
            "algorithm": self.config.algorithm,
            "dataset": self.config.dataset,
            "partition": self.config.partition,
            "mode": self.config.mode,
            "epochs_completed": len(self.records),
            # the epochs run when the validation accuracy plateaued before --epochs
            "stopped_on_plateau": (
                len(self.records) if len(self.records) < self.config.epochs and self.done else None
            ),
            **accuracy_summary(records),
            "total_transfers": sum(record.transfers for record in self.records),
            "total_steps": sum(record.steps for record in self.records),
            "total_wall_seconds": round(sum(record.wall_seconds for record in self.records), 4),
            "sample_gradients_per_round": statistics.fmean(gradients) if gradients else None,
            "transfers_per_round": per_round([record.transfers for record in self.records]),
            "bytes_per_round": per_round([record.bytes_sent for record in self.records]),
            # None where no client returned an update of its own (Stratify's plans)
            "distinct_clients_trained": len(trained) if trained else None,
            "method": self.strategy.summarize(records),
            **self.privacy_summary(),
        }

    def privacy_summary(self) -> dict[str, Any]:
        """``{"privacy": {...}}``: the (ε, δ) this run has spent so far, from Opacus's
        accountant over the most uses of any one sample (docs/architecture.md,
        "Differential privacy"); nothing for a run without DP.

        Each use of a sample is counted as it happens; the epochs before a ``--resume``
        count at their planned uses, an upper bound of what they made.
        """
        trainer = private_trainer(self.engine.context.trainer)
        if trainer is None or not isinstance(trainer.privacy, DPSettings):
            return {}
        settings = trainer.privacy
        uses = self.start_epoch * trainer.uses_per_epoch + int(trainer.uses.max(initial=0))
        return {
            "privacy": {
                "mechanism": "per-sample clipping + Gaussian noise, no subsampling",
                "accountant": "opacus RDP",
                "target_epsilon": settings.epsilon,
                "delta": settings.delta,
                "clip": settings.clip,
                "noise_multiplier": trainer.noise_multiplier,
                "noise_seed": "given (--dp-seed)" if settings.seed is not None else "entropy",
                "planned_uses": self.config.epochs * trainer.uses_per_epoch,
                "uses": uses,
                "epsilon": epsilon_spent(trainer.noise_multiplier, settings.delta, uses),
            }
        }


def per_round(values: list[int]) -> float | None:
    """The mean of per-epoch counts, ``None`` before the first epoch."""
    return statistics.fmean(values) if values else None


def record_line(record: EpochRecord) -> str:
    """One ``metrics.jsonl`` line: strict JSON, a non-finite value written as ``null``."""
    return strict_json(dataclasses.asdict(record)) + "\n"


def train(config: TrainConfig, **kwargs: Any) -> dict[str, Any]:
    """Build and run ``config``; see :class:`Run` for the keyword arguments."""
    return Run(config, **kwargs).train()


__all__ = ["TrainConfig", "Run", "EpochRecord", "train", "StratifyError"]


def check_order_keys(secrets: RegistrySecrets, clients: int) -> None:
    """Refuse secrets holding another number of clients' order keys than the run has.

    Parameters
    ----------
    secrets : RegistrySecrets
        The run's secrets (format 1's derive every client's order: always accepted).
    clients : int
        The run's clients.

    Raises
    ------
    ConfigError
        One line naming both numbers.
    """
    if secrets.is_legacy or len(secrets.order_keys) == clients:
        return
    raise ConfigError(
        f"the registry secrets hold the order keys of {len(secrets.order_keys)} clients, "
        f"the run has {clients}; give the secrets of a run with {clients} clients"
    )


def read_secrets(path: Path, option: str, if_missing: str = "") -> RegistrySecrets:
    """The registry secrets a run kept in ``path`` (its ``client_secrets.json``).

    Parameters
    ----------
    path : Path
        The secrets file.
    option : str
        The option that named it, for the error message.
    if_missing : str
        What to do when the file is missing, appended to that message.

    Raises
    ------
    CheckpointError
        The file is missing, unreadable, not a file or not a secrets file.
    """
    try:
        data = read_file(path, limit=4096)
    except FileNotFoundError:
        raise CheckpointError(
            f"{option}: {path} is missing" + (f"; {if_missing}" if if_missing else "")
        ) from None
    except OSError as error:
        raise CheckpointError(f"{option}: cannot read {path}: {error.strerror}") from None
    except CorruptRunError as error:  # a folder or a FIFO where the file belongs
        raise CheckpointError(f"{option}: {error}") from None
    return RegistrySecrets.from_bytes(data, f"{option}: {path}")
