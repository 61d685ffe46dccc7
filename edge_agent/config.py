"""Agent settings: defaults < YAML file < FL_AGENT_* environment < CLI flags."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from edge_agent.identity import certificate_identity, check_certificate_identity
from edge_agent.stragglers import DelayModel, parse_delay
from protocol.compression import COMPRESSORS
from protocol.security.signing import PublicKey
from protocol.topics import check_identifier
from service_kit.broker import BrokerSettings


class AgentSettings(BrokerSettings):
    model_config = SettingsConfigDict(env_prefix="FL_AGENT_", extra="forbid", validate_default=True)

    federation: str = Field(default="default", description=(
        "the federation to join: its topics live under fl/<federation>/, as the coordinator's"))
    device: Literal["jetson", "rpi", "phone", "cpu"] = Field(default="cpu", description=(
        "device profile: batch size, threads and model family; jetson trains on CUDA where available"))
    check_certificate_identity: bool = Field(default=True, description=(
        "with cert_file: refuse to start unless the certificate's CN is agent_id, as a broker with "
        "use_identity_as_username (Mosquitto) names the client after it; turn off for a broker that maps "
        "certificates to identities otherwise (docs/device-identity.md)"))
    agent_id: str | None = Field(default=None, description=(
        "this agent's id; unset: kept in the state dir, made on first start (with cert_file and "
        "check_certificate_identity: the certificate's CN)"))
    state_dir: Path = Field(default=Path("agent-state"), description=(
        "the agent's id, key, progress, privacy budget and training state, kept across restarts"))
    task: str = Field(default="digits", description=(
        "the task to run: an installed task's name ('edge-agent tasks' lists them) or package.module:attr"))
    family: str | None = Field(default=None, description="model family; unset: the one the task gives the device")

    data: str | None = Field(default=None, description=(
        "this device's data, as the task reads it (built-in tasks: a built-in set's name, an .npz, an image folder, "
        "CSV/Parquet readings); unset: the task's built-in set"))
    eval_data: str | None = Field(default=None, description=(
        "held-out data for the metrics this agent reports; unset: eval_fraction of its data"))
    partition: Literal["none", "iid", "dirichlet", "classes"] = Field(default="none", description=(
        "simulate a fleet from one data set: keep only this agent's share of it (none: all of it)"))
    num_partitions: int = Field(default=1, ge=1, description="shares the data is split into (agents simulated)")
    partition_index: int = Field(default=0, ge=0, description="which share is this agent's, from 0")
    alpha: float = Field(default=0.5, gt=0.0, description="dirichlet: label skew, smaller is more skewed")
    min_size: int = Field(default=10, ge=1, description="dirichlet: fewest samples in any share")
    classes_per_client: int = Field(default=2, ge=1, description="classes: labels each share holds")
    samples_per_class: int | None = Field(default=None, ge=1, description=(
        "few-shot: each share keeps at most this many samples of each class (the rest unused); unset: no limit"))
    data_seed: int = Field(default=0, description="seed of the partition and of the held-out split")
    eval_fraction: float = Field(default=0.15, ge=0.0, lt=1.0, description=(
        "fraction of the data held out for evaluation, when eval_data is unset"))

    # FOR TESTS AND BENCHMARKS ONLY: make this agent Byzantine (edge_agent/attacks).
    attack: Literal["none", "sign_flip", "scaling", "gaussian_noise", "label_flip", "alie"] = Field(
        default="none", description="TESTS/BENCHMARKS ONLY: send malicious updates")
    attack_scale: float | None = Field(default=None, gt=0.0, allow_inf_nan=False, description=(
        "sign_flip: send -s x delta; scaling: poisoned delta x s; gaussian_noise: sigma = s x RMS of the delta; "
        "unset: 4, 10 and 100 respectively"))
    attack_z: float | None = Field(default=None, ge=0.0, allow_inf_nan=False, description=(
        "alie: send mean - z x std of the colluders' benign updates; unset: 1"))
    secagg_vanish_after: Literal["none", "advertise", "shares", "masked", "reveal"] = Field(
        default="none", description=(
            "TESTS ONLY: once the broker acknowledged this agent's message of this secure-aggregation stage, the "
            "process exits at once, as a device losing power (no clean disconnect: its last will goes out)"))
    secagg_audit: bool = Field(default=False, description=(
        "TESTS/AUDITS ONLY: keep the clipped, weighted vector each secure round masked in the state dir "
        "(secagg-input-<round>); it is never sent"))
    attack_claim_samples: int | None = Field(default=None, ge=1, description=(
        "TESTS/BENCHMARKS ONLY, with an attack: claim this many training samples in every update"))
    attack_report_accuracy: float | None = Field(default=None, ge=0.0, le=1.0, allow_inf_nan=False, description=(
        "TESTS/BENCHMARKS ONLY, with an attack: report this held-out accuracy for the global model"))

    compressors: str = Field(default=",".join(COMPRESSORS.names()), description=(
        f"the update compressors this device may use (comma-separated: {', '.join(COMPRESSORS.names())}; 'none' for "
        "none); a round asking for another is answered uncompressed, and the update says why"))

    threads: int | None = Field(default=None, ge=0, description=(
        "torch CPU threads; unset: the device profile's; 0: torch's default"))
    tf32: bool = Field(default=False, description=(
        "on CUDA, let convolutions and matrix products round to TF32 (faster on Ampere and later, about 1e-3 "
        "relative error per product); off, a GPU's update matches a CPU's to float32 rounding"))
    batch_size: int | None = Field(default=None, ge=1, description=(
        "local batch size unless the coordinator sets one; unset: the device profile's"))
    heartbeat_s: float = Field(default=15.0, gt=0.0, description="seconds between status heartbeats to the coordinator")
    straggler_delay: str = Field(default="off", description=(
        "simulated extra compute time per training round, for demos and benchmarks: off, profile (the "
        "device profile's distribution), constant:S, uniform:A,B, lognormal:MEDIAN,SIGMA, exponential:MEAN"))

    # differential privacy: DP-SGD through Opacus; the budget is kept in state_dir (edge_agent/privacy)
    dp: bool = Field(default=False, description="train with DP-SGD; epsilon spent is kept in the state dir")
    dp_max_grad_norm: float = Field(default=1.0, gt=0.0, description="per-sample gradient clipping norm")
    dp_noise_multiplier: float | None = Field(default=None, gt=0.0,
                                              description="noise std over the clipping norm; or dp_target_epsilon")
    dp_target_epsilon: float | None = Field(default=None, gt=0.0,
                                            description="calibrate the noise once to reach this after dp_planned_rounds")
    dp_planned_rounds: int | None = Field(default=None, ge=1, description="rounds dp_target_epsilon is spread over")
    dp_delta: float = Field(default=1e-5, gt=0.0, lt=1.0, description="delta of the (epsilon, delta) guarantee")
    dp_budget_epsilon: float | None = Field(default=None, gt=0.0,
                                            description="stop training before epsilon passes this; unset: the target")
    dp_accountant: Literal["rdp", "prv"] = Field(default="rdp", description=(
        "how spent epsilon is computed (Opacus accountants): rdp, or prv (tighter, slower)"))
    dp_prototype_noise_multiplier: float | None = Field(
        default=None, gt=0.0, description="Gaussian mechanism on FedProto prototypes; unset refuses them under dp")
    dp_prototype_clip: float = Field(default=1.0, gt=0.0, description="embedding norm clip for prototypes")

    # memory: see edge_agent/resident.py
    give_back_library_pages: bool = Field(default=True, description=(
        "at start-up, unmap the clean code pages torch and other libraries left resident (Linux; "
        "they come back from the page cache when used): a lower resident set, see edge_agent/resident.py"))

    max_message_bytes: int = Field(default=0, ge=0, description="split updates above this size; 0 never")
    coordinator_key: str | None = Field(default=None, description=(
        "the coordinator's public key (ed25519:<base64>, or a file holding it): act only on what it signed"))
    signing_key_file: Path | None = Field(default=None, description=(
        "this agent's Ed25519 key from enrollment (created if missing); unset: STATE_DIR/agent_key.pem"))
    exit_when_finished: bool = Field(default=False, description="exit (status 0) once the coordinator's run finished")
    max_broker_denials: int = Field(default=3, ge=1, description=(
        "exit (status 3) once the broker refused this many publishes or subscriptions (MQTT 5 reason code "
        ">= 0x80, e.g. an ACL's 0x87 not authorized) instead of training for updates nobody receives"))
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(default="INFO", description="least severe log level shown")

    @field_validator("dp_accountant", mode="before")
    @classmethod
    def _no_gdp(cls, value: object) -> object:
        if value == "gdp":  # a bound that can be below the true epsilon breaks the budget's promise
            raise ValueError("gdp (Opacus's GaussianAccountant, a central-limit approximation) can report less "
                             "epsilon than was spent; use rdp or prv (a ledger kept under gdp is recomputed, never "
                             "lowered)")
        return value

    @field_validator("federation")
    @classmethod
    def _federation(cls, value: str) -> str:
        return check_identifier(value, "federation")

    @field_validator("family")
    @classmethod
    def _family(cls, value: str | None) -> str | None:
        return None if value is None else check_identifier(value, "family")

    @field_validator("agent_id")
    @classmethod
    def _agent_id(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        check_identifier(value, "agent_id")
        cert_file = info.data.get("cert_file")  # BrokerSettings' fields are validated first
        if cert_file is not None and info.data.get("check_certificate_identity", True):
            check_certificate_identity(value, cert_file)
        return value

    def certificate_identity(self) -> str | None:
        """The identity the broker gives this agent's certificate (its CN); None without one or the check."""
        return certificate_identity(self.cert_file) if self.cert_file and self.check_certificate_identity else None

    @field_validator("compressors")
    @classmethod
    def _compressors(cls, value: str) -> str:
        kinds = [k.strip() for k in value.split(",") if k.strip()]
        if kinds == ["none"]:
            return "none"
        known = COMPRESSORS.names()  # the registered compressors (protocol/compression/registry.py)
        unknown = [k for k in kinds if k not in known]
        if unknown or not kinds:
            raise ValueError(f"compressors: {', '.join(unknown) or 'nothing'} is not one of {', '.join(known)} (or 'none')")
        return ",".join(k for k in known if k in kinds)  # canonical order, no repeats

    def compressor_kinds(self) -> frozenset[str]:
        return frozenset() if self.compressors == "none" else frozenset(self.compressors.split(","))

    @field_validator("coordinator_key")
    @classmethod
    def _coordinator_key(cls, value: str | None) -> str | None:
        if value is not None:
            PublicKey.load(value)  # a clear error at start-up, naming the field
        return value

    def pinned_coordinator_key(self) -> PublicKey | None:
        return None if self.coordinator_key is None else PublicKey.load(self.coordinator_key)

    @property
    def signing_key_path(self) -> Path:
        return self.signing_key_file or Path(self.state_dir) / "agent_key.pem"

    @model_validator(mode="after")
    def _consistent(self) -> AgentSettings:
        if self.partition_index >= self.num_partitions:
            raise ValueError(f"partition_index {self.partition_index} must be below num_partitions {self.num_partitions}")
        if self.partition == "none" and self.num_partitions != 1:
            raise ValueError("num_partitions > 1 needs a partition kind (iid, dirichlet, classes)")
        if self.attack_scale is not None and self.attack not in ("sign_flip", "scaling", "gaussian_noise"):
            raise ValueError(f"attack_scale has no effect with attack {self.attack!r}")
        if self.attack_z is not None and self.attack != "alie":
            raise ValueError(f"attack_z has no effect with attack {self.attack!r}")
        if self.attack == "none" and (self.attack_claim_samples is not None or self.attack_report_accuracy is not None):
            raise ValueError("attack_claim_samples and attack_report_accuracy need an attack")
        if 0 < self.max_message_bytes < 4096:
            raise ValueError("max_message_bytes must be 0 (no chunking) or at least 4096")
        self.straggler_model()
        self._check_dp()
        return self

    def straggler_model(self) -> DelayModel:
        return parse_delay(self.straggler_delay, self.device)

    def _check_dp(self) -> None:
        dp_fields = sorted(f for f in self.model_fields_set if f.startswith("dp_"))
        if not self.dp:
            if dp_fields:
                raise ValueError(f"{', '.join(dp_fields)} set but dp is off: add --dp (FL_AGENT_DP=true)")
            return
        if self.tf32:
            raise ValueError("tf32 cannot be on with dp: DP-SGD checks that each batch gradient is the mean of its "
                             "per-sample gradients to float32 rounding (a term outside them would escape clipping), "
                             "and TF32 products differ by about 1e-3; turn tf32 off")
        if (self.dp_noise_multiplier is None) == (self.dp_target_epsilon is None):
            raise ValueError("with dp on, set exactly one of dp_noise_multiplier (fixed noise) and "
                             "dp_target_epsilon (noise calibrated to it over dp_planned_rounds)")
        if self.dp_target_epsilon is not None and self.dp_planned_rounds is None:
            raise ValueError("dp_target_epsilon needs dp_planned_rounds: the rounds the budget is spread over")
        if self.dp_target_epsilon is None and self.dp_planned_rounds is not None:
            raise ValueError("dp_planned_rounds is only used with dp_target_epsilon")
        if (self.dp_target_epsilon is not None and self.dp_budget_epsilon is not None
                and self.dp_budget_epsilon < self.dp_target_epsilon):
            raise ValueError(f"dp_budget_epsilon {self.dp_budget_epsilon} is below dp_target_epsilon "
                             f"{self.dp_target_epsilon}: the planned rounds would not fit")
        if self.dp_target_epsilon is not None and self.dp_prototype_noise_multiplier is not None:
            raise ValueError("dp_target_epsilon calibrates the DP-SGD noise for the training steps alone, and the "
                             "prototype releases of dp_prototype_noise_multiplier would spend the budget before "
                             "dp_planned_rounds: with prototypes, set dp_noise_multiplier and dp_budget_epsilon")
