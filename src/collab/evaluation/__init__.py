"""Evaluation: held-out scores with standard errors, torchmetrics (pass@k, IoU, majority vote), the
prompt baselines, the comparison grid and the analysis helpers of the notebooks."""
