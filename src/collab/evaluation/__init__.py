"""Evaluation: held-out scores with standard errors, torchmetrics (pass@k, IoU, majority vote), the
prompt baselines, CoLLM's Table 1 and the analysis helpers of the notebooks."""
