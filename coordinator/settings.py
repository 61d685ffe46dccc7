"""Coordinator settings: defaults < YAML file < FL_COORDINATOR_* environment < CLI flags."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from coordinator.aggregation.registry import RULES, fewest_updates
from coordinator.policies.registry import POLICIES
from coordinator.schedule import decay_problem
from coordinator.strategies.registry import ALGORITHMS
from protocol.compression import COMPRESSORS, CompressionSpec, state_compressors
from protocol.compression.registry import described
from protocol.messages import MAX_AGENTS_PER_ROUND
from protocol.secagg.accounting import affordable_rounds, gaussian_rdp, skellam_round_bound
from protocol.secagg.ring import GRID_LEVELS, RING_BITS, ring_bits
from protocol.tasks import TaskCard, load_task_card
from protocol.topics import check_identifier
from service_kit.broker import BrokerSettings

AggregatorName = RULES.literal()
"""The registered aggregation rules' names (coordinator/aggregation/registry.py)."""
AlgorithmName = ALGORITHMS.literal()
"""The registered algorithms' names (coordinator/strategies/registry.py)."""
StateCompressionName = Literal.__getitem__(("none", *state_compressors()))  # type: ignore[attr-defined]
"""``none`` or a compressor that declares the ``global_state`` payload (protocol/compression/registry.py)."""

DEFAULT_MOMENTUM = 0.9
"""Local SGD momentum when none is set; SCAFFOLD's default is 0 (the paper corrects plain SGD steps)."""


MEDIAN_OF = 3
"""Deltas of a family a round's median norm rests on (``coordinator.round.norm_clip.HOLD``)."""


