"""Differential privacy on the device: DP-SGD through Opacus, with a budget that survives reboots.

- ``config``: the DP settings (fixed noise, or a target epsilon over planned rounds);
- ``ledger``: the durable accountant (history, epsilon, budget) in the agent's state dir;
- ``dp_training``: one round of DP-SGD, and the contract algorithm hooks keep under DP;
- ``prototypes``: the Gaussian mechanism for FedProto's prototypes;
- ``compat``: the start-up check that a model can be trained with per-sample gradients;
- ``trainer``: ties them together for the worker.

Nothing here is imported unless ``dp`` is on, so agents without DP never load Opacus.
"""