class CoordinatorSettings(BrokerSettings):
    model_config = SettingsConfigDict(env_prefix="FL_COORDINATOR_", extra="forbid", validate_default=True)

    # where
    federation: str = Field(default="default", description=(
        "the federation's name: its topics live under fl/<federation>/, shared with its agents"))
    client_id: str | None = Field(default=None, description="MQTT client id; unset: coordinator-{federation}")
    state_dir: Path = Field(default=Path("coordinator-state"), description=(
        "checkpoints, the rounds log, keys and enrollments; a restart resumes the run kept here"))
    http_host: str = Field(default="0.0.0.0", description="address serving /metrics, /healthz and /readyz")
    http_port: int = Field(default=9100, ge=0, le=65535, description="port of /metrics, /healthz, /readyz; 0: any free")

    # what
    task: str = Field(default="digits", description=(
        "the task agents run: a built-in task's name (digits, mnist-5k, basic-motions) or a task card file "
        "(.json, from 'edge-agent tasks --card NAME'); agents of another task, version or model layout are refused"))
    algorithm: AlgorithmName = Field(default="fedavg", description="the federated learning algorithm")  # type: ignore[valid-type]
    aggregator: AggregatorName = Field(default="mean", description="how updates are combined")
    byzantine_f: int = Field(default=0, ge=0, le=10_000, description=(
        "Byzantine updates to tolerate per aggregation: Krum and Multi-Krum need n > 2f + 2 updates, the median "
        "and the geometric median n > 2f, the trimmed mean must trim at least f per end; a round with fewer fails "
        "(too_few_updates)"))
    trim_beta: float = Field(default=0.1, ge=0.0, lt=0.5, description=(
        "trimmed_mean: fraction trimmed at each end of every coordinate (floor(beta * n) values)"))
    multi_krum_m: int | None = Field(default=None, ge=1, description=(
        "multi_krum: how many best-scored updates to average; unset: n - f"))
    geomed_iterations: int = Field(default=10, ge=1, le=1000, description=(
        "geometric_median: most smoothed Weiszfeld iterations, each one pass over the round's updates"))
    geomed_smoothing: float = Field(default=1e-6, gt=0.0, le=1.0, allow_inf_nan=False, description=(
        "geometric_median: an update closer than this to the current estimate weighs as if at this L2 distance "
        "(RFA's nu: no division by zero)"))
    geomed_tolerance: float = Field(default=1e-6, ge=0.0, lt=1.0, description=(
        "geometric_median: stop once an iteration lowers the sum of distances by at most this fraction of it; "
        "0: run every iteration"))
    clip_norm: float | None = Field(default=None, gt=0.0, allow_inf_nan=False, description=(
        "scale each update (delta) to at most this L2 norm before aggregating; unset: no clipping"))
    rounds: int = Field(default=20, ge=1, le=1_000_000, description="training rounds to run")
    local_epochs: int = Field(default=2, ge=1, le=1000, description="epochs each agent trains per round")
    local_steps: int | None = Field(default=None, ge=1, le=1_000_000, description=(
        "mini-batch steps each agent takes per round, whatever its data size, instead of local_epochs; "
        "scaffold's control variates assume every agent takes the same number (with epochs, an agent of "
        "1,400 samples takes 30x the steps of one of 50, and the corrections no longer cancel in the mean)"))
    learning_rate: float = Field(default=0.05, gt=0.0, le=10.0, description="agents' local SGD learning rate")
    learning_rate_decay: float = Field(default=1.0, gt=0.0, le=1.0, description=(
        "each round's announced local learning rate is learning_rate x this^(round - 1); below 1, later rounds take "
        "smaller local steps (what convergence on non-IID data needs: Li et al., ICLR 2020), which keeps a skewed, "
        "partly sampled fleet from swinging late"))
    momentum: float | None = Field(default=None, ge=0.0, lt=1.0,
                                   description="local SGD momentum; unset: 0.9, or 0 for scaffold (the paper's plain SGD)")
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0, description="agents' local SGD weight decay")
    batch_size: int | None = Field(default=None, ge=1, description=(
        "local batch size for every agent; unset: each agent's own (its device profile's or its --batch-size)"))
    server_learning_rate: float = Field(default=1.0, gt=0.0, le=10.0,
                                        description="global step on the mean delta (SCAFFOLD's global learning rate)")
    prox_mu: float = Field(default=0.01, ge=0.0, le=100.0, description="fedprox: weight of the proximal term")
    scaffold_correct_head: bool = Field(default=True, description=(
        "scaffold: correct the classifier head's steps too (the paper); false: the head takes plain SGD steps and "
        "only the feature layers are corrected, which kept SCAFFOLD from swinging on strongly skewed real MNIST "
        "(bench/scaffold_reference.py)"))
    scaffold_absent_class_scale: float = Field(default=1.0, gt=0.0, le=1.0, description=(
        "scaffold: below 1, each agent's training loss scales the logits of the classes it holds no sample of by "
        "this (a restricted softmax, as FedRS); under strong label skew it keeps one-class agents from swinging the "
        "model (bench/scaffold_reference.py); refused by agents with dp on"))
    proto_lambda: float = Field(default=1.0, ge=0.0, le=1000.0, description="fedproto: weight of the alignment loss")
    proto_warmup_rounds: int = Field(default=0, ge=0, le=100_000,
                                     description="fedproto: rounds over which lambda ramps up linearly; 0: none")
    proto_momentum: float = Field(default=0.0, ge=0.0, lt=1.0,
                                  description="fedproto: server momentum on the global prototypes")
    proto_normalize: bool = Field(default=False, description="fedproto: L2-normalise embeddings and prototypes")
    init_seed: int = Field(default=0, ge=0, lt=2**31, description=(
        "seed of the initial global model, built alike by every agent"))
    evaluate_final: bool = Field(default=True, description=(
        "after the last round, one evaluation round of the final model on the agents' held-out data"))

    compression: str = Field(default="none", description=(
        "how agents compress their update's delta: none, or a registered compressor (protocol/compression/): "
        + described()))
    state_compression: StateCompressionName = Field(default="none", description=(  # type: ignore[valid-type]
        "how global states go out: none (float32) or fp16 (half the bytes; the coordinator keeps float32 "
        "master weights, agents widen to float32 losslessly)"))

    # how rounds run (coordinator/policies)
    mode: POLICIES.literal() = Field(default="sync", description=(  # type: ignore[valid-type]
        "the round policy: sync: rounds with a deadline and a quorum; async: buffered asynchronous aggregation "
        "(FedBuff), every agent trains whenever it is free and a new global version is made every buffer_size "
        "updates"))
    buffer_size: int = Field(default=10, ge=1, le=MAX_AGENTS_PER_ROUND, description=(
        "async: updates folded into each new global version"))
    max_staleness: int = Field(default=4, ge=0, le=1000, description=(
        "async: drop an update trained from a version more than this many versions old (too_stale)"))
    staleness_exponent: float = Field(default=0.5, ge=0.0, le=4.0, description=(
        "async: an update s versions stale weighs (1 + s) ** -exponent of its samples; 0.5 is FedBuff's 1/sqrt(1+s)"))
    weighting: Literal["samples", "kl"] = Field(default="samples", description=(
        "samples: weight updates by sample count; kl: also by exp(-KL / kl_temperature) (topped up so that no class "
        "weighs less than under sample-count weighting), KL of the agent's label "
        "distribution to the federation's (agents report label counts, except under DP)"))
    kl_temperature: float = Field(default=1.0, ge=0.1, le=100.0, description=(
        "kl weighting: an agent at KL = temperature keeps e^-1 = 37% of its weight; at least 0.1 (below, every "
        "skewed agent's factor can underflow to 0 and every round fail with no weight)"))

    # who, and how long to wait for them
    seed: int = Field(default=0, ge=0, lt=2**63, description="seed of agent selection (with the round number: a restart re-selects alike)")
    fraction_fit: float = Field(default=1.0, gt=0.0, le=1.0, description=(
        "fraction of the available agents a round wants updates from"))
    min_fit_agents: int = Field(default=2, ge=1, description="fewest agents a round wants updates from")
    over_selection: float = Field(default=0.0, ge=0.0, le=10.0, description=(
        "select this fraction more agents than the round wants (0.3: 30% more); the round closes as soon "
        "as the wanted number answered, so a few stragglers or dropouts do not hold it up"))
    max_agents_per_round: int = Field(default=MAX_AGENTS_PER_ROUND, ge=1, le=MAX_AGENTS_PER_ROUND, description=(
        "most agents one round (training or the final evaluation) selects; larger fleets are sampled"))
    max_known_agents: int = Field(default=50_000, ge=1, le=10_000_000, description=(
        "agents the registry remembers; when full, the longest-silent one is forgotten, or a new one refused"))
    forget_agents_after_s: float = Field(default=7 * 86_400.0, gt=0.0, description=(
        "forget an agent not heard from for this long (it re-enters with its next status)"))
    min_available_agents: int = Field(default=2, ge=1, description="a round opens once this many agents are online")
    quorum_fraction: float = Field(default=0.5, gt=0.0, le=1.0, description=(
        "fraction of the wanted updates that must arrive by the deadline, else the round fails (quorum_missed)"))
    min_updates: int = Field(default=1, ge=1, description="fewest updates a round needs at its deadline (the quorum's floor)")
    round_deadline_s: float = Field(default=60.0, gt=0.0, le=86_400.0, description=(
        "seconds a round waits for updates before it closes"))
    agent_timeout_s: float = Field(default=90.0, gt=0.0, description=(
        "an agent not heard from for this long is offline, even without its last will"))
    resume_grace_s: float = Field(default=10.0, ge=0.0, le=3600.0, description=(
        "after a restart, a round whose deadline passed while the coordinator was down still collects "
        "updates (queued by the broker or resent by agents) for this long before closing; 0 closes it at "
        "once as interrupted"))

    # limits
    max_update_bytes: int = Field(default=256 * 1024 * 1024, ge=1024, description=(
        "largest update accepted from one agent, in bytes (reassembled, if sent in chunks)"))
    secure_aggregation: bool = Field(default=False, description=(
        "SecAgg+: the coordinator learns only the sum of each round's updates (fedavg, fedprox, scaffold, fedproto; "
        "mean only)"))
    secagg_degree: int = Field(default=0, ge=0, le=1024, description=(
        "secure aggregation: neighbours each agent shares its secrets with; 0: 3 log2 n, all when fewer"))
    secagg_threshold: int = Field(default=0, ge=0, le=1024, description=(
        "secure aggregation: shares needed to recover an agent's secrets (and survivors a round needs); 0: from the degree"))
    # Measured 2026-12-04 (bench/secagg.py's prg line, 127,000 values): ChaCha20 0.18 ms a mask, AES-256-CTR 0.095 ms
    # on this project's x86 machine (AES-NI); a device without AES instructions (Raspberry Pi 4) is the reverse.
    secagg_prg: Literal["chacha20", "aes-ctr"] = Field(default="chacha20", description=(
        "secure aggregation: the stream cipher that expands mask seeds; aes-ctr (AES-256-CTR) masks about twice as "
        "fast where every agent has AES instructions (x86, Jetson, most phones), chacha20 everywhere else"))
    secagg_clip: float = Field(default=0.5, gt=0.0, le=1e6, allow_inf_nan=False, description=(
        "secure aggregation: agents clip every value of their delta to [-clip, clip] before quantising"))
    # Measured 2026-12-02 (10 agents, plain SCAFFOLD, lr 0.05): the largest |control delta| was 0.29 on digits
    # Dir(0.1) 4 epochs, 0.12 on digits Dir(0.5) 25 steps, 0.30 on mnist-5k Dir(0.1) 25 steps over 15 rounds;
    # 1.0 clips none of them. It is its own setting: c ~ delta / (steps x lr), which varies by agent under epochs.
    secagg_control_clip: float = Field(default=1.0, gt=0.0, le=1e6, allow_inf_nan=False, description=(
        "secure aggregation under scaffold: agents clip every value of their control-variate delta (gradient "
        "units) to [-clip, clip] before quantising"))
    # Measured 2026-12-03 (bench/secagg.py --accuracy --algorithm fedproto: digits, 9 agents of three families,
    # plain FedProto, 20 rounds): the largest |prototype value| was 1.24 from the initial models and 4.06 from the
    # final personal ones; 8.0 clips none of them. Under proto_normalize every value lies within 1.
    secagg_prototype_clip: float = Field(default=8.0, gt=0.0, le=1e6, allow_inf_nan=False, description=(
        "secure aggregation under fedproto: agents clip every prototype value (embedding units) to [-clip, clip] "
        "before quantising"))
    secagg_noise_multiplier: float = Field(default=0.0, ge=0.0, le=1000.0, allow_inf_nan=False, description=(
        "distributed DP under secure aggregation: each round's sum carries noise of this many times "
        "secagg_dp_clip_norm, added in shares by the agents; 0: none (docs/privacy.md)"))
    secagg_noise_mechanism: Literal["skellam", "gaussian"] = Field(default="skellam", description=(
        "distributed DP: skellam adds integer noise on the grid, so the sum's noise and the rounding are accounted "
        "exactly; gaussian adds floating-point noise before rounding (the rounding is not accounted)"))
    secagg_dp_clip_norm: float = Field(default=1.0, gt=0.0, le=1e6, allow_inf_nan=False, description=(
        "distributed DP: agents bound the L2 norm of their delta by this before weighing and noising it"))
    secagg_dp_delta: float = Field(default=1e-5, gt=0.0, lt=1.0, description=(
        "distributed DP: the delta of the (epsilon, delta) the coordinator reports"))
    secagg_dp_target_epsilon: float | None = Field(default=None, gt=0.0, le=1e4, description=(
        "distributed DP: refuse to start a run whose secure rounds could spend more epsilon; unset: report only"))
    secagg_stage_s: float = Field(default=15.0, gt=0.0, le=3600.0, allow_inf_nan=False, description=(
        "secure aggregation: seconds for advertising keys, for sharing them, and for the unmasking answers"))
    enrollment: Literal["required", "open"] = Field(default="required", description=(
        "required: accept only agents enrolled with 'coordinator enroll', by their signatures; "
        "open: anyone who reaches the broker (experiments only)"))
    enrolled_agents_file: Path | None = Field(default=None, description=(
        "enrolled agents' public keys; unset: STATE_DIR/enrolled.json"))
    signing_key_file: Path | None = Field(default=None, description=(
        "the coordinator's Ed25519 key (created if missing); unset: STATE_DIR/coordinator_key.pem"))
    max_samples_per_update: int = Field(default=1_000_000, ge=1, description=(
        "most samples an update counts for, whatever it claims (an enrollment's max_samples replaces it)"))
    claim_cap_multiple: float = Field(default=1.0, ge=0.0, le=1000.0, allow_inf_nan=False, description=(
        "without an enrolled max_samples, an update counts for at most this times the median sample count the "
        "round's selected agents report (a larger claim is cut, and counted); 0: only max_samples_per_update"))
    max_norm_ratio: float = Field(default=1.0, ge=0.0, allow_inf_nan=False, description=(
        "clip each delta to this times the median L2 norm of its family's deltas in the same round (counted); "
        "0 turns it off"))
    notice_interval_s: float = Field(default=30.0, ge=0.0, le=86_400.0, allow_inf_nan=False, description=(
        "at most one refusal notice per agent and reason in this many seconds (signed, on notices/<agent_id>); "
        "0 sends none"))
    aggregation_memory_mb: int = Field(default=512, ge=0, le=1_048_576, description=(
        "robust rules keep a round's updates in memory up to this, in a memory-mapped file under state_dir beyond it"))
    max_message_bytes: int = Field(default=0, ge=0, description=(
        "split published global states above this size into chunks (for brokers that cap messages); 0 never"))
    exit_when_finished: bool = Field(default=False, description=(
        "exit (status 0) once the run is finished, instead of serving metrics until stopped"))
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(default="INFO", description="least severe log level shown")

    @field_validator("federation")
    @classmethod
    def _federation(cls, value: str) -> str:
        return check_identifier(value, "federation")

    @field_validator("momentum")
    @classmethod
    def _momentum(cls, value: float | None, info: ValidationInfo) -> float:
        """Fills in the algorithm's default; ``algorithm`` is declared (so validated) before it."""
        scaffold = info.data.get("algorithm") == "scaffold"
        if value is None:
            return 0.0 if scaffold else DEFAULT_MOMENTUM
        return value

    @field_validator("task")
    @classmethod
    def _task(cls, value: str) -> str:
        load_task_card(value)  # a clear error at start-up, naming the field
        return value

    @field_validator("compression")
    @classmethod
    def _compression(cls, value: str) -> str:
        return str(CompressionSpec.parse(value))  # a clear error at start-up, naming the field

    @field_validator("client_id")
    @classmethod
    def _client_id(cls, value: str | None) -> str | None:
        return None if value is None else check_identifier(value, "client_id")

    @model_validator(mode="after")
    def _consistent(self) -> CoordinatorSettings:
        if self.min_fit_agents > self.min_available_agents:
            raise ValueError("min_fit_agents cannot exceed min_available_agents")
        if self.min_available_agents > self.max_known_agents:
            raise ValueError(f"min_available_agents {self.min_available_agents} exceeds max_known_agents "
                             f"{self.max_known_agents}: no round would open")
        fewest = fewest_updates(self.aggregator, self.byzantine_f, self.trim_beta)
        if fewest is None or fewest > self.max_agents_per_round:
            need = "trim_beta above 0" if fewest is None else f"{fewest} updates a round"
            raise ValueError(f"aggregator {self.aggregator} with byzantine_f {self.byzantine_f} needs {need}, and a "
                             f"round takes at most max_agents_per_round {self.max_agents_per_round}: every round "
                             f"would fail (too_few_updates)")
        if 0 < self.max_message_bytes < 4096:
            raise ValueError("max_message_bytes must be 0 (no chunking) or at least 4096")
        kind = CompressionSpec.parse(self.compression).kind
        if kind != "none" and COMPRESSORS.get(kind).error_feedback and self.momentum != 0.0:
            raise ValueError(f"compression {self.compression} needs momentum 0 (add --momentum 0): with local momentum, "
                             f"{kind}'s error feedback sends what it held back in bursts, and a large model stayed at "
                             f"chance in bench/compression.py")
        problem = decay_problem(self.learning_rate, self.learning_rate_decay, self.rounds)
        if problem is not None:
            raise ValueError(problem)
        if self.mode == "secagg":
            raise ValueError("mode secagg is not set directly: keep mode sync and set secure_aggregation true")
        algorithm = ALGORITHMS.entry(self.algorithm)
        if not algorithm.supports("modes", self.mode):
            runs = " or ".join(e.name for e in ALGORITHMS if e.supports("modes", self.mode))
            raise ValueError(f"mode {self.mode} runs {runs}, not {self.algorithm}: SCAFFOLD's control variates "
                             f"and FedProto's prototypes assume every update starts from the same round")
        if self.mode == "async" and self.max_norm_ratio and self.buffer_size < MEDIAN_OF:
            raise ValueError(f"buffer_size {self.buffer_size} with max_norm_ratio {self.max_norm_ratio:g}: a buffer needs "
                             f"at least {MEDIAN_OF} updates for the median norm that clips each one (with fewer, a "
                             f"device alone in a buffer is clipped against its own norm, and one alone proposes the "
                             f"first state); raise buffer_size, or set max_norm_ratio 0")
        if self.mode == "async" and self.over_selection:
            raise ValueError("over_selection has no effect with mode async: every available agent is selected")
        if self.secagg_noise_multiplier and not self.secure_aggregation:
            raise ValueError("secagg_noise_multiplier adds distributed DP noise to secure rounds' sums: it needs "
                             "secure_aggregation (without it, agents' device-side DP-SGD keeps updates private)")
        problem = secure_problem(self)
        if problem is not None:
            raise ValueError(problem)
        if self.algorithm == "fedproto":
            problem = self.task_card().prototype_problem()
            if problem is not None:
                raise ValueError(f"algorithm fedproto cannot run task {self.task!r}: {problem}")
        return self

    def task_card(self) -> TaskCard:
        return load_task_card(self.task)

    @property
    def mqtt_client_id(self) -> str:
        return self.client_id or f"coordinator-{self.federation}"

    @property
    def enrollment_path(self) -> Path:
        return self.enrolled_agents_file or Path(self.state_dir) / "enrolled.json"

    @property
    def signing_key_path(self) -> Path:
        return self.signing_key_file or Path(self.state_dir) / "coordinator_key.pem"


# -- secure aggregation: what it refuses at start-up, and why ----------------------------------------
# Each of these needs something the coordinator no longer has under SecAgg+: an individual update, or one
# agent's norm or label distribution (coordinator/round/secure.py, coordinator/policies/secure.py).
def noise_problem(settings: CoordinatorSettings) -> str | None:
    """Why distributed DP (``secagg_noise_multiplier``) cannot run with ``settings``; None if it can (or is off)."""
    s = settings
    if not s.secagg_noise_multiplier:
        return None
    if s.algorithm not in ("fedavg", "fedprox"):
        return (f"secagg_noise_multiplier noises the delta only: {s.algorithm}'s "
                f"{'control deltas' if s.algorithm == 'scaffold' else 'prototypes'} would leave without noise")
    if CompressionSpec.parse(s.compression).kind != "none":
        return ("secagg_noise_multiplier needs compression none: a compression grid's rounding is not accounted "
                "under gaussian noise, and its few steps cannot hold the clip norm finely enough under skellam")
    if s.secagg_dp_target_epsilon is not None:
        releases = max(s.rounds - 1, 0)  # round 1 bootstraps: seeded weights, nothing learned from data
        z = s.secagg_noise_multiplier
        per_round = gaussian_rdp(z) if s.secagg_noise_mechanism == "gaussian" else skellam_round_bound(z)
        affordable = affordable_rounds(per_round, s.secagg_dp_delta, s.secagg_dp_target_epsilon)
        if releases > affordable:
            return (f"secagg_dp_target_epsilon {s.secagg_dp_target_epsilon:g} (delta {s.secagg_dp_delta:g}) affords "
                    f"{affordable} secure rounds at secagg_noise_multiplier {z:g} ({s.secagg_noise_mechanism}), and rounds "
                    f"{s.rounds} would release {releases}: lower rounds or raise the noise multiplier")
    return None


def secure_problem(settings: CoordinatorSettings) -> str | None:
    """Why ``settings`` cannot run with ``secure_aggregation`` on, naming the setting; None if they can."""
    s = settings
    if not s.secure_aggregation:
        return None
    head = "secure_aggregation is on, so the coordinator sees only the sum of the round's updates:"
    entry = ALGORITHMS.entry(s.algorithm)
    if "secure" not in entry.compatible or not entry.supports("secure", "on"):
        able = ", ".join(e.name for e in ALGORITHMS if "secure" in e.compatible and e.supports("secure", "on"))
        return (f"{head} algorithm {s.algorithm} cannot run so (it does not declare secure=on in its registration); "
                f"use {able}")
    if s.aggregator != "mean":
        return (f"{head} aggregator {s.aggregator} needs every individual update (median, trimmed mean, Krum and "
                f"the geometric median rank or compare them); use aggregator mean")
    if s.clip_norm is not None:
        return f"{head} clip_norm scales each update by its own norm, which is hidden; agents clip to secagg_clip"
    if s.max_norm_ratio:
        return (f"{head} max_norm_ratio clips each delta against the round's median norm, a per-update check it "
                f"cannot make; set max_norm_ratio 0 (agents clip every value to secagg_clip on the device)")
    if s.weighting == "kl":
        return f"{head} weighting kl weighs each update by its agent's label skew; use weighting samples"
    if s.mode != "sync":
        return f"{head} mode {s.mode} folds updates one at a time as they arrive; use mode sync"
    kind = CompressionSpec.parse(s.compression).kind
    if kind != "none" and kind not in GRID_LEVELS:
        return (f"{head} compression {s.compression} cannot be masked: each agent keeps its own coordinates, and a "
                f"sparse masked upload shows which (the positions are what it would hide); use "
                f"{', '.join(['none', *GRID_LEVELS])} (quantised inside the ring, protocol/secagg/ring.py)")
    if kind in GRID_LEVELS and ring_bits(GRID_LEVELS[kind], MAX_AGENTS_PER_ROUND) > RING_BITS:
        # n agents' values in [-L, L] sum within [-nL, nL]: the ring must hold that without wrapping.
        return (f"{head} compression {kind} puts values in [-{GRID_LEVELS[kind]}, {GRID_LEVELS[kind]}]: "
                f"{MAX_AGENTS_PER_ROUND} agents' sum could wrap a ring of 2^{RING_BITS}")
    noise = noise_problem(s)
    if noise is not None:
        return f"{head} {noise}"
    if s.secagg_threshold and s.secagg_degree and s.secagg_threshold > s.secagg_degree:
        return f"secagg_threshold {s.secagg_threshold} exceeds secagg_degree {s.secagg_degree}"
    if s.round_deadline_s <= 2 * s.secagg_stage_s:
        return (f"round_deadline_s {s.round_deadline_s} leaves no time to train: advertising and sharing keys take "
                f"up to 2 x secagg_stage_s ({2 * s.secagg_stage_s}s) of it")
    if s.secagg_threshold and s.secagg_threshold > s.min_fit_agents:
        return (f"secagg_threshold {s.secagg_threshold} exceeds min_fit_agents {s.min_fit_agents}: a round could "
                f"select fewer agents than it needs to survive")
    return None
